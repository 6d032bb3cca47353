"""Choosing the drafter and the draft length k each round."""

from __future__ import annotations

from .decoding import Drafter, RoundRecord


class FixedPolicy:
    """Always the same drafter and k (k = 0 or drafter None: plain decoding).

    Raises:
        ValueError: if k is negative or not an integer.
    """

    def __init__(self, drafter: Drafter | None, k: int) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"k must be an integer >= 0 (0 = plain decoding), got {k!r}")
        self.drafter = drafter if k > 0 else None
        self.k = k if drafter is not None else 0

    def choose(self) -> tuple[Drafter | None, int]:
        return self.drafter, self.k

    def observe(self, record: RoundRecord) -> None:
        pass
