"""Prediction intervals of S(k) and k*, the verdict in words, and errors under --json."""

import json

import numpy as np
import pytest
from scipy.stats import norm
from typer.testing import CliRunner

from verispec.cli import app
from verispec.plan import plan
from verispec.plan.intervals import ratio_interval, speedup_interval, verdict
from verispec.theory import expected_tokens


def test_no_scatter_and_a_fixed_alpha_give_the_point_speedup():
    ratios, c = [1.0, 1.1, 1.25, 1.4, 1.6], 0.05
    iv = speedup_interval(ratios, c, 4, alpha=0.7)
    for k in range(5):
        s = expected_tokens(0.7, k) / (k * c + ratios[k])
        assert iv.low[k] == pytest.approx(s) and iv.high[k] == pytest.approx(s)


def test_ratio_scatter_gives_the_lognormal_quantiles():
    # c = 0: S(k) = E / (r(k+1) · exp(σ z)), so its 10 % / 90 % quantiles are E / (r · exp(±1.2816 σ))
    ratios, sigma, e = [1.0, 2.0, 2.5], 0.3, expected_tokens(0.8, 2)
    iv = speedup_interval(ratios, 0.0, 2, alpha=0.8, sigma_ratio=sigma, draws=200_000, seed=3)
    z = norm.ppf(0.9)
    assert iv.low[2] == pytest.approx(e / (2.5 * np.exp(z * sigma)), rel=0.01)
    assert iv.high[2] == pytest.approx(e / (2.5 * np.exp(-z * sigma)), rel=0.01)
    assert ratio_interval(2.5, sigma) == pytest.approx((2.5 * np.exp(-z * sigma), 2.5 * np.exp(z * sigma)))
    assert ratio_interval(1.05, sigma)[0] == 1.0        # a forward over more rows never costs less than one


def test_alpha_draws_widen_the_interval_and_tau_fixes_one_k():
    ratios = [1.0, 1.05, 1.1, 1.15]
    fixed = speedup_interval(ratios, 0.1, 3, alpha=0.6)
    drawn = speedup_interval(ratios, 0.1, 3, alpha_draws=np.random.default_rng(0).beta(6, 4, size=(4000, 3)))
    assert drawn.high[3] - drawn.low[3] > fixed.high[3] - fixed.low[3] + 0.1
    t = speedup_interval(ratios, 0.1, 3, tau=2.0, tau_k=2)
    assert t.best_k == 2 and t.low[2] == pytest.approx(2.0 / (0.2 + 1.1))


@pytest.mark.parametrize("low,high,words", [(1.1, 1.5, "likely a gain"), (0.6, 0.95, "likely a loss"),
                                            (0.9, 1.2, "uncertain")])
def test_verdict_words(low, high, words):
    assert verdict(low, high) == words


def test_a_plan_carries_its_interval_and_k_star_band():
    p = plan("qwen2.5-32b", "qwen2.5-0.5b", "m4-pro", alpha=0.6, dtype="Q4_K_M", k_max=8)
    iv = p.interval
    assert p.stack.name == "llamacpp-metal" and iv.level == 0.8
    assert all(lo <= s <= hi for lo, s, hi in zip(iv.low, p.speedups, iv.high))
    assert iv.k_star_low <= p.k_star <= iv.k_star_high
    assert iv.verdict == verdict(iv.low[iv.best_k], iv.high[iv.best_k])
    wide = plan("qwen2.5-32b", "qwen2.5-0.5b", "m4-pro", alpha=0.6, dtype="Q4_K_M", k_max=8, level=0.95).interval
    assert wide.high[iv.best_k] - wide.low[iv.best_k] > iv.high[iv.best_k] - iv.low[iv.best_k]


def test_apple_silicon_at_alpha_half_is_no_longer_a_sure_gain():
    # the finding: at α = 0.5-0.6 on Apple silicon the old planner said 1.7-2.1x where
    # llama.cpp measured a loss; the per-stack model must not call that a likely gain
    p = plan("qwen2.5-32b", "qwen2.5-3b", "m4-pro", alpha=0.55, dtype="Q4_K_L", draft_dtype="Q4_0", k_max=16)
    assert p.interval.verdict != "likely a gain" and p.speedup_star < 1.3


def run(*args):
    return CliRunner().invoke(app, ["plan", *args])


def test_missing_alpha_explains_alpha_and_how_to_measure_it():
    r = run("--target", "llama-3-8b", "--draft", "llama-3.2-1b", "--hardware", "m1")
    assert r.exit_code == 2
    text = " ".join(r.output.split())
    for words in ("acceptance rate α", "verispec analyze", "--metrics-url", "--alpha"):
        assert words in text


@pytest.mark.parametrize("args,param", [
    (["--target", "llama-3-8b", "--draft", "llama-3.2-1b", "--hardware", "rtx30", "--alpha", "0.7"], "--hardware"),
    (["--target", "llama-3-8b", "--draft", "llama-3.2-1b", "--hardware", "m1"], "--alpha"),
    (["--target", "llama-3-8b", "--draft", "llama-3.2-1b", "--hardware", "m1", "--alpha", "0.7", "--dtype", "Q4_K_X"],
     "--dtype"),
])
def test_errors_are_json_under_json(args, param):
    r = run(*args, "--json")
    assert r.exit_code == 2
    err = json.loads(r.stdout)["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and param in err["message"]


def test_plan_text_output_has_the_interval_the_verdict_and_deploy_flags():
    r = run("--target", "meta-llama/Meta-Llama-3.1-8B-Instruct", "--draft", "llama3.2:1b", "--hardware", "rtx4090",
            "--alpha", "0.8", "--dtype", "Q4_K_M")
    assert r.exit_code == 0, r.output
    for text in ("80% interval", "verdict", "likely", "--speculative-config", "--draft-max"):
        assert text in r.output
