"""Exact audit: the loop's output distribution, the target's, and their distance.

`exact_distribution` enumerates every execution path of the shipped
`verispec.decoding.decode` loop (`verispec.audit.enumeration`) and returns the
probability of every output of n new tokens; `target_distribution` computes the
distribution the target alone gives (the product of its warped conditionals, and
the same loop with k = 0, which must agree). Speculative sampling is exact iff the
two are equal (Leviathan et al. 2023, Appendix A.1; Chen et al. 2023, Theorem 1):
on float64 toy models (`verispec.audit.toys`) "equal" means a total variation
below ~1e-15, so a TV above `tol` (default 1e-12) is a bias, never rounding.

`audit_exact` turns that into a verdict ("exact", "biased", or "inconsistent"
when the enumerator caught the rule behaving unlike any exact sampler), and
`audit_exact_rules` runs it for verispec's rule and each biased shortcut of
`verispec.audit.rules` against one reference distribution (`exact_table` shows
the reports).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from ..decoding import decode, decoded_logits
from ..models.base import CausalLM
from ..sampling import SamplingConfig, warp
from ..verify import Rule, standard
from .enumeration import AuditError, Distribution, Enumerator
from .rules import NAIVE_RULES, as_rule
from .runs import policy_factory, single_thread, state_key

__all__ = ["exact_distribution", "target_distribution", "total_variation", "marginal",
           "ExactReport", "audit_exact", "audit_exact_rules", "exact_table"]


def exact_distribution(
    target: CausalLM,
    drafter_or_policy_factory,
    prompt: Sequence[int],
    n: int,
    k: int | None = None,
    sampling: SamplingConfig = SamplingConfig(),
    rule: Rule | Callable | None = None,
    *,
    stop: Callable[[list[int]], bool] | None = None,
    memo: bool = True,
    collapse_drafts: bool = True,
    representatives: str = "boundary",
    max_paths: int = 2_000_000,
    stats: dict | None = None,
) -> Distribution:
    """Exact probability of every output of the shipped `decode` loop.

    Args:
        target: the target model (a float64 `FunctionModel` for exact results;
            any deterministic `CausalLM` works, at its own precision).
        drafter_or_policy_factory: a `Drafter` (run as ``FixedPolicy(drafter, k)``),
            or a zero-argument callable returning a fresh policy for every replay
            (policies are stateful), or None for plain decoding.
        prompt: prompt token ids.
        n: max_new_tokens.
        k: draft length when a drafter is given (ignored for a policy factory).
        sampling: warps for p and q.
        rule: the acceptance rule `decode` runs (see `as_rule`; None: the shipped
            standard rule). If it has ``acceptance_probs(p, q, x)`` (per-position
            P(accept x_i), accepting iff u_i < that), the pattern weights come from
            it; otherwise the rule is audited against min(1, p/q). A rule with
            ``uses_uniforms = False`` (the coupled `gumbel` rule) is enumerated
            through its categorical draws alone, each an independent branch: with
            a draft model that is the independent coupling of x_i ~ q_i and
            y_i ~ p_i, not the shared Gumbel noise the rule uses at run time, and
            exact too (the emitted token is y_i either way); with a point-mass
            drafter it is the run-time behaviour itself.
        stop: passed to `decode`.
        memo: merge paths at identical round-boundary states (module doc).
        collapse_drafts: when a round's categorical draws are exactly its k drafts
            (as with `ModelDrafter`), enumerate the pattern "first rejection at j"
            under one value of the later drafts x_{j+2..k} only, with weight 1
            (they cannot change the outcome; their probabilities sum to 1). Also
            checks that each draft was drawn from the q the drafter reports.
        representatives: "boundary" (default) or "extreme" uniforms per pattern.
        max_paths: safety cap on replays.
        stats: if a dict, filled with replays/probes/merges/seconds/dtype.

    Returns:
        {new-token tuple: probability}; tuples end at EOS / stop or have length n.

    Raises:
        AuditError: a realised acceptance pattern disagrees with its probability
            (broken rule), the replay is not deterministic, or the tree is too large.
    """
    start = time.perf_counter()
    make_policy = policy_factory(drafter_or_policy_factory, k)
    prompt = list(prompt)
    enum = Enumerator(as_rule(rule), memo=memo, representatives=representatives,
                      max_paths=max_paths, collapse=collapse_drafts)

    def run(e: Enumerator) -> list[int]:
        policy = make_policy()
        key_fn = state_key(policy)
        e.state_key = lambda: key_fn(e.history)
        result = decode(target, prompt, policy, sampling=sampling, max_new_tokens=n, rng=e,
                        rule=e.rule, stop=stop, observer=e.observer, on_commit=e.on_commit)
        return result.tokens

    with single_thread():
        dist = enum.enumerate(run)
    if stats is not None:
        stats.update(replays=enum.replays, probes=enum.probes, merges=enum.merges,
                     seconds=time.perf_counter() - start,
                     dtype=str(enum.dtype).replace("torch.", "") if enum.dtype else None)
    return dist


def _direct_target_distribution(target: CausalLM, prompt: list[int], n: int,
                                sampling: SamplingConfig) -> Distribution:
    """Π of warped target conditionals, by recursion over prefixes (no decode loop)."""
    eos = target.eos_token_ids
    out: Distribution = {}

    def rec(prefix: tuple[int, ...], w: float) -> None:
        if len(prefix) == n:
            out[prefix] = out.get(prefix, 0.0) + w
            return
        p = warp(decoded_logits(target, prompt, prefix)[-1], sampling,
                 prompt + list(prefix), len(prompt)).tolist()
        for t, pt in enumerate(p):
            if pt > 0:
                if t in eos:
                    out[prefix + (t,)] = out.get(prefix + (t,), 0.0) + w * pt
                else:
                    rec(prefix + (t,), w * pt)

    rec((), 1.0)
    return out


def target_distribution(target: CausalLM, prompt: Sequence[int], n: int,
                        sampling: SamplingConfig = SamplingConfig(), *,
                        method: str = "both", tol: float = 1e-12) -> Distribution:
    """Exact distribution of n new tokens sampled from the target alone.

    Args:
        target: the target model (float64 `FunctionModel` for exact results).
        prompt: prompt token ids.
        n: new tokens (outputs stop early at an EOS id).
        sampling: the warps giving p.
        method: "decode" (the shipped loop with k = 0, enumerated like
            `exact_distribution`), "direct" (multiply the warped conditionals), or
            "both" (compute both and check they agree within `tol` in TV).
        tol: the TV the two methods may differ by.

    Returns:
        {new-token tuple: probability}.

    Raises:
        ValueError: for an unknown `method`.
        AuditError: when "both" disagree.
    """
    if method not in ("both", "decode", "direct"):
        raise ValueError(f"method must be 'both', 'decode' or 'direct', got {method!r}")
    prompt = list(prompt)
    direct = None
    if method != "decode":
        with single_thread():
            direct = _direct_target_distribution(target, prompt, n, sampling)
    if method == "direct":
        return direct
    via_loop = exact_distribution(target, None, prompt, n, 0, sampling)
    if direct is not None:
        tv = total_variation(direct, via_loop)
        if not tv <= tol:
            raise AuditError(f"plain decode (k=0) and the product of target conditionals "
                             f"disagree: TV = {tv:.3g}")
    return via_loop


def total_variation(d1: dict, d2: dict) -> float:
    """TV(d1, d2) = ½ Σ_s |d1(s) − d2(s)| over the union of supports (in [0, 1]).

    Args:
        d1, d2: {outcome: probability} (missing outcomes have probability 0).
    """
    keys = set(d1) | set(d2)
    return 0.5 * math.fsum(abs(d1.get(s, 0.0) - d2.get(s, 0.0)) for s in keys)


def marginal(dist: Distribution, position: int = 0, vocab_size: int | None = None) -> list[float] | dict:
    """Marginal of the token at `position` (0-based) under a sequence distribution.

    Returns a list of V probabilities when `vocab_size` is given (sequences too short
    to have that position are left out, so the list may sum to less than 1),
    else a {token: probability} dict.
    """
    m: defaultdict[int, float] = defaultdict(float)
    for s, w in dist.items():
        if len(s) > position:
            m[s[position]] += w
    if vocab_size is None:
        return dict(m)
    return [m.get(t, 0.0) for t in range(vocab_size)]


@dataclass
class ExactReport:
    """Result of `audit_exact`.

    Attributes:
        rule: "verispec" or the injected rule's name.
        tv: TV between the loop's output distribution and the target's (nan if inconsistent).
        n_sequences: outputs with positive probability.
        verdict: "exact" (tv <= tol), "biased", or "inconsistent" (AuditError).
        mass: total probability enumerated (1 up to rounding).
        tol: the tolerance used.
        n, k, vocab_size: the configuration (new tokens, draft length, V).
        seconds, replays, merges, dtype: enumeration statistics (wall seconds,
            decode runs, merged paths, the dtype of p).
        detail: the AuditError message for "inconsistent".
    """

    rule: str
    tv: float
    n_sequences: int
    verdict: str
    mass: float = float("nan")
    tol: float = 1e-12
    n: int = 0
    k: int | None = None
    vocab_size: int = 0
    seconds: float = 0.0
    replays: int = 0
    merges: int = 0
    dtype: str | None = None
    detail: str = ""

    @property
    def flagged(self) -> bool:
        """True when the rule does not reproduce the target distribution."""
        return self.verdict != "exact"

    def to_dict(self) -> dict:
        """JSON-ready dict (nan becomes None; ``flagged`` added)."""
        d = asdict(self)
        d["tv"] = None if math.isnan(self.tv) else self.tv
        d["mass"] = None if math.isnan(self.mass) else self.mass
        d["flagged"] = self.flagged
        return d


def audit_exact(target: CausalLM, drafter_or_policy_factory, prompt: Sequence[int], n: int,
                k: int | None = None, sampling: SamplingConfig = SamplingConfig(),
                rule: Rule | Callable | None = None, *, name: str | None = None,
                tol: float = 1e-12, reference: Distribution | None = None,
                **kwargs) -> ExactReport:
    """Enumerate the loop and the target alone exactly and compare them.

    Args: as `exact_distribution`; `reference` reuses a target distribution
    computed before; `name` names the report (default "verispec" for the shipped
    standard rule, else the rule's name). Extra keyword arguments go to
    `exact_distribution`.

    Returns:
        `ExactReport`; an `AuditError` becomes verdict "inconsistent".
    """
    the_rule = as_rule(rule)
    name = name or ("verispec" if the_rule is standard else the_rule.name)
    if reference is None:
        reference = target_distribution(target, prompt, n, sampling)
    stats: dict = {}
    base = dict(rule=name, n=n, k=k, vocab_size=target.vocab_size, tol=tol)
    try:
        dist = exact_distribution(target, drafter_or_policy_factory, prompt, n, k, sampling,
                                  the_rule, stats=stats, **kwargs)
    except AuditError as err:
        return ExactReport(tv=float("nan"), n_sequences=0, verdict="inconsistent",
                           detail=str(err), **base)
    tv = total_variation(dist, reference)
    return ExactReport(tv=tv, n_sequences=sum(1 for w in dist.values() if w > 0),
                       verdict="exact" if tv <= tol else "biased",
                       mass=math.fsum(dist.values()), seconds=stats["seconds"],
                       replays=stats["replays"], merges=stats["merges"], dtype=stats["dtype"],
                       **base)


def audit_exact_rules(target: CausalLM, drafter_or_policy_factory, prompt: Sequence[int], n: int,
                      k: int | None = None, sampling: SamplingConfig = SamplingConfig(), *,
                      rules: dict[str, Rule | Callable | None] | None = None,
                      tol: float = 1e-12) -> list[ExactReport]:
    """`audit_exact` for verispec's rule and each naive shortcut (or `rules`), one reference.

    Args: as `audit_exact`; `rules` maps report names to rules (`as_rule`
    accepts each; default: "verispec" → the shipped standard rule, then
    `NAIVE_RULES`). The target's distribution is enumerated once.

    Returns:
        One `ExactReport` per rule, in the order of `rules`.
    """
    rules = rules if rules is not None else {"verispec": None, **NAIVE_RULES}
    reference = target_distribution(target, prompt, n, sampling)
    return [audit_exact(target, drafter_or_policy_factory, prompt, n, k, sampling, rule,
                        name=name, tol=tol, reference=reference)
            for name, rule in rules.items()]


def exact_table(reports: Sequence[ExactReport], title: str = "Exact enumeration audit"):
    """A rich `Table` of `ExactReport`s, one row each (verdict in colour)."""
    from rich.table import Table

    table = Table(title=title)
    for col in ("rule", "k", "n", "V", "outputs", "TV vs target", "verdict", "seconds"):
        table.add_column(col, justify="left" if col in ("rule", "verdict") else "right")
    for r in reports:
        colour = "green" if not r.flagged else "red"
        table.add_row(r.rule, str(r.k), str(r.n), str(r.vocab_size), str(r.n_sequences),
                      "—" if math.isnan(r.tv) else f"{r.tv:.3g}",
                      f"[{colour}]{r.verdict}[/{colour}]", f"{r.seconds:.2f}")
    return table


