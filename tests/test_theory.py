"""Tests for verispec.theory (Leviathan et al. 2023, Eq. 1, Def 3.1, Thm 3.8)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verispec.simulate import simulate_rounds
from verispec.theory import (
    CostCurve,
    alpha,
    expected_tokens,
    expected_tokens_positional,
    fit_linear,
    optimal_k_constant,
    optimal_k_cost_curve,

    speedup_constant_cost,
    speedup_cost_curve,
)

probs = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
ks = st.integers(min_value=0, max_value=30)


# ----------------------------------------------------------------------------- alpha


def test_alpha_known_values():
    p = [0.5, 0.3, 0.2]
    q = [0.2, 0.3, 0.5]
    assert alpha(p, q) == pytest.approx(0.2 + 0.3 + 0.2)
    assert alpha(p, p) == pytest.approx(1.0)
    assert alpha([1.0, 0.0], [0.0, 1.0]) == 0.0


def test_alpha_is_one_minus_tv_and_accepts_torch_and_batches():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(50), size=4)
    q = rng.dirichlet(np.ones(50), size=4)
    tv = 0.5 * np.abs(p - q).sum(axis=-1)
    got = alpha(p, q)
    assert got.shape == (4,)
    np.testing.assert_allclose(got, 1.0 - tv, atol=1e-12)
    got_t = alpha(torch.tensor(p, dtype=torch.float32), torch.tensor(q, dtype=torch.float32))
    np.testing.assert_allclose(got_t, 1.0 - tv, atol=1e-5)
    assert isinstance(alpha(torch.tensor(p[0]), torch.tensor(q[0])), float)


def test_alpha_validation():
    with pytest.raises(ValueError, match="shape"):
        alpha([0.5, 0.5], [1.0, 0.0, 0.0])
    with pytest.raises(ValueError, match=r"\bp\b"):
        alpha([1.5, -0.5], [0.5, 0.5])
    with pytest.raises(ValueError, match=r"\bq\b"):
        alpha([0.5, 0.5], [0.5, 0.2])


# ----------------------------------------------------------------------------- expected tokens


def test_expected_tokens_leviathan_example():
    # (1 - 0.8^5) / 0.2 = 0.67232 / 0.2
    assert abs(expected_tokens(0.8, 4) - 3.3616) < 1e-9


@pytest.mark.parametrize("k", range(11))
def test_expected_tokens_limits(k):
    assert expected_tokens(1.0, k) == k + 1
    assert expected_tokens(1, k) == k + 1
    assert expected_tokens(0.0, k) == 1.0
    # continuity at alpha -> 1 (no cancellation blow-up)
    assert expected_tokens(1 - 1e-13, k) == pytest.approx(k + 1, rel=1e-10)


@given(probs)
def test_expected_tokens_k0_is_one(a):
    assert expected_tokens(a, 0) == 1.0


@given(probs, ks)
def test_expected_tokens_bounds_and_series(a, k):
    e = expected_tokens(a, k)
    assert 1.0 - 1e-12 <= e <= k + 1 + 1e-9
    assert e == pytest.approx(sum(a**i for i in range(k + 1)), rel=1e-9, abs=1e-12)


@given(probs, ks)
def test_positional_matches_iid(a, k):
    assert expected_tokens_positional([a] * k) == pytest.approx(expected_tokens(a, k), rel=1e-9)


def test_positional_hand_case():
    assert expected_tokens_positional([]) == 1.0
    assert expected_tokens_positional(np.array([0.9, 0.5, 0.0, 1.0])) == pytest.approx(1 + 0.9 + 0.45)


# ----------------------------------------------------------------------------- speedup


@given(probs, ks, st.floats(0, 10), st.floats(0, 10))
def test_speedup_constant_cost_nonincreasing_in_c(a, k, c1, c2):
    lo, hi = sorted((c1, c2))
    s_lo, s_hi = speedup_constant_cost(a, k, lo), speedup_constant_cost(a, k, hi)
    assert s_lo >= s_hi
    if k >= 1 and hi > lo * (1 + 1e-9) + 1e-12:
        assert s_lo > s_hi


@given(probs, st.floats(0, 10))
def test_speedup_k0_is_one(a, c):
    assert speedup_constant_cost(a, 0, c) == 1.0
    assert speedup_cost_curve(a, 0, lambda n: 0.02 * n, c) == 1.0


def test_speedup_constant_cost_value():
    # Leviathan Thm 3.8: E / (k c + 1)
    assert speedup_constant_cost(0.8, 4, 0.1) == pytest.approx(3.3616 / 1.4)


@given(probs, ks, st.floats(0, 5), st.floats(1e-3, 10))
@settings(max_examples=200)
def test_cost_curve_reduces_to_constant_c(a, k, c, t1):
    flat_fn = lambda n: t1  # noqa: E731
    flat_seq = [t1] * (k + 1)
    expected = speedup_constant_cost(a, k, c)
    assert speedup_cost_curve(a, k, flat_fn, c * t1) == pytest.approx(expected, rel=1e-12)
    assert speedup_cost_curve(a, k, flat_seq, c * t1) == pytest.approx(expected, rel=1e-12)
    curve = CostCurve(flat_seq, c * t1)
    assert curve.constant_c() == pytest.approx(c)
    assert curve.speedup(a, k) == pytest.approx(expected, rel=1e-12)


def test_cost_curve_positional_alphas():
    alphas = [0.9, 0.8, 0.5]
    tt = [1.0, 1.1, 1.2, 1.3]
    e = 1 + 0.9 + 0.72
    assert speedup_cost_curve(alphas, 2, tt, 0.1) == pytest.approx(e * 1.0 / (0.2 + 1.2))
    with pytest.raises(ValueError, match="k"):
        speedup_cost_curve(alphas, 4, lambda n: 1.0, 0.1)


# ----------------------------------------------------------------------------- optimal k


def test_optimal_k_zero_when_alpha_small_or_c_large():
    # S(1) = (1 + a) / (1 + c) < 1 iff a < c; here a = 0.1 < c = 0.5 and S(k) < 1 for all k.
    assert optimal_k_constant(0.1, 0.5, 10) == (0, 1.0)
    # c >= 1: S(k) = E / (k c + 1) <= E / (k + 1) < 1 for a < 1.
    assert optimal_k_constant(0.9, 1.0, 10) == (0, 1.0)
    assert optimal_k_cost_curve(0.1, [1.0] * 11, 0.5, 10) == (0, 1.0)
    # tie: a = 1, c = 1 gives S(k) = 1 for all k -> smallest k wins
    assert optimal_k_constant(1.0, 1.0, 10) == (0, 1.0)


def test_optimal_k_hand_computed():
    # a = 0.8, c = 0.1: S(k) = 5 (1 - 0.8^{k+1}) / (1 + 0.1 k)
    # k=5: 3.68928/1.5 = 2.45952, k=6: 3.951424/1.6 = 2.46964, k=7: 4.1611392/1.7 = 2.44773
    k, s = optimal_k_constant(0.8, 0.1, 20)
    assert k == 6
    assert s == pytest.approx(3.951424 / 1.6, abs=1e-9)
    # capped by k_max
    assert optimal_k_constant(0.8, 0.1, 4)[0] == 4
    assert optimal_k_constant(0.8, 0.1, 0) == (0, 1.0)
    # alpha = 1 and c = 0: S = k + 1 increases to k_max
    assert optimal_k_constant(1.0, 0.0, 7) == (7, 8.0)
    # cost-curve version agrees with the constant one on a flat curve
    assert optimal_k_cost_curve(0.8, lambda n: 2.0, 0.2, 20) == (6, pytest.approx(s))


def test_constant_c_is_badly_wrong_for_transformers_like_curve():
    # T_t(n) = 1 + 0.5 (n - 1): each extra verified token costs half a forward.
    alpha_, t_d = 0.8, 0.05
    curve = CostCurve([1 + 0.5 * (n - 1) for n in range(1, 22)], t_d)
    k_const, s_const = optimal_k_constant(alpha_, curve.constant_c(), 20)
    k_curve, s_curve = curve.optimal_k(alpha_, 20)
    # hand: S(k) = E / (1 + 0.55 k): k=1 1.8/1.55 = 1.16129, k=2 2.44/2.1 = 1.16190,
    # k=3 2.952/2.65 = 1.11396
    assert k_curve == 2
    assert s_curve == pytest.approx(2.44 / 2.1, abs=1e-9)
    assert k_const == 8 and k_const != k_curve
    assert s_const > 3.0  # what the constant-c model promises ...
    assert curve.speedup(alpha_, k_const) < 0.81  # ... is a slowdown on this curve


def test_steep_curve_makes_speculation_useless_while_flat_says_otherwise():
    # T_t(n) = 1 + 0.6 (n - 1) vs flat T_t(n) = 1, same T_d = 0.05, alpha = 0.6.
    alpha_, t_d = 0.6, 0.05
    steep = lambda n: 1 + 0.6 * (n - 1)  # noqa: E731
    k_flat, s_flat = optimal_k_cost_curve(alpha_, lambda n: 1.0, t_d, 20)
    k_steep, s_steep = optimal_k_cost_curve(alpha_, steep, t_d, 20)
    assert (k_flat, s_flat) == optimal_k_constant(alpha_, t_d, 20)
    assert k_flat == 4  # flat: 2.3056 / 1.2 = 1.92133
    assert s_flat == pytest.approx((1 - 0.6**5) / 0.4 / 1.2)
    # steep: S(1) = 1.6 / (0.05 + 1.6) < 1, and it only gets worse
    assert (k_steep, s_steep) == (0, 1.0)
    assert k_steep != k_flat


# ----------------------------------------------------------------------------- CostCurve


def test_fit_linear():
    a, b = fit_linear([1, 2, 3, 4], [1.0, 1.5, 2.0, 2.5])
    assert a == pytest.approx(0.5) and b == pytest.approx(0.5)
    with pytest.raises(ValueError, match="ns"):
        fit_linear([1, 1], [1.0, 2.0])
    with pytest.raises(ValueError, match="ns and times"):
        fit_linear([1, 2, 3], [1.0, 2.0])


def test_cost_curve_from_measurements_and_extrapolation():
    curve = CostCurve.from_measurements(
        [[1.0, 9.0, 1.0], [1.5, 1.4, 1.6], [2.0, 2.0, 50.0]], [0.1, 0.3, 0.2, 0.2, 0.9]
    )
    assert curve.target_times == (1.0, 1.5, 2.0)
    assert curve.draft_time == pytest.approx(0.2)
    assert curve.k_measured == 2
    assert curve.constant_c() == pytest.approx(0.2)
    assert curve.target(3) == 2.0
    assert curve.target(5) == pytest.approx(3.0)  # slope 0.5 beyond n = 3
    # speedups need T_t(k+1) beyond the measured range -> extrapolated
    assert curve.speedup(1.0, 4) == pytest.approx(5 * 1.0 / (4 * 0.2 + 3.0))
    # single point: flat; decreasing fit: clamped flat
    assert CostCurve([2.0], 0.1).target(7) == 2.0
    assert CostCurve([2.0, 1.0], 0.1).target(5) == 1.0
    with pytest.raises(ValueError, match="n"):
        curve.target(0)


def test_cost_curve_validation():
    with pytest.raises(ValueError, match="target_times"):
        CostCurve([], 0.1)
    with pytest.raises(ValueError, match="target_times"):
        CostCurve([1.0, 0.0], 0.1)
    with pytest.raises(ValueError, match="draft_time"):
        CostCurve([1.0], -0.1)
    with pytest.raises(ValueError, match="target_samples"):
        CostCurve.from_measurements([[1.0], []], [0.1])
    with pytest.raises(ValueError, match="draft_samples"):
        CostCurve.from_measurements([[1.0]], [])


# ----------------------------------------------------------------------------- simulation


@pytest.mark.parametrize("a,k", [(0.8, 4), (0.5, 3), (0.95, 8), (0.0, 2), (1.0, 5), (0.3, 0)])
def test_simulated_engine_matches_expected_tokens(a, k):
    rounds = 20_000
    mean = simulate_rounds(a, k, rounds, np.random.default_rng(1234))
    e = expected_tokens(a, k)
    # Var(tokens) = Var(#accepted), with P(#accepted >= i) = a^i for i <= k.
    second = 1 + sum((2 * i - 1 + 2) * a**i for i in range(1, k + 1))  # E[(1+N)^2]
    var = second - e**2
    assert abs(mean - e) <= 5 * math.sqrt(max(var, 0.0) / rounds) + 1e-12


def test_simulated_engine_positional():
    alphas = [0.9, 0.7, 0.4, 0.2]
    rounds = 20_000
    mean = simulate_rounds(alphas, 4, rounds, np.random.default_rng(7))
    e = expected_tokens_positional(alphas)
    assert abs(mean - e) <= 5 * math.sqrt((5 - 1) ** 2 / 4 / rounds)  # Popoviciu: tokens in [1, 5]


# ----------------------------------------------------------------------------- argument errors


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: expected_tokens(1.5, 3), "alpha"),
        (lambda: expected_tokens(-0.1, 3), "alpha"),
        (lambda: expected_tokens(float("nan"), 3), "alpha"),
        (lambda: expected_tokens(True, 3), "alpha"),
        (lambda: expected_tokens(0.5, -1), "k"),
        (lambda: expected_tokens(0.5, 2.0), "k"),
        (lambda: expected_tokens(0.5, True), "k"),
        (lambda: expected_tokens_positional([0.5, 1.2]), "alphas"),
        (lambda: expected_tokens_positional(0.5), "alphas"),
        (lambda: speedup_constant_cost(0.5, 2, -1.0), "c"),
        (lambda: speedup_constant_cost(0.5, 2, float("inf")), "c"),
        (lambda: speedup_cost_curve(0.5, 2, [1.0, 1.0], 0.1), "target_time"),
        (lambda: speedup_cost_curve(0.5, 2, lambda n: 0.0, 0.1), "target_time"),
        (lambda: speedup_cost_curve(0.5, 2, "abc", 0.1), "target_time"),
        (lambda: speedup_cost_curve(0.5, 2, lambda n: 1.0, -0.1), "draft_time"),
        (lambda: speedup_cost_curve([0.5, 2.0], 2, lambda n: 1.0, 0.1), "alpha_or_alphas"),
        (lambda: optimal_k_constant(0.5, 0.1, -1), "k_max"),
        (lambda: optimal_k_constant(0.5, -0.1, 3), "c"),
        (lambda: optimal_k_constant(2.0, 0.1, 3), "alpha"),
        (lambda: optimal_k_cost_curve(0.5, [1.0] * 3, 0.1, 3), "target_time"),
        (lambda: optimal_k_cost_curve([0.5, 0.5], lambda n: 1.0, 0.1, 3), "k_max"),
        (lambda: simulate_rounds(0.5, 2, 0, np.random.default_rng(0)), "rounds"),
        (lambda: simulate_rounds(0.5, 2, 10, "seed"), "rng"),
        (lambda: simulate_rounds(1.5, 2, 10, np.random.default_rng(0)), "alpha"),
    ],
)
def test_bad_arguments_raise_value_error_naming_argument(call, name):
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        call()


def test_speedups_in_one_pass_are_the_floats_of_speedup_for_each_k():
    """`CostCurve.speedups` (the adaptive policy prices every k with it) gives exactly
    `speedup(alphas[:k], k)` for k = 1..K, also for k beyond the measured widths (extrapolated),
    and an empty list for no α."""
    from verispec.theory import CostCurve

    curve = CostCurve((0.0266, 0.044, 0.0565, 0.0699, 0.0839), 0.0153)
    for alphas in ([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2], [1.0] * 8, [0.0, 1.0, 0.5], [0.31]):
        got = curve.speedups(alphas)
        assert got == [curve.speedup(alphas[:k], k) for k in range(1, len(alphas) + 1)]
    assert curve.speedups([]) == []
    with pytest.raises(ValueError, match="alphas"):
        curve.speedups([0.5, 1.5])
