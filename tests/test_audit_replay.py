"""Seed-synced replay against `verispec serve`: its tokens are a function of (prompt, settings,
seed), so each must equal the local replay; a server with another rule fails at once."""

from __future__ import annotations

from test_serve_toys import CountingModel, toy_decoder, toy_logits

from verispec.api import SpeculativeDecoder
from verispec.audit import NAIVE_RULES
from verispec.audit.endpoint import Endpoint
from verispec.audit.tokens import run_token_audit
from verispec.sampling import SamplingConfig
from verispec.serve import BackgroundServer, create_app

PROMPTS = [[3, 5, 7], [2, 4]]


def _audit(app):
    local = SpeculativeDecoder(CountingModel(toy_logits, "ref"), None, drafter="none")
    with BackgroundServer(app) as url:
        return run_token_audit(Endpoint(url + "/v1", "toy"), CountingModel(toy_logits, "ref"), PROMPTS, 6, 12,
                               SamplingConfig(temperature=0.8), tolerance=0.2,
                               replay={"decoder": local, "k": 0, "rule": "gumbel"})


def test_verispec_serve_equals_its_replay_token_for_token():
    """k = "auto" serves with the coupled rule: the output is the plain seeded sample."""
    report = _audit(create_app(toy_decoder(), model_name="toy"))
    replay = report.probes[-1]
    assert replay.name == "replay" and replay.status == "pass", replay.detail
    assert replay.requests == 12 and "144 tokens identical" in replay.detail


def test_a_server_with_another_rule_fails_the_replay():
    report = _audit(create_app(toy_decoder(), model_name="toy", k=3, rule=NAIVE_RULES["naive-agree"]))
    assert report.probes[-1].status == "FAIL" and "server token" in report.probes[-1].detail
    assert report.verdict == "FAIL"
