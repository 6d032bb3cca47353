"""A fixed drafter and k, and `make_policy`: the policy `generate(k=...)` asks for.

The contract every policy meets is `verispec.decoding.Policy` (`choose` -> (drafter, k)
before a round, `observe` after it, `verify_width`): the decode loop's side of it.
"""

from __future__ import annotations

import time

from collections.abc import Sequence

from ..decoding import Policy, RoundRecord
from ..drafters.base import Drafter
from .adaptive import AdaptivePolicy, check_k_max

__all__ = ["FixedPolicy", "make_policy", "check_k"]


def check_k(k) -> None:
    """Raise ValueError naming `k` unless it is an integer >= 0."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be an integer >= 0 (0 = plain decoding) or 'auto', got {k!r}")


class FixedPolicy(Policy):
    """Always the same drafter and k (k = 0 or drafter None: plain decoding).

    Raises:
        ValueError: if k is negative or not an integer.
    """

    def __init__(self, drafter: Drafter | None, k: int) -> None:
        check_k(k)
        self.drafter = drafter if k > 0 else None
        self.k = k if drafter is not None else 0

    def choose(self, seq: Sequence[int]) -> tuple[Drafter | None, int]:
        return self.drafter, self.k

    def observe(self, record: RoundRecord) -> None:
        pass


def make_policy(k: int | str, drafters: dict[str, Drafter], *, k_max: int = 8, **kwargs):
    """Build the policy for `generate(k=...)`.

    Args:
        k: an integer >= 0 (fixed; the first available drafter, model before
            lookup) or "auto" (`AdaptivePolicy`, which may also pick k = 0).
        drafters: name -> drafter; may be empty (then always plain decoding).
        k_max: largest draft length the adaptive policy considers (tokens, >= 1).
        **kwargs: further `AdaptivePolicy` options (ignored for a fixed k).

    Returns:
        A `FixedPolicy` or an `AdaptivePolicy`.

    Raises:
        ValueError: naming `k` when it is neither, or `k_max` when it is not an integer
            >= 1 (checked for a fixed k too, so a bad setting never passes silently).
    """
    check_k_max(k_max)
    if k == "auto":
        kwargs.setdefault("clock", time.perf_counter)   # the round overhead reads the wall clock
        return AdaptivePolicy(drafters, k_max=k_max, **kwargs)
    check_k(k)
    drafter = next(iter(drafters.values()), None)
    return FixedPolicy(drafter, k)
