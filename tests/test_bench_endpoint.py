"""`bench --endpoint`: servers measured as bench methods (no timings asserted).

Servers are on 127.0.0.1: verispec serve over the toy decoder of `test_serve_toys`
(speculation on, k = 3, vs off, k = 0; τ read from its /metrics), and small FastAPI
fakes that answer as llama-server does (a recorded response shape with `timings`).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from test_serve_toys import toy_decoder
from typer.testing import CliRunner

import pytest

from verispec.bench import run_bench, summarize
from verispec.bench.endpoint import ServerError, ServerMethod, scrape_metrics, spec_counts
from verispec.cli import app as cli_app
from verispec.prompts import load_prompts
from verispec.serve import BackgroundServer, create_app

PROMPT = [3, 5, 7]

VLLM_METRICS = """# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 40.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 25.0
"""


def test_vllm_counters_are_read_and_differenced():
    after = scrape_metrics(VLLM_METRICS)
    assert after["vllm:spec_decode_num_draft_tokens_total"] == 40.0
    before = {"vllm:spec_decode_num_draft_tokens_total": 30.0,
              "vllm:spec_decode_num_accepted_tokens_total": 20.0}
    assert spec_counts(before, after) == (10, 5)
    assert spec_counts({}, {"llamacpp:tokens_predicted_total": 3.0}) is None
    assert scrape_metrics("not { prometheus") == {}


def test_a_url_that_is_not_http_is_refused():
    with pytest.raises(ValueError, match="http://"):
        ServerMethod("127.0.0.1:8080")
    assert ServerMethod("http://127.0.0.1:8080/v1/").url == "http://127.0.0.1:8080"


def test_verispec_serve_spec_on_and_off_give_tau_from_metrics_and_the_same_greedy_tokens():
    on_app = create_app(toy_decoder(), model_name="toy", k=3)
    off_app = create_app(toy_decoder(draft=False), model_name="toy", k=0)
    with BackgroundServer(on_app) as on_url, BackgroundServer(off_app) as off_url:
        extra = {"return_token_ids": True}
        on = ServerMethod(on_url, extra=extra).generate(PROMPT, max_new_tokens=12)
        off = ServerMethod(off_url, extra=extra).generate(PROMPT, max_new_tokens=12)
    assert on["new_tokens"] == off["new_tokens"] == 12
    assert on["spec_source"] == off["spec_source"] == "metrics"
    assert off["drafted"] == 0 and off["tau"] == 1.0
    assert on["drafted"] > 0 and 0 <= on["accepted"] <= on["drafted"]
    assert on["target_forwards"] == 12 - on["accepted"]
    assert on["tau"] == 12 / (12 - on["accepted"])
    assert on["text"] == off["text"]


def _llama_server(draft: tuple[int, int] | None, text: str = "same answer") -> FastAPI:
    """A fake with llama-server's response shape (chat; `timings` with draft counts when
    it speculates, recorded from llama-server 0c1e570)."""
    app = FastAPI()
    seen: list[dict] = []
    app.state.seen = seen

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "qwen.gguf"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        seen.append(body)
        n = body["max_tokens"]
        timings = {"prompt_n": 20, "prompt_ms": 50.0, "predicted_n": n, "predicted_ms": 400.0}
        if draft is not None:
            timings.update(draft_n=draft[0], draft_n_accepted=draft[1])
        return {"choices": [{"index": 0, "finish_reason": "length",
                             "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": 20, "completion_tokens": n, "total_tokens": 20 + n},
                "timings": timings}

    return app


def test_endpoint_only_bench_interleaves_servers_and_fills_the_tables(dataset):
    questions = load_prompts(dataset, ["translation", "qa"], 1)
    plain_app, spec_app = _llama_server(None), _llama_server((10, 6))
    with BackgroundServer(plain_app) as plain_url, BackgroundServer(spec_app) as spec_url:
        endpoints = {"plain": ServerMethod(plain_url), "plain-again": ServerMethod(plain_url),
                     "endpoint": ServerMethod(spec_url)}
        rows = run_bench(questions, target=None, endpoints=endpoints, max_new_tokens=16,
                         warmup=False, progress=False)
    assert {r["method"] for r in rows} == {"plain", "plain-again", "endpoint"}
    assert not any(r["error"] for r in rows)
    spec = [r for r in rows if r["method"] == "endpoint"]
    assert all(r["tau"] == 16 / 10 and r["draft_acceptance_rate"] == 0.6 for r in spec)
    assert all(r["identical_to_plain"] for r in rows if r["method"] != "plain")
    # the same prompt, as one user message, reached both servers
    assert [b["messages"] for b in spec_app.state.seen] == [b["messages"] for b in plain_app.state.seen][::2]
    # every timed request follows an untimed 1-token one of the same prompt on the same server
    # (a prefix cache is warm for plain, plain-again and the spec-on server alike)
    for seen in (plain_app.state.seen, spec_app.state.seen):
        timed = [i for i, b in enumerate(seen) if b["max_tokens"] == 16]
        assert len(timed) == len(seen) // 2
        assert all(seen[i - 1]["max_tokens"] == 1 and seen[i - 1]["messages"] == seen[i]["messages"]
                   for i in timed)
    cells = summarize(rows)["cells"]
    assert cells["endpoint"]["overall"]["tau"] == 16 / 10
    assert cells["plain-again"]["overall"]["speedup"] is not None


def test_endpoint_only_bench_needs_a_baseline_and_records_an_unreachable_server(dataset):
    questions = load_prompts(dataset, ["qa"], 1)
    with pytest.raises(ValueError, match="reference-endpoint"):
        run_bench(questions, target=None, endpoints={"endpoint": ServerMethod("http://127.0.0.1:9")},
                  progress=False)
    with BackgroundServer(_llama_server(None)) as url:
        rows = run_bench(questions, target=None, max_new_tokens=4, warmup=False, progress=False,
                         endpoints={"plain": ServerMethod(url),
                                    "endpoint": ServerMethod("http://127.0.0.1:9", model="m")})
    bad = [r for r in rows if r["method"] == "endpoint"][0]
    assert bad["error"].startswith("ServerError") and "127.0.0.1:9" in bad["error"]


def test_cli_endpoint_mode_writes_the_table_and_refuses_a_lone_reference(dataset, tmp_path):
    runner = CliRunner()
    lone = runner.invoke(cli_app, ["bench", "--reference-endpoint", "http://127.0.0.1:9",
                                   "--dataset", str(dataset)])
    assert lone.exit_code != 0 and "--endpoint" in lone.output
    with BackgroundServer(_llama_server(None)) as plain_url, \
            BackgroundServer(_llama_server((8, 8))) as spec_url:
        out = tmp_path / "run"
        result = runner.invoke(cli_app, ["bench", "--endpoint", spec_url, "--reference-endpoint", plain_url,
                                         "--dataset", str(dataset), "--categories", "qa",
                                         "--per-category", "1", "--max-new-tokens", "8",
                                         "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    table = (out / "table.md").read_text()
    assert "endpoint" in table and "plain-again" in table and "speculation on" in table
    assert "timed on a warm prompt cache" in table       # the report says how servers were timed
