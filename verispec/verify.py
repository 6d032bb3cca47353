"""The acceptance rules of speculative sampling, batched over the k draft positions.

Notation (Leviathan et al. 2023, "Fast Inference from Transformers via
Speculative Decoding", Algorithm 1; Chen et al. 2023, Algorithm 2):
p = target distribution, q = draft distribution, x_i = i-th draft token,
t = output position of x_1 (0 = the first new token).

Vocabulary of one round: the drafts x_1..x_k are *accepted* up to the first
rejection; the token emitted after the accepted ones is *recovered* (drawn at the
first rejection) or, when all k are accepted, the *bonus* token (from p_{k+1}).

Two rules, each exact (the committed tokens are distributed as tokens sampled
from p one at a time):

* ``standard`` (Leviathan et al. 2023, Algorithm 1; `verify` below):

      accept x_i  iff  u_i * q_i(x_i) < p_i(x_i),   u_i ~ U[0, 1)     (P = min(1, p/q))
      first rejection at i: recovered token from the residual max(0, p_i - q_i) / Z
      all k accepted:       bonus token from p_{k+1}

  exact because min(p, q) + max(0, p - q) = p for every token. It accepts with
  the highest possible probability, α = Σ min(p, q), for any draft.

* ``gumbel`` (coupled): y_i is drawn from p_i with position t+i-1's randomness,
  x_i is accepted iff x_i = y_i, and y_i is emitted at the first disagreement
  (y_{k+1} is the bonus token). The emitted token at every position is y, the very
  token plain seeded sampling draws there, so the output is token for token the
  plain seeded sample for every k and every drafter — exact trivially, by
  induction over positions. For a deterministic drafter (q = δ_x: prompt lookup,
  suffix decoding) it accepts with probability p(x) = min(1, p(x)/q(x)), exactly
  the standard rule's, and the recovered token is distributed as the standard
  residual max(0, p - δ_x)/Z = p restricted to y ≠ x; for a draft model that draws
  x_i with the *same* Gumbel noise as y_i (`draft_stream = "sample"`), it accepts
  iff the two noisy argmaxes agree, with probability at least (1 - TV)/(1 + TV),
  TV = 1 - α (Gumbel-max coupling: Daliri, Musco, Suresh 2024, "Coupling without
  Communication and Drafter-Invariant Speculative Decoding", Theorem 1) — less
  than the standard rule's α, the price of drafter-invariant output.
"""

from __future__ import annotations

from typing import Protocol

import torch

from .sampling import Randomness


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Residual distribution max(0, p - q) / Z  (Leviathan et al. 2023, eq. in §2.3).

    Args:
        p: [V] float32 target probabilities.
        q: [V] float32 draft probabilities (zero-padded to V).

    Returns:
        [V] float32. Normalised by division by its sum Z = 1 - Σ min(p, q)
        (never a softmax, never an epsilon floor). When Z == 0 (p == q, so a
        rejection has probability 0) it falls back to p, so no NaN can appear.
    """
    r = (p - q).clamp_min(0.0)
    z = r.sum()
    if not z > 0:
        return p
    return r / z


def alpha(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Acceptance rate α = Σ_x min(p(x), q(x)) = 1 - TV(p, q), batched (torch).

    The standard rule's probability of accepting a draft drawn from q. Not to be
    confused with α̂ = accepted / drafted, the *draft acceptance rate* counted in
    `verispec.decoding.Stats` (a noisy estimate of α). `verispec.theory.alpha`
    computes the same number with input checks, for numpy inputs.

    Args:
        p: [..., V] float target probabilities.
        q: [..., V] float draft probabilities, same shape.

    Returns:
        [...] float: the probability that a token drawn from q is accepted
        (Leviathan et al. 2023, Definition 3.1 / Corollary 3.6).
    """
    return torch.minimum(p, q).sum(-1)


def verify(
    p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, u: torch.Tensor
) -> tuple[int, torch.Tensor]:
    """Verify k draft tokens against one target forward.

    Args:
        p: [k+1, V] float32 warped target probabilities; row i is the target's
            distribution for draft position i+1 given the prefix and x_1..x_i,
            row k is the bonus position.
        q: [k, V] float32 warped draft probabilities that each x_i was drawn
            from (a deterministic drafter reports a point mass).
        x: [k] int64 draft token ids.
        u: [k] float32 uniforms in [0, 1).

    Returns:
        (n, dist): n in 0..k is the number of accepted drafts (counting stops
        at the first rejection); dist is the [V] float32 distribution of the
        one token emitted after them, the residual at position n+1 if n < k,
        else the bonus distribution p[k].
    """
    k = x.shape[0]
    if k == 0:
        return 0, p[0]
    px = p[:k].gather(-1, x[:, None]).squeeze(-1)
    qx = q.gather(-1, x[:, None]).squeeze(-1)
    accepted = u * qx < px
    n = int(accepted.to(torch.int64).cumprod(0).sum())
    if n == k:
        return n, p[k]
    return n, residual(p[n], q[n])


class Rule(Protocol):
    """An acceptance rule: which drafts to keep and which token to emit after them.

    Attributes:
        name: the name reports and the CLI use ("standard", "gumbel", ...).
        draft_stream: the `Randomness` stream a draft model must draw x_i from
            ("draft": independent of the rule's draws; "sample": shared noise).
        uses_uniforms: whether the rule draws `rng.uniform(k, t)` once per round
            with k > 0 (exact enumeration needs to know).
        argmax_under_greedy: optional, default False. True promises that when every p_i
            is a point mass on a*_i (greedy decoding), the rule accepts exactly the
            longest prefix of x equal to a* and then emits a*_{n+1}, whatever q and the
            randomness: `decode` then verifies on the raw logits' argmax, with no warp and
            no q rows. A biased rule (the audit's shortcuts) must not claim it.
    """

    name: str
    draft_stream: str
    uses_uniforms: bool

    def __call__(self, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, rng: Randomness,
                 position: int) -> tuple[int, int]:
        """Verify one round.

        Args:
            p: [k+1, V] float warped target probabilities (row k: bonus position).
            q: [k, V] float warped draft probabilities each x_i was drawn from
                (one-hot rows for a deterministic drafter).
            x: [k] int64 draft token ids (k may be 0: a plain step).
            rng: the decode's randomness.
            position: output position t of x_1 (0 = the first new token).

        Returns:
            (n, y): n in 0..k accepted drafts and the token id y emitted after them
            (recovered at position t+n if n < k, else the bonus token).
        """
        ...


class UniformRule:
    """A `Rule` from a verify function: one uniform per draft, then one categorical draw.

    Draws u = rng.uniform(k, t), calls ``verify_fn(p, q, x, u) -> (n, dist)`` and
    emits ``rng.categorical(dist, t + n)``. The standard rule is
    ``UniformRule(verify, "standard")``; the audit builds its biased shortcuts the
    same way, so every rule runs through the shipped loop.

    Args:
        verify_fn: the pure test, with `verify`'s signature and contract.
        name: the rule's name in reports.
        acceptance_probs: optional ``(p, q, x) -> [k] floats``, P(accept x_i) given
            x_1..x_{i-1} accepted, when the test is "u_i below that" (the exact
            enumeration weighs acceptance patterns with it).
        argmax_under_greedy: the `Rule` promise (True only for an exact test; the
            audit's biased shortcuts leave it False, so the loop runs them in full).
    """

    draft_stream = "draft"
    uses_uniforms = True

    def __init__(self, verify_fn, name: str, acceptance_probs=None, *,
                 argmax_under_greedy: bool = False) -> None:
        self.verify_fn, self.name = verify_fn, name
        self.acceptance_probs = acceptance_probs
        self.argmax_under_greedy = argmax_under_greedy

    def __call__(self, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, rng: Randomness,
                 position: int) -> tuple[int, int]:
        k = x.shape[0]
        n, dist = self.verify_fn(p, q, x, rng.uniform(k, position)) if k else (0, p[0])
        return n, rng.categorical(dist, position + n)

    def __repr__(self) -> str:
        return f"UniformRule({self.name!r})"


def min_one_p_over_q(p: torch.Tensor, q: torch.Tensor, x: torch.Tensor) -> list[float]:
    """P(accept x_i | x_1..x_{i-1} accepted) = min(1, p_i(x_i) / q_i(x_i)), [k] floats
    (Leviathan et al. 2023, §2.3)."""
    px = p[:x.shape[0]].gather(-1, x[:, None]).squeeze(-1).tolist()
    qx = q.gather(-1, x[:, None]).squeeze(-1).tolist()
    return [min(1.0, a / b) if b > 0 else (1.0 if a > 0 else 0.0) for a, b in zip(px, qx)]


class GumbelRule:
    """Coupled rule: emit y_i ~ p_i drawn with position t+i's noise; accept x_i iff x_i = y_i.

    See the module docstring for why it is exact and when it accepts less than
    the standard rule. Draws `rng.categorical(p_i, t + i)` for i = 0..n (stream
    "sample"), no uniforms.
    """

    name = "gumbel"
    draft_stream = "sample"
    uses_uniforms = False
    argmax_under_greedy = True     # y_i ~ p_i is a*_i when p_i is a point mass

    def __call__(self, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, rng: Randomness,
                 position: int) -> tuple[int, int]:
        k = x.shape[0]
        for i in range(k):
            y = rng.categorical(p[i], position + i)
            if y != int(x[i]):
                return i, y
        return k, rng.categorical(p[k], position + k)

    def __repr__(self) -> str:
        return "GumbelRule()"


# with p_i the point mass on a*_i: u·q(x_i) < p(x_i) iff x_i = a*_i (u < 1, q <= 1), and the
# residual max(0, p - q) is nonzero only at a*_i
standard = UniformRule(verify, "standard", min_one_p_over_q, argmax_under_greedy=True)
gumbel = GumbelRule()

#: Rules by name, for the API, the CLI and the audit (a new rule is one class plus one line).
RULES: dict[str, Rule] = {"standard": standard, "gumbel": gumbel}


def resolve_rule(rule: str | Rule, k: int | str, drafters: dict) -> Rule:
    """The acceptance rule a generation uses.

    "auto" picks the coupled rule (`gumbel`) whenever the output must not depend on
    which positions were drafted: with k = "auto" (the policy's choices depend on
    measured times and on earlier calls) and whenever every drafter in use is a
    point mass (prompt lookup: there the coupled rule accepts with the standard
    rule's probability p(x), so it costs nothing). With a fixed k and a draft model
    it picks `standard`, which accepts more (α = Σ min(p, q)) and is reproducible
    for the same (seed, k, drafter).

    Args:
        rule: "auto", a name in `verispec.verify.RULES`, or a `Rule`.
        k: the generation's k (an integer or "auto").
        drafters: name -> drafter in use.

    Raises:
        ValueError: naming `rule` when it is unknown.
    """
    if not isinstance(rule, str):
        return rule
    if rule == "auto":
        if k == "auto":
            return gumbel
        first = next(iter(drafters.values()), None)   # a fixed k drafts with the first one
        return gumbel if first is None or first.point_mass else standard
    if rule not in RULES:
        raise ValueError(f"rule must be auto or one of {', '.join(RULES)}, got {rule!r}")
    return RULES[rule]
