"""Prompt lookup: draft by continuing an n-gram that already occurred (no model).

Saxena 2023, "Prompt Lookup Decoding": if the last n tokens occurred earlier in
the prompt or the output, propose the tokens that followed that occurrence.
The choice is deterministic given the context, so q is a point mass on each
proposed token. Verification is then still exact in sampling mode: a point-mass
q accepts x with probability min(1, p(x)/1) = p(x), and on rejection the
residual max(0, p - δ_x)/Z is p with x removed and renormalised (the coupled
rule, `verispec.verify.GumbelRule`, does the same with the plain sample itself).
"""

from __future__ import annotations

import time

from collections.abc import Sequence

from .base import DraftSampler


class LookupDrafter:
    """Longest most-recent n-gram match over prompt + generated text.

    Args:
        max_ngram: longest suffix tried first (>= min_ngram).
        min_ngram: shortest suffix accepted as a match (>= 1).

    The index maps every n-gram (n = min..max) to the position right after its
    most recent occurrence; it is extended incrementally as the context grows,
    so a round costs O(max_ngram) dictionary look-ups plus O(new tokens)
    insertions, independent of the prompt length.

    Raises:
        ValueError: for bad n-gram bounds.
    """

    name = "lookup"
    point_mass = True
    alpha_prior = 0.4   # an n-gram match is a weaker promise than a draft model's guess
    forwards = 0
    catchup_seconds = 0.0

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.seconds = 0.0
        self._seq: list[int] = []
        self._index: dict[tuple[int, ...], int] = {}
        self._cached: tuple[int, int] | None = None   # (len(context), match position)

    def _update(self, context: list[int]) -> None:
        seq = self._seq
        if len(context) < len(seq) or context[:len(seq)] != seq:
            self._seq, self._index = [], {}          # a different text: rebuild
            seq = self._seq
        index = self._index
        for j in range(max(len(seq), 1), len(context)):
            # n-grams ending just before position j are followed by context[j]
            for n in range(self.min_ngram, min(self.max_ngram, j) + 1):
                index[tuple(context[j - n:j])] = j
        seq.extend(context[len(seq):])

    def match(self, context: list[int]) -> int | None:
        """Position in `context` where the continuation of the longest match starts.

        Returns:
            j such that context[j - n:j] == context[-n:] for the largest n in
            max_ngram..min_ngram with an earlier occurrence (most recent one),
            or None when no suffix occurred before.
        """
        if self._cached is not None and self._cached[0] == len(context) and self._seq == context:
            return self._cached[1]
        start = time.perf_counter()
        self._update(context)
        found = None
        for n in range(min(self.max_ngram, len(context) - 1), self.min_ngram - 1, -1):
            j = self._index.get(tuple(context[-n:]))
            if j is not None:
                found = j
                break
        self._cached = (len(context), found)
        self.seconds += time.perf_counter() - start
        return found

    def available(self, context: Sequence[int]) -> int:
        """How many tokens a proposal could hold now (0 = no match)."""
        j = self.match(context)
        return 0 if j is None else len(context) - j

    def propose(self, context: list[int], k: int,
                sample: DraftSampler | None = None) -> tuple[list[int], None]:
        """Propose up to k tokens following the most recent longest match.

        Returns:
            (x, None): x holds min(k, available) token ids (maybe none); q is a
            point mass on each (None).
        """
        j = self.match(context)
        return ([] if j is None else list(context[j:j + k])), None

    def rollback(self, committed: list[int]) -> None:
        pass  # the index only ever holds committed text

    def reset(self) -> None:
        self._seq, self._index, self._cached = [], {}, None
