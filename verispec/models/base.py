"""The small model protocol every backend implements.

A model owns a KV cache indexed by position. The decode loop only ever asks
for two things: "append these tokens and give me the logits after each", and
"forget everything after position n". Nobody outside a backend knows its cache
layout; rollback after a rejection is one `truncate` call.
"""

from __future__ import annotations

import contextlib
import platform
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo's "model name"; elsewhere `platform`'s guess)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cpu_vector() -> str:
    """The widest SIMD extension /proc/cpuinfo lists: "avx512", "avx2" or "neon" ("neon" on
    any arm64 without one), else "". Machines sold under one CPU name differ in it (two
    "AMD EPYC" VMs here, one with AVX-512 and one without), and llama.cpp's kernels with it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith(("flags", "Features"))), [])
    except OSError:
        flags = []
    for flag, name in (("avx512f", "avx512"), ("avx2", "avx2"), ("asimd", "neon"), ("neon", "neon")):
        if flag in flags:
            return name
    return "neon" if platform.machine() in ("arm64", "aarch64") else ""


class CausalLM(ABC):
    """Base class for a causal LM with a position-indexed KV cache.

    Attributes:
        tokens: token ids whose keys/values are in the cache (list[int]).
        vocab_size: V, the number of logits per position (may exceed the
            tokenizer's length when embeddings are padded).
        context_length: the most tokens the model can attend to.
        eos_token_ids: ids that end generation.
        tokenizer: a Hugging Face-style tokenizer or None (toy models).
        name: human-readable name for statistics.
        backend: the `BACKENDS` name this class implements ("" for a model outside the table).
        forward_seconds: wall seconds spent in `_extend`, accumulated.
    """

    backend: str = ""
    vocab_size: int
    context_length: int
    eos_token_ids: frozenset[int] = frozenset()
    tokenizer = None
    name: str = "model"
    # seconds inside forward() spent waiting for other sequences' rows (a batching server's
    # slot, `verispec.batching`); not in forward_seconds
    waited_seconds: float = 0.0

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.forward_seconds = 0.0
        self.forwards = 0

    @classmethod
    def open(cls, spec: str, *, fetch_missing: bool = True, **options) -> "CausalLM":
        """Load a model by registered name, directory, file or hub id
        (`verispec.api.load_model` calls it with the options its `BACKENDS` line lists).

        Backends override it; this default refuses, for a backend whose models are
        only built in code.

        Raises:
            ValueError: naming `spec`.
        """
        raise ValueError(f"{cls.__name__} cannot load {spec!r} by name; build the model in code "
                         "and pass the object instead")

    # -- backend hooks -------------------------------------------------
    @abstractmethod
    def _extend(self, tokens: list[int], keep: int) -> torch.Tensor:
        """Append tokens to the cache; return [keep, V] logits of the last `keep` positions."""

    @abstractmethod
    def _truncate(self, length: int) -> None:
        """Drop cache entries at positions >= length."""

    # -- protocol --------------------------------------------------------
    def forward(self, tokens: Sequence[int], keep: int | None = None) -> torch.Tensor:
        """Append `tokens` to the cache and score them.

        Args:
            tokens: n >= 1 new token ids.
            keep: return only the last `keep` rows (None = all n). Backends
                skip the output layer for the others (a long prefill then
                never materialises n x V logits).

        Returns:
            [min(keep, n), V] float32 logits; row -1 is the next-token logits
            after self.tokens + tokens (row i of the full [n, V] is the
            next-token logits after self.tokens + tokens[: i + 1]).

        Raises:
            ValueError: if the cache would exceed `context_length`.
        """
        tokens = list(tokens)
        if len(self.tokens) + len(tokens) > self.context_length:
            raise ValueError(
                f"{self.name}: {len(self.tokens) + len(tokens)} tokens exceed the context "
                f"length {self.context_length}; shorten the prompt or max_new_tokens"
            )
        keep = len(tokens) if keep is None else max(1, min(keep, len(tokens)))
        start = time.perf_counter()
        logits = self._extend(tokens, keep)
        self.forward_seconds += time.perf_counter() - start
        self.forwards += 1
        self.tokens.extend(tokens)
        return logits

    def truncate(self, length: int) -> None:
        """Roll the cache back so it holds exactly self.tokens[:length]."""
        if length < len(self.tokens):
            self._truncate(length)
            del self.tokens[length:]

    def rollback_to(self, context: Sequence[int]) -> None:
        """Truncate the cache to its longest common prefix with `context`.

        Keeps at most len(context) - 1 tokens, so a following forward always
        has at least one token to score.
        """
        limit = min(len(self.tokens), len(context) - 1)
        common = limit
        if self.tokens[:limit] != list(context[:limit]):
            common = next(i for i in range(limit) if self.tokens[i] != context[i])
        self.truncate(common)

    def sync(self, context: Sequence[int], keep: int | None = None) -> torch.Tensor:
        """Make the cache hold `context` and return the logits it lacked.

        Args:
            context: the full token sequence, len >= 1.
            keep: as in `forward`.

        Returns:
            [m, V] float32 logits for the last m >= 1 positions of `context`
            (those not already cached, at most `keep`); row -1 is the next-token logits.
        """
        self.rollback_to(context)
        return self.forward(context[len(self.tokens):], keep)

    def decoding(self) -> contextlib.AbstractContextManager:
        """A context the decode loop holds for a whole generation: backend settings that
        speed the hot path and must not outlive it (llama.cpp: torch kept to one thread).
        Default: nothing."""
        return contextlib.nullcontext()

    def reset(self) -> None:
        """Empty the cache, even when an exception left it out of step with `tokens`."""
        try:
            self._truncate(0)
        finally:
            self.tokens.clear()


def eos_token_ids(tokenizer=None, *configs) -> frozenset[int]:
    """Token ids that end generation, from configs (`eos_token_id`: int or list) and a tokenizer.

    Args:
        tokenizer: a Hugging Face-style tokenizer (its `eos_token_id`), or None.
        *configs: objects with an `eos_token_id` attribute (generation config,
            model config), or None.

    Returns:
        The union of all ids found (may be empty).
    """
    ids: set[int] = set()
    for source in configs:
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(int(v) for v in value)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)
