"""An online suffix automaton with occurrence counts: the index behind suffix and lookup drafts.

The suffix automaton of a text (Blumer et al. 1985, "The smallest automaton recognizing
the subwords of a text"; Crochemore & Hancart 1997) has one state per class of
substrings with the same set of end positions (`endpos`), at most 2n - 1 states and
3n - 4 transitions for n tokens, and is built online: appending one token costs
amortised O(1) transitions. Each state here also keeps

* `count`: |endpos|, how many times its substrings occur;
* `end`: the most recent end position (index of the occurrence's last token).

Both are kept exact online: the new end position n belongs to exactly the states on
the suffix-link path from the state of the whole text, so appending walks that path
(its length is the number of distinct "repeat classes" among the text's suffixes:
small for natural text and code, up to n on a run of one repeated token).

What the drafters ask of it (SuffixDecoding, Oliaro et al. 2024, §3, does the same
with a suffix tree):

* `longest_repeat`: the longest suffix of the text that also occurred earlier;
* `follow`: the continuations of a matched string with their empirical frequencies,
  count(s·t) / count(s·any);
* `advance`: matching statistics of another text against this one (the longest
  suffix of a growing context that occurs here), for a cache over other texts.

Negative token ids are separators: unique per indexed sequence, never proposed.
"""

from __future__ import annotations

from collections.abc import Iterable


class SuffixAutomaton:
    """Online suffix automaton over a token sequence, with occurrence counts.

    Attributes:
        tokens: the indexed text (list[int]); negative ids are sequence separators.
        length: [states] longest substring length of each state (tokens).
        link: [states] suffix link (state of the longest suffix in another class; -1 at the root).
        next: [states] transitions, token id -> state.
        count: [states] occurrences |endpos| of the state's substrings.
        end: [states] most recent end position (index into `tokens`), -1 for the root.
    """

    __slots__ = ("count", "end", "last", "length", "link", "next", "tokens")

    def __init__(self, tokens: Iterable[int] = ()) -> None:
        self.tokens: list[int] = []
        self.length, self.link, self.next = [0], [-1], [{}]
        self.count, self.end = [0], [-1]
        self.last = 0
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def states(self) -> int:
        """Number of states (<= 2 * len(tokens) - 1 for len(tokens) >= 2; memory is O(states))."""
        return len(self.length)

    def append(self, token: int) -> None:
        """Index one more token (amortised O(1) transitions, plus the count walk)."""
        length, link, nxt, count, end = self.length, self.link, self.next, self.count, self.end
        position = len(self.tokens)
        self.tokens.append(token)
        cur = len(length)
        length.append(length[self.last] + 1)
        link.append(0)
        nxt.append({})
        count.append(0)
        end.append(position)
        p = self.last
        while p != -1 and token not in nxt[p]:
            nxt[p][token] = cur
            p = link[p]
        if p != -1:
            q = nxt[p][token]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:   # split q: the shorter strings of q now also end at `position`
                clone = len(length)
                length.append(length[p] + 1)
                link.append(link[q])
                nxt.append(dict(nxt[q]))
                count.append(count[q])
                end.append(end[q])
                while p != -1 and nxt[p].get(token) == q:
                    nxt[p][token] = clone
                    p = link[p]
                link[q] = link[cur] = clone
        self.last = cur
        v = cur   # every suffix of the text gains the end position `position`
        while v > 0:
            count[v] += 1
            end[v] = position
            v = link[v]

    def extend(self, tokens: Iterable[int]) -> None:
        """Index each token of `tokens` in turn."""
        for token in tokens:
            self.append(token)

    # -- queries ---------------------------------------------------------------
    def longest_repeat(self) -> tuple[int, int]:
        """(state, L): the longest suffix of the text that also ends at an earlier position.

        L = 0 (state 0, the root) when the last token never occurred before.
        """
        u = self.link[self.last] if self.last else 0
        return max(u, 0), self.length[u] if u > 0 else 0

    def shorten(self, state: int, matched: int, to: int) -> tuple[int, int]:
        """The state of the length-`to` suffix of a matched string of length `matched` (to <= matched)."""
        link, length = self.link, self.length
        while state > 0 and length[link[state]] >= to:
            state = link[state]
        return state, min(matched, to)

    def advance(self, state: int, matched: int, token: int) -> tuple[int, int]:
        """Matching statistics, one token on: (state, L) of the longest suffix of
        (a context whose longest suffix occurring here was (state, matched)) + token
        that occurs in this text (Blumer et al. 1985; amortised O(1))."""
        nxt, link, length = self.next, self.link, self.length
        while state > 0 and token not in nxt[state]:
            state = link[state]
            matched = length[state]
        if token in nxt[state]:
            return nxt[state][token], matched + 1
        return 0, 0

    def occurrences_with_continuation(self, state: int) -> int:
        """How many occurrences of the state's strings are followed by a token (separators count)."""
        return self.count[state] - (self.end[state] == len(self.tokens) - 1)

    def follow(self, state: int, steps: int, *, recent: bool = False) -> tuple[list[int], list[int], list[float], list[int]]:
        """Continue a matched string for up to `steps` tokens.

        Args:
            state: the matched string's state (> 0).
            steps: the most tokens to continue, >= 0.
            recent: False: at each step the most frequent continuation (ties: the most
                recent), as SuffixDecoding's greedy path; True: copy what followed the
                most recent earlier occurrence (prompt lookup, Saxena 2023).

        Returns:
            (tokens, states, frequencies, supports), one entry per continued token:
            tokens[i], the state after it, its empirical frequency
            count(s·x_1..x_i) / count(s·x_1..x_{i-1}·any) in (0, 1], and that
            denominator (occurrences counted). Stops early at a separator or a string
            nothing followed.
        """
        nxt, count, end, tokens = self.next, self.count, self.end, self.tokens
        xs: list[int] = []
        states: list[int] = []
        freqs: list[float] = []
        supports: list[int] = []
        copy_from = -1
        if recent and state > 0:
            # the most recent occurrence with a continuation ends right before its child's end
            children = nxt[state]
            if children:
                copy_from = max(end[v] for v in children.values())
        for i in range(steps):
            children = nxt[state]
            if not children:
                break
            support = self.occurrences_with_continuation(state)
            if recent:
                if copy_from + i >= len(tokens):
                    break
                token = tokens[copy_from + i]
                child = children.get(token)
            else:
                token, child = -1, None
                best = (-1, -1)
                for t, v in children.items():
                    key = (count[v], end[v])
                    if key > best:
                        best, token, child = key, t, v
            if child is None or token < 0:
                break
            xs.append(token)
            states.append(child)
            freqs.append(count[child] / support if support > 0 else 0.0)
            supports.append(support)
            state = child
        return xs, states, freqs, supports

    def occurrences(self, pattern: list[int]) -> int:
        """How many times `pattern` (len >= 1) occurs in the text (0 if never)."""
        state = 0
        for token in pattern:
            state = self.next[state].get(token, -1)
            if state < 0:
                return 0
        return self.count[state]
