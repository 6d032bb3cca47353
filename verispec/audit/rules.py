"""The acceptance rules an audit runs: verispec's own, and the classic biased shortcuts.

Every audited rule is a `verispec.verify.Rule` handed to the shipped `decode` as its
``rule`` parameter, so an audit exercises the real loop (drafting, caching, rollback,
stopping) and changes only the accept/emit decision. Nothing is patched globally.

The shortcuts are pure verify functions with `verispec.verify.verify`'s signature
``fn(p, q, x, u) -> (n, dist)``, wrapped as `UniformRule`s. Each carries
``acceptance_probs(p, q, x)``, the per-position probability that x_i is accepted
given x_1..x_{i-1} were, which exact enumeration uses to weigh acceptance patterns:

* ``naive-agree``: accept x_i iff x_i = argmax p_i, emit a sample of p_n at the first
  disagreement. Biased towards the argmax: with one draft x ~ q the first token is
  a = argmax p with probability q(a) + (1 − q(a)) p(a), not p(a).
* ``naive-always-accept``: accept every draft. Biased: drafted positions follow q.

Names: "verispec" is whatever rule verispec itself is configured to run (the
standard rule unless told otherwise); "standard" and "gumbel" are the rules of
`verispec.verify.RULES`; the shortcuts are in `NAIVE_RULES`. `audited_rule` maps
any of these names to its `Rule`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..verify import RULES, Rule, UniformRule, standard

__all__ = ["as_rule", "naive_agree_verify", "always_accept_verify", "NAIVE_RULES",
           "RULE_NAMES", "audited_rule"]


def as_rule(rule: Rule | Callable | None, name: str | None = None) -> Rule:
    """The `Rule` an audit runs, from a rule, a pure verify function, or None.

    Args:
        rule: a `Rule` (returned as is: anything with a ``draft_stream`` attribute),
            a pure verify function ``fn(p, q, x, u) -> (n, dist)`` with
            `verispec.verify.verify`'s contract (wrapped as a `UniformRule`, with
            its ``acceptance_probs`` attribute if it has one), or None (the shipped
            standard rule, `verispec.verify.standard`).
        name: the name reports give a wrapped function (default: its ``__name__``).

    Returns:
        A `Rule`.
    """
    if rule is None:
        return standard
    if hasattr(rule, "draft_stream"):
        return rule
    return UniformRule(rule, name or getattr(rule, "__name__", "custom"),
                       getattr(rule, "acceptance_probs", None))


def naive_agree_verify(p: torch.Tensor, q: torch.Tensor, x: torch.Tensor,
                       u: torch.Tensor) -> tuple[int, torch.Tensor]:
    """Shortcut "accept only when draft and target agree" (biased; for audits only).

    Accepts x_i iff x_i == argmax p_i (ignores q and u), stops at the first
    disagreement and samples that position from p_i; all accepted: bonus from p_k.

    Args:
        p: [k+1, V] float warped target probabilities.
        q: [k, V] float warped draft probabilities (ignored).
        x: [k] int64 draft token ids.
        u: [k] float uniforms (ignored).

    Returns:
        (n, dist): n accepted drafts, and the [V] distribution of the next token (p_n).
    """
    k = x.shape[0]
    if k == 0:
        return 0, p[0]
    agree = (p[:k].argmax(-1) == x).to(torch.int64)
    n = int(agree.cumprod(0).sum())
    return n, p[n]


def _agree_probs(p: torch.Tensor, q: torch.Tensor, x: torch.Tensor) -> list[float]:
    """P(accept x_i) under `naive_agree_verify`: 1 if x_i = argmax p_i, else 0."""
    k = x.shape[0]
    return [1.0 if v else 0.0 for v in (p[:k].argmax(-1) == x).tolist()]


naive_agree_verify.acceptance_probs = _agree_probs  # type: ignore[attr-defined]


def always_accept_verify(p: torch.Tensor, q: torch.Tensor, x: torch.Tensor,
                         u: torch.Tensor) -> tuple[int, torch.Tensor]:
    """Shortcut "always accept the draft" (biased: the output follows q; audits only).

    Accepts all k drafts and draws the bonus token from p_k. Arguments and return
    as `naive_agree_verify`.
    """
    k = x.shape[0]
    return k, p[k]


always_accept_verify.acceptance_probs = (  # type: ignore[attr-defined]
    lambda p, q, x: [1.0] * int(x.shape[0]))

#: The classic shortcuts, by the names the reports and the CLI use.
NAIVE_RULES: dict[str, Rule] = {
    "naive-agree": as_rule(naive_agree_verify, "naive-agree"),
    "naive-always-accept": as_rule(always_accept_verify, "naive-always-accept"),
}

#: Every rule name an audit accepts: "verispec" (verispec's configured rule), the
#: exact rules of `verispec.verify.RULES`, then the shortcuts.
RULE_NAMES: tuple[str, ...] = ("verispec", *RULES, *NAIVE_RULES)


def audited_rule(name: str, verispec_rule: Rule = standard) -> Rule:
    """The `Rule` an audit runs under the name `name`.

    Args:
        name: one of `RULE_NAMES`: "verispec" (→ `verispec_rule`), a key of
            `verispec.verify.RULES` ("standard", "gumbel"), or a key of `NAIVE_RULES`.
        verispec_rule: the rule verispec itself is configured to run.

    Raises:
        ValueError: naming the unknown rule and the known names.
    """
    if name == "verispec":
        return verispec_rule
    rule = RULES.get(name) or NAIVE_RULES.get(name)
    if rule is None:
        raise ValueError(f"unknown rule {name!r}; choose from {', '.join(RULE_NAMES)}")
    return rule
