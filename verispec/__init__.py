"""verispec: exact (lossless) speculative decoding, and the maths to know when it pays."""

from .api import GenerationResult, SpeculativeDecoder, load_model
from .sampling import SamplingConfig, TorchRandomness, warp

__all__ = ["SpeculativeDecoder", "GenerationResult", "load_model", "SamplingConfig",
           "TorchRandomness", "warp"]
__version__ = "0.1.0"
