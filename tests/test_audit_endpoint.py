"""`verispec audit --endpoint`: auditing a running server over HTTP.

Fixture servers are `verispec.serve.create_app` over the float64 toy decoder of
`test_serve_toys` (V = 16, no tokenizer) on 127.0.0.1: the exact one, one whose
acceptance rule is the naive "accept only if draft and target agree" (passed as
create_app's `rule`), and one whose verifier ignores the request's temperature
(the vLLM bug class, a decoder subclass). N is chosen from the power calculation
so that the bugs' total variation is detectable with >= 80 % power.
"""

from __future__ import annotations

import json
import socket

import httpx
import numpy as np
import pytest
import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from test_serve_toys import CountingModel, draft_logits, toy_decoder, toy_logits

from verispec.api import SpeculativeDecoder
from verispec.audit import NAIVE_RULES
from verispec.audit.endpoint import Endpoint, EndpointError, EndpointSettings, draw_samples, seed_check
from verispec.audit.power import detectable_tv, samples_for
from verispec.audit.reference import compare_exact, compare_two_sample, target_next_probs
from verispec.sampling import SamplingConfig
from verispec.serve import BackgroundServer, create_app

PROMPT = (3, 5, 7)
M = 2
T = 0.7
SIGNIFICANCE = 0.01
PER_TEST = SIGNIFICANCE / (M + 1)


class VerifierIgnoresTemperature(SpeculativeDecoder):
    """The verifier scores drafts with the raw target logits (temperature 1) whatever
    temperature the request asked for; the draft samples at the asked temperature."""

    def generate(self, prompt, **kw):
        t = kw["sampling"].temperature if kw.get("sampling") else kw.get("temperature", 0.0)
        target, raw = self.target, self.target.sync
        target.sync = lambda context, keep=None: raw(context, keep) * (t if t > 0 else 1.0)
        try:
            return super().generate(prompt, **kw)
        finally:
            del target.sync


def _reference():
    """The exact p of the toy target at temperature T (a separate model object: the
    server's own is busy in its worker thread)."""
    return target_next_probs(CountingModel(toy_logits, "ref"), list(PROMPT), SamplingConfig(temperature=T))


def _tv(p, q) -> float:
    return 0.5 * float(np.abs(p - q).sum())


@pytest.fixture(scope="module")
def n_samples() -> int:
    """N such that the smaller of the two bugs' position-1 TVs is detected with 80 %
    power under the worst-case alternative (the bugs are far larger than that)."""
    p = _reference()(())
    hot = target_next_probs(CountingModel(toy_logits, "hot"), list(PROMPT), SamplingConfig(temperature=1.0))(())
    tv_hot = _tv(p, hot)
    assert tv_hot > 0.05                    # the wrong temperature changes p enough to matter
    n = samples_for(tv_hot / 2, p, PER_TEST, alternative="worst")
    assert 100 <= n <= 1500
    return n


def _serve(decoder=None, k: int = 3, **kw):
    return BackgroundServer(create_app(decoder or toy_decoder(), model_name="toy", k=k, **kw))


def _sample(url: str, n: int, **kw) -> list[list[int]]:
    ep = Endpoint(url + "/v1", "toy")
    settings = EndpointSettings(url, "toy", PROMPT, M, T)
    return [s.token_ids for s in draw_samples(ep, settings, n, progress=False, concurrency=8, **kw)]


def _audit(url: str, n: int):
    return compare_exact(_sample(url, n), M, _reference(), significance=SIGNIFICANCE, tolerance=0.1)


def test_an_exact_server_passes_with_its_power_reported(n_samples):
    with _serve() as url:
        report = _audit(url, n_samples)
    assert report.verdict == "pass", report.reasons
    for row in report.rows[:M]:
        assert row.detectable_top2 is not None and row.detectable_top2 <= 0.1
        assert row.detectable_worst >= row.detectable_top2 * 0.5
        assert row.tv_ci[0] <= row.tv_corrected <= row.tv_ci[1] + 1e-12


def test_a_server_with_the_naive_agree_rule_fails(n_samples):
    with _serve(rule=NAIVE_RULES["naive-agree"]) as url:
        report = _audit(url, n_samples)
    assert report.verdict == "FAIL"
    assert report.rows[0].status == "reject" and report.rows[0].tv_ci[0] > 0.05


def test_a_verifier_that_ignores_the_temperature_fails(n_samples):
    d = VerifierIgnoresTemperature(CountingModel(toy_logits, "toy"), CountingModel(draft_logits, "toy-draft"),
                                   drafter="auto")
    with _serve(d) as url:
        report = _audit(url, n_samples)
    assert report.verdict == "FAIL"
    assert report.rows[0].status == "reject"


def test_two_sample_mode_passes_two_exact_servers_and_fails_a_biased_one(n_samples):
    with _serve() as a, _serve(toy_decoder(draft=False), k=0) as plain, _serve(rule=NAIVE_RULES["naive-agree"]) as bad:
        n = n_samples // 2
        ref = _sample(plain, n, seed_offset=10**9)
        good = compare_two_sample(_sample(a, n), ref, M, tolerance=0.2)
        biased = compare_two_sample(_sample(bad, n), ref, M, tolerance=0.2)
    assert good.verdict in ("pass", "inconclusive") and not any(r.reject for r in good.rows)
    assert biased.verdict == "FAIL"


def test_the_power_figure_is_the_power_a_simulation_measures():
    """At the detectable δ the test rejects ~80 % of the time (Monte Carlo, fixed seed)."""
    from scipy.stats import chisquare

    p = np.array([0.45, 0.25, 0.15, 0.1, 0.05])
    n, level = 400, 0.01
    delta = detectable_tv([(n, p)], level)
    alt = p.copy()
    alt[0] -= delta
    alt[1] += delta
    rng = np.random.default_rng(0)
    counts = rng.multinomial(n, alt, size=4000)
    rate = float((chisquare(counts, n * p, axis=1).pvalue < level).mean())
    assert abs(rate - 0.8) < 0.04
    worst = detectable_tv([(n, p)], level, alternative="worst")
    assert worst > delta                     # the hardest shift needs a larger TV
    assert detectable_tv([(4 * n, p)], level) == pytest.approx(delta / 2, rel=0.1)   # δ ∝ 1/sqrt(N)


def test_a_deviation_within_the_numerics_floor_is_numerics_not_fail():
    rng = np.random.default_rng(0)
    p = np.array([0.6, 0.3, 0.1])
    shifted = np.array([0.5, 0.4, 0.1])
    samples = [[int(t)] for t in rng.choice(3, size=2000, p=shifted)]
    probs = lambda prefix: p  # noqa: E731
    assert compare_exact(samples, 1, probs).verdict == "FAIL"
    lenient = compare_exact(samples, 1, probs, floor=[0.2])
    assert lenient.rows[0].status == "numerics" and lenient.verdict == "inconclusive"
    assert "numerics" in lenient.reasons[0]


def test_an_impossible_token_fails_at_once():
    p = np.array([0.5, 0.5, 0.0])
    samples = [[0]] * 50 + [[1]] * 49 + [[2]]
    report = compare_exact(samples, 1, lambda prefix: p)
    assert report.rows[0].p_value == 0.0 and report.verdict == "FAIL"


def test_seed_check_sees_reproducible_and_varying_seeds():
    with _serve() as url:
        ep = Endpoint(url + "/v1", "toy")
        check = seed_check(ep, EndpointSettings(url, "toy", PROMPT, 4, 1.0))
    assert check.reproducible and check.varies


# -- retries, resume ------------------------------------------------------------------------

def _flaky(app, every: int = 3, retry_after: str | None = "0"):
    """Wrap `app`: every `every`-th POST /v1/completions answers 503 (Retry-After)."""
    calls = {"n": 0, "ok": 0}

    @app.middleware("http")
    async def fail_some(request: Request, call_next):
        if request.url.path == "/v1/completions":
            calls["n"] += 1
            if calls["n"] % every == 0:
                headers = {"Retry-After": retry_after} if retry_after is not None else {}
                return JSONResponse({"error": {"message": "busy"}}, status_code=503, headers=headers)
            calls["ok"] += 1
        return await call_next(request)

    return calls


def test_retries_on_a_server_that_fails_every_third_request_then_resumes(tmp_path):
    out = tmp_path / "samples.jsonl"
    settings_of = lambda url: EndpointSettings("fixture", "toy", PROMPT, M, T)  # noqa: E731
    with _serve() as url:
        plain = _sample(url, 30)
    app = create_app(toy_decoder(), model_name="toy", k=3)
    calls = _flaky(app)
    waits = []
    with BackgroundServer(app) as url:
        ep = Endpoint(url + "/v1", "toy", sleep=waits.append, backoff=0.25)
        first = draw_samples(ep, settings_of(url), 12, out=out, progress=False)
        assert ep.retried >= 4 and all(w == 0.0 for w in waits)       # Retry-After: 0 honoured
        assert [s.token_ids for s in first] == plain[:12]             # same seeds, same samples
        served = calls["ok"]
        more = draw_samples(ep, settings_of(url), 30, out=out, progress=False, concurrency=3)
        assert calls["ok"] - served == 18                             # only the missing ones
    assert [s.token_ids for s in more] == plain
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["i"] for r in lines) == list(range(30))


def test_back_off_doubles_without_retry_after_and_gives_up_with_a_clear_error(tmp_path):
    app = create_app(toy_decoder(), model_name="toy", k=3)
    _flaky(app, every=1, retry_after=None)
    waits = []
    with BackgroundServer(app) as url:
        ep = Endpoint(url + "/v1", "toy", sleep=waits.append, retries=3, backoff=0.5)
        with pytest.raises(EndpointError, match="503"):
            draw_samples(ep, EndpointSettings(url, "toy", PROMPT, M, T), 5, out=tmp_path / "s.jsonl",
                         progress=False)
    assert waits == [0.5, 1.0, 2.0]


def test_resume_refuses_a_file_of_another_audit(tmp_path):
    out = tmp_path / "s.jsonl"
    with _serve() as url:
        ep = Endpoint(url + "/v1", "toy")
        draw_samples(ep, EndpointSettings(url, "toy", PROMPT, M, T), 3, out=out, progress=False)
        with pytest.raises(EndpointError, match="another audit.*temperature"):
            draw_samples(ep, EndpointSettings(url, "toy", PROMPT, M, 0.9), 3, out=out, progress=False)


# -- clear errors ---------------------------------------------------------------------------

def test_an_unreachable_url_is_a_clear_error():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                                   # nothing listens there now
    with pytest.raises(EndpointError, match="cannot reach.*Is the server running"):
        Endpoint(f"http://127.0.0.1:{port}/v1", "toy").models()
    with pytest.raises(EndpointError, match="http"):
        Endpoint("127.0.0.1:8000", "toy")


def test_a_model_the_server_does_not_list_is_a_clear_error():
    with _serve() as url:
        with pytest.raises(EndpointError, match="--model 'gpt-9' is not served.*toy"):
            Endpoint(url, "gpt-9").check_model()


def _fake(completion: dict, tokenize: dict | None = None) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "fake"}]}

    @app.post("/v1/completions")
    async def completions():
        return completion

    if tokenize is not None:
        @app.post("/tokenize")
        async def tok(request: Request):
            body = await request.json()
            return tokenize if "content" in body else JSONResponse({"error": "no"}, status_code=400)

    return app


def test_a_server_that_ignores_max_tokens_is_a_clear_error():
    with BackgroundServer(_fake({"choices": [{"text": "abcde", "token_ids": [1, 2, 3, 4, 5],
                                              "finish_reason": "length"}]})) as url:
        with pytest.raises(EndpointError, match="max_tokens=2.*returned 5 tokens.*ignores max_tokens"):
            Endpoint(url, "fake").complete("hi", 2, 1.0)


def test_a_response_with_neither_ids_nor_text_is_a_clear_error():
    with BackgroundServer(_fake({"choices": [{"finish_reason": "length"}]})) as url:
        with pytest.raises(EndpointError, match="neither token ids nor text"):
            Endpoint(url, "fake").complete("hi", 2, 1.0)


def test_text_only_servers_are_re_tokenised_and_say_so():
    with BackgroundServer(_fake({"choices": [{"text": "ab", "finish_reason": "length"}]},
                                tokenize={"tokens": [7, 8]})) as url:
        ep = Endpoint(url, "fake")
        s = ep.complete("hi", 2, 1.0)
    assert s.token_ids == [7, 8] and s.source == "retokenised" and ep.tokenize_shape == "llama.cpp"


def test_llama_server_style_tokens_are_read():
    with BackgroundServer(_fake({"choices": [{"text": "ab", "finish_reason": "length"}],
                                 "__verbose": {"tokens": [4, 9]}})) as url:
        s = Endpoint(url, "fake").complete("hi", 2, 1.0)
    assert s.token_ids == [4, 9] and s.source == "llama.cpp tokens"


def test_optional_fields_a_strict_server_refuses_are_dropped():
    app = FastAPI()
    seen = []

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        seen.append(sorted(body))
        if "return_token_ids" in body:
            return JSONResponse({"error": {"message": "unrecognized request field 'return_token_ids'"}},
                                status_code=400)
        return {"choices": [{"text": "x", "finish_reason": "length"}], "tokens": [1]}

    with BackgroundServer(app) as url:
        s = Endpoint(url, "fake").complete("hi", 2, 1.0)
    assert s.token_ids == [1] and "return_token_ids" not in seen[-1] and len(seen) == 2


# -- the CLI --------------------------------------------------------------------------------

def test_cli_two_sample_audit_as_json(tmp_path):
    from typer.testing import CliRunner

    from verispec.cli import app

    with _serve() as a, _serve(toy_decoder(draft=False), k=0) as b:
        result = CliRunner().invoke(app, ["audit", "--endpoint", a + "/v1", "--reference-endpoint", b,
                                          "--prompt-ids", "3,5,7", "--n-samples", "150", "--m", "2",
                                          "--temperature", "0.7", "--out", str(tmp_path / "a.jsonl"),
                                          "--tolerance", "0.3", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["verdict"] in ("pass", "inconclusive") and report["n_samples"] == 150
    assert report["info"]["id_source"] == "token_ids" and report["info"]["seed_check"]["reproducible"]
    assert len(report["rows"]) == 3 and all(r["detectable_worst"] for r in report["rows"])
    assert (tmp_path / "a.reference.jsonl").exists()


@pytest.mark.parametrize("args, message", [
    (["--model", "nope"], "--model 'nope' is not served"),
    ([], "needs a reference"),
])
def test_cli_errors_name_the_option(args, message):
    from typer.testing import CliRunner

    from verispec.cli import app

    with _serve() as url:
        extra = ["--reference-endpoint", url] if "--model" in args else []
        result = CliRunner().invoke(app, ["audit", "--endpoint", url, "--prompt-ids", "3,5,7",
                                          "--n-samples", "10", *args, *extra])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_cli_endpoint_options_need_endpoint():
    from typer.testing import CliRunner

    from verispec.cli import app

    result = CliRunner().invoke(app, ["audit", "--model", "x", "--exact"])
    assert result.exit_code == 2 and "--model only apply with --endpoint" in " ".join(result.output.split())


def test_unreachable_server_httpx_error_is_not_leaked():
    """The CLI shows the EndpointError line, never an httpx traceback."""
    from typer.testing import CliRunner

    from verispec.cli import app

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    result = CliRunner().invoke(app, ["audit", "--endpoint", f"http://127.0.0.1:{port}/v1",
                                      "--reference-endpoint", f"http://127.0.0.1:{port}/v1",
                                      "--prompt-ids", "1"])
    assert result.exit_code == 2 and "cannot reach" in result.output
    assert not isinstance(result.exception, httpx.HTTPError)


def test_numerics_floor_is_zero_for_exact_kernels_and_sees_width_dependent_ones():
    from verispec.audit.numerics import numerics_floor

    sampling = SamplingConfig(temperature=T)
    exact = numerics_floor(CountingModel(toy_logits, "toy"), list(PROMPT), [11, 13, 5], sampling)
    assert exact == [0.0, 0.0, 0.0]

    class WidthDependent(CountingModel):     # a verification forward's logits drift slightly
        def sync(self, context, keep=None):
            out = super().sync(context, keep)
            return out + 0.3 * torch.arange(out.shape[-1], dtype=out.dtype) / out.shape[-1] if (keep or 1) > 1 else out

    drift = numerics_floor(WidthDependent(toy_logits, "toy"), list(PROMPT), [11, 13, 5], sampling)
    assert all(0 < d < 0.2 for d in drift)


def test_a_nearly_deterministic_position_is_still_tested_exactly():
    """< 5 expected samples off the top token: the binomial test, not 'untestable'."""
    p = np.array([0.995, 0.005, 0.0])
    fine = compare_exact([[0]] * 100, 1, lambda prefix: p, tolerance=0.2)
    biased = compare_exact([[0]] * 90 + [[1]] * 10, 1, lambda prefix: p)
    assert fine.rows[0].dof == 1 and fine.rows[0].status == "ok"
    assert biased.verdict == "FAIL"


def test_llama_server_native_completion_gives_ids_once_its_openai_route_gives_text_only():
    app = _fake({"choices": [{"text": "ab", "finish_reason": "length"}]})
    native = []

    @app.post("/completion")
    async def completion(request: Request):
        body = await request.json()
        native.append(body)
        return {"content": "ab", "tokens": [5, 6], "stop_type": "limit"}

    with BackgroundServer(app) as url:
        ep = Endpoint(url + "/v1", "fake")
        first, second = ep.complete("hi", 2, 1.0, seed=1), ep.complete("hi", 2, 1.0, seed=2)
    assert first.token_ids == second.token_ids == [5, 6] and second.source == "llama.cpp /completion"
    assert [b["seed"] for b in native] == [1, 2] and native[0]["n_predict"] == 2 and native[0]["return_tokens"]
    assert first.finish_reason == "length"


def test_a_token_at_a_near_tie_with_the_top_k_cut_is_numerics_a_far_one_is_impossible():
    """llama.cpp logits move with the forward's shape: the 11th token at a near-tie with the
    10th can be in the server's top-10; one far below the cut cannot."""
    logits = torch.tensor([3.0, 2.0, 1.5, 1.49, -4.0], dtype=torch.float64)
    ref = target_next_probs(_FixedLogits(logits), [0], SamplingConfig(temperature=1.0, top_k=3))
    p = ref(())
    near = [[0]] * 60 + [[1]] * 25 + [[2]] * 13 + [[3]] * 2
    far = [[0]] * 60 + [[1]] * 25 + [[2]] * 13 + [[4]] * 2
    assert ref.near_support(()) == {3}
    ok = compare_exact(near, 1, ref, tolerance=0.5)
    assert ok.rows[0].status == "ok" and "near-tie" in ok.rows[0].note
    assert compare_exact(far, 1, ref).verdict == "FAIL"
    assert p[3] == 0 and p[4] == 0


class _FixedLogits(CountingModel):
    def __init__(self, logits):
        super().__init__(lambda prefix: logits, "fixed")
        self.vocab_size = len(logits)


def test_cli_rereads_a_complete_out_file_without_the_server(tmp_path):
    """A finished audit can be re-read (another significance, say) after the server is gone:
    with every sample in --out and --no-seed-check, nothing is sent (the URL is dead here)."""
    from typer.testing import CliRunner

    from verispec.cli import app

    out = tmp_path / "s.jsonl"
    with _serve() as url:
        settings = EndpointSettings(url + "/v1", "toy", PROMPT, M, T)
        draw_samples(Endpoint(url + "/v1", "toy"), settings, 40, out=out, progress=False)
    args = ["audit", "--endpoint", url + "/v1", "--model", "toy", "--prompt-ids", "3,5,7", "--n-samples", "40",
            "--m", "2", "--temperature", str(T), "--out", str(out), "--target", "smollm2-135m",
            "--backend", "transformers", "--json"]
    reread = CliRunner().invoke(app, args + ["--no-seed-check"])
    assert reread.exit_code == 0, reread.output
    report = json.loads(reread.stdout.strip().splitlines()[-1])
    assert "not contacted" in report["info"]["reread"] and report["n_samples"] == 40
    more = CliRunner().invoke(app, args[:-1] + ["--no-seed-check", "--n-samples", "41"])  # one missing
    assert more.exit_code == 2 and "cannot reach" in more.output
