"""How an audit runs the shipped loop: a fresh policy per run, one thread for toy models.

Both audits run `verispec.decoding.decode` many times (the exact one replays it once
per execution path, the statistical one once per sample), and every run must start
from the same state: policies learn (k, α) as they go, and drafters index the text
they saw, so each run gets a *fresh* policy from a factory. A drafter given alone
is run as ``FixedPolicy(drafter, k)``; the enumerator also needs to know which
policy state two paths must share to be merged (`state_key`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ..policy import FixedPolicy

__all__ = ["policy_factory", "state_key", "single_thread"]


def policy_factory(drafter_or_policy_factory, k: int | None) -> Callable[[], Any]:
    """A zero-argument callable building a fresh policy for each run.

    Args:
        drafter_or_policy_factory: a `Drafter` (→ ``FixedPolicy(drafter, k)``; a
            model-free drafter that indexes the text should be given through a
            factory instead, so every run gets a fresh index), a zero-argument
            callable returning a fresh policy, or None (plain decoding).
        k: draft length, required with a drafter, ignored otherwise.

    Raises:
        ValueError: a drafter without k.
        TypeError: a policy instance (stateful: runs would share it) or anything else.
    """
    obj = drafter_or_policy_factory
    if obj is None:
        return lambda: FixedPolicy(None, 0)
    if hasattr(obj, "propose"):             # a Drafter: FixedPolicy(drafter, k)
        if k is None:
            raise ValueError("k is required when a drafter (not a policy factory) is given")
        return lambda: FixedPolicy(obj, k)
    if hasattr(obj, "choose"):
        raise TypeError("pass a policy *factory* (a zero-argument callable returning a fresh "
                        "policy), not a policy instance")
    if not callable(obj):
        raise TypeError(f"expected a drafter or a policy factory, got {type(obj).__name__}")
    return obj


def state_key(policy) -> Callable[[list[tuple[int, int]]], Hashable]:
    """The part of `policy`'s state two paths must share to continue alike.

    Returns:
        ``history -> key``, where history is the run's [(k, accepted)] per round:
        the policy's own ``audit_state()`` when it defines one, None for a
        `FixedPolicy` (stateless), else the whole history (always safe).
    """
    state = getattr(policy, "audit_state", None)
    if state is not None:
        return lambda history: state()
    if type(policy) is FixedPolicy:
        return lambda history: None
    return lambda history: tuple(history)


@contextmanager
def single_thread() -> Iterator[None]:
    """One intra-op thread: toy tensors are tiny, and on a busy machine waking
    OpenMP workers costs ~100x the work (a [3, 6] softmax: 1 us vs 130 us)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
