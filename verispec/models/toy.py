"""A model given by an explicit next-token function of the whole prefix.

Used by exact enumeration (`verispec.audit`) and by tests: it implements the
same `CausalLM` protocol as the real backends, so the shipped decode loop,
caching and rollback run unchanged on it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .base import CausalLM


class FunctionModel(CausalLM):
    """`CausalLM` whose logits at each position are `fn(prefix)`.

    Args:
        fn: maps the prefix (tuple of ints, prompt included) to [V] logits
            (float64 recommended for exact enumeration; -inf for impossible
            tokens). Use `log_probs` to turn a probability table into logits.
        vocab_size: V.
        eos_token_ids: ids that end generation.
        context_length: maximum tokens.
        name: label.
    """

    backend = "toy"

    def __init__(self, fn: Callable[[tuple[int, ...]], torch.Tensor], vocab_size: int,
                 eos_token_ids: Sequence[int] = (), context_length: int = 1 << 20,
                 name: str = "toy") -> None:
        super().__init__()
        self.fn = fn
        self.vocab_size = vocab_size
        self.eos_token_ids = frozenset(eos_token_ids)
        self.context_length = context_length
        self.name = name

    def _extend(self, tokens: list[int], keep: int) -> torch.Tensor:
        prefix = tuple(self.tokens)
        rows = []
        for t in tokens:
            prefix = prefix + (t,)
            rows.append(torch.as_tensor(self.fn(prefix)))
        return torch.stack(rows[len(rows) - keep:])

    def _truncate(self, length: int) -> None:
        pass  # the "cache" is self.tokens, truncated by the base class


def log_probs(probs: Sequence[float]) -> torch.Tensor:
    """Logits (float64) whose softmax is exactly `probs` (zeros become -inf)."""
    return torch.tensor(probs, dtype=torch.float64).log()
