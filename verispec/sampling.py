"""Logits -> warped float32 probabilities, and injectable randomness.

The same `warp` is applied to the target's logits (giving p) and to the draft's
logits (giving q) at every position. Speculative sampling is exact only for the
distributions it is handed, so p and q must both be the *post-warp*
distributions the tokens are actually drawn from (Leviathan et al. 2023, §2.3;
Chen et al. 2023, Algorithm 2).

Temperature 0 means greedy: the warped distribution is a point mass on the
argmax (ties broken towards the lowest token id, as `torch.argmax` does), so
greedy decoding is the special case of sampling with point-mass p and q.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """Warps applied identically to p and q.

    Attributes:
        temperature: >= 0. 0 means greedy (point mass on the argmax).
        top_k: keep the k most likely tokens; 0 disables the filter.
        top_p: keep the smallest set of most likely tokens whose mass is >= top_p;
            in (0, 1], 1.0 disables the filter (nucleus sampling, Holtzman et al. 2020).

    Raises:
        ValueError: naming the argument, for any value outside its range.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or not 0 <= self.temperature < math.inf:
            raise ValueError(f"temperature must be finite and >= 0 (0 = greedy), got {self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = no top-k filter), got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 = no nucleus filter), got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def warp(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Turn logits into the distribution tokens are sampled from.

    Args:
        logits: [..., V] any float dtype.
        config: temperature, top-k, top-p.

    Returns:
        [..., V] float32 probabilities summing to 1 over the last axis
        (float64 logits stay float64, for exact enumeration). Greedy
        gives a one-hot vector at the argmax. Order of warps follows HF
        `generate()`: temperature, then top-k, then top-p.
    """
    if logits.dtype != torch.float64:
        logits = logits.float()
    if config.greedy:
        out = torch.zeros_like(logits)
        out.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        return out
    logits = logits / config.temperature
    vocab = logits.shape[-1]
    if 0 < config.top_k < vocab:
        kth = torch.topk(logits, config.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if config.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # mass strictly before each token; keep a token while that mass < top_p
        before = sorted_probs.cumsum(-1) - sorted_probs
        drop_sorted = before >= config.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


class Randomness(Protocol):
    """Where every random number of a decode comes from.

    Injecting it (instead of using torch's global RNG) gives per-call seeds and
    lets `verispec.audit` replace the coins with exact enumeration.
    """

    def categorical(self, probs: torch.Tensor) -> int:
        """Draw one token id from probs ([V] float32, sums to 1)."""
        ...

    def uniform(self, n: int) -> torch.Tensor:
        """[n] float32 uniforms on [0, 1), for the acceptance test."""
        ...


class TorchRandomness:
    """`Randomness` backed by a private `torch.Generator` seeded per call.

    Args:
        seed: integer seed; None draws a fresh seed from the OS.
    """

    def __init__(self, seed: int | None = None) -> None:
        self.generator = torch.Generator()
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(int(seed))

    def categorical(self, probs: torch.Tensor) -> int:
        if int(torch.count_nonzero(probs)) == 1:  # exact point mass (greedy): no draw
            return int(probs.argmax())
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def uniform(self, n: int) -> torch.Tensor:
        return torch.rand(n, generator=self.generator)
