"""Calibration: timing this machine once, before the first round, as the cost model's prior.

* The target: forwards over n = 1..n_max new tokens after the prompt (`time_target`),
  timed with `verispec.timing.time_forwards` (the code `verispec analyze` times with:
  one warm-up, then `repeats` rounds interleaved over n), the median of each kept.
  Measuring every n beats extrapolating (CPU matmul cost is far from linear in n).
  Costs about (repeats + 1) · Σ_n T_t(n) seconds.
* The drafters that can time themselves (`SupportsCalibrate`, a draft model): reading a
  prefix of the context (work their first catch-up does anyway) -> (seconds per
  caught-up token, seconds per drafted token), the priors of their catch-up cost and T_d.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from ..drafters.base import Drafter, SupportsCalibrate
from ..models.base import CausalLM
from ..timing import Clock, time_forwards

__all__ = ["time_target", "time_drafters"]


def time_target(target: CausalLM, context: Sequence[int], n_max: int, *, repeats: int = 3,
                clock: Clock = time.perf_counter) -> dict[int, float]:
    """Median seconds of a target forward over n = 1..n_max new tokens after `context`.

    Leaves the target's cache holding context[:-1] (the state `decode` starts from);
    widths that would overflow the context length are skipped.

    Args:
        target: the target model.
        context: prompt token ids (len >= 1); its last token is the filler of the forwards.
        n_max: widest forward timed (tokens, >= 1).
        repeats: timed runs per n after one warm-up run.
        clock: seconds, monotonic (injectable for tests).

    Returns:
        {n: median seconds} for the n that fit.

    Raises:
        ValueError: if `context` is empty.
    """
    context = list(context)
    if not context:
        raise ValueError("calibrate needs a context of at least one token")
    target.rollback_to(context)
    if len(target.tokens) < len(context) - 1:
        target.forward(context[len(target.tokens):-1], keep=1)
    base = len(target.tokens)
    filler = [context[-1]] * n_max
    ns = [n for n in range(1, n_max + 1) if base + n <= target.context_length]
    timed = time_forwards(target, [filler[:n] for n in ns], repeats=repeats, warmup=1, clock=clock)
    return {n: statistics.median(values) for n, values in zip(ns, timed)}


def time_drafters(drafters: dict[str, Drafter], context: Sequence[int]) -> dict[str, tuple[float, float]]:
    """Ask each drafter that can (`SupportsCalibrate`) to time reading a prefix of `context`.

    Returns:
        {name: (seconds per caught-up token, seconds per drafted token)} for the drafters
        that measured something.
    """
    out = {}
    for name, drafter in drafters.items():
        timed = drafter.calibrate(context) if isinstance(drafter, SupportsCalibrate) else None
        if timed is not None:
            out[name] = timed
    return out
