"""verispec: exact (lossless) speculative decoding, and the maths to know when it pays."""

from .sampling import SamplingConfig, TorchRandomness, warp
from .verify import acceptance_rate, residual, verify

__all__ = ["SamplingConfig", "TorchRandomness", "warp", "verify", "residual", "acceptance_rate"]
__version__ = "0.1.0"
