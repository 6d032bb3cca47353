"""verispec.predict: S(k) tables and k* from measured α and cost curve, all through theory's S(k)."""

import pytest

from verispec import predict, theory

def test_predict_speedup_matches_theory():
    curve = theory.CostCurve((0.10, 0.11, 0.13, 0.16), 0.02)
    alphas = [0.8, 0.7, 0.6]
    for k in range(4):
        assert predict.predict_speedup(alphas, curve, k) == pytest.approx(
            theory.speedup_cost_curve(alphas, k, curve.target, 0.02))
    k_star, s_star = predict.optimal_k(alphas, curve)
    assert (k_star, s_star) == curve.optimal_k(alphas, 3)
    assert predict.predict_speedup(alphas, curve, "auto") == pytest.approx(s_star)
    assert predict.predict_speedup([0.8, None, None], curve, 3) == pytest.approx(curve.speedup([0.8, 0, 0], 3))
    table = predict.speedup_table(0.8, alphas, curve, 3)
    assert table["constant"] == pytest.approx([theory.speedup_constant_cost(0.8, k, 0.2) for k in range(4)])
    assert table["curve"][0] == table["constant"][0] == 1.0
    assert (table["k_star_constant"], table["S_star_constant"]) == theory.optimal_k_constant(0.8, 0.2, 3)
    assert table["curve_at_k_star_constant"] == table["curve"][table["k_star_constant"]]
    assert "refeed" not in table
    # T_d(2) == T_d: the re-feed costs nothing extra, curve+ is the curve
    same = predict.speedup_table(0.8, alphas, curve, 3, draft_time_2=0.02)
    assert same["refeed"] == pytest.approx(same["curve"]) and same["k_star_refeed"] == same["k_star_curve"]
    # T_d(2) = 0.05: k drafts cost (k-1)·T_d + Πα·T_d(2) + (1-Πα)·T_d
    more = predict.speedup_table(0.8, alphas, curve, 3, draft_time_2=0.05)
    pa = 0.8 * 0.7
    e = theory.expected_tokens_positional(alphas[:2])
    assert more["refeed"][2] == pytest.approx(e * 0.10 / (0.02 + pa * 0.05 + (1 - pa) * 0.02 + 0.13))
    assert more["refeed"][0] == 1.0 and all(r < c for r, c in zip(more["refeed"][1:], more["curve"][1:]))
