"""The decayed mean every online estimate of the policy is made of.

Vocabulary: an observation x_t arrives at round t; with decay λ in (0, 1] the mean is

    m_t = Σ_s λ^(t-s) · x_s / Σ_s λ^(t-s)        (total / weight, both decayed)

so an observation `age` rounds old weighs λ^age: the estimate follows a text (or a
machine) that drifts, and `weight` counts the observations it rests on (a pseudo-count:
`prior_weight` in the shrinkage formulas of `verispec.policy.alphas` is in the same unit).

Guard: a non-finite value (NaN or ±inf, e.g. the exact α of a round whose warped p was
NaN) is refused, so no estimate built from `Decayed` is ever non-finite.
"""

from __future__ import annotations

import math

__all__ = ["Decayed"]


class Decayed:
    """Exponentially decayed mean: weight `decay`**age for each observation.

    Attributes:
        total: Σ λ^age · x (the unit of x).
        weight: Σ λ^age (observations; 0 before the first).
    """

    __slots__ = ("total", "weight")

    def __init__(self) -> None:
        self.total, self.weight = 0.0, 0.0

    def add(self, value: float, decay: float) -> bool:
        """Age the past by `decay` and add `value` with weight 1.

        Returns:
            True if stored; False (nothing changes) for a non-finite `value`.
        """
        if not math.isfinite(value):
            return False
        self.total = self.total * decay + value
        self.weight = self.weight * decay + 1.0
        return True

    def scale(self, factor: float) -> None:
        """Keep `factor` (in [0, 1]) of the weight, mean unchanged (a weaker prior)."""
        self.total *= factor
        self.weight *= factor

    @property
    def mean(self) -> float:
        """total / weight (ZeroDivisionError before the first observation: check `weight`)."""
        return self.total / self.weight
