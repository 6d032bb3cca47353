"""Statistical audit: compare samplers by their samples, with a verdict and its limits.

Exact enumeration (`verispec.audit.exact`) needs toy models; real models are
audited by sampling. Any two samplers ``(seed: int) -> list[int]`` (the first m new
token ids of one generation) can be compared: N seeded samples each, a test of
homogeneity (`verispec.audit.homogeneity`) for the token at every position 1..m
and for the joint m-token prefix, Bonferroni over the m + 1 tests, a total
variation estimate with a bootstrap interval, and a verdict. N and the
significance level are fixed before sampling. A pass is not a proof: it only
rules out differences large enough for N to see (read `tv_ci`).

`verispec.audit.samplers` builds samplers for verispec, the biased shortcuts and
transformers' assisted generation; any callable works, so third-party
implementations can be audited too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from .homogeneity import HomogeneityResult, homogeneity_test, tv_resampling

__all__ = ["Sampler", "AuditReport", "draw_samples", "audit_samples", "statistical_audit",
           "audit_rules"]

#: ``seed -> new token ids of one generation`` (only the first m are compared).
Sampler = Callable[[int], Sequence[int]]

_ENDED = -1     # category for "generation had ended before this position"


@dataclass
class AuditReport:
    """Result of a statistical audit of a candidate sampler against a reference.

    Attributes:
        reference, candidate: labels.
        n_samples: N per sampler; m: tokens compared; alpha_level: family-wise
            significance level (the CLI's --significance; not the acceptance rate α).
        alpha_per_test: alpha_level / number of tests (Bonferroni).
        tests: per position 1..m, then the joint m-token prefix.
        tv: plug-in TV between the two empirical distributions of the joint prefix.
            It is biased upwards (order sqrt(categories / N) even with no
            difference); read it together with:
        tv_corrected, tv_ci: bootstrap bias-corrected TV and basic bootstrap
            interval (clipped at 0) at level `confidence`;
        tv_null: the `confidence` quantile of the plug-in TV under random
            re-splits of the pooled samples (its size when nothing differs);
        tv_p_value: permutation p-value of the observed TV (informational; the
            verdict uses the chi-square / G tests).
        verdict: "pass" (no test rejects) or "FAIL".
    """

    reference: str
    candidate: str
    n_samples: int
    m: int
    alpha_level: float
    alpha_per_test: float
    method: str
    tests: list[HomogeneityResult]
    tv: float
    tv_corrected: float
    tv_ci: tuple[float, float]
    tv_null: float
    tv_p_value: float
    confidence: float
    verdict: str
    seconds: float = 0.0
    seeds: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """True when no test rejected."""
        return self.verdict == "pass"

    @property
    def min_p_value(self) -> float:
        """The smallest p-value over the m + 1 tests."""
        return min(t.p_value for t in self.tests)

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        d = asdict(self)
        d["tv_ci"] = list(self.tv_ci)
        d["passed"] = self.passed
        d["min_p_value"] = self.min_p_value
        for t, row in zip(self.tests, d["tests"]):
            row["testable"] = t.testable
        return d

    def table(self):
        """A rich Table: one row per test, the verdict in the caption."""
        from rich.table import Table

        colour = "green" if self.passed else "red"
        table = Table(title=f"{self.candidate} vs {self.reference}: N = {self.n_samples} each, "
                            f"m = {self.m}, significance {self.alpha_level} (Bonferroni {self.alpha_per_test:.2g})",
                      caption=f"[{colour}]{self.verdict}[/{colour}]  TV̂(joint) = {self.tv:.4f} "
                              f"(no-difference level {self.tv_null:.4f}); bias-corrected "
                              f"{self.tv_corrected:.4f} [{self.tv_ci[0]:.4f}, {self.tv_ci[1]:.4f}] "
                              f"({self.confidence:.0%} bootstrap)")
        for col in ("test", self.method, "dof", "p-value", "categories", "TV̂", "reject"):
            table.add_column(col, justify="left" if col == "test" else "right")
        for t in self.tests:
            if not t.testable:
                table.add_row(t.name, "—", "—", "n/a", f"{t.categories} (+{t.pooled} pooled)",
                              f"{t.tv:.4f}", "too sparse")
                continue
            table.add_row(t.name, f"{t.statistic:.2f}", str(t.dof), f"{t.p_value:.3g}",
                          f"{t.categories} (+{t.pooled} pooled)" if t.pooled else str(t.categories),
                          f"{t.tv:.4f}", "[red]yes[/red]" if t.reject else "no")
        return table


def _normalise(sample: Sequence[int], m: int) -> tuple[int, ...]:
    """The first m token ids, padded with `_ENDED` when generation ended earlier."""
    s = [int(t) for t in list(sample)[:m]]
    return tuple(s + [_ENDED] * (m - len(s)))


def draw_samples(sampler: Sampler, seeds: Sequence[int], m: int, *, progress: bool = True,
                 desc: str = "sampling") -> list[tuple[int, ...]]:
    """Call `sampler(seed)` for each seed; keep the first m tokens (padded with -1 = ended).

    Args:
        sampler: ``seed -> token ids``.
        seeds: the seeds, in order.
        m: tokens kept per sample.
        progress: show a tqdm bar (stderr) labelled `desc`.

    Returns:
        One m-tuple of token ids per seed.
    """
    from tqdm.auto import tqdm

    return [_normalise(sampler(int(s)), m)
            for s in tqdm(seeds, desc=desc, disable=not progress, leave=False)]


def audit_samples(reference: Sequence[Sequence[int]], candidate: Sequence[Sequence[int]], m: int,
                  alpha_level: float = 0.01, *, method: str = "chi2",
                  reference_label: str = "reference", candidate_label: str = "candidate",
                  bootstrap: int = 300, confidence: float = 0.95,
                  bootstrap_seed: int = 0) -> AuditReport:
    """The tests of `statistical_audit` on samples already drawn (lists of token lists).

    Args:
        reference, candidate: samples (token-id lists; only the first m tokens count,
            shorter ones end with the "ended" category).
        m: tokens compared, >= 1.
        alpha_level: family-wise significance level in (0, 1), split over the
            m + 1 tests (Bonferroni).
        method: "chi2" (Pearson) or "g" (G-test).
        reference_label, candidate_label: names in the report.
        bootstrap: bootstrap and permutation resamples for the TV interval.
        confidence: level of the TV interval.
        bootstrap_seed: seed of the resampling (the report is deterministic).

    Returns:
        `AuditReport`.

    Raises:
        ValueError: naming `method`, `alpha_level` or `m` when out of range.
    """
    if method not in ("chi2", "g"):
        raise ValueError(f"method must be 'chi2' or 'g' (log-likelihood ratio), got {method!r}")
    if not 0 < alpha_level < 1:
        raise ValueError(f"alpha_level must be in (0, 1), got {alpha_level!r}")
    if m < 1:
        raise ValueError(f"m must be >= 1, got {m!r}")
    start = time.perf_counter()
    a = [_normalise(s, m) for s in reference]
    b = [_normalise(s, m) for s in candidate]
    lam = "log-likelihood" if method == "g" else None
    tests = [homogeneity_test([s[i] for s in a], [s[i] for s in b], f"position {i + 1}", lam)
             for i in range(m)]
    tests.append(homogeneity_test(a, b, f"joint 1..{m}", lam))
    alpha_per_test = alpha_level / len(tests)
    for t in tests:
        t.reject = t.p_value < alpha_per_test
    resampled = tv_resampling(a, b, bootstrap, confidence, bootstrap_seed)
    return AuditReport(
        reference=reference_label, candidate=candidate_label, n_samples=min(len(a), len(b)),
        m=m, alpha_level=alpha_level, alpha_per_test=alpha_per_test,
        method="G" if method == "g" else "χ²", tests=tests, tv=tests[-1].tv, **resampled,
        confidence=confidence, verdict="FAIL" if any(t.reject for t in tests) else "pass",
        seconds=time.perf_counter() - start)


def statistical_audit(sample_reference: Sampler, sample_candidate: Sampler, n_samples: int,
                      m: int, alpha_level: float = 0.01, progress: bool = True, *,
                      method: str = "chi2", reference_label: str = "reference",
                      candidate_label: str = "candidate", seed_offset: int = 0,
                      bootstrap: int = 300, confidence: float = 0.95) -> AuditReport:
    """Test whether two samplers produce the same distribution of the first m tokens.

    Each sampler is any callable ``(seed: int) -> list[int]`` returning the new
    token ids of one generation (only the first m are used; a shorter output
    means generation ended, and counts as its own category). The reference is
    called with seeds ``seed_offset + 0..N-1`` and the candidate with
    ``seed_offset + N..2N-1``, so the two sample sets are independent even when
    both samplers share a random-number scheme.

    For each position 1..m (marginal) and for the joint m-token prefix a test of
    homogeneity of the 2 x C contingency table (`scipy.stats.chi2_contingency`,
    Pearson χ² or, with ``method="g"``, the G-test) is run after pooling
    categories with expected count < 5 (a test left with < 2 columns is reported as
    too sparse, p = 1: raise N or lower m). N and the significance level a
    (`alpha_level`; not the acceptance rate α) are fixed before sampling (and
    printed when `progress`); with Bonferroni over the m + 1 tests the verdict is
    "pass" when no p-value is below a / (m + 1), else "FAIL". A pass is not a
    proof: the test only detects differences large enough for N (see `tv_ci`).

    Returns:
        `AuditReport` (``.to_dict()`` for JSON, ``.table()`` for a rich Table).
    """
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples!r}")
    if progress:
        from rich.console import Console

        Console(stderr=True).print(
            f"statistical audit: {candidate_label} vs {reference_label}: N = {n_samples} samples "
            f"each, m = {m} tokens, significance {alpha_level} over {m + 1} tests "
            f"(Bonferroni, {alpha_level / (m + 1):.3g} per test), {method}")
    start = time.perf_counter()
    ref_seeds = range(seed_offset, seed_offset + n_samples)
    cand_seeds = range(seed_offset + n_samples, seed_offset + 2 * n_samples)
    a = draw_samples(sample_reference, ref_seeds, m, progress=progress, desc=reference_label)
    b = draw_samples(sample_candidate, cand_seeds, m, progress=progress, desc=candidate_label)
    report = audit_samples(a, b, m, alpha_level, method=method, reference_label=reference_label,
                           candidate_label=candidate_label, bootstrap=bootstrap,
                           confidence=confidence)
    report.seconds = time.perf_counter() - start
    report.seeds = {"reference": [ref_seeds.start, ref_seeds.stop - 1],
                    "candidate": [cand_seeds.start, cand_seeds.stop - 1]}
    return report


def audit_rules(samplers: dict[str, Sampler], n_samples: int, m: int, alpha_level: float = 0.01,
                *, reference: str = "target", progress: bool = True,
                method: str = "chi2") -> dict[str, AuditReport]:
    """Audit every sampler in `samplers` against `samplers[reference]`.

    The reference is sampled once (seeds 0..N-1) and reused; each candidate gets
    seeds N..2N-1. Each report carries its own verdict (the significance level is per candidate).
    Typical use: ``audit_rules(rule_samplers(...), 2000, 4)`` gives
    "verispec: pass; naive-agree: FAIL; naive-always-accept: FAIL".
    """
    if reference not in samplers:
        raise ValueError(f"reference sampler {reference!r} not in {sorted(samplers)}")
    if progress:
        from rich.console import Console

        Console(stderr=True).print(
            f"statistical audit: N = {n_samples} samples per sampler, m = {m} tokens, "
            f"significance {alpha_level} per candidate over {m + 1} tests (Bonferroni), {method}")
    ref = draw_samples(samplers[reference], range(n_samples), m, progress=progress, desc=reference)
    reports = {}
    for name, sampler in samplers.items():
        if name == reference:
            continue
        start = time.perf_counter()
        cand = draw_samples(sampler, range(n_samples, 2 * n_samples), m, progress=progress, desc=name)
        rep = audit_samples(ref, cand, m, alpha_level, method=method, reference_label=reference,
                            candidate_label=name)
        rep.seconds = time.perf_counter() - start
        rep.seeds = {"reference": [0, n_samples - 1], "candidate": [n_samples, 2 * n_samples - 1]}
        reports[name] = rep
    return reports

