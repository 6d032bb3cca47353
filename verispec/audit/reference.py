"""The endpoint audit's comparison: a server's samples vs a reference, with power and verdict.

Two references (`verispec.audit.endpoint` draws the samples):

* **exact** (`compare_exact`): the target's warped p, computed locally from the
  same weights; per-position conditional χ² goodness of fit and their sum as the
  joint test (`verispec.audit.goodness`);
* **two-sample** (`compare_two_sample`): samples from a reference server (e.g. the
  same server without a draft); the homogeneity tests of the in-process audit
  (`verispec.audit.statistical.audit_samples`) and its bootstrap TV per position.

Every row (position 1..m, then the joint) reports the test, its p-value, the
observed TV with a 95 % interval, and the smallest TV the test detects with 80 %
power at its (Bonferroni) level, against the named alternative "mass δ moved from
the reference's most probable token to its second" and against the worst case
over the support (`verispec.audit.power`), plus the numerics floor
(`verispec.audit.numerics`) when the weights are local.

Verdict (significance a family-wise, over the m + 1 tests):
* "FAIL": a test rejects and its TV interval lies above the numerics floor;
* "inconclusive": a test rejects but the deviation fits under the numerics floor
  (row status "numerics": the server's kernels alone can explain it), or nothing
  rejects but some position was untestable or its detectable δ (named alternative)
  exceeds `tolerance` (N too small to call it a pass);
* "pass": nothing rejects and every position could have detected δ = `tolerance`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from .goodness import FitResult, conditional_fit, joint_fit
from .homogeneity import tv_resampling
from .power import detectable_tv
from .statistical import _normalise, audit_samples

__all__ = ["Row", "EndpointReport", "compare_exact", "compare_two_sample", "target_next_probs"]


@dataclass
class Row:
    """One test of the endpoint audit (see the module doc for the columns)."""

    name: str
    test: str
    statistic: float
    dof: int
    p_value: float
    n: int
    tv: float
    tv_corrected: float
    tv_ci: tuple[float, float]
    detectable_top2: float | None
    detectable_worst: float | None
    floor: float | None = None
    reject: bool = False
    status: str = "ok"          # ok | reject | numerics | untestable
    note: str = ""


@dataclass
class EndpointReport:
    """The endpoint audit's result (``to_dict()`` for --json, ``table()`` for the terminal).

    Attributes:
        endpoint, reference: what was compared ("exact p of NAME" or a URL).
        n_samples, n_reference: samples per side; m: tokens per sample.
        significance: family-wise level; per_test: significance / (m + 1).
        tolerance: the δ a pass must be able to detect (named alternative).
        rows: positions 1..m then the joint; verdict, reasons: see the module doc.
        info: settings, id source, seed check, retries, machine (free-form).
    """

    endpoint: str
    reference: str
    n_samples: int
    n_reference: int | None
    m: int
    significance: float
    per_test: float
    tolerance: float
    rows: list[Row]
    verdict: str = "pass"
    reasons: list[str] = field(default_factory=list)
    info: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        for r in d["rows"]:
            r["tv_ci"] = list(r["tv_ci"])
            if r["statistic"] == float("inf"):
                r["statistic"] = "inf"
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "EndpointReport":
        """The inverse of `to_dict` (re-render a saved --json report)."""
        d = dict(d)
        rows = []
        for r in d.pop("rows"):
            r = dict(r, tv_ci=tuple(r["tv_ci"]))
            if r["statistic"] == "inf":
                r["statistic"] = float("inf")
            rows.append(Row(**r))
        return cls(rows=rows, **d)

    def table(self):
        """A rich Table, one row per test, readable at 80 columns (the test kind, statistic
        and dof are in ``to_dict()``), the verdict and reasons in the caption."""
        from rich import box
        from rich.table import Table

        colour = {"pass": "green", "FAIL": "red"}.get(self.verdict, "yellow")
        t = Table(title=f"{self.endpoint} vs {self.reference}: N = {self.n_samples}"
                        + (f" / {self.n_reference}" if self.n_reference else "")
                        + f", m = {self.m}, significance {self.significance} "
                          f"(Bonferroni {self.per_test:.2g} per test)",
                  box=box.SIMPLE_HEAD, padding=(0, 1),
                  caption=f"[{colour}]{self.verdict}[/{colour}]"
                          + (": " + "; ".join(self.reasons) if self.reasons else "")
                          + "\nδ top2 / δ any: smallest TV found with 80 % power, moving mass from the "
                            "most probable token to the second / any shift; floor: numerics floor")
        for col in ("test", "p", "TV̂", "95 % CI", "δ top2", "δ any", "floor", "status"):
            t.add_column(col, justify="left" if col in ("test", "status") else "right", no_wrap=col != "status")
        fmt = lambda x: "—" if x is None else f"{x:.3f}"  # noqa: E731
        for r in self.rows:
            status = {"reject": "[red]reject[/red]", "numerics": "[yellow]numerics[/yellow]"}.get(
                r.status, r.status)
            name = r.name.replace("position ", "pos ")
            t.add_row(name, f"{r.p_value:.2g}", f"{r.tv:.3f}", f"{r.tv_ci[0]:.3f}–{r.tv_ci[1]:.3f}",
                      fmt(r.detectable_top2), fmt(r.detectable_worst), fmt(r.floor),
                      status + (f" {r.note}" if r.note else ""))
        return t


def _decide(report: EndpointReport) -> EndpointReport:
    """Set each row's status and the verdict (module doc)."""
    reasons = []
    for r in report.rows:
        r.reject = r.p_value < report.per_test
        if r.dof == 0:
            r.status = "untestable"
        elif r.reject:
            within = r.floor is not None and r.tv_ci[0] <= r.floor
            r.status = "numerics" if within else "reject"
        else:
            r.status = "ok"
    fails = [r for r in report.rows if r.status == "reject"]
    numerics = [r for r in report.rows if r.status == "numerics"]
    positions = report.rows[:-1]
    if fails:
        report.verdict = "FAIL"
        reasons += [f"{r.name}: p = {r.p_value:.2g}, TV̂ {r.tv:.3f} [{r.tv_ci[0]:.3f}, {r.tv_ci[1]:.3f}]"
                    + (f" above the numerics floor {r.floor:.3f}" if r.floor is not None else "")
                    for r in fails]
    elif numerics:
        report.verdict = "inconclusive"
        reasons += [f"{r.name}: rejected (p = {r.p_value:.2g}) but TV̂ {r.tv:.3f} fits under the "
                    f"numerics floor {r.floor:.3f}: numerics, not a bias of the sampler" for r in numerics]
    else:
        weak = [r for r in positions if r.status == "untestable"
                or r.detectable_top2 is None or r.detectable_top2 > report.tolerance]
        report.verdict = "inconclusive" if weak else "pass"
        reasons += [f"{r.name}: " + ("too few samples per prefix to test" if r.status == "untestable"
                                     else f"detectable δ {fmt_d(r.detectable_top2)} > tolerance "
                                          f"{report.tolerance}") for r in weak]
    report.reasons = reasons
    return report


def fmt_d(x: float | None) -> str:
    return "none (N too small)" if x is None else f"{x:.3f}"


def _fit_row(fit: FitResult, level: float, floor: float | None) -> Row:
    groups = [(g.n, g.p) for g in fit.groups]
    d2 = detectable_tv(groups, level) if groups else None
    dw = detectable_tv(groups, level, alternative="worst") if groups else None
    note = f"{fit.outside} tokens outside the reference's support" if fit.outside else ""
    if fit.boundary:
        note += (", " if note else "") + (f"{fit.boundary} samples at a near-tie with the support's "
                                          f"cut-off left out (numerics)")
    if fit.untested:
        note += (", " if note else "") + f"{fit.untested} samples in untested prefixes"
    return Row(fit.name, "χ² fit | prefix", fit.statistic, fit.dof, fit.p_value, fit.n, fit.tv,
               fit.tv_corrected, fit.tv_ci, d2, dw, floor, note=note)


#: logits (divided by the temperature) within this of the support's lowest are near-ties:
#: llama.cpp's logits move by up to ~0.4 between forward shapes, so such a token can be
#: inside the server's top-k and outside the reference's
BOUNDARY_MARGIN = 0.5


def target_next_probs(target, prompt: Sequence[int], sampling,
                      margin: float = BOUNDARY_MARGIN) -> Callable[[tuple[int, ...]], np.ndarray]:
    """prefix -> the target's warped p of the next token ([V] float64 numpy), cached;
    one forward per new prefix, computed as `decode` computes it (`decoded_logits`; the
    common prefix stays cached).

    The callable has a ``near_support(prefix)`` attribute: the tokens outside the
    support whose logit / T is within `margin` of the support's lowest (the near-ties
    at a top-k / top-p / min-p cut-off, see `conditional_fit`)."""
    from ..decoding import decoded_logits
    from ..sampling import warp

    cache: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}
    prompt = list(prompt)
    t = sampling.temperature or 1.0

    def entry(prefix: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        if prefix not in cache:
            logits = decoded_logits(target, prompt, prefix)[-1].double()   # as decode() saw them
            cache[prefix] = (warp(logits[None], sampling)[0].numpy(), (logits / t).numpy())
        return cache[prefix]

    def next_probs(prefix: tuple[int, ...]) -> np.ndarray:
        return entry(prefix)[0]

    def near_support(prefix: tuple[int, ...]) -> set[int]:
        p, scaled = entry(prefix)
        lowest = scaled[p > 0].min()
        return set(np.flatnonzero((p <= 0) & (scaled >= lowest - margin)).tolist())

    next_probs.near_support = near_support
    return next_probs


def compare_exact(samples: Sequence[Sequence[int]], m: int, next_probs, *, significance: float = 0.01,
                  tolerance: float = 0.05, stop_ids: Sequence[int] = (), floor: Sequence[float] | None = None,
                  endpoint: str = "endpoint", reference: str = "exact p", min_group: int = 10,
                  seed: int = 0) -> EndpointReport:
    """Goodness of fit of an endpoint's samples to the exact reference p.

    Args:
        samples: token-id lists (first m used; shorter ones ended).
        m: tokens per sample, >= 1.
        next_probs: prefix -> reference next-token probabilities (`target_next_probs`).
        significance: family-wise level in (0, 1), Bonferroni over the m + 1 tests.
        tolerance: the δ (TV, named alternative) a pass must be able to detect.
        stop_ids: EOS ids (prefixes holding one are not tested further).
        floor: the numerics floor per position (`numerics_floor`), or None.
        min_group: the fewest samples a prefix needs to be tested.

    Returns:
        `EndpointReport` with its verdict.

    Raises:
        ValueError: naming `m`, `significance` or `tolerance` when out of range.
    """
    _check(m, significance, tolerance)
    a = [_normalise(s, m) for s in samples]
    per = significance / (m + 1)
    fits = [conditional_fit(a, i, next_probs, min_group=min_group, stop_ids=stop_ids, seed=seed + i,
                            near_support=getattr(next_probs, "near_support", None))
            for i in range(1, m + 1)]
    rows = [_fit_row(f, per, floor[i] if floor is not None else None) for i, f in enumerate(fits)]
    rows.append(_fit_row(joint_fit(fits), per, sum(floor) if floor is not None else None))
    rows[-1].test = "Σ χ² (chain)"
    return _decide(EndpointReport(endpoint, reference, len(a), None, m, significance, per, tolerance, rows))


def compare_two_sample(samples: Sequence[Sequence[int]], reference_samples: Sequence[Sequence[int]], m: int, *,
                       significance: float = 0.01, tolerance: float = 0.05,
                       floor: Sequence[float] | None = None, endpoint: str = "endpoint",
                       reference: str = "reference endpoint", bootstrap: int = 300,
                       seed: int = 0) -> EndpointReport:
    """Homogeneity of an endpoint's samples with a reference endpoint's (the in-process
    audit's tests, `audit_samples`), with per-position TV intervals and power.

    Args and returns as `compare_exact`; `reference_samples` are the reference's samples.
    """
    _check(m, significance, tolerance)
    a = [_normalise(s, m) for s in reference_samples]
    b = [_normalise(s, m) for s in samples]
    base = audit_samples(a, b, m, significance, reference_label=reference, candidate_label=endpoint,
                         bootstrap=bootstrap, bootstrap_seed=seed)
    n_eff = len(a) * len(b) / (len(a) + len(b))
    rows = []
    for i, t in enumerate(base.tests):
        joint = i == m
        col_a = a if joint else [s[i] for s in a]
        col_b = b if joint else [s[i] for s in b]
        res = (dict(tv_corrected=base.tv_corrected, tv_ci=base.tv_ci) if joint
               else tv_resampling(col_a, col_b, bootstrap, 0.95, seed + i))
        counts = Counter(col_a)
        p = np.array(sorted(counts.values(), reverse=True), dtype=float) / len(col_a)
        d2 = detectable_tv([(n_eff, p)], base.alpha_per_test, two_sample=True) if len(p) > 1 else None
        dw = detectable_tv([(n_eff, p)], base.alpha_per_test, alternative="worst", two_sample=True)
        fl = (sum(floor) if joint else floor[i]) if floor is not None else None
        rows.append(Row(t.name, "χ² homogeneity" if base.method == "χ²" else "G homogeneity",
                        t.statistic, t.dof, t.p_value, len(b), t.tv, res["tv_corrected"],
                        tuple(res["tv_ci"]), d2, dw, fl,
                        note=f"{t.pooled} categories pooled" if t.pooled else ""))
    return _decide(EndpointReport(endpoint, reference, len(b), len(a), m, significance,
                                  base.alpha_per_test, tolerance, rows))


def _check(m: int, significance: float, tolerance: float) -> None:
    if m < 1:
        raise ValueError(f"m must be >= 1, got {m!r}")
    if not 0 < significance < 1:
        raise ValueError(f"significance must be in (0, 1), got {significance!r}")
    if not 0 < tolerance < 1:
        raise ValueError(f"tolerance must be in (0, 1), got {tolerance!r}")
