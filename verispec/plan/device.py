"""One machine as the cost model sees it: a :class:`Hardware` (the leaf room of the planner).

Kept apart from the catalogue (:mod:`.hardware`) and the local measurement
(:mod:`.local`) so that both can build one without importing each other.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["KINDS", "Hardware"]

# what kind of processor runs the forward; the per-stack cost model picks its default
# software stack by it (verispec.plan.stacks.default_stack)
KINDS = ("gpu", "apple", "cpu", "tpu")


@dataclass(frozen=True)
class Hardware:
    """Per-device ceilings and the device count.

    Attributes:
        name: label.
        bandwidth: memory bandwidth per device, bytes/s (> 0).
        flops: peak FLOP/s per device, or None when unknown (then a plan refuses, asking
            for ``flops=``). NVIDIA: dense fp16 tensor throughput (GeForce: with fp32
            accumulate, as llama.cpp and PyTorch use); Apple: GPU fp32 ALU peak (fp16 runs
            at the same rate); CPUs: fp32 FMA vector peak at base clock.
        memory: device memory in bytes, or None when unknown (no fit check).
        n_devices: devices the model is split over (tensor parallel), >= 1.
        link_bandwidth: interconnect bytes/s per device for all-reduces (None: unknown;
            only needed when n_devices > 1, then the latency term alone is used).
        kind: "gpu", "apple", "cpu", "tpu" or "" (unknown: a spec string).
        vector: the widest vector/matrix unit ("tensor", "avx512", "avx2", "neon", ...).
        source: where the figures come from.
    """

    name: str
    bandwidth: float
    flops: float | None = None
    memory: float | None = None
    n_devices: int = 1
    link_bandwidth: float | None = None
    kind: str = ""
    vector: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        if not (isinstance(self.bandwidth, (int, float)) and self.bandwidth > 0):
            raise ValueError(f"--hardware: bandwidth must be > 0 bytes/s, got {self.bandwidth!r}")
        for field in ("flops", "memory", "link_bandwidth"):
            value = getattr(self, field)
            if value is not None and not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"--hardware: {field} must be > 0, got {value!r}")
        if isinstance(self.n_devices, bool) or not isinstance(self.n_devices, int) or self.n_devices < 1:
            raise ValueError(f"--hardware: n (devices) must be an integer >= 1, got {self.n_devices!r}")
        if self.kind not in KINDS + ("",):
            raise ValueError(f"--hardware: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")

    @property
    def label(self) -> str:
        return self.name if self.n_devices == 1 else f"{self.n_devices}x {self.name}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
