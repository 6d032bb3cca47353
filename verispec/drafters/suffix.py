"""Suffix decoding: draft the most frequent continuation of the longest matching suffix.

SuffixDecoding (Oliaro, Jia, Campos & Qiao 2024, "SuffixDecoding: Extreme Speculative
Decoding for Emerging AI Applications", §3) indexes the request's prompt and output
(a per-request tree) and earlier requests' outputs (a global tree), matches the
context's longest suffix, and proposes the continuation that followed it most often,
scoring each drafted token by its empirical frequency. Here the index is an online
suffix automaton (`automaton.SuffixAutomaton`); the same code path, configured to
copy the most recent occurrence of a suffix of at most 4 tokens, is prompt lookup
(Saxena 2023; `lookup.LookupDrafter`).

Each proposal comes with a `Confidence` per position (the continuation's frequency,
the match length it is conditioned on, the occurrences counted); the adaptive policy
learns the acceptance rate α per (match length, frequency) bin and drafts only the
k that pays on this machine's cost curve, or nothing.

The proposal is a deterministic function of the committed context (and of the cache,
which only changes between generations), so q is a point mass on each token and
verification stays exact: the standard rule accepts x with probability p(x) and
resamples from p with x removed; the coupled rule (`verify.gumbel`) returns the plain
seeded sample itself.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from .automaton import SuffixAutomaton
from .base import Confidence, DraftSampler

#: `verispec serve`'s default suffix cache size, in tokens (at most ~32 MB of index).
SERVE_CACHE_TOKENS = 32768


class SuffixCache:
    """Earlier outputs of this decoder (SuffixDecoding's global tree), bounded, LRU by request.

    Args:
        max_tokens: the most tokens of earlier outputs kept, >= 1. Whole outputs are
            evicted, least recently used first (added, or supplied a draft); an output
            longer than `max_tokens` keeps its last `max_tokens` tokens.

    Memory: the index holds at most 2 * max_tokens tokens (evicted outputs stay in it,
    still proposable, until it is rebuilt from the live ones once it holds twice the
    budget: amortised O(1) work per added token), so at most ~4 * max_tokens automaton
    states plus one separator per output.

    Raises:
        ValueError: if max_tokens < 1.
    """

    def __init__(self, max_tokens: int) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"suffix cache size must be an integer >= 1 (tokens), got {max_tokens!r}")
        self.max_tokens = max_tokens
        self.entries: OrderedDict[int, list[int]] = OrderedDict()   # id -> tokens, LRU first
        self.live_tokens = 0
        self.version = 0          # changes whenever the index does
        self._next_id = 0
        self._rebuild()

    def _rebuild(self) -> None:
        self.automaton = SuffixAutomaton()
        self._starts: list[int] = []   # index position where each indexed output starts
        self._ids: list[int] = []
        self.indexed_tokens = 0
        for entry, tokens in self.entries.items():
            self._index(entry, tokens)

    def _index(self, entry: int, tokens: list[int]) -> None:
        self._starts.append(len(self.automaton.tokens))
        self._ids.append(entry)
        self.automaton.extend(tokens)
        self.automaton.append(-1 - entry)   # a separator of its own: no match spans two outputs
        self.indexed_tokens += len(tokens)

    def add(self, tokens: Iterable[int]) -> None:
        """Keep one finished output (token ids; empty outputs are ignored)."""
        tokens = [int(t) for t in tokens][-self.max_tokens:]
        if not tokens:
            return
        entry, self._next_id = self._next_id, self._next_id + 1
        self.entries[entry] = tokens
        self.live_tokens += len(tokens)
        while self.live_tokens > self.max_tokens:
            _, evicted = self.entries.popitem(last=False)
            self.live_tokens -= len(evicted)
        if self.indexed_tokens + len(tokens) > 2 * self.max_tokens:
            self._rebuild()
        else:
            self._index(entry, tokens)
        self.version += 1

    def touch(self, position: int) -> None:
        """Mark the output holding index position `position` as just used (LRU)."""
        i = bisect_right(self._starts, position) - 1
        if i >= 0 and self._ids[i] in self.entries:
            self.entries.move_to_end(self._ids[i])

    def clear(self) -> None:
        """Forget every output."""
        self.entries.clear()
        self.live_tokens = 0
        self.version += 1
        self._rebuild()


class SuffixDrafter:
    """Drafts from a suffix automaton over the prompt, the output, and optionally earlier outputs.

    Args:
        max_draft: the longest proposal, in tokens (>= 1).
        min_probability: stop a proposal where the product of its tokens'
            frequencies falls below this (SuffixDecoding's threshold), in [0, 1].
        max_match: match at most this many trailing context tokens (None: the longest
            suffix that occurred before, however long).
        min_match: the shortest match proposed from, >= 1 (tokens).
        recent: copy what followed the most recent occurrence (prompt lookup) instead
            of following the most frequent continuation.
        cache: earlier outputs to draft from as well (`SuffixCache`), or None.
        name: the drafter's label ("suffix").
        alpha_prior: the α the policy assumes before it has measured any.

    Raises:
        ValueError: for bounds outside those ranges.
    """

    point_mass = True
    forwards = 0

    def __init__(self, *, max_draft: int = 16, min_probability: float = 0.1,
                 max_match: int | None = None, min_match: int = 1, recent: bool = False,
                 cache: SuffixCache | None = None, name: str = "suffix",
                 alpha_prior: float = 0.5) -> None:
        if max_draft < 1:
            raise ValueError(f"max_draft must be >= 1, got {max_draft}")
        if not 0 <= min_probability <= 1:
            raise ValueError(f"min_probability must be in [0, 1], got {min_probability}")
        if min_match < 1 or (max_match is not None and max_match < min_match):
            raise ValueError(f"need 1 <= min_match <= max_match, got {min_match}, {max_match}")
        self.max_draft, self.min_probability = max_draft, min_probability
        self.max_match, self.min_match, self.recent = max_match, min_match, recent
        self.cache, self.name, self.alpha_prior = cache, name, alpha_prior
        self.seconds = 0.0
        self.catchup_seconds = 0.0
        self.reset()

    def reset(self) -> None:
        self.index = SuffixAutomaton()
        self._cache_match = (0, 0)      # (state, length) of the context's suffix in the cache
        self._cache_seen = (-1, 0)      # (cache version, context tokens matched)
        self._forecast: tuple[int, int, list[int], list[Confidence]] | None = None

    # -- keeping the indexes in step with the context ---------------------------
    def _sync(self, context: Sequence[int]) -> None:
        indexed = self.index.tokens
        n = len(indexed)
        if len(context) < n or list(context[:n]) != indexed:   # another text: start over
            self.reset()
            n = 0
        if len(context) > n:
            start = time.perf_counter()
            self.index.extend(int(t) for t in context[n:])
            self.catchup_seconds += time.perf_counter() - start
        cache = self.cache
        if cache is None:
            return
        version, seen = self._cache_seen
        if version != cache.version or seen > len(context):
            state, matched, seen = 0, 0, 0    # the cache changed between generations: rematch
        else:
            state, matched = self._cache_match
        advance = cache.automaton.advance
        for token in context[seen:]:
            state, matched = advance(state, matched, int(token))
        self._cache_match, self._cache_seen = (state, matched), (cache.version, len(context))

    def _candidate(self, automaton: SuffixAutomaton, state: int, matched: int):
        if self.max_match is not None and matched > self.max_match:
            state, matched = automaton.shorten(state, matched, self.max_match)
        if matched < self.min_match or state <= 0:
            return None
        xs, states, freqs, supports = automaton.follow(state, self.max_draft, recent=self.recent)
        confidences, product, score = [], 1.0, 0.0
        for i, (f, support) in enumerate(zip(freqs, supports)):
            product *= f
            if product < self.min_probability:
                break
            score += product    # E[accepted drafts] if frequencies were acceptance probabilities
            confidences.append(Confidence(f, matched + i, support))
        return score, matched, xs[:len(confidences)], confidences, states[:1]

    def forecast(self, context: Sequence[int]) -> tuple[list[int], list[Confidence]]:
        """The proposal after `context` and each token's evidence (at most `max_draft`).

        The better-scoring of two candidates (score: Σ_i Π_{j<=i} frequency_j, then the
        longer match): the longest earlier repeat of the context's suffix within the
        context, and the longest suffix of the context found in the cache.

        Returns:
            (x, confidences): token ids and one `Confidence` each (both empty: nothing to propose).
        """
        key = (len(context), self.cache.version if self.cache is not None else 0)
        cached = self._forecast
        if cached is not None and cached[:2] == key and self.index.tokens == list(context):
            return cached[2], cached[3]
        start = time.perf_counter()
        self._sync(context)
        best = self._candidate(self.index, *self.index.longest_repeat())
        if self.cache is not None:
            other = self._candidate(self.cache.automaton, *self._cache_match)
            if other is not None and (best is None or other[:2] > best[:2]):
                best = other
                if other[4]:
                    self.cache.touch(self.cache.automaton.end[other[4][0]])
        xs, confidences = (best[2], best[3]) if best is not None else ([], [])
        self._forecast = (*key, xs, confidences)
        self.seconds += time.perf_counter() - start
        return xs, confidences

    # -- the Drafter contract -----------------------------------------------------
    def available(self, context: Sequence[int]) -> int:
        """How many tokens a proposal after `context` holds now (0: no usable match)."""
        return len(self.forecast(context)[0])

    def confidences(self, context: Sequence[int]) -> list[Confidence]:
        """Evidence for each token of the proposal after `context` (see `Confidence`)."""
        return self.forecast(context)[1]

    def propose(self, context: list[int], k: int,
                sample: DraftSampler | None = None) -> tuple[list[int], None]:
        """Propose up to k tokens: the first min(k, available) of `forecast(context)`.

        Returns:
            (x, None): token ids (maybe none); q is a point mass on each (None).
        """
        return list(self.forecast(context)[0][:k]), None

    def rollback(self, committed: list[int]) -> None:
        pass   # the index only ever holds committed text
