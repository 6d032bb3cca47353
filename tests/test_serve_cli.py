"""`verispec serve` on the command line: bad options fail before loading; the real
process serves, answers /health 503 while loading, and exits 0 on Ctrl-C."""

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from typer.testing import CliRunner

from verispec.cli import app
from verispec.serve import bind

runner = CliRunner()


@pytest.mark.parametrize("args,needle", [
    (["--k", "-1"], "--k"),
    (["--k", "many"], "--k"),
    (["--rule", "bogus"], "--rule"),
    (["--drafter", "psychic"], "--drafter"),
    (["--max-queue", "-1"], "--max-queue"),
    (["--api-key", " "], "--api-key"),
    (["--api-key", " pad "], "--api-key"),
    (["--max-request-bytes", "0"], "--max-request-bytes"),
    (["--max-prompt-tokens", "0"], "--max-prompt-tokens"),
    (["--request-timeout", "0"], "--request-timeout"),
    (["--read-timeout", "0"], "--read-timeout"),
    (["--max-seqs", "0"], "--max-seqs"),
    (["--max-seqs", "2", "--backend", "transformers"], "--max-seqs"),     # batches on llama.cpp only
    (["--max-batched-rows", "64"], "--max-batched-rows"),                 # needs --max-seqs > 1
    (["--max-seqs", "2", "--max-batched-rows", "0"], "--max-batched-rows"),
])
def test_bad_options_fail_before_loading_anything(args, needle):
    result = runner.invoke(app, ["serve", "--target", "no-such-model", "--port", "0", *args])
    assert result.exit_code == 2
    assert needle in result.output


def test_a_port_in_use_fails_before_loading_anything():
    sock = bind("127.0.0.1", 0)
    try:
        result = runner.invoke(app, ["serve", "--target", "no-such-model", "--port", str(sock.getsockname()[1])])
    finally:
        sock.close()
    assert result.exit_code == 2 and "cannot listen" in result.output


def test_the_cli_serves_then_exits_0_on_ctrl_c_with_a_request_in_flight():
    env = {**os.environ, "COLUMNS": "300", "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen(
        [sys.executable, "-m", "verispec.cli", "serve", "--target", "smollm2-135m", "--draft", "none",
         "--drafter", "lookup", "--backend", "transformers", "--k", "2", "--port", "0",
         "--graceful-seconds", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        stderr_lines: list[str] = []
        reader = threading.Thread(target=lambda: stderr_lines.extend(proc.stderr), daemon=True)
        reader.start()
        deadline = time.monotonic() + 300
        base = None
        while base is None and time.monotonic() < deadline:
            for line in stderr_lines:
                if "listening on http://" in line:
                    base = line.split("listening on ")[1].split()[0]
            time.sleep(0.05)
        assert base, "".join(stderr_lines)
        early = httpx.get(base + "/health", timeout=30).status_code          # still loading
        url = proc.stdout.readline().strip()                                  # printed when ready
        assert url == base + "/v1", (url, "".join(stderr_lines))
        assert early == 503
        assert httpx.get(base + "/health", timeout=30).status_code == 200
        r = httpx.post(url + "/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                        "max_tokens": 4, "temperature": 0}, timeout=300)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        with httpx.stream("POST", url + "/completions", json={"prompt": "Once", "max_tokens": 2000, "stream": True},
                          timeout=300) as stream:
            next(stream.iter_lines())                                         # a request is in flight
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_limit_options_default_to_the_limits_the_app_documents():
    import dataclasses
    import inspect

    from verispec.cli.serve import serve
    from verispec.serve.guard import Limits

    params = inspect.signature(serve).parameters
    for f in dataclasses.fields(Limits):
        assert params[f.name].default.default == f.default, f.name


def test_the_warm_up_times_the_draft_models_catch_up_and_draft_step_too(tiny_pair):
    """`verispec serve --k auto` warms up before its first request; a warm-up prompt too
    short for the draft model's calibration (it was "Hello") left its catch-up unpriced,
    and the policy then read a whole prompt into the draft model at a price of 0 s."""
    from verispec.api import SpeculativeDecoder
    from verispec.cli.serve import warm_up

    target, draft = tiny_pair
    decoder = SpeculativeDecoder(target, draft, drafter="model")
    warm_up(decoder)
    costs = decoder.auto_policy("model").costs
    assert costs.ready
    assert costs.draft_time("model") is not None and costs.catchup_time("model") is not None
