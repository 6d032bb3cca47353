"""Software stacks: the overheads and efficiencies the roofline needs, and where they come from.

No constant here was fitted to the published speedups the planner is validated against
(``benchmarks/plan/published.md``); each comes from a separate source:

``compiled`` - graph-captured or compiled decoding (XLA on TPU, CUDA graphs, torch.compile:
    gpt-fast, vLLM, TensorRT-LLM). From gpt-fast's README (pytorch-labs/gpt-fast, A100-80GB
    power-limited to 330 W, batch 1): "peak bandwidth is about 1700 GB/s" of the 2039 GB/s
    datasheet figure → bandwidth_efficiency = 1700/2039 = 0.834. Llama-2-7B bf16 runs at
    104.9 tok/s = 9.53 ms/token, of which 13.21 GB / 1.70 TB/s = 7.77 ms is the weight read:
    the remaining 1.76 ms over 32 layers gives per_layer = 55 µs (the small per-layer
    kernels: norms, rotary, attention, residual adds). Its tensor-parallel rows (7B on
    2/4/8 GPUs: 168.8/254.0/328.4 tok/s) leave 4.3/3.7/4.9 µs per all-reduce after
    the weight read and the per-layer cost: allreduce_latency = 4.5 µs. With these, the
    same table's Llama-2-70B tensor-parallel rows (2/4/8 GPUs), not used to set them,
    are predicted within 5 % (benchmarks/plan/published.md). compute_efficiency = 0.7
    is an assumption (large bf16 GEMMs reach 70-80 % of dense peak); at batch 1 and
    n <= 16 no catalogued GPU is compute-bound for a model above 1B, so it rarely matters.

``eager`` - PyTorch eager with Hugging Face transformers on a GPU. The GPU is idle while
    Python dispatches each operator, and kernels are enqueued asynchronously, so a forward
    costs max(device time, host time) (``overhead_overlaps``). Host time per token and per
    layer is what ``benchmarks/plan/eager_overhead.py`` measures on a CPU with a model too
    narrow to compute (hidden size 64): greedy ``generate()``, 0.56 ms per token + 0.36 ms
    per layer in thread CPU time on this project's 2-core Xeon VM
    (``benchmarks/plan/eager_overhead.json``). It leaves out CUDA launch latency (no GPU
    here), so it underestimates a GPU host's time; a faster host CPU dispatches faster.
    Efficiencies as ``compiled``.

``eager-cpu`` - the same host costs on a CPU, where the cores that dispatch also compute:
    T = roofline + overhead; efficiencies 1 because ``--hardware local`` measures attained
    (not vendor) bandwidth and FLOP/s. ``--hardware local --calibrate MODEL`` fits a stack
    for one backend from a real model's cost curve instead (:mod:`verispec.plan.fit`).

``llamacpp-cuda``, ``llamacpp-metal``, ``llamacpp-cpu`` - llama.cpp's quantised kernels,
    fitted (``stacks.json`` beside this file, written by ``benchmarks/plan/fit_consumer.py``)
    to the fit half of the published cost curves in ``benchmarks/plan/consumer.csv``
    (llama-bench tables posted in llama.cpp's pull requests for RTX cards and Apple
    silicon) and, for the CPU, to this machine's measured curves. Each carries the
    kernel regime of up to 8 rows (MMVQ / mul_mv_ext: weights dequantised once per row)
    and the scatter of its fit (``sigma_log_ratio``, ``sigma_log_time``) from which
    :mod:`verispec.plan.intervals` draws prediction intervals.

Default stack per machine (:func:`default_stack`): Apple silicon → ``llamacpp-metal``,
consumer RTX cards → ``llamacpp-cuda``, CPUs → ``llamacpp-cpu`` (``local``: ``eager-cpu``
unless calibrated), datacenter GPUs and TPUs → ``compiled``.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path

from .device import Hardware
from .roofline import Stack

__all__ = ["STACKS", "default_stack", "get_stack", "load_stack", "save_stack"]

_GPT_FAST = "pytorch-labs/gpt-fast README (A100-80GB at 330 W; Llama-2-7B bf16 single-GPU and tensor-parallel rows)"
_EAGER_SRC = "benchmarks/plan/eager_overhead.json (HF generate(), Llama of hidden 64, 1 host thread, 2-core Xeon VM)"

# measured by benchmarks/plan/eager_overhead.py (see that JSON for the samples and machine load)
_EAGER_PER_FORWARD_S = 0.56e-3
_EAGER_PER_LAYER_S = 0.36e-3

# Scatter of the built-in stacks (for intervals), from their own checks: the RMS log error
# of the 16 scored published speedups (benchmarks/plan/published.md: 0.20), of gpt-fast's
# absolute ms/token (0.03), and of this machine's llama.cpp curve (cpu.md: 0.08).
_SIGMA_PUBLISHED, _SIGMA_GPT_FAST, _SIGMA_CPU = 0.20, 0.03, 0.08

STACKS: dict[str, Stack] = {
    "compiled": Stack("compiled", per_forward_s=0.0, per_layer_s=55e-6, bandwidth_efficiency=0.834,
                      compute_efficiency=0.7, allreduce_latency_s=4.5e-6, overhead_overlaps=False,
                      sigma_log_ratio=_SIGMA_PUBLISHED, sigma_log_time=_SIGMA_GPT_FAST, source=_GPT_FAST),
    "eager": Stack("eager", per_forward_s=_EAGER_PER_FORWARD_S, per_layer_s=_EAGER_PER_LAYER_S,
                   bandwidth_efficiency=0.834, compute_efficiency=0.7, allreduce_latency_s=4.5e-6,
                   overhead_overlaps=True, sigma_log_ratio=_SIGMA_PUBLISHED, sigma_log_time=_SIGMA_PUBLISHED,
                   source=f"{_EAGER_SRC}; efficiencies: {_GPT_FAST}"),
    "eager-cpu": Stack("eager-cpu", per_forward_s=_EAGER_PER_FORWARD_S, per_layer_s=_EAGER_PER_LAYER_S,
                       bandwidth_efficiency=1.0, compute_efficiency=1.0, overhead_overlaps=False,
                       sigma_log_ratio=_SIGMA_CPU, sigma_log_time=_SIGMA_CPU, source=_EAGER_SRC),
}


def _fitted() -> dict[str, Stack]:
    """The stacks fitted to published curves (stacks.json), by name."""
    data = json.loads(resources.files(__package__).joinpath("stacks.json").read_text(encoding="utf-8"))
    return {name: Stack(name=name, **fields) for name, fields in data["stacks"].items()}


STACKS.update(_fitted())


def default_stack(hardware: Hardware) -> str:
    """The stack most people run on ``hardware`` (see the module doc)."""
    if hardware.name.startswith("local"):
        return "eager-cpu"
    if hardware.kind == "apple":
        return "llamacpp-metal"
    if hardware.kind == "cpu":
        return "llamacpp-cpu"
    if hardware.kind == "gpu" and hardware.name.startswith("RTX"):
        return "llamacpp-cuda"
    return "compiled"


def load_stack(path: str | os.PathLike) -> Stack:
    """A stack saved by :func:`save_stack` (e.g. a local calibration).

    Raises:
        ValueError: naming ``--stack`` when the file is not a stack JSON.
    """
    try:
        data = json.loads(Path(path).read_text())
        return Stack(**data)
    except (OSError, json.JSONDecodeError, TypeError) as e:
        raise ValueError(f"--stack: cannot read a stack from {path}: {e}") from e


def save_stack(stack: Stack, path: str | os.PathLike) -> None:
    """Write a stack as JSON (what :func:`load_stack` reads)."""
    Path(path).write_text(json.dumps(stack.as_dict(), indent=1) + "\n")


def get_stack(spec: str | Stack | None, default: str = "compiled") -> Stack:
    """A named stack, a stack JSON file, or the default.

    Raises:
        ValueError: naming ``--stack`` and listing the names when ``spec`` is neither.
    """
    if isinstance(spec, Stack):
        return spec
    spec = default if spec is None else str(spec).strip()
    if spec in STACKS:
        return STACKS[spec]
    if spec.endswith(".json") or os.path.exists(spec):
        return load_stack(spec)
    raise ValueError(f"--stack: unknown stack {spec!r}; choose {', '.join(STACKS)} or a stack .json file")
