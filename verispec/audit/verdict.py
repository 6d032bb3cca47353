"""The verdict of an endpoint audit: pass, FAIL or inconclusive, and its error rate as a whole.

Inputs: the deciding statistics (`verispec.audit.tokenstats.Effect`s: the token
statistics against the exact local reference, or the spec-on vs spec-off comparison
of `verispec.audit.twosample`), the tokens outside the reference's support, the
greedy divergences, and the probes (`verispec.audit.probes`).

Rules (significance a, tolerance τ on the effect whose role is "tolerance" — the
top-1 excess, or its spec-on minus spec-off difference):

* **FAIL** when any of
  - a token has reference probability 0 and is not a near-tie at the support's cut-off
    (an exact sampler cannot produce it; near-ties are counted as numerics);
  - a greedy position's token is not the reference's argmax and its top-2 margin
    exceeds the numerics floor (shown with prompt, position and both tokens);
  - a probe fails (they are deterministic checks: equal outputs, argmax, logprobs);
  - a statistical hypothesis is rejected by Holm's step-down procedure (Holm 1979,
    Scand. J. Statist. 6:65–70) over the F deciding statistics at family-wise level a:
    for the tolerance statistic H0 is |effect| <= τ (one-sided p-value at the
    boundary), for the others (PIT omnibus, log-likelihood excess, the permutation
    omnibus) H0 is "no effect". The PIT omnibus always takes part, so a fault that
    keeps the top-1 rate but moves mass among other tokens cannot pass.
* **pass** when nothing fails and the tolerance statistic is shown inside ±τ by two
  one-sided tests at level a (Schuirmann 1987, J. Pharmacokinet. Biopharm. 15:657–680):
  H0⁻: effect <= −τ and H0⁺: effect >= τ are both rejected, i.e. its equivalence
  interval estimate ± q_{1−a}·se (confidence 1 − 2a; q the normal quantile, or
  Student's t with the effect's ``df``) lies inside ±τ (`equivalence_interval`).
* **inconclusive** otherwise, with the number of tokens that would settle it.

Error rate of the verdict as a whole: for an exact server scored by its true law
(or spec-on vs an exact spec-off arm), P(FAIL) <= a — Holm controls the family-wise
error over all F statistical hypotheses, and the deterministic checks cannot fire
for an exact server (a near-tie within the numerics floor is not a FAIL). For a
server whose |effect| >= τ, P(pass) <= a: a pass needs the tolerance statistic's
one-sided test on the side of its true effect to reject a true H0 (the other
statistics and checks can only turn a pass into FAIL, never the reverse), so no
Bonferroni factor is owed on that side. The probes and references of one run are in
the same family: F counts every statistic that decides (the local comparison, when it
is only reported beside the two-sample one, is not in F).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .tokenstats import Effect, tokens_needed

__all__ = ["Verdict", "decide", "equivalence_interval", "greedy_divergences", "holm", "impossible_tokens"]


@dataclass
class Verdict:
    verdict: str
    reasons: list[str]
    tokens_needed: int | None = None
    family: int = 0
    error_rate: str = ""
    rejected: list[str] = field(default_factory=list)


def holm(p_values: Sequence[float], level: float) -> list[bool]:
    """Holm's step-down rejections at family-wise `level` (in input order)."""
    order = np.argsort(p_values, kind="stable")
    f = len(p_values)
    out = [False] * f
    for rank, i in enumerate(order):
        if p_values[i] <= level / (f - rank):
            out[i] = True
        else:
            break
    return out


def equivalence_interval(e: Effect, significance: float) -> tuple[float, float]:
    """The interval whose inclusion in ±τ is the two one-sided tests at `significance`
    (module doc): estimate ∓ q_{1−significance}·se, q from Student's t with ``e.df``
    degrees of freedom, or the normal when ``e.df`` is None. Confidence 1 − 2·significance.

    Raises:
        ValueError: naming `significance` when not in (0, 0.5).
    """
    if not 0 < significance < 0.5:
        raise ValueError(f"significance must be in (0, 0.5), got {significance!r}")
    if e.se <= 0 or not math.isfinite(e.se):
        return (e.estimate, e.estimate) if e.se == 0 else (-math.inf, math.inf)
    if e.df is None:
        from scipy.stats import norm
        q = float(norm.isf(significance))
    else:
        from scipy.stats import t as student
        q = float(student.isf(significance, e.df))
    return (e.estimate - q * e.se, e.estimate + q * e.se)


def fail_p_value(e: Effect, tolerance: float) -> float:
    """p-value of the FAIL hypothesis test of one deciding statistic (module doc)."""
    if e.role != "tolerance":
        return e.p_value
    from scipy.stats import norm
    if e.se <= 0 or not math.isfinite(e.se):
        return 1.0 if abs(e.estimate) <= tolerance else 0.0
    return float(norm.sf((abs(e.estimate) - tolerance) / e.se))


def greedy_divergences(tokens: dict[str, np.ndarray], margin: float) -> list[dict]:
    """Every greedy position (reference p a point mass) whose token is not the argmax,
    classified "numerics" (top logit − its logit <= `margin`) or "bug"."""
    if not tokens:
        return []
    sel = np.flatnonzero((tokens["pmax"] >= 1.0) & ~tokens["top1"])
    return [{"prompt": int(tokens["prompt"][i]), "completion": int(tokens["completion"][i]),
             "position": int(tokens["position"][i]), "token": int(tokens["tokens"][i]),
             "argmax": int(tokens["argmax"][i]), "margin": float(tokens["margin"][i]),
             "kind": "numerics" if tokens["margin"][i] <= margin else "bug"} for i in sel]


def greedy_pair_divergences(on: Sequence, off: Sequence, margin: float) -> list[dict]:
    """Greedy spec-on vs spec-off, completion by completion (`TokenScores` with the same
    ``(prompt_index, index)``): the first position where the two servers' tokens differ,
    classified by the reference's logit gap between the two tokens there (the prefix is
    shared up to that position): "numerics" if it is <= `margin` (a near-tie either
    server's kernels may break either way), else "bug". Completions equal up to the
    shorter one's end do not diverge."""
    by_key = {(s.prompt_index, s.index): s for s in off}
    out = []
    for a in on:
        b = by_key.get((a.prompt_index, a.index))
        if b is None:
            continue
        n = min(a.m, b.m)
        diff = np.flatnonzero(a.tokens[:n] != b.tokens[:n])
        if not len(diff):
            continue
        t = int(diff[0])
        gap = abs(float(a.margin[t]) - float(b.margin[t]))
        out.append({"prompt": a.prompt_index, "completion": a.index, "position": t + 1,
                    "token": int(a.tokens[t]), "argmax": int(b.tokens[t]), "margin": gap,
                    "against": "spec-off", "kind": "numerics" if gap <= margin else "bug"})
    return out


def impossible_tokens(tokens: dict[str, np.ndarray]) -> tuple[int, int, list[dict]]:
    """(impossible, near-tie) counts of sampled tokens outside the reference's support,
    and up to 5 impossible examples (prompt, completion, position, token)."""
    if not tokens:
        return 0, 0, []
    sampled = tokens["pmax"] < 1.0
    bad = tokens["outside"] & ~tokens["near_tie"] & sampled
    near = tokens["outside"] & tokens["near_tie"] & sampled
    ex = [{"prompt": int(tokens["prompt"][i]), "completion": int(tokens["completion"][i]),
           "position": int(tokens["position"][i]), "token": int(tokens["tokens"][i])}
          for i in np.flatnonzero(bad)[:5]]
    return int(bad.sum()), int(near.sum()), ex


def decide(decisive: Sequence[Effect], significance: float, tolerance: float, *, impossible: int = 0,
           impossible_examples: Sequence[dict] = (), greedy: Sequence[dict] = (),
           probes: Sequence = ()) -> Verdict:
    """The verdict (module doc). `decisive` must have been computed at level significance / F
    (F = len(decisive)); `probes` are `ProbeResult`s (status "FAIL" fails the verdict).

    Raises:
        ValueError: naming `significance` or `tolerance` when out of range.
    """
    if not 0 < significance < 1:
        raise ValueError(f"significance must be in (0, 1), got {significance!r}")
    if not 0 < tolerance < 1:
        raise ValueError(f"tolerance must be in (0, 1), got {tolerance!r}")
    f = len(decisive)
    err = (f"P(FAIL | exact server) <= {significance:g} (Holm over {f} statistics; the deterministic "
           f"checks cannot fire on an exact server); P(pass | |effect| >= {tolerance:g}) <= "
           f"{significance:g} (two one-sided tests)")
    reasons, rejected = [], []
    if impossible:
        where = ", ".join(f"prompt {e['prompt']} completion {e['completion']} position {e['position']} "
                          f"token {e['token']}" for e in impossible_examples[:3])
        reasons.append(f"{impossible} token(s) the reference gives probability 0, not near its "
                       f"cut-off (impossible for an exact sampler): {where}")
    bugs = [g for g in greedy if g["kind"] == "bug"]
    if bugs:
        g = bugs[0]
        other = ("spec-off gave" if g.get("against") == "spec-off" else "the reference's argmax is")
        gap = "logit gap" if g.get("against") == "spec-off" else "top-2 margin"
        reasons.append(f"{len(bugs)} greedy divergence(s) beyond the numerics floor, e.g. prompt "
                       f"{g['prompt']} completion {g['completion']} position {g['position']}: token "
                       f"{g['token']} where {other} {g['argmax']}, {gap} {g['margin']:.3g}")
    for pr in probes:
        if getattr(pr, "status", "") == "FAIL":
            reasons.append(f"probe {pr.name}: {pr.detail}")
    if f:
        rej = holm([fail_p_value(e, tolerance) for e in decisive], significance)
        for e, r in zip(decisive, rej):
            if r:
                rejected.append(e.name)
                reasons.append(f"{e.name} {e.estimate:+.4g} {e.unit} [{e.ci[0]:+.4g}, {e.ci[1]:+.4g}]"
                               + (f" outside ±{tolerance:g}" if e.role == "tolerance"
                                  else f", p = {e.p_value:.2g}") + " (Holm)")
    if reasons:
        return Verdict("FAIL", reasons, None, f, err, rejected)
    tol = [(e, equivalence_interval(e, significance)) for e in decisive if e.role == "tolerance"]
    if tol and all(-tolerance < lo and hi < tolerance for _, (lo, hi) in tol):
        return Verdict("pass", [f"{e.name} {e.estimate:+.4f}, equivalence interval [{lo:+.4f}, {hi:+.4f}] "
                                f"inside ±{tolerance:g}; no statistic rejects" for e, (lo, hi) in tol],
                       None, f, err)
    need = [tokens_needed(e, tolerance, significance if abs(e.estimate) < tolerance else significance / f)
            for e, _ in tol]
    need = [n for n in need if n is not None]
    n_now = max((e.n for e, _ in tol), default=0)
    why = [f"{e.name} {e.estimate:+.4f}, equivalence interval [{lo:+.4f}, {hi:+.4f}] straddles "
           f"±{tolerance:g}" for e, (lo, hi) in tol] or ["no sampled tokens to test"]
    unit = "completions" if any(e.name.startswith("Δ") for e, _ in tol) else "tokens"
    if need:
        why.append(f"about {max(need):,} {unit} would settle it (now {n_now:,})")
    return Verdict("inconclusive", why, max(need) if need else None, f, err)
