"""Goodness of fit against a known distribution: samples vs the target's exact p.

The endpoint audit with ``--target`` knows the reference exactly: the target's
warped p at every prefix (`verispec.sampling.warp` of its logits). The token at
position i is tested *conditionally on the tokens before it*: the samples are
grouped by their prefix x_1..x_{i−1}, and in each group with enough samples the
counts of x_i are compared with p(· | prompt, prefix) by Pearson's χ²
after pooling categories whose expected count is < 5 into one "other" column
(Cochran's rule, as `verispec.audit.homogeneity` does). A nearly deterministic
prefix (less than 5 expected samples off its top token) gets the exact binomial
test of "top token vs the rest" instead, entered as the χ²(1) quantile of its p-value.
The groups are independent multinomials given their sizes, so their statistics
and degrees of freedom add up to one test of position i. Only the prefixes the
samples visit need a forward, so this works whatever the width of the support
(the marginal at position i would need all of them: (top-k)^(i−1) forwards).

Adding the position tests gives a test of the joint law of the m tokens: the joint
is the product of these conditionals (chain rule), and the conditional Pearson
statistics of successive positions are asymptotically independent (Anderson &
Goodman 1957, "Statistical inference about Markov chains", Ann. Math. Statist.
28:89–110, §3, the same decomposition for transition counts).

A sample token outside the reference's support (p = 0) makes its group's
statistic infinite (p-value 0): an exact sampler cannot produce it.

The observed TV of position i is Σ_g (n_g / n) · TV(p̂_g, p_g) over the tested
groups (the expected conditional TV), with a parametric bootstrap bias correction
and basic interval (Davison & Hinkley 1997, §5.2), as `tv_resampling` does for two samples.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["GroupFit", "FitResult", "conditional_fit", "joint_fit"]

#: prefix -> the reference's probabilities of the next token, [V] float64
NextProbs = Callable[[tuple[int, ...]], np.ndarray]


@dataclass
class GroupFit:
    """One prefix's test: n samples, `observed` counts, the reference `p` (dense [V])."""

    prefix: tuple[int, ...]
    n: int
    statistic: float
    dof: int
    observed: dict[int, int]
    p: np.ndarray = field(repr=False)
    outside: int = 0


@dataclass
class FitResult:
    """The test of one position (or the joint, as the sum of the positions).

    Attributes:
        name: "position i" or "joint 1..m".
        statistic, dof, p_value: the summed χ² statistic, its dof, P(χ² >= it).
        groups: the tested prefixes; untested: samples in prefixes too small to test
            (or after an end of generation).
        outside: sample tokens with reference probability 0.
        boundary: samples left out as near-ties at the support's cut-off (`near_support`).
        tv, tv_corrected, tv_ci: observed TV, bias-corrected, bootstrap interval.
    """

    name: str
    statistic: float
    dof: int
    p_value: float
    groups: list[GroupFit]
    untested: int
    outside: int
    tv: float = 0.0
    tv_corrected: float = 0.0
    tv_ci: tuple[float, float] = (0.0, 0.0)
    reject: bool = False
    boundary: int = 0

    @property
    def testable(self) -> bool:
        return self.dof > 0

    @property
    def n(self) -> int:
        return sum(g.n for g in self.groups)


def _group_test(counts: Counter, n: int, p: np.ndarray) -> tuple[float, int, int]:
    """(χ², dof, tokens outside the support) for one multinomial; dof 0 = untestable."""
    expected = n * p
    outside = sum(c for t, c in counts.items() if t >= len(p) or p[t] <= 0)
    support = np.flatnonzero(p > 0)
    order = support[np.argsort(-expected[support], kind="stable")]
    keep = [int(t) for t in order if expected[t] >= 5]
    pooled = [int(t) for t in order if expected[t] < 5]
    while pooled and expected[pooled].sum() < 5 and keep:
        pooled.append(keep.pop())
    cols_e = [expected[t] for t in keep] + ([expected[pooled].sum()] if pooled else [])
    cols_o = [counts.get(t, 0) for t in keep] + ([sum(counts.get(t, 0) for t in pooled)] if pooled else [])
    if outside:                      # an impossible token: no exact sampler produces it
        return float("inf"), max(1, len(cols_e) - 1), outside
    if len(cols_e) < 2:
        top = int(order[0]) if len(order) else None
        rest = [int(t) for t in order[1:]]
        if top is None or not rest or expected[top] < 5:
            return 0.0, 0, 0
        # a nearly deterministic reference: too little expected mass off the top token for
        # χ²; the exact binomial test of "top token vs the rest", as a χ²(1) quantile
        from scipy.stats import binomtest, chi2

        off = sum(counts.get(t, 0) for t in rest)
        pv = binomtest(off, n, float(p[rest].sum())).pvalue
        return (float(chi2.isf(pv, 1)) if pv > 0 else float("inf")), 1, 0
    e, o = np.array(cols_e), np.array(cols_o, dtype=float)
    return float(((o - e) ** 2 / e).sum()), len(cols_e) - 1, 0


def _tv(counts: dict[int, int], n: int, p: np.ndarray) -> float:
    emp = np.zeros(max(len(p), max(counts, default=0) + 1))
    for t, c in counts.items():
        emp[t] = c / n
    ref = np.zeros_like(emp)
    ref[:len(p)] = p
    return 0.5 * float(np.abs(emp - ref).sum())


def _bootstrap(groups: list[GroupFit], reps: int, confidence: float, seed: int) -> tuple[float, float, tuple]:
    """(observed TV, bias-corrected TV, basic interval) of Σ_g n_g/n TV(p̂_g, p_g)."""
    n = sum(g.n for g in groups)
    if not n:
        return 0.0, 0.0, (0.0, 0.0)
    observed = sum(g.n / n * _tv(g.observed, g.n, g.p) for g in groups)
    rng = np.random.default_rng(seed)
    boot = np.zeros(reps)
    for g in groups:
        toks = np.array(sorted(g.observed))
        probs = np.array([g.observed[t] for t in toks], dtype=float) / g.n
        draws = rng.multinomial(g.n, probs, size=reps)
        for r in range(reps):
            boot[r] += g.n / n * _tv(dict(zip(toks.tolist(), draws[r].tolist())), g.n, g.p)
    q_lo, q_hi = np.quantile(boot, [(1 - confidence) / 2, (1 + confidence) / 2])
    return observed, max(0.0, 2 * observed - float(boot.mean())), (
        max(0.0, 2 * observed - float(q_hi)), max(0.0, 2 * observed - float(q_lo)))


def conditional_fit(samples: Sequence[Sequence[int]], position: int, next_probs: NextProbs, *,
                    min_group: int = 10, ended: int = -1, stop_ids: Sequence[int] = (),
                    near_support: Callable[[tuple[int, ...]], set[int]] | None = None,
                    bootstrap: int = 200, confidence: float = 0.95, seed: int = 0) -> FitResult:
    """χ² goodness of fit of the tokens at `position` (1-based) given their prefixes.

    Args:
        samples: m-tuples of token ids (`ended` after a generation ended).
        position: 1..m.
        next_probs: prefix -> the reference's next-token probabilities ([V] float64).
            Called once per tested prefix.
        min_group: prefixes with fewer samples are not tested (counted as untested).
        ended: the padding id for "generation had ended".
        stop_ids: ids that end generation (EOS): prefixes holding one are not tested.
        near_support: prefix -> tokens outside the reference's support but at a near-tie
            with its cut-off (top-k / top-p / min-p): another forward shape's rounding
            can put them inside. Samples of such tokens are left out of the test and
            counted in ``boundary`` (numerics, not an impossible token). None: none are.
        bootstrap, confidence, seed: the TV interval's resampling.

    Returns:
        `FitResult` (``reject`` left False for the caller).
    """
    from scipy.stats import chi2

    by_prefix: defaultdict[tuple[int, ...], Counter] = defaultdict(Counter)
    for s in samples:
        by_prefix[tuple(s[:position - 1])][s[position - 1]] += 1
    groups, untested, outside, boundary = [], 0, 0, 0
    stops = set(stop_ids) | {ended}
    for prefix, counts in sorted(by_prefix.items(), key=lambda kv: -sum(kv[1].values())):
        n = sum(counts.values())
        if n < min_group or any(t in stops for t in prefix) or ended in counts:
            untested += n
            continue
        p = np.asarray(next_probs(prefix), dtype=float)
        if near_support is not None and any(t >= len(p) or p[t] <= 0 for t in counts):
            near = near_support(prefix)
            for t in [t for t in counts if t in near and (t >= len(p) or p[t] <= 0)]:
                boundary += counts.pop(t)
            n = sum(counts.values())
        stat, dof, out = _group_test(counts, n, p)
        if dof == 0:
            untested += n
            continue
        outside += out
        groups.append(GroupFit(prefix, n, stat, dof, dict(counts), p, out))
    stat = sum(g.statistic for g in groups)
    dof = sum(g.dof for g in groups)
    p_value = float(chi2.sf(stat, dof)) if dof else 1.0
    tv, tv_c, ci = _bootstrap(groups, bootstrap, confidence, seed)
    return FitResult(f"position {position}", stat, dof, p_value, groups, untested, outside, tv, tv_c, ci,
                     boundary=boundary)


def joint_fit(positions: Sequence[FitResult]) -> FitResult:
    """The joint test of the m tokens: the sum of the position tests (module doc)."""
    from scipy.stats import chi2

    stat = sum(r.statistic for r in positions)
    dof = sum(r.dof for r in positions)
    return FitResult(f"joint 1..{len(positions)}", stat, dof, float(chi2.sf(stat, dof)) if dof else 1.0,
                     [g for r in positions for g in r.groups], sum(r.untested for r in positions),
                     sum(r.outside for r in positions),
                     # Σ of the positions' conditional TVs bounds the joint TV from above; a total
                     # variation never exceeds 1, so neither does what is printed for it
                     tv=min(1.0, sum(r.tv for r in positions)),
                     tv_corrected=min(1.0, sum(r.tv_corrected for r in positions)),
                     tv_ci=(min(1.0, max(r.tv_ci[0] for r in positions)),
                            min(1.0, sum(r.tv_ci[1] for r in positions))),
                     boundary=sum(r.boundary for r in positions))
