"""What one generation may spend: its tokens left, and the seconds probes may lose.

Vocabulary:

* R - tokens left in the generation's budget, max_new_tokens minus the tokens
  committed since its first round (`start(max_new_tokens)`; inf when not told).
* spent - decoding seconds observed in this generation (target + draft + catch-up).
* probe loss - what one probe of a drafter cost beyond plain decoding: its round's
  seconds minus T_t(1) per token it committed, >= 0; `explored` sums them over this
  generation, and each drafter keeps a decayed mean of its losses across generations.
* charge - the seconds a drafter must spend reading context it lacks before drafting
  (its catch-up), paid before the first token it drafts.

The two rules (`AdaptivePolicy` asks both before drafting):

* a catch-up pays when drafting at the predicted speedup S for the rest of the budget
  saves more than it costs: R · T_t(1) · (1 - 1/S) > charge (the time of R tokens at
  T_t(1) each, shortened by the factor 1/S; Leviathan et al. 2023, Theorem 3.8, S);
* a probe fits the ration when explored + max(its typical loss, its charge) <=
  explore_fraction · spent, so a short answer is not slowed down by a probe of a draft
  model that has to read the whole prompt first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .decayed import Decayed

__all__ = ["Budget"]


class Budget:
    """Tokens left and the exploration ration of the current generation.

    Args:
        drafters: the drafter names probes may be charged to.
        explore_fraction: largest share of `spent` that probes may lose, in [0, 1].
        decay: weight of the past per new probe loss, in (0, 1).

    Attributes:
        probe_loss: drafter -> decayed mean of its probes' losses (seconds; kept
            across generations: they belong to the machine).
        spent, explored: seconds of this generation, and of them lost to probes.
    """

    def __init__(self, drafters: Iterable[str], *, explore_fraction: float, decay: float) -> None:
        self.explore_fraction, self.decay = explore_fraction, decay
        self.probe_loss = {name: Decayed() for name in drafters}
        self.spent = 0.0
        self.explored = 0.0
        self.max_new_tokens: int | None = None
        self.prompt_length: int | None = None    # len(seq) at the generation's first round

    def start(self, max_new_tokens: int | None) -> None:
        """A new generation of at most `max_new_tokens` tokens (None: unknown, never short)."""
        self.spent = self.explored = 0.0
        self.max_new_tokens, self.prompt_length = max_new_tokens, None

    def remaining(self, seq: Sequence[int]) -> float:
        """R, tokens left after the committed `seq` (inf when the budget is unknown);
        the first call of a generation fixes its prompt length."""
        if self.max_new_tokens is None:
            return float("inf")
        if self.prompt_length is None:
            self.prompt_length = len(seq)
        return max(0, self.max_new_tokens - (len(seq) - self.prompt_length))

    def pays_for(self, speedup: float, charge: float, seq: Sequence[int], t1: float) -> bool:
        """Whether drafting at `speedup` for the rest of the budget saves more than
        `charge` seconds: R · T_t(1) · (1 - 1/S) > charge, T_t(1) = `t1` seconds."""
        if charge <= 0:
            return True
        if speedup <= 1.0:
            return False
        return self.remaining(seq) * t1 * (1.0 - 1.0 / speedup) > charge

    def may_probe(self, name: str, charge: float = 0.0) -> bool:
        """Whether a probe of drafter `name` fits the ration now (its typical loss, or
        the catch-up `charge` in seconds it would pay now if larger)."""
        loss = self.probe_loss[name]
        expected = max(loss.mean if loss.weight else 0.0, charge)
        return self.explored + expected <= self.explore_fraction * self.spent

    def spend(self, seconds: float) -> None:
        """A round took `seconds` (>= 0)."""
        self.spent += seconds

    def lose(self, name: str, seconds: float) -> None:
        """A probe of drafter `name` lost `seconds` (>= 0) against plain decoding."""
        self.explored += seconds
        self.probe_loss[name].add(seconds, self.decay)
