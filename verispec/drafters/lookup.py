"""Prompt lookup: draft by copying what followed the last few tokens' most recent occurrence.

Saxena 2023, "Prompt Lookup Decoding": if the last n tokens (n <= 4) occurred earlier in
the prompt or the output, propose the tokens that followed their most recent earlier
occurrence. It is a configuration of the suffix drafter (one index, one code path:
`verispec.drafters.suffix`): matches capped at `max_ngram` tokens, the most recent
occurrence copied instead of the most frequent continuation followed, no cache.
The choice is deterministic given the context, so q is a point mass on each
proposed token and verification stays exact (see `suffix`).
"""

from __future__ import annotations

from collections.abc import Sequence

from .suffix import SuffixDrafter


class LookupDrafter(SuffixDrafter):
    """Longest (<= max_ngram tokens) most-recent n-gram match over prompt + generated text.

    Args:
        max_ngram: longest suffix matched (>= min_ngram).
        min_ngram: shortest suffix accepted as a match (>= 1).
        max_draft: the longest proposal, in tokens.

    The index grows with the context (amortised O(1) per token), so a round costs
    O(max_ngram + k) steps, independent of the prompt length.

    Raises:
        ValueError: for bad n-gram bounds.
    """

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1, max_draft: int = 64) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        # an n-gram match is a weaker promise than a draft model's guess: prior α 0.4
        super().__init__(max_draft=max_draft, min_probability=0.0, max_match=max_ngram,
                         min_match=min_ngram, recent=True, name="lookup", alpha_prior=0.4)
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def match(self, context: Sequence[int]) -> int | None:
        """Position in `context` where the continuation of the longest match starts.

        Returns:
            j such that context[j - n:j] == context[-n:] for the largest n <= max_ngram
            with an earlier occurrence (its most recent one), or None when the context's
            last `min_ngram` tokens never occurred before.
        """
        self._sync(context)
        state, matched = self.index.shorten(*self.index.longest_repeat(), self.max_ngram)
        if matched < self.min_ngram or state <= 0 or not self.index.next[state]:
            return None
        return max(self.index.end[v] for v in self.index.next[state].values())
