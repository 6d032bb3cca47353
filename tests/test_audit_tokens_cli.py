"""`verispec audit --endpoint` (token-level mode) end to end: the bug zoo over HTTP, the CLI's
report folder and JSON, and clear errors for bad options. The local reference is the zoo's
own target (`load_model` patched to return it: it has no registry name)."""

from __future__ import annotations

import json

import pytest
from fastapi import Request
from typer.testing import CliRunner

from verispec.audit.zoo import zoo_app, zoo_reference
from verispec.cli import app
from verispec.serve import BackgroundServer


@pytest.fixture
def zoo_target(monkeypatch):
    import verispec.api
    monkeypatch.setattr(verispec.api, "load_model", lambda spec, **kw: zoo_reference())


def run(*args):
    result = CliRunner().invoke(app, ["audit", *args])
    return result, " ".join(result.output.split())


def test_cli_passes_the_exact_zoo_server_and_writes_its_report(zoo_target, tmp_path):
    with BackgroundServer(zoo_app("exact")) as url:
        result, out = run("--endpoint", url + "/v1", "--target", "zoo", "--prompt-ids", "1,2,3,4,5",
                          "--n-samples", "60", "--m", "48", "--temperature", "0.7", "--tolerance", "0.05",
                          "--probes", "cold-warm,stream,logprobs", "--report", str(tmp_path / "r"),
                          "--out", str(tmp_path / "s.jsonl"), "--json")
    assert result.exit_code == 0, out
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["verdict"] == "pass", report["reasons"]
    assert [p["name"] for p in report["probes"]] == ["cold-warm", "stream", "logprobs"]
    assert {p.name for p in (tmp_path / "r").iterdir()} >= {"report.md", "audit.json", "pit.png", "positions.png"}
    assert (tmp_path / "s.p0.jsonl").exists()


def test_cli_fails_a_naive_server_in_an_80_column_table(zoo_target):
    with BackgroundServer(zoo_app("naive-agree")) as url:
        result = CliRunner().invoke(app, ["audit", "--endpoint", url, "--target", "zoo", "--prompt-ids",
                                          "1,2,3,4,5", "--n-samples", "40", "--m", "32", "--temperature",
                                          "0.7"])
    assert result.exit_code == 0, result.output
    table = result.stdout
    assert "verdict: FAIL" in table and max(len(line) for line in table.splitlines()) <= 80


@pytest.mark.parametrize("args, match", [
    (["--per-position", "--tolerance", "0.1"], "use --position-tolerance"),
    (["--per-position", "--m", "9"], "--m must be <= 8"),
    (["--probes", "cold-warm,nope"], "--probes: unknown nope"),
    (["--tolerance", "1.5"], "--tolerance is on the top-1 excess"),
    (["--prompt-ids", "1,99"], "outside the reference's vocabulary 0..15"),
    (["--paired"], "--paired compares two servers"),
    (["--per-position", "--paired"], "--paired is a mode of the token-level audit"),
])
def test_bad_options_are_clear_errors(zoo_target, args, match):
    with BackgroundServer(zoo_app("exact")) as url:
        base = ["--endpoint", url, "--target", "zoo"]
        if "--prompt-ids" not in args:
            base += ["--prompt-ids", "1,2"]
        result, out = run(*base, *args)
    assert result.exit_code == 2 and match in out, out


def test_a_text_only_server_is_re_tokenised_and_the_report_says_the_audit_is_weaker():
    """A server that returns text without ids: the text is re-tokenised by its /tokenize and the
    report warns (a tokenisation mismatch would look like a bias)."""
    from verispec.audit.endpoint import Endpoint
    from verispec.audit.render import text
    from verispec.audit.tokens import run_token_audit
    from verispec.audit.zoo import ALPHABET
    from verispec.sampling import SamplingConfig

    inner = zoo_app("exact")
    app = zoo_app("exact")
    app.router.routes = [r for r in app.router.routes if getattr(r, "path", "") != "/v1/completions"]

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        body.pop("return_token_ids", None)
        from fastapi.testclient import TestClient
        data = TestClient(inner).post("/v1/completions", json=body).json()
        data["choices"][0].pop("token_ids")
        return data

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await request.json()
        return {"tokens": [ALPHABET.index(c) for c in body.get("content", body.get("prompt", ""))]}

    with BackgroundServer(app) as url:
        report = run_token_audit(Endpoint(url, "zoo"), zoo_reference(), [[1, 2, 3]], 10, 8,
                                 SamplingConfig(temperature=0.7), tolerance=0.3)
    assert report.info["id_source"] == "retokenised" and "weaker" in report.info["warning"]
    assert "weaker" in text(report)


@pytest.mark.parametrize("extra, says", [
    (["--reference-kernels", "vllm"], "--reference-kernels must be one of verispec, llama-server"),
    (["--reference-kernels", "llama-server", "--backend", "transformers"], "needs --backend llamacpp"),
])
def test_reference_kernels_are_checked_before_anything_loads(extra, says):
    result, out = run("--endpoint", "http://127.0.0.1:9/v1", "--target", "smollm2-135m", *extra)
    assert result.exit_code != 0 and says in out, out


def test_llama_server_kernels_load_a_flash_attention_stepwise_reference(monkeypatch):
    """--reference-kernels llama-server: the reference is loaded with flash attention and the
    batch-invariant mode off, and scores one token per forward (`stepwise`)."""
    import verispec.api
    from verispec.cli.audit_endpoint import load_reference

    seen = {}

    def fake(spec, **kw):
        seen.update(kw)
        return zoo_reference()
    monkeypatch.setattr(verispec.api, "load_model", fake)
    model = load_reference("smollm2-135m", "llamacpp", 2, "as the reference", "llama-server")
    assert seen == {"backend": "llamacpp", "n_threads": 2, "batch_invariant": False, "flash_attn": True}
    assert model.stepwise is True
    assert getattr(load_reference("smollm2-135m", "llamacpp", 2, "as the reference"), "stepwise", False) is False
