"""Two-sample statistics: is one set of samples distributed like another?

The statistical audit draws N samples from a reference (the target alone) and N
from a candidate (a speculative implementation) and asks whether they come from
one distribution. This module holds the statistics on the samples themselves,
with no knowledge of how they were drawn:

* `homogeneity_test`: Pearson's χ² (or the G-test, the log-likelihood ratio) on
  the 2 × C contingency table of category counts (`scipy.stats.chi2_contingency`,
  no continuity correction), after pooling categories too rare for the χ²
  approximation (expected count < 5, Cochran's rule);
* `tv_resampling`: the plug-in total variation between the two empirical
  distributions, with a bootstrap bias correction (Efron & Tibshirani 1993, "An
  Introduction to the Bootstrap", ch. 10) and basic bootstrap interval (Davison &
  Hinkley 1997, "Bootstrap Methods and their Application", §5.2), and a
  permutation view of its size when nothing differs.

Categories are any hashable values: a token id (one position) or a tuple of ids
(the joint prefix).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["HomogeneityResult", "homogeneity_test", "tv_resampling"]


@dataclass
class HomogeneityResult:
    """One homogeneity test (a 2 x C table after pooling rare categories).

    Attributes:
        name: what was tested ("position 2", "joint 1..3").
        statistic: χ² or G; dof: its degrees of freedom (columns − 1).
        p_value: P(statistic at least this large | one distribution); 1.0 when untestable.
        categories: columns tested (after pooling); pooled: raw categories pooled into "other".
        tv: plug-in TV between the two empirical distributions (before pooling).
        reject: set by the caller: p_value below its per-test significance level.
    """

    name: str
    statistic: float
    dof: int
    p_value: float
    categories: int
    pooled: int
    tv: float
    reject: bool = False

    @property
    def testable(self) -> bool:
        """False when pooling left < 2 columns (too few samples for this many categories)."""
        return self.categories >= 2


def homogeneity_test(a: Sequence[Hashable], b: Sequence[Hashable], name: str,
                     lambda_: str | None) -> HomogeneityResult:
    """Chi-square (or G-) test that samples a and b come from one distribution.

    Categories whose smaller expected count is < 5 are pooled into "other"; if
    "other" itself stays below 5, the rarest remaining categories join it. A
    table left with < 2 columns is reported untestable (p = 1).

    Args:
        a, b: the two samples (hashable categories; sizes may differ, >= 1 each).
        name: the test's label.
        lambda_: None for Pearson's χ², "log-likelihood" for the G-test (passed to
            `scipy.stats.chi2_contingency`).

    Returns:
        `HomogeneityResult` (``reject`` left False for the caller to set).
    """
    from scipy.stats import chi2_contingency

    ca, cb = Counter(a), Counter(b)
    na, nb = len(a), len(b)
    cats = sorted(set(ca) | set(cb), key=lambda c: (-(ca[c] + cb[c]), repr(c)))
    tv = 0.5 * sum(abs(ca[c] / na - cb[c] / nb) for c in cats)
    share = min(na, nb) / (na + nb)

    def expected(cs) -> float:
        return sum(ca[c] + cb[c] for c in cs) * share

    keep = [c for c in cats if expected([c]) >= 5]
    pooled = [c for c in cats if expected([c]) < 5]
    while pooled and expected(pooled) < 5 and keep:
        pooled.append(keep.pop())           # the rarest kept category
    columns = [[c] for c in keep] + ([pooled] if pooled else [])
    if len(columns) < 2:
        return HomogeneityResult(name, 0.0, 0, 1.0, len(columns), len(pooled), tv)
    table = np.array([[sum(ca[c] for c in col) for col in columns],
                      [sum(cb[c] for c in col) for col in columns]], dtype=float)
    stat, p, dof, _ = chi2_contingency(table, correction=False, lambda_=lambda_)
    return HomogeneityResult(name, float(stat), int(dof), float(p), len(columns),
                             len(pooled) if pooled else 0, tv)


def tv_resampling(a: Sequence[Hashable], b: Sequence[Hashable], reps: int, confidence: float,
                  seed: int) -> dict[str, Any]:
    """Bootstrap and permutation views of the plug-in TV between samples a and b.

    The plug-in TV is biased upwards (with C categories and N samples it is of
    order sqrt(C / N) even when the distributions are equal), so:
      * ``tv_corrected`` = max(0, 2·TV̂ − mean of bootstrap TVs) (bootstrap bias correction);
      * ``tv_ci`` = the basic bootstrap interval [2·TV̂ − q_hi, 2·TV̂ − q_lo], clipped at 0;
      * ``tv_null`` = the `confidence` quantile of TV̂ over random re-splits of the
        pooled samples (what TV̂ looks like at this N when nothing differs), and
        ``tv_p_value`` the permutation p-value of the observed TV̂.

    Args:
        a, b: the two samples (hashable categories).
        reps: bootstrap resamples, and as many permutations.
        confidence: level of the interval and of the null quantile, in (0, 1).
        seed: seed of the numpy generator doing the resampling (deterministic results).

    Returns:
        {"tv_corrected", "tv_ci", "tv_null", "tv_p_value"}.
    """
    index: dict[Hashable, int] = {}
    ia = np.array([index.setdefault(s, len(index)) for s in a])
    ib = np.array([index.setdefault(s, len(index)) for s in b])
    c, na, nb = len(index), len(ia), len(ib)

    def tv(xa: np.ndarray, xb: np.ndarray) -> float:
        return 0.5 * float(np.abs(np.bincount(xa, minlength=c) / len(xa)
                                  - np.bincount(xb, minlength=c) / len(xb)).sum())

    rng = np.random.default_rng(seed)
    observed = tv(ia, ib)
    boot = np.array([tv(ia[rng.integers(0, na, na)], ib[rng.integers(0, nb, nb)])
                     for _ in range(reps)])
    pooled = np.concatenate([ia, ib])
    null = np.empty(reps)
    for r in range(reps):
        perm = rng.permutation(pooled)
        null[r] = tv(perm[:na], perm[na:])
    q_lo, q_hi = np.quantile(boot, [(1 - confidence) / 2, (1 + confidence) / 2])
    return dict(
        tv_corrected=max(0.0, 2 * observed - float(boot.mean())),
        tv_ci=(max(0.0, 2 * observed - float(q_hi)), max(0.0, 2 * observed - float(q_lo))),
        tv_null=float(np.quantile(null, confidence)),
        tv_p_value=float((1 + np.sum(null >= observed - 1e-15)) / (reps + 1)),
    )

