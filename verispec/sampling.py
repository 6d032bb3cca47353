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

import hashlib
import math
import secrets
from dataclasses import dataclass
from typing import Protocol

import numpy as np
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
    """Where every random number of a decode comes from, keyed by output position.

    Every draw names the absolute output position t it is for (0 = the first new
    token) and a *stream* (what it is used for), so the number drawn for (t, stream)
    never depends on how many numbers earlier rounds consumed, on k, on the drafter,
    or on earlier calls. The streams used by the shipped loop:

    * ``"sample"``: the token emitted at position t (plain decoding, the residual or
      bonus token, and y_t of the coupled rule). A draft model under the coupled
      rule draws x_t from this stream too (shared noise).
    * ``"draft"``: x_t drawn by a draft model under the standard rule (independent of
      the target's draws, as Leviathan et al. 2023, Algorithm 1 requires).
    * ``"accept"``: u_t of the acceptance test u_t · q(x_t) < p(x_t).

    Injecting it (instead of using torch's global RNG) gives per-call seeds and lets
    `verispec.audit` replace the coins with exact enumeration (which may ignore the keys).
    """

    def categorical(self, probs: torch.Tensor, position: int, stream: str = "sample") -> int:
        """Draw one token id for output position `position` from probs ([V] float, sums to 1)."""
        ...

    def uniform(self, n: int, position: int) -> torch.Tensor:
        """[n] float32 uniforms on [0, 1) for positions position..position+n-1 (stream "accept")."""
        ...


def _key(seed: int, position: int, stream: str) -> int:
    """63-bit generator seed for (seed, position, stream): a BLAKE2b hash, so keys of
    nearby positions or seeds give unrelated streams."""
    digest = hashlib.blake2b(f"{seed}/{position}/{stream}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class SeededRandomness:
    """`Randomness` keyed by (seed, position, stream): reproducible whatever the policy does.

    Each draw seeds a private numpy PCG64 generator from a hash of the key, so the random numbers used at output position t are a function of
    (seed, t, stream) alone. Categorical draws use the exponential race, which is
    Gumbel-max in another form (Gumbel 1954; Maddison et al. 2014, "A* Sampling", §2):

        y = argmax_i p_i / E_i,   E_i ~ Exp(1) i.i.d.   =>   P(y = i) = p_i / Σ_j p_j

    (argmax p_i / E_i = argmax log p_i + G_i with G_i = −log E_i Gumbel-distributed).
    Two distributions drawn with the same key share the noise E, which is what the
    coupled acceptance rule (`verispec.verify.GumbelRule`) relies on. A point mass
    (greedy) is returned without drawing.

    Args:
        seed: integer seed; None draws a fresh 63-bit seed from the OS, readable as
            ``.seed`` afterwards, so any sample can be replayed.

    Raises:
        ValueError: if seed is not an integer.
    """

    def __init__(self, seed: int | None = None) -> None:
        if seed is None:
            seed = secrets.randbits(63)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an integer or None, got {seed!r}")
        self.seed = int(seed)

    def generator(self, position: int, stream: str) -> np.random.Generator:
        """A fresh numpy PCG64 generator seeded for (self.seed, position, stream)."""
        return np.random.Generator(np.random.PCG64(_key(self.seed, position, stream)))

    def categorical(self, probs: torch.Tensor, position: int, stream: str = "sample") -> int:
        if int(torch.count_nonzero(probs)) == 1:  # exact point mass (greedy): no draw
            return int(probs.argmax())
        e = self.generator(position, stream).standard_exponential(probs.shape[-1], dtype=np.float32)
        return int(torch.argmax(probs / torch.from_numpy(e)))

    def uniform(self, n: int, position: int) -> torch.Tensor:
        return torch.tensor([self.generator(position + i, "accept").random(dtype=np.float32)
                             for i in range(n)], dtype=torch.float32)


#: The name earlier releases used; kept so existing code keeps working.
TorchRandomness = SeededRandomness
