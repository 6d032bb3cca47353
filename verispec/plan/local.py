"""``--hardware local``: measure this machine's two roofline ceilings with torch.

* memory bandwidth: ``torch.sum`` over a 1 GiB float32 tensor (a pure streaming read,
  larger than any CPU cache), best of a few runs, bytes / second;
* peak FLOP/s: a float32 1024×1024 by 1024×1024 ``torch.mm`` (2·1024³ FLOPs), best of
  a few runs;
* memory: physical RAM (``os.sysconf``).

These are attained figures (what torch reaches with all intra-op threads), not vendor
peaks, so the stacks used with them (``eager-cpu``, or a fitted one) take efficiency 1
as their starting point. The measurement takes about a second; the result is cached
for the process. On a shared machine, the best of several runs is taken because other
processes only ever slow a run down.
"""

from __future__ import annotations

import os
import time
from functools import lru_cache

from ..models.base import cpu_name, cpu_vector
from .device import Hardware

__all__ = ["local_hardware", "measure_bandwidth", "measure_flops", "physical_memory"]


def _best_seconds(fn, repeats: int, clock=time.perf_counter) -> float:
    fn()   # warm-up: page faults, thread pool start
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        fn()
        best = min(best, clock() - start)
    return best


def measure_bandwidth(nbytes: int = 1 << 30, repeats: int = 5, clock=time.perf_counter) -> float:
    """Read bandwidth in bytes/s: ``nbytes`` of float32 summed by torch, best of ``repeats``.

    ``clock`` (seconds) may be ``time.thread_time`` for a one-thread measurement that
    other processes' load does not stretch.
    """
    import torch

    x = torch.ones(nbytes // 4, dtype=torch.float32)
    return nbytes / _best_seconds(lambda: float(x.sum()), repeats, clock)


def measure_flops(dim: int = 1024, repeats: int = 5, clock=time.perf_counter) -> float:
    """float32 matmul throughput in FLOP/s: 2·dim³ / best seconds of ``torch.mm`` (``clock`` as above)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(dim, dim, generator=gen)
    b = torch.randn(dim, dim, generator=gen)
    seconds = _best_seconds(lambda: torch.mm(a, b), repeats, clock)
    return 2.0 * dim**3 / seconds


def physical_memory() -> float | None:
    """Physical RAM in bytes, or None where ``os.sysconf`` cannot tell."""
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


CLOCKS = ("wall", "thread")


@lru_cache(maxsize=2)
def local_hardware(clock: str = "wall") -> Hardware:
    """This machine as a Hardware (one device), measured once per process and clock.

    ``clock="wall"``: wall-clock seconds with all of torch's threads (what the machine
    gives when idle). ``clock="thread"``: one thread, timed in that thread's CPU seconds
    (``time.thread_time``), which other processes' load does not stretch - the ceilings
    of a one-thread machine, for ``--calibrate-clock thread`` on a shared computer.

    Raises:
        ValueError: naming ``--calibrate-clock`` for another clock.
    """
    import torch

    if clock not in CLOCKS:
        raise ValueError(f"--calibrate-clock must be one of {', '.join(CLOCKS)}, got {clock!r}")
    threads = torch.get_num_threads()
    if clock == "thread":
        torch.set_num_threads(1)
    try:
        timer = time.thread_time if clock == "thread" else time.perf_counter
        bw = measure_bandwidth(clock=timer)
        flops = measure_flops(clock=timer)
    finally:
        torch.set_num_threads(threads)
    label = "1 thread, CPU time" if clock == "thread" else f"{threads} threads"
    return Hardware(name=f"local ({cpu_name()}, {label})", bandwidth=bw, flops=flops, memory=physical_memory(),
                    n_devices=1, kind="cpu", vector=cpu_vector(),
                    source=f"measured {time.strftime('%Y-%m-%d %H:%M')} ({label}): torch.sum over 1 GiB float32, "
                           f"torch.mm 1024^3 float32, best of 5")
