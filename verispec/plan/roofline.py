"""The cost of one forward: a roofline plus the software's fixed costs.

For a forward that scores n new tokens (per sequence) after ``context`` cached tokens,
batch B, on ``N`` devices (tensor parallel, Megatron-style: every weight matrix split
N ways; Shoeybi et al. 2019):

    memory   = (weight_bytes + B · context · kv_bytes_per_token) / N / (bandwidth · e_bw)
    compute  = FLOPs(n, context, B) / N / (peak · e_flops)
    roofline = max(memory, compute)                       (Williams et al. 2009; with
             + (1 − overlap) · min(memory, compute)        overlap < 1 when the same cores
                                                           load and multiply, as on a CPU)
    comm     = 2 · layers · (latency + 2 (N − 1)/N · n · B · d_model · act_bytes / link)   if N > 1
    overhead = per_forward + per_layer · layers
    T(n)     = roofline + comm + overhead                 (host and device in series)
             = max(roofline + comm, overhead)             (``overhead_overlaps``: an eager
                                                          framework enqueues GPU kernels
                                                          asynchronously, so host time and
                                                          device time overlap)

The compute term runs at ``e_flops`` of peak, or, for forwards of at most
``small_batch_rows`` rows, at the stack's small-batch efficiency: the kernel regime of
llama.cpp's mat-vec kernels, which dequantise every weight block once per row (the
reason a 5-token verification on an Apple GPU can cost twice one token).

FLOPs(n, L, B) ≈ B · (2 · decode_params · n + attention), see
:meth:`verispec.plan.shapes.ModelShape.flops`. The all-reduce term is a ring all-reduce
(two per layer: after attention and after the MLP) whose payload is n·B·d_model
activations. ``e_bw`` and ``e_flops`` are the fractions of the vendor peaks a real
kernel reaches; they and the overheads belong to the software :class:`Stack`.

Assumptions (stated, not hidden): weights are read once per forward whatever n is (the
reason verification is cheap: Leviathan et al. 2023, Sec. 3.4); activations and the
KV-cache writes are negligible next to the weights; the LM head is computed for all n
rows (a verification forward keeps all of them); the draft runs on the same devices as
the target, one forward per draft token.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from .device import Hardware
from .shapes import ModelShape

__all__ = ["ForwardTime", "Stack", "forward_time"]


@dataclass(frozen=True)
class Stack:
    """The software's share of a forward: fixed costs and attainable fractions of peak.

    Attributes:
        name: label ("compiled", "eager", or a fitted local backend).
        per_forward_s: seconds per forward (Python, sampling glue, the LM-head launch...).
        per_layer_s: seconds per decoder layer per forward (kernel launches / small
            kernels that do not scale with the model's width).
        bandwidth_efficiency: fraction of the vendor memory bandwidth reached, in (0, 1.5]
            (a fit on a CPU can exceed 1 when the weights stay in a large cache).
        compute_efficiency: fraction of the vendor peak FLOP/s reached, in (0, 1.5].
        allreduce_latency_s: seconds per all-reduce beyond the bandwidth term (N > 1).
        overhead_overlaps: host overhead runs concurrently with device work
            (asynchronous GPU launches): T = max(device, overhead) instead of the sum.
        overlap: how far weight reads and arithmetic overlap, in [0, 1]: 1 is the pure
            roofline max(memory, compute) (GPUs: separate memory system and tensor
            cores); 0 is their sum. Only fitted stacks (:mod:`verispec.plan.fit`) use < 1.
        small_batch_rows: forwards of up to this many rows run the stack's mat-vec
            kernels (llama.cpp: MMVQ on CUDA, mul_mv_ext on Metal, both <= 8 rows), which
            dequantise the weights once per row; 0: one kernel regime for every n.
        small_batch_compute_efficiency: fraction of peak FLOP/s those kernels reach
            (0: the same as ``compute_efficiency``).
        sigma_log_ratio: fitted scatter (standard deviation of the log error) of
            T(n)/T(1) on the stack's fit set; 0 when not fitted (no interval then).
        sigma_log_time: the same for absolute T(1) (so for c = T_d / T_t(1)).
        source: where the numbers come from.
    """

    name: str
    per_forward_s: float = 0.0
    per_layer_s: float = 0.0
    bandwidth_efficiency: float = 1.0
    compute_efficiency: float = 1.0
    allreduce_latency_s: float = 0.0
    overhead_overlaps: bool = False
    overlap: float = 1.0
    small_batch_rows: int = 0
    small_batch_compute_efficiency: float = 0.0
    sigma_log_ratio: float = 0.0
    sigma_log_time: float = 0.0
    source: str = ""

    def __post_init__(self) -> None:
        if not (isinstance(self.overlap, (int, float)) and 0.0 <= self.overlap <= 1.0):
            raise ValueError(f"stack {self.name}: overlap must be in [0, 1], got {self.overlap!r}")
        for field in ("per_forward_s", "per_layer_s", "allreduce_latency_s", "sigma_log_ratio", "sigma_log_time"):
            value = getattr(self, field)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"stack {self.name}: {field} must be >= 0 seconds, got {value!r}")
        for field in ("bandwidth_efficiency", "compute_efficiency"):
            value = getattr(self, field)
            if not (isinstance(value, (int, float)) and 0 < value <= 1.5):
                raise ValueError(f"stack {self.name}: {field} must be in (0, 1.5], got {value!r}")
        if not 0.0 <= self.small_batch_compute_efficiency <= 1.5:
            raise ValueError(f"stack {self.name}: small_batch_compute_efficiency must be in [0, 1.5], "
                             f"got {self.small_batch_compute_efficiency!r}")
        if isinstance(self.small_batch_rows, bool) or not isinstance(self.small_batch_rows, int) \
                or self.small_batch_rows < 0:
            raise ValueError(f"stack {self.name}: small_batch_rows must be an integer >= 0, got {self.small_batch_rows!r}")

    def compute_efficiency_at(self, n: int) -> float:
        """The fraction of peak FLOP/s a forward over ``n`` rows reaches (its kernel regime)."""
        if n <= self.small_batch_rows and self.small_batch_compute_efficiency > 0:
            return self.small_batch_compute_efficiency
        return self.compute_efficiency

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ForwardTime:
    """One predicted forward, in seconds, with its parts.

    Attributes:
        n: new tokens per sequence scored by the forward.
        memory_s, compute_s: the two roofline terms (per device).
        comm_s: all-reduce time (0 on one device).
        overhead_s: the stack's fixed cost.
        total_s: the forward's predicted wall time.
        bound: "memory", "compute" or "overhead" - the largest term.
    """

    n: int
    memory_s: float
    compute_s: float
    comm_s: float
    overhead_s: float
    total_s: float
    bound: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def forward_time(shape: ModelShape, hardware: Hardware, stack: Stack, n: int, context: int = 0,
                 batch: int = 1) -> ForwardTime:
    """Predicted seconds of one forward over ``n`` new tokens (see the module doc).

    Args:
        shape: the model's sizes.
        hardware: per-device bandwidth (bytes/s), peak FLOP/s, device count N.
        stack: overheads and efficiencies of the software that runs it.
        n: new tokens per sequence, integer >= 1 (k + 1 for a verification forward).
        context: tokens already in the KV cache (for an encoder-decoder also the
            encoder length), integer >= 0.
        batch: sequences per forward, integer >= 1.

    Returns:
        ForwardTime (seconds).

    Raises:
        ValueError: naming ``n``, ``context`` or ``batch`` when out of range, or
            ``--hardware`` when its peak FLOP/s is unknown.
    """
    for name, value, low in (("n", n, 1), ("context", context, 0), ("batch", batch, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if hardware.flops is None:
        raise ValueError(f"--hardware: {hardware.name} has no published peak FLOP/s; add the vendor's "
                         f"figure as '{hardware.name},flops=<TFLOP/s>'")
    devices = hardware.n_devices
    kv_tokens = context * (2 if shape.cross_attention else 1)
    bytes_read = shape.weight_bytes + batch * kv_tokens * shape.kv_bytes_per_token()
    memory_s = bytes_read / devices / (hardware.bandwidth * stack.bandwidth_efficiency)
    rows = n * batch    # the weight matrices see n·batch rows, whatever sequence they belong to
    compute_s = shape.flops(n, context, batch) / devices / (hardware.flops * stack.compute_efficiency_at(rows))
    comm_s = 0.0
    if devices > 1:
        payload = n * batch * shape.d_model * shape.kv_bits / 8.0
        per = stack.allreduce_latency_s
        if hardware.link_bandwidth:
            per += 2.0 * (devices - 1) / devices * payload / hardware.link_bandwidth
        comm_s = 2 * shape.n_layers * per
    overhead_s = stack.per_forward_s + stack.per_layer_s * shape.n_layers
    device_s = max(memory_s, compute_s) + (1.0 - stack.overlap) * min(memory_s, compute_s) + comm_s
    total_s = max(device_s, overhead_s) if stack.overhead_overlaps else device_s + overhead_s
    parts = {"memory": memory_s, "compute": compute_s, "overhead": overhead_s}
    bound = max(parts, key=parts.get)
    return ForwardTime(n=n, memory_s=memory_s, compute_s=compute_s, comm_s=comm_s,
                       overhead_s=overhead_s, total_s=total_s, bound=bound)
