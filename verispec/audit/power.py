"""Power of the audit's χ² tests: the smallest total variation N samples can detect.

A pass says only that no difference *large enough for N* was seen. This module
says how large: for a χ² test at level `level` with `dof` degrees of freedom, the
statistic under an alternative is approximately noncentral χ²(dof, λ) with

    goodness of fit (N samples vs a known p):   λ = N · Σ_j (p'_j − p_j)² / p_j
    homogeneity (n₁, n₂ samples of p and p'):   λ = n₁n₂/(n₁+n₂) · Σ_j (p'_j − p_j)² / p̄_j,
                                                 p̄ = (n₁p + n₂p') / (n₁ + n₂)

(Cohen 1988, "Statistical Power Analysis for the Behavioral Sciences", 2nd ed.,
ch. 7, λ = N·w²; the noncentral χ² approximation of Pearson's statistic is
Patnaik 1949, Biometrika 36:202–232; for the 2 × C table, Meng & Chapman 1966,
JASA 61:965–975). Power = P(χ²(dof, λ) > χ²_{1−level}(dof)) (`scipy.stats.ncx2`).

Two alternatives at total variation δ from the reference p, both reported:

* ``"top2"``, the named one: mass δ moved from p's most probable token to its
  second (the shape of the classic bugs, a bias towards what the draft proposes):
  Σ d²/p = δ² (1/p₍₁₎ + 1/p₍₂₎) (goodness of fit).
* ``"worst"``, the worst case over the support: by Cauchy–Schwarz,
  (Σ|d_j|)² ≤ Σ d_j²/p_j · Σ p_j, so every alternative at TV δ (Σ|d| = 2δ) has
  Σ d²/p ≥ 4δ², reached by moving mass proportionally between two halves of p. With
  λ = 4Nδ², *every* alternative at TV ≥ the returned δ is detected with at least
  the asked power (under the χ² approximation).

Tests made of several groups (the per-position conditional tests of the exact
reference: one multinomial per observed prefix) add their λ and dof: the same δ
moved in every group. The dof of a group is what the test itself uses: the
categories with expected count >= 5, plus one pooled "other" column (Cochran's
rule, as in `verispec.audit.homogeneity`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["power", "detectable_tv", "samples_for", "test_dof", "ALTERNATIVES"]

ALTERNATIVES = ("top2", "worst")


def power(lam: float, dof: int, level: float) -> float:
    """P(reject) of a χ² test at `level` with `dof` degrees of freedom when the
    statistic is χ²(dof, λ) (noncentrality `lam` >= 0)."""
    from scipy.stats import chi2, ncx2

    crit = chi2.isf(level, dof)
    return float(chi2.sf(crit, dof)) if lam <= 0 else float(ncx2.sf(crit, dof, lam))


def test_dof(n: float, p: np.ndarray) -> int:
    """Degrees of freedom of the χ² test of n samples over categories p (>= 1): the
    columns with expected count n·p_j >= 5, plus one pooled column for the rest when
    its expected count reaches 5 (else it joins the rarest kept one), minus 1."""
    p = np.asarray(p, dtype=float)
    e = n * p[p > 0]
    kept = int((e >= 5).sum())
    rest = float(e[e < 5].sum())
    cols = kept + (1 if rest >= 5 or (rest > 0 and kept == 0) else 0)
    return max(1, cols - 1)


def _sum_d2(p: np.ndarray, delta: float, alternative: str, two_sample: bool) -> float:
    """Σ d²/p (or /p̄) for the alternative at TV δ."""
    if alternative == "worst":
        return 4.0 * delta * delta
    top = np.sort(p)[::-1]
    p1, p2 = float(top[0]), float(top[1]) if len(top) > 1 else 0.0
    if two_sample:                  # p̄ = p + d/2 for equal sizes (the alternative's side)
        return delta * delta * (1 / (p1 - delta / 2) + 1 / (p2 + delta / 2))
    return delta * delta * (1 / p1 + (1 / p2 if p2 > 0 else np.inf))


def detectable_tv(groups: Sequence[tuple[float, Sequence[float]]], level: float, *, target_power: float = 0.8,
                  alternative: str = "top2", two_sample: bool = False) -> float | None:
    """The smallest TV δ that a χ² test detects with probability `target_power`.

    Args:
        groups: (n, p) per multinomial of the test: n its effective sample size (N
            for goodness of fit; n₁n₂/(n₁+n₂) for homogeneity), p the reference's
            probabilities (float, summing to 1). One group for a plain test.
        level: the test's significance level (per test, after Bonferroni), in (0, 1).
        target_power: in (level, 1), e.g. 0.8.
        alternative: "top2" (δ moved from the most probable token to the second) or
            "worst" (any alternative at TV δ; module doc).
        two_sample: homogeneity (λ with the pooled p̄) instead of goodness of fit.

    Returns:
        δ in (0, 1], or None when no δ the alternative allows (δ <= p₍₁₎ for "top2",
        <= 1/2 for "worst") reaches the power: N is too small.

    Raises:
        ValueError: naming `level`, `target_power`, `alternative` or `groups` when out of range.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    if not level < target_power < 1:
        raise ValueError(f"target_power must be in (level, 1), got {target_power!r}")
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative must be one of {ALTERNATIVES}, got {alternative!r}")
    gs = [(float(n), np.asarray(p, dtype=float)) for n, p in groups if n > 0]
    if not gs:
        raise ValueError("groups is empty: no samples to compute a power for")
    dof = sum(test_dof(n, p) for n, p in gs)
    hi = 0.5 if alternative == "worst" else min(float(p.max()) for _, p in gs)
    if alternative == "top2" and two_sample:
        hi = min(hi, 2 * min(float(p.max()) for _, p in gs)) * 0.999

    def pw(delta: float) -> float:
        lam = sum(n * _sum_d2(p, delta, alternative, two_sample) for n, p in gs)
        return power(lam, dof, level)

    if pw(hi) < target_power:
        return None
    lo = 0.0
    for _ in range(60):             # bisection: power is increasing in δ
        mid = (lo + hi) / 2
        if pw(mid) >= target_power:
            hi = mid
        else:
            lo = mid
    return hi


def samples_for(delta: float, p: Sequence[float], level: float, *, target_power: float = 0.8,
                alternative: str = "top2", two_sample: bool = False, n_max: int = 10_000_000) -> int:
    """The smallest N (per side for homogeneity) whose test detects `delta` with
    `target_power` (a doubling search, then bisection on `detectable_tv`).

    Raises:
        ValueError: when even `n_max` samples are not enough (δ too small).
    """
    p = np.asarray(p, dtype=float)

    def ok(n: int) -> bool:
        eff = n / 2 if two_sample else n
        d = detectable_tv([(eff, p)], level, target_power=target_power, alternative=alternative,
                          two_sample=two_sample)
        return d is not None and d <= delta

    hi = 16
    while not ok(hi):
        hi *= 2
        if hi > n_max:
            raise ValueError(f"delta={delta} needs more than n_max={n_max} samples")
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi
