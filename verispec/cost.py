"""Measuring the cost curve on this machine: T_t(n), n = 1..K+1, and T_d.

Notation as in `verispec.theory`: T_t(n) is the seconds of one target forward that
scores n new tokens (verifying k drafts costs T_t(k+1)); T_d the seconds per draft
token (one draft forward; for prompt lookup, one matching round). The measured curve
replaces Leviathan et al.'s (2023, Theorem 3.8) constant cost ratio c = T_d / T_t(1)
and its assumption T_t(k+1) = T_t(1).

How (`measure_cost_curve`): the target's cache is filled with a realistic prefix, then
every forward is timed `repeats` times after `warmup` untimed runs, rounds interleaved
over n (`verispec.timing.time_forwards`), the cache rolled back after each; the curve
holds the medians, and every sample is kept to show the noise (`timing_noise`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from .drafters.base import Drafter, DraftSampler
from .drafters.lookup import LookupDrafter
from .models.base import CausalLM
from .sampling import SamplingConfig, SeededRandomness
from .theory import CostCurve
from .timing import Clock, time_forwards

__all__ = ["CostMeasurement", "measure_cost_curve", "time_forward", "timing_noise"]


def _fill(model: CausalLM, prefix: Sequence[int]) -> None:
    """Make the model's cache hold exactly `prefix`."""
    prefix = list(prefix)
    model.rollback_to(prefix + [0])   # keeps at most len(prefix) tokens, the common prefix
    rest = prefix[len(model.tokens):]
    if rest:
        model.forward(rest, keep=1)


def _cycle(tokens: Sequence[int], n: int) -> list[int]:
    """The first n tokens of `tokens` repeated ([0] repeated when empty)."""
    tokens = list(tokens) or [0]
    reps = -(-n // len(tokens))
    return (tokens * reps)[:n]


def time_forward(model: CausalLM, tokens: Sequence[int], *, keep_all: bool = True, repeats: int = 5,
                 warmup: int = 1, clock: Clock = time.perf_counter) -> list[float]:
    """`time_forwards` for one batch of new tokens: `repeats` durations in seconds.

    Raises:
        ValueError: for repeats < 1 or warmup < 0.
    """
    return time_forwards(model, [tokens], keep_all=keep_all, repeats=repeats, warmup=warmup, clock=clock)[0]


@dataclass
class CostMeasurement:
    """The measured cost curve and every sample behind it.

    Attributes:
        curve: medians: T_t(n) for n = 1..K+1 and T_d, seconds.
        target_samples: [K+1] lists of seconds, one list per n.
        draft_samples: seconds per draft token (model) or per lookup round.
        draft_kind: "model", the timed drafter's name ("lookup", "suffix", ...) or "none".
        prefix_tokens: context length (tokens) the forwards were timed after.
        repeats, warmup: timed and untimed runs per point.
        draft_samples_2: seconds of a 2-token draft forward (model only, else None):
            after a fully accepted round `ModelDrafter` feeds x_k and the bonus token.
    """

    curve: CostCurve
    target_samples: list[list[float]]
    draft_samples: list[float]
    draft_kind: str
    prefix_tokens: int
    repeats: int
    warmup: int
    draft_samples_2: list[float] | None = None

    @property
    def draft_time_2(self) -> float | None:
        """T_d(2): median seconds of a 2-token draft forward (None unless a draft model)."""
        return statistics.median(self.draft_samples_2) if self.draft_samples_2 else None

    def as_dict(self) -> dict:
        """JSON-ready: the medians (target_times, draft_time, draft_time_2), c = T_d / T_t(1),
        every sample, the draft kind, prefix_tokens, repeats and warmup."""
        return {"target_times": list(self.curve.target_times), "draft_time": self.curve.draft_time,
                "draft_time_2": self.draft_time_2,
                "c": self.curve.constant_c(), "target_samples": self.target_samples,
                "draft_samples": self.draft_samples, "draft_samples_2": self.draft_samples_2,
                "draft_kind": self.draft_kind,
                "prefix_tokens": self.prefix_tokens, "repeats": self.repeats, "warmup": self.warmup}


def measure_cost_curve(
    target: CausalLM,
    k_max: int,
    context_tokens: Sequence[int],
    *,
    draft: CausalLM | None = None,
    drafter: Drafter | None = None,
    lookup: bool = False,
    prefix_tokens: int = 200,
    repeats: int = 5,
    warmup: int = 1,
    clock: Clock = time.perf_counter,
) -> CostMeasurement:
    """Measure T_t(n), n = 1..K+1, and T_d on this machine.

    The target's cache is filled with `prefix_tokens` tokens of `context_tokens`
    (cycled if shorter; capped so K+1 more fit the context); then a forward over the
    next n tokens is timed `repeats` times after `warmup` runs (rounds interleaved over
    n, see `time_forwards`), rolled back after each; the median is used. T_d is one
    single-token draft forward on the same prefix (draft model; a 2-token forward,
    T_d(2), is timed alongside), or one `drafter.propose` round after the prefix
    (a model-free drafter: prompt lookup, suffix decoding, one of your own; one new
    token per round); 0 when neither is given.

    Args:
        target: the target model (its cache is left holding the prefix).
        k_max: K >= 0; forwards over n = 1..K+1 new tokens are timed.
        context_tokens: token ids to time with (e.g. a prompt and its continuation).
        draft: the draft model, or None.
        drafter: a model-free `Drafter` to time (when `draft` is None); its state
            is left holding the timed context.
        lookup: time a fresh `LookupDrafter` (shorthand for drafter=LookupDrafter()).
        prefix_tokens: context length before the timed forwards.
        repeats, warmup: timed and untimed rounds.
        clock: seconds, monotonic (injectable for tests).

    Returns:
        CostMeasurement (medians in `.curve`, raw samples alongside).

    Raises:
        ValueError: for k_max < 0, repeats < 1 or warmup < 0.
    """
    if isinstance(k_max, bool) or not isinstance(k_max, int) or k_max < 0:
        raise ValueError(f"k_max must be an integer >= 0, got {k_max!r}")
    prefix_tokens = max(1, min(prefix_tokens, target.context_length - (k_max + 1) - 1))
    seq = _cycle(context_tokens, prefix_tokens + k_max + 1 + warmup + repeats)
    prefix, new = seq[:prefix_tokens], seq[prefix_tokens:]
    _fill(target, prefix)
    target_samples = time_forwards(target, [new[:n] for n in range(1, k_max + 2)], repeats=repeats,
                                   warmup=warmup, clock=clock)
    draft_samples: list[float]
    draft_samples_2 = None
    if draft is not None:
        kind = "model"
        _fill(draft, prefix)
        draft_samples, draft_samples_2 = time_forwards(draft, [new[:1], new[:2]], keep_all=False,
                                                       repeats=repeats, warmup=warmup, clock=clock)
    elif drafter is not None or lookup:
        drafter = drafter if drafter is not None else LookupDrafter()
        kind = drafter.name
        drafter.available(prefix)   # index the prefix (untimed)
        sample = DraftSampler(SamplingConfig(), SeededRandomness(0), 0, "draft", target.vocab_size)
        draft_samples = []
        for i in range(warmup + repeats):
            context = prefix + new[:i + 1]
            start = clock()
            drafter.propose(context, max(k_max, 1), sample)
            elapsed = clock() - start
            drafter.rollback(context)
            sample.drafted.clear()
            if i >= warmup:
                draft_samples.append(elapsed)
    else:
        kind, draft_samples = "none", [0.0]
    curve = CostCurve.from_measurements(target_samples, draft_samples)
    return CostMeasurement(curve, target_samples, draft_samples, kind, prefix_tokens, repeats, warmup,
                           draft_samples_2)


def timing_noise(cost_curve: dict, spread: float = 1.5) -> str | None:
    """A warning when the cost-curve samples look disturbed, else None.

    Flags a point whose slowest sample exceeds `spread` x its fastest, and a curve
    that is not non-decreasing in n (a longer forward measured cheaper by more than
    10%): both mean other work shared the machine.

    Args:
        cost_curve: `CostMeasurement.as_dict()` (target_samples, draft_samples,
            target_times).
        spread: the max/min ratio of one point's samples above which it is flagged.
    """
    problems = []
    series = [(f"T_t({n})", s) for n, s in enumerate(cost_curve["target_samples"], start=1)]
    series.append(("T_d", cost_curve["draft_samples"]))
    worst = max(((max(s) / min(s), name) for name, s in series if s and min(s) > 0), default=None)
    if worst and worst[0] > spread:
        problems.append(f"samples of {worst[1]} spread {worst[0]:.1f}x")
    tt = cost_curve["target_times"]
    drops = [n for n in range(1, len(tt)) if tt[n] < 0.9 * tt[n - 1]]
    if drops:
        problems.append("T_t(n) falls at n = " + ", ".join(str(n + 1) for n in drops))
    if not problems:
        return None
    return ("timings look noisy (" + "; ".join(problems) + "): other work probably shared the CPU/GPU; "
            "rerun on an idle machine or with more --repeats")
