"""Fit a software stack to measured cost curves on this machine (``--calibrate``).

Given measured T(n) of one or more models on one backend (llama.cpp, transformers) and
the machine's measured ceilings (:func:`verispec.plan.local.local_hardware`), choose the
stack's free parameters - the per-forward and per-layer overheads, the attainable
fractions of bandwidth and FLOP/s, and how far memory and arithmetic overlap
(:data:`LOCAL_PARAMS`) - to minimise the squared log
error of the roofline's T(n) (:func:`verispec.plan.roofline.forward_time`) over every
measured point: relative errors, so a 30 ms model and a 300 ms model weigh alike.
``scipy.optimize.least_squares`` (trust-region reflective, with bounds) from a few
starting points; the best is kept.

Fit on some models and predict another: fitting and scoring the same model proves
nothing (``benchmarks/plan/validate_cpu.py`` fits on SmolLM2-135M and the 0.5B draft and
predicts the 1.5B target).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from scipy.optimize import least_squares

from .device import Hardware
from .resolve import load_shape
from .roofline import Stack, forward_time
from .shapes import ModelShape

__all__ = ["FIT_PARAMS", "LOCAL_PARAMS", "calibrate", "fit_stack", "measure_curve"]

# parameter: (lower bound, upper bound, starting values, typical scale)
FIT_PARAMS: dict[str, tuple[float, float, tuple[float, ...], float]] = {
    "per_forward_s": (0.0, 1.0, (1e-3,), 1e-3),
    "per_layer_s": (0.0, 0.1, (1e-4,), 1e-4),
    "bandwidth_efficiency": (0.02, 1.5, (0.5, 1.0), 0.5),
    "compute_efficiency": (0.02, 1.5, (0.3, 1.0), 0.5),
    "overlap": (0.0, 1.0, (0.0, 1.0), 0.5),
}
# what a local calibration fits: overheads, both efficiencies, and how far loads and
# arithmetic overlap on these cores (the data decide between max and sum)
LOCAL_PARAMS = ("per_forward_s", "per_layer_s", "bandwidth_efficiency", "compute_efficiency", "overlap")


def _predict(stack: Stack, shape: ModelShape, hardware: Hardware, ns: Sequence[int], context: int) -> np.ndarray:
    return np.array([forward_time(shape, hardware, stack, n, context).total_s for n in ns])


def fit_stack(curves: Sequence[tuple[ModelShape, Sequence[float]]], hardware: Hardware, *, context: int,
              name: str = "fitted", base: Stack | None = None,
              params: Sequence[str] = ("per_forward_s", "per_layer_s", "bandwidth_efficiency",
                                       "compute_efficiency")) -> Stack:
    """Fit ``params`` of a stack to measured curves.

    Args:
        curves: (shape, times) pairs; ``times[n-1]`` = measured seconds of a forward over
            n new tokens after ``context`` cached tokens, n = 1..len(times).
        hardware: the machine's ceilings (bandwidth bytes/s, FLOP/s).
        context: the cache length the curves were timed at (tokens).
        name: the fitted stack's name.
        base: values of the parameters not fitted (default: efficiencies 1, no overhead,
            host and device in series).
        params: which of :data:`FIT_PARAMS` to fit (at least one).

    Returns:
        Stack with the fitted values; ``source`` records the fit's RMS log error.

    Raises:
        ValueError: for an unknown parameter, no curves, or a non-positive time.
    """
    unknown = [p for p in params if p not in FIT_PARAMS]
    if unknown or not params:
        raise ValueError(f"params must be a non-empty subset of {list(FIT_PARAMS)}, got {list(params)}")
    if not curves:
        raise ValueError("fit_stack needs at least one measured curve")
    for shape, times in curves:
        if not len(times) or any(not (t > 0 and math.isfinite(t)) for t in times):
            raise ValueError(f"{shape.name}: measured times must be positive and finite")
    stack, residuals = _fit_continuous(curves, hardware, context, replace(base or Stack(name), name=name), params)
    rms = float(np.sqrt(np.mean(residuals ** 2)))
    # the scatter that remains, for prediction intervals: of log T(n)/T(1), and of log T
    ratio_res, start = [], 0
    for _, times in curves:
        res = residuals[start:start + len(times)]
        ratio_res.extend(res[1:] - res[0])
        start += len(times)
    ratio_rms = float(np.sqrt(np.mean(np.square(ratio_res)))) if ratio_res else rms
    names = ", ".join(shape.name for shape, _ in curves)
    return replace(stack, sigma_log_ratio=ratio_rms, sigma_log_time=rms,
                   source=f"fitted to {names} on {hardware.name} at context {context}: RMS log error {rms:.3f}")


def _fit_continuous(curves, hardware: Hardware, context: int, base: Stack,
                    params: Sequence[str]) -> tuple[Stack, np.ndarray]:
    """Least-squares fit of ``params`` from every combination of their starting values;
    returns the best stack and its log residuals."""
    logs = [np.log(np.asarray(times, dtype=float)) for _, times in curves]

    def make(x: np.ndarray) -> Stack:
        return replace(base, **{p: float(v) for p, v in zip(params, x)})

    def residuals(x: np.ndarray) -> np.ndarray:
        stack = make(x)
        return np.concatenate([np.log(_predict(stack, shape, hardware, range(1, len(times) + 1), context)) - lt
                               for (shape, times), lt in zip(curves, logs)])

    lower = [FIT_PARAMS[p][0] for p in params]
    upper = [FIT_PARAMS[p][1] for p in params]
    best = None
    for start in itertools.product(*(FIT_PARAMS[p][2] for p in params)):
        res = least_squares(residuals, np.array(start, dtype=float), bounds=(lower, upper), method="trf",
                            x_scale=np.array([FIT_PARAMS[p][3] for p in params]))
        if best is None or res.cost < best.cost:
            best = res
    return make(best.x), best.fun


def measure_curve(model, n_max: int = 8, context: int = 200, repeats: int = 5, warmup: int = 1,
                  clock=time.perf_counter) -> list[float]:
    """Median seconds of a forward over n = 1..n_max new tokens after ``context`` tokens.

    ``model`` is a loaded :class:`verispec.models.base.CausalLM`; timing is
    :func:`verispec.timing.time_forwards` (repeats interleaved over n, cache rolled back)
    with ``clock`` (seconds).
    """
    # the backends' base class (torch): loaded only when calibrating
    from ..timing import time_forwards

    vocab = max(2, min(model.vocab_size, 30000))
    ids = [(1000 + 37 * i) % vocab for i in range(context + n_max)]
    model.truncate(0)
    model.forward(ids[:context], keep=1)
    samples = time_forwards(model, [ids[context:context + n] for n in range(1, n_max + 1)],
                            repeats=repeats, warmup=warmup, clock=clock)
    return [float(np.median(s)) for s in samples]


def calibrate(models: Sequence[str], backend: str, hardware: Hardware, *, context: int = 200, n_max: int = 8,
              repeats: int = 5, clock: str = "wall") -> tuple[Stack, dict]:
    """Load registered models on ``backend``, measure their curves, fit a stack.

    ``clock="thread"`` (llama.cpp only) runs the models on one thread and times them in
    that thread's CPU seconds, as ``hardware`` must then have been measured
    (``local_hardware("thread")``): on a shared machine other processes' load stretches
    wall-clock times by up to 10x, CPU time hardly.

    Returns:
        (stack, {"context": ..., "curves": {model: [seconds, ...]}, "seconds": wall time}).

    Raises:
        ValueError: for a model that cannot be loaded or sized, or an unknown backend.
    """
    from ..api import load_model  # torch and the backends: loaded only when calibrating

    if clock not in ("wall", "thread"):
        raise ValueError(f"--calibrate-clock must be wall or thread, got {clock!r}")
    if clock == "thread" and backend != "llamacpp":
        raise ValueError("--calibrate-clock thread needs --backend llamacpp (one llama.cpp thread computes on the "
                         "timing thread; torch's intra-op threads would escape the clock)")
    threads = {"n_threads": 1} if clock == "thread" else {}
    timer = time.thread_time if clock == "thread" else time.perf_counter
    start = time.perf_counter()
    curves, raw = [], {}
    for name in models:
        shape = load_shape(name, flag="--calibrate")
        if backend == "transformers":
            shape = shape.with_dtype("float32")   # the transformers backend runs float32 on a CPU
        model = load_model(name, backend=backend, fetch_missing=False, **threads)
        times = measure_curve(model, n_max=n_max, context=context, repeats=repeats, clock=timer)
        del model
        curves.append((shape, times))
        raw[name] = times
    # one model cannot separate per-forward from per-layer costs: fit one overhead then
    params = LOCAL_PARAMS if len(models) > 1 else tuple(p for p in LOCAL_PARAMS if p != "per_layer_s")
    stack = fit_stack(curves, hardware, context=context, name=f"{backend}@local", params=params)
    return stack, {"context": context, "curves": raw, "clock": clock, "seconds": time.perf_counter() - start}
