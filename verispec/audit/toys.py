"""Toy models for audits: small float64 models whose every distribution is known exactly.

Exact enumeration multiplies probabilities along every execution path, so it needs
models with a tiny vocabulary, deterministic logits and float64 precision; the
statistical audit can use them too (seconds instead of minutes). All three are
`verispec.models.toy.FunctionModel`s, so the shipped decode loop, caching and
rollback run on them unchanged:

* `toy_random_model`: logits that depend on the whole prefix (a hash of it seeds
  them), so a bug that mixes up positions, or forgets to roll a cache back,
  changes the output distribution;
* `toy_fixed_model`: the same distribution at every position (hand-checkable);
* `seed_example`: the acceptance-criterion chapter's four-token example,
  p = (0.5, 0.3, 0.15, 0.05), q = (0.6, 0.2, 0.1, 0.1), at every position.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import numpy as np
import torch

from ..models.toy import FunctionModel, log_probs

__all__ = ["toy_random_model", "toy_fixed_model", "seed_example"]


def toy_random_model(vocab_size: int, seed: int = 0, *, sharpness: float = 1.5,
                     eos_token_ids: Sequence[int] = (), name: str | None = None,
                     zero_ids: Sequence[int] = ()) -> FunctionModel:
    """A `FunctionModel` whose float64 logits depend on the whole prefix.

    The logits at a position are Gaussian (scale `sharpness`), drawn from a
    generator seeded with a CRC32 hash of (seed, prefix), so the next-token
    distribution changes with every earlier token. Deterministic and cached.

    Args:
        vocab_size: V.
        seed: selects the model (different seeds give different models).
        sharpness: standard deviation of the logits (larger = peakier).
        eos_token_ids: ids that end generation.
        name: label; defaults to "toy-V-seed".
        zero_ids: ids given probability exactly 0 at every position.

    Returns:
        A `FunctionModel` with [V] float64 logits per position.
    """
    cache: dict[tuple[int, ...], torch.Tensor] = {}
    zero = list(zero_ids)

    def fn(prefix: tuple[int, ...]) -> torch.Tensor:
        out = cache.get(prefix)
        if out is None:
            h = zlib.crc32(np.asarray((seed, *prefix), dtype=np.int64).tobytes())
            gen = torch.Generator().manual_seed(h)
            out = torch.randn(vocab_size, generator=gen, dtype=torch.float64) * sharpness
            if zero:
                out[zero] = -math.inf
            cache[prefix] = out
        return out

    return FunctionModel(fn, vocab_size, eos_token_ids=eos_token_ids,
                         name=name or f"toy-{vocab_size}-{seed}")


def toy_fixed_model(probs: Sequence[float], *, eos_token_ids: Sequence[int] = (),
                    name: str = "toy-fixed") -> FunctionModel:
    """A `FunctionModel` with the same next-token distribution `probs` at every position.

    Args:
        probs: V probabilities (zeros allowed: those tokens get logit -inf).
        eos_token_ids: ids that end generation.
        name: label.
    """
    logits = log_probs(probs)
    return FunctionModel(lambda prefix: logits, len(probs), eos_token_ids=eos_token_ids, name=name)


def seed_example() -> tuple[FunctionModel, FunctionModel]:
    """(target, draft) with p = (0.5, 0.3, 0.15, 0.05) and q = (0.6, 0.2, 0.1, 0.1).

    The four-token example of the acceptance-criterion chapter, at every position
    (α = Σ min(p, q) = 0.85).
    """
    return (toy_fixed_model((0.5, 0.3, 0.15, 0.05), name="seed-p"),
            toy_fixed_model((0.6, 0.2, 0.1, 0.1), name="seed-q"))
