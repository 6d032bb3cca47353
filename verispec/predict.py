"""Predicted speedup from measured α and a measured cost curve: S(k) tables and k*.

Every S(k) here is `verispec.theory`'s: the cost-curve form (`CostCurve.speedup`, i.e.
`theory.speedup_cost_curve`),

    S(k) = E(α_1..α_k) · T_t(1) / (k·T_d + T_t(k+1)),

a generalisation of Leviathan et al. 2023, Theorem 3.8, and that theorem's constant-c form
S(k) = E(α, k) / (k·c + 1) (`theory.speedup_constant_cost`) for comparison. The one
addition is "curve+" (`speedup_refeed`): the cost-curve S(k) with T_d raised to charge the
2-token draft forward `ModelDrafter` runs after a fully accepted round.

Inputs come from `verispec analyze`: per-position α_i (`verispec.analyze.summarize_points`)
and the curve (`verispec.cost.measure_cost_curve`); `predict_from_analysis` reads both out
of an analysis.json.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .theory import CostCurve, optimal_k_constant, speedup_constant_cost

__all__ = ["predict_speedup", "optimal_k", "speedup_refeed", "speedup_table", "predict_from_analysis"]


def _filled(alphas: Sequence[float | None]) -> list[float]:
    """α_i with unreached positions (None) as 0: they never add to E."""
    return [0.0 if a is None else float(a) for a in alphas]


def predict_speedup(alpha_per_position: Sequence[float | None], cost_curve: CostCurve,
                    k: int | str = "auto", k_max: int | None = None) -> float:
    """Predicted speedup over plain decoding under the measured cost curve.

    Args:
        alpha_per_position: α_1..α_K in [0, 1] (None entries count as 0).
        cost_curve: measured T_t(n) and T_d.
        k: a draft length 0..K, or "auto": the best k (what an adaptive policy that
            knew these α and costs would pick), searched over 0..k_max.
        k_max: search bound for "auto" (default K = len(alpha_per_position)).

    Returns:
        S (`theory.speedup_cost_curve`), dimensionless, 1.0 at k = 0.

    Raises:
        ValueError: from theory, naming k or the α values when out of range.
    """
    if k == "auto":
        return optimal_k(alpha_per_position, cost_curve, k_max)[1]
    return cost_curve.speedup(_filled(alpha_per_position), k)


def optimal_k(alpha_per_position: Sequence[float | None], cost_curve: CostCurve,
              k_max: int | None = None) -> tuple[int, float]:
    """(k*, S(k*)) under the cost curve, k searched over 0..k_max (default K); ties go
    to the smaller k (`theory.optimal_k_cost_curve`)."""
    alphas = _filled(alpha_per_position)
    return cost_curve.optimal_k(alphas, len(alphas) if k_max is None else k_max)


def speedup_refeed(alpha_per_position: Sequence[float | None], k: int, cost_curve: CostCurve,
                   draft_time_2: float) -> float:
    """Cost-curve speedup that also charges `ModelDrafter`'s 2-token re-feed ("curve+").

    The draft model never feeds its last draft x_k; after a fully accepted round
    (probability Π_{i<=k} α_i) the next round's first draft forward scores x_k and the
    bonus token, T_d(2) seconds instead of T_d. Per round the drafts then cost

        (k − 1)·T_d + Π α_i · T_d(2) + (1 − Π α_i)·T_d  =  k · T_d',
        T_d' = T_d + Π α_i · (T_d(2) − T_d) / k,

    and S(k) is `theory.speedup_cost_curve` with T_d' for T_d; S(0) = 1.

    Args:
        alpha_per_position: α_1..α_K in [0, 1] (None counts as 0), K >= k.
        k: draft length >= 0.
        cost_curve: measured T_t(n) and T_d (seconds).
        draft_time_2: T_d(2), seconds of a 2-token draft forward (>= 0).

    Returns:
        S, dimensionless.

    Raises:
        ValueError: from theory, for α outside [0, 1], k > K or a negative T_d'.
    """
    if k == 0:
        return 1.0
    alphas = _filled(alpha_per_position)[:k]
    all_accepted = float(np.prod(alphas))
    t_d = cost_curve.draft_time
    per_token = t_d + all_accepted * (draft_time_2 - t_d) / k
    return CostCurve(cost_curve.target_times, per_token).speedup(alphas, k)


def speedup_table(alpha: float, alpha_per_position: Sequence[float | None], cost_curve: CostCurve,
                  k_max: int, draft_time_2: float | None = None) -> dict:
    """Predicted S(k), k = 0..k_max, under both models, and each model's k*.

    Args:
        alpha: the scalar α for the constant-c model (clamped to [0, 1]).
        alpha_per_position: α_1..α_K for the cost-curve model (None = 0; clamped).
        cost_curve: measured T_t(n), T_d.
        k_max: largest k predicted (<= K).
        draft_time_2: T_d(2) in seconds, to add the "curve+" column (`speedup_refeed`).

    Returns:
        {"constant": [S], "curve": [S], "c": c, "k_star_constant", "S_star_constant",
         "k_star_curve", "S_star_curve", "curve_at_k_star_constant"}: the constant-c
        column uses the scalar α and c = T_d / T_t(1); the curve column the
        per-position α and measured T_t(n). With `draft_time_2` also "refeed",
        "k_star_refeed", "S_star_refeed". Ties in k* go to the smaller k.
    """
    a = min(max(float(alpha), 0.0), 1.0)
    alphas = [min(max(x, 0.0), 1.0) for x in _filled(alpha_per_position)][:k_max]
    c = cost_curve.constant_c()
    constant = [speedup_constant_cost(a, k, c) for k in range(k_max + 1)]
    curve = [cost_curve.speedup(alphas, k) for k in range(k_max + 1)]
    kc, sc = optimal_k_constant(a, c, k_max)
    kv, sv = cost_curve.optimal_k(alphas, k_max)
    out = {"constant": constant, "curve": curve, "c": c, "k_star_constant": kc, "S_star_constant": sc,
           "k_star_curve": kv, "S_star_curve": sv, "curve_at_k_star_constant": curve[kc]}
    if draft_time_2 is not None:
        refeed = [speedup_refeed(alphas, k, cost_curve, draft_time_2) for k in range(k_max + 1)]
        kr = 0
        for k in range(1, k_max + 1):   # ties go to the smaller k, as in theory.optimal_k_*
            if refeed[k] > refeed[kr] * (1 + 1e-12):
                kr = k
        out.update(refeed=refeed, k_star_refeed=kr, S_star_refeed=refeed[kr])
    return out


def predict_from_analysis(analysis: dict, category: str = "overall", k: int | str = "auto",
                          model: str = "curve") -> dict:
    """Predicted speedup for one category of an analysis.

    Args:
        analysis: `verispec.analyze.run_analysis` output (or `load_analysis`).
        category: a category name or "overall".
        k: draft length, or "auto" for k* (the adaptive policy's target).
        model: "curve" (measured T_t(n), per-position α), "constant" (c = T_d/T_t(1),
            scalar α) or "curve+" (curve plus the draft's 2-token re-feed; needs T_d(2)).

    Returns:
        {"k": k, "speedup": S}.

    Raises:
        KeyError: for an unknown category; ValueError for a bad model or k.
    """
    summary = analysis["overall"] if category == "overall" else analysis["categories"][category]
    cm = analysis["cost_curve"]
    curve = CostCurve(tuple(cm["target_times"]), cm["draft_time"])
    k_max = analysis["k_max"]
    alpha = summary["alpha"] or 0.0
    if model == "curve":
        if k == "auto":
            kk, s = optimal_k(summary["alphas"], curve, k_max)
            return {"k": kk, "speedup": s}
        return {"k": k, "speedup": predict_speedup(summary["alphas"], curve, k)}
    if model == "constant":
        c = curve.constant_c()
        if k == "auto":
            kk, s = optimal_k_constant(alpha, c, k_max)
            return {"k": kk, "speedup": s}
        return {"k": k, "speedup": speedup_constant_cost(alpha, k, c)}
    if model == "curve+":
        t_d2 = cm.get("draft_time_2")
        if t_d2 is None:
            raise ValueError("model 'curve+' needs the draft's T_d(2) (a draft-model analysis)")
        table = speedup_table(alpha, summary["alphas"], curve, k_max, t_d2)
        kk = table["k_star_refeed"] if k == "auto" else k
        return {"k": kk, "speedup": table["refeed"][kk]}
    raise ValueError(f"model must be 'curve', 'constant' or 'curve+', got {model!r}")
