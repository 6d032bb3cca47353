"""Plan speculative decoding for hardware you don't have: cost curve, best k, speedup.

``plan(target, draft, hardware, alpha=...)`` predicts the target's cost curve T_t(n)
for n = 1..k_max+1 and the draft's T_d with a roofline per forward, then applies the
measured-curve speedup of :mod:`verispec.theory` to it:

    T(n) = max(bytes / bandwidth, FLOPs / peak) + overhead          (roofline: Williams,
           bytes = weights · bits/8 + KV cache read at context L      Waterman, Patterson
           FLOPs ≈ 2 · params · n + attention                         2009, CACM 52(4))
           on N devices: bytes/N, FLOPs/N + 2 all-reduces per layer
    S(k) = E(α, k) · T_t(1) / (k · T_d + T_t(k + 1))                 (Leviathan et al. 2023,
    E(α, k) = (1 − α^{k+1}) / (1 − α)                                 Eq. 1 and Thm 3.8, with
                                                                      the measured T_t(n))

Assumptions, all stated in the rooms that make them:

* decoding is memory-bound until n·FLOPs-per-token outgrows bandwidth × arithmetic
  intensity; weights are read once per forward, whatever n (:mod:`.roofline`);
* the software adds a fixed cost per forward and per layer and reaches a fraction of
  the vendor peaks, in a kernel regime that depends on the rows (llama.cpp's mat-vec
  kernels up to 8 rows dequantise the weights per row); these come from separate
  sources (:mod:`.stacks`), from the fit half of published curves
  (``benchmarks/plan/consumer.csv``; scored on the other half), or are fitted on this
  machine (:mod:`.fit`, ``--hardware local --calibrate``);
* acceptance is i.i.d. with rate α (or per position α_i from ``verispec analyze``) and
  does not depend on the hardware; α is the pair's, T is the machine's;
* the draft runs on the same devices, one forward per draft token; prompt lookup costs 0.

Rooms: :mod:`.shapes` (model sizes: config.json, GGUF, dtypes), :mod:`.presets` (well-known
models by name, HF id or Ollama name), :mod:`.resolve` (``--target``/``--draft`` → sizes),
:mod:`.device` (one machine), :mod:`.hardware` (catalogue ``hardware.csv`` and ``--hardware``
specs), :mod:`.local`
(micro-benchmarks of this machine), :mod:`.roofline` (one forward), :mod:`.stacks`
(software overheads and efficiencies per stack; the llama.cpp ones fitted to published
curves), :mod:`.fit` (fit a stack to measured curves), :mod:`.intervals` (prediction
intervals of S(k) and k*, the verdict in words), :mod:`.server_alpha` (α per position
from a running server's /metrics), :mod:`.planner` (the plan), :mod:`.project` (an
analysis.json onto other hardware). The plan's T_t(n) and T_d are a
:class:`verispec.theory.CostCurve` (``Plan.cost_curve``): the one cost model, of which a
stack is a parameterisation.
"""

from .device import Hardware
from .hardware import catalogue, lookup, parse_hardware
from .planner import Plan, alpha_from_tau, break_even_alpha, ceiling, plan
from .presets import PRESETS, get_preset, preset_names
from .project import load_analysis_alphas, project_analysis
from .resolve import load_shape
from .roofline import ForwardTime, Stack, forward_time
from .shapes import (
    ModelShape,
    dtype_bits,
    shape_from_config,
    shape_from_dims,
    shape_from_gguf,
)
from .stacks import STACKS, get_stack

__all__ = [
    "PRESETS",
    "STACKS",
    "ForwardTime",
    "Hardware",
    "ModelShape",
    "Plan",
    "Stack",
    "alpha_from_tau",
    "break_even_alpha",
    "catalogue",
    "ceiling",
    "dtype_bits",
    "forward_time",
    "get_preset",
    "get_stack",
    "load_analysis_alphas",
    "load_shape",
    "lookup",
    "parse_hardware",
    "plan",
    "preset_names",
    "project_analysis",
    "shape_from_config",
    "shape_from_dims",
    "shape_from_gguf",
]
