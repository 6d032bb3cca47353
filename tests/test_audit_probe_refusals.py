"""A server that refuses a request field is not a lossless violation: the controls probe
drops a logit bias the server refuses with a 400 (vLLM with speculation: "The min_p and
logit_bias sampling parameters are not yet supported with speculative decoding", recorded in
benchmarks/audit/tokens-vllm-cpu-ngram-greedy.txt) and still probes the penalties, so a
server that skips them at draft positions still FAILs."""

from __future__ import annotations

import json

import pytest
from fastapi.responses import JSONResponse

from verispec.audit.endpoint import Endpoint
from verispec.audit.probes import ProbeContext, run_probes
from verispec.audit.zoo import detokenize, zoo_app, zoo_reference
from verispec.serve import BackgroundServer

VLLM_REFUSAL = "The min_p and logit_bias sampling parameters are not yet supported with speculative decoding."
PROMPTS = [[1, 2, 3, 4, 5], [9, 8, 7, 6]]


def refusing(fault: str, fields: tuple[str, ...]):
    """The zoo's server, answering vLLM's 400 to any completion that sets one of `fields`."""
    app = zoo_app(fault)
    seen: list[dict] = []

    @app.middleware("http")
    async def refuse(request, call_next):
        if request.url.path.endswith("/completions"):
            body = json.loads(await request.body())
            seen.append(body)
            if any(body.get(f) not in (None, {}, 0, 0.0, 1.0) for f in fields):
                return JSONResponse({"error": {"message": VLLM_REFUSAL, "type": "BadRequestError", "param": None,
                                               "code": 400}}, status_code=400)
        return await call_next(request)
    return app, seen


def controls_probe(app):
    with BackgroundServer(app) as url:
        ep = Endpoint(url + "/v1", "zoo")
        try:
            return run_probes(ProbeContext(ep, zoo_reference(), PROMPTS, m=16, detokenize=detokenize), ["controls"])[0]
        finally:
            ep.close()


def test_a_refused_logit_bias_is_dropped_and_the_penalties_still_probed():
    app, seen = refusing("exact", ("logit_bias",))
    result = controls_probe(app)
    assert result.status == "pass", result.detail
    assert "logit bias refused" in result.detail and "not yet supported" in result.detail
    ok = [b for b in seen if not b.get("logit_bias")]
    assert ok and all(b["presence_penalty"] == 2.0 and b["repetition_penalty"] == 1.3 for b in ok)


def test_penalties_skipped_at_draft_positions_still_fail_when_the_bias_is_refused():
    app, _ = refusing("penalties-skipped", ("logit_bias",))
    result = controls_probe(app)
    assert result.status == "FAIL" and "reference argmax" in result.detail, result.detail


@pytest.mark.parametrize("fields", [("logit_bias", "presence_penalty")])
def test_a_server_refusing_the_penalties_too_is_skipped_not_failed(fields):
    app, _ = refusing("exact", fields)
    result = controls_probe(app)
    assert result.status == "skipped" and "refuses penalties" in result.detail, result.detail
