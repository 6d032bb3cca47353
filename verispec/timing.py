"""Timing model forwards: the measurements behind the cost curve T_t(n).

Used by `verispec analyze` (the reported curve) and by the adaptive policy's
calibration (its prior), so both time forwards the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from .models.base import CausalLM

Clock = Callable[[], float]


def time_forwards(model: CausalLM, batches: Sequence[Sequence[int]], *, keep_all: bool = True,
                  repeats: int = 5, warmup: int = 1, clock: Clock = time.perf_counter) -> list[list[float]]:
    """Seconds of `model.forward(batch)` for each batch, on the current cache.

    The repeats are interleaved (round r times every batch once, then round
    r + 1), so a burst of load from other processes hits every batch alike
    instead of skewing one point of the curve. The cache is rolled back with
    `truncate` after every forward.

    Args:
        model: a model whose cache holds the context to time against.
        batches: the new tokens of each forward (batch j has n_j tokens).
        keep_all: keep all n rows of logits (a verification forward) or only the last.
        repeats: timed rounds (>= 1).
        warmup: untimed rounds first (>= 0).
        clock: seconds, monotonic (injectable for tests).

    Returns:
        [len(batches)] lists of `repeats` durations in seconds; the cache is
        back at its starting length.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats}, {warmup}")
    base = len(model.tokens)
    batches = [list(b) for b in batches]
    samples: list[list[float]] = [[] for _ in batches]
    for i in range(warmup + repeats):
        for j, tokens in enumerate(batches):
            start = clock()
            model.forward(tokens, keep=len(tokens) if keep_all else 1)
            elapsed = clock() - start
            model.truncate(base)
            if i >= warmup:
                samples[j].append(elapsed)
    return samples
