"""Extreme but accepted sampling settings give finite p and q summing to 1, and take
their mathematical limit; settings without a limit are refused by name.

The bug these catch: temperature 1e-310, top_p 1e-300 or repetition_penalty 1e-300
made `warp` return NaN (l / T overflowing to inf, top_p rounding to 0 in float32 and
emptying the nucleus, l / r overflowing), which the decode loop then turned into
token 0 repeated, and into a NaN acceptance estimate kept by the k="auto" policy.
"""

import math

import pytest
import torch
from test_serve_toys import toy_decoder

from verispec.api import SpeculativeDecoder
from verispec.sampling import LOGIT_BIAS_LIMIT, REPETITION_PENALTY_RANGE, SamplingConfig, warp

TINY_TEMPERATURES = [1e-310, 5e-324, 1e-45, 1e-300]


def logits(dtype=torch.float32, scale=5.0, seed=0):
    return (torch.randn(4, 50, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


def greedy(x):
    return warp(x, SamplingConfig())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("temperature", TINY_TEMPERATURES)
def test_a_temperature_too_small_to_divide_by_is_greedy(dtype, temperature):
    x = logits(dtype)
    assert torch.equal(warp(x, SamplingConfig(temperature=temperature)), greedy(x))


def test_a_tiny_temperature_that_still_divides_gives_the_same_point_mass():
    """1e-30 never overflowed (exp underflows to exactly 0): the limit path agrees with it."""
    x = logits()
    assert torch.equal(warp(x, SamplingConfig(temperature=1e-30)), greedy(x))


@pytest.mark.parametrize("top_p", [1e-300, 1e-45, 1e-9])
def test_a_top_p_below_the_top_probability_keeps_the_top_token(top_p):
    x = logits()
    assert torch.equal(warp(x, SamplingConfig(temperature=1.0, top_p=top_p)), greedy(x))


def test_top_p_still_keeps_the_nucleus_when_it_is_larger_than_the_top_token():
    x = torch.tensor([math.log(0.5), math.log(0.3), math.log(0.2)], dtype=torch.float64)
    p = warp(x, SamplingConfig(temperature=1.0, top_p=0.6))
    assert p.tolist() == pytest.approx([0.5 / 0.8, 0.3 / 0.8, 0.0])


@pytest.mark.parametrize("config", [
    SamplingConfig(temperature=1e300),
    SamplingConfig(temperature=1e300, top_p=1e-300, min_p=1.0),
    SamplingConfig(temperature=1e-310, top_k=1),
    SamplingConfig(temperature=1.0, repetition_penalty=REPETITION_PENALTY_RANGE[0]),
    SamplingConfig(temperature=1.0, repetition_penalty=REPETITION_PENALTY_RANGE[1]),
    SamplingConfig(temperature=1e-3, logit_bias={3: LOGIT_BIAS_LIMIT, 4: LOGIT_BIAS_LIMIT}),
    SamplingConfig(temperature=1.0, logit_bias={3: -LOGIT_BIAS_LIMIT}, bad_words_ids=[[5]]),
], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_extreme_accepted_settings_give_finite_distributions_summing_to_one(config, dtype):
    x = logits(dtype, scale=1e4)          # large logits: where divisions overflow first
    history = list(range(0, 50, 3))
    p = warp(x, config, history=history, n_prompt=5, drafts=[1, 2, 3])
    assert torch.isfinite(p).all()
    assert torch.allclose(p.sum(-1).double(), torch.ones(4, dtype=torch.float64), atol=1e-5)
    if config.bad_words_ids:
        assert (p[:, 5] == 0).all()


def test_a_huge_temperature_never_revives_a_banned_token():
    x = logits()
    p = warp(x, SamplingConfig(temperature=1e300, bad_words_ids=[[7]]), history=[1], n_prompt=1,
             drafts=[2, 3, 4])
    assert (p[:, 7] == 0).all() and torch.isfinite(p).all()
    assert p[0, 0] == pytest.approx(1 / 49)     # the T -> inf limit: uniform over the allowed


@pytest.mark.parametrize("field,value", [
    ("repetition_penalty", 1e-300), ("repetition_penalty", 0.001), ("repetition_penalty", 1e300),
    ("logit_bias", {1: 1e300}),
])
def test_settings_without_a_limit_are_refused_naming_the_argument(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingConfig(**{field: value})


def test_generate_refuses_them_by_name_too():
    with pytest.raises(ValueError, match="repetition_penalty"):
        toy_decoder().generate([1, 2], max_new_tokens=2, repetition_penalty=1e-300)


def test_controls_that_ban_every_token_are_a_clear_error():
    config = SamplingConfig(temperature=1.0, bad_words_ids=[[i] for i in range(4)])
    with pytest.raises(ValueError, match="ban every token"):
        warp(torch.zeros(4), config, history=[0], n_prompt=1)


def test_nan_logits_from_a_model_are_a_fault_not_a_distribution():
    x = logits()
    x[1, 3] = float("nan")
    with pytest.raises(FloatingPointError):
        warp(x, SamplingConfig(temperature=0.7))


@pytest.mark.parametrize("k", [0, 3, "auto"])
@pytest.mark.parametrize("temperature", [1e-310, 1e-45])
def test_speculative_generation_at_a_tiny_temperature_is_the_greedy_output(k, temperature):
    """End to end through drafting, verification and the policy: the same tokens as greedy,
    and every acceptance estimate finite (a NaN here is what poisoned k="auto")."""
    decoder: SpeculativeDecoder = toy_decoder()
    ref = decoder.generate([3, 1, 4], max_new_tokens=12, temperature=0, k=k)
    out = decoder.generate([3, 1, 4], max_new_tokens=12, temperature=temperature, seed=1, k=k,
                           rule="standard")
    assert out.token_ids == ref.token_ids
    assert math.isfinite(out.stats.alpha_sum)
    after = decoder.generate([3, 1, 4], max_new_tokens=12, temperature=0, k=k)
    assert after.token_ids == ref.token_ids


@pytest.mark.parametrize("option,value", [("--repetition-penalty", "1e-300"), ("--repetition-penalty", "1000"),
                                          ("--temperature", "-1"), ("--top-p", "0"), ("--min-p", "2"),
                                          ("--presence-penalty", "5"), ("--logit-bias", "3=nan")])
def test_the_cli_refuses_them_by_option_name_before_loading(option, value):
    from typer.testing import CliRunner

    from verispec.cli import app

    result = CliRunner().invoke(app, ["generate", "Hi", "--target", "no-such-model", option, value])
    assert result.exit_code == 2 and f"error: {option}" in result.output, result.output
