"""The suffix automaton against brute-force matchers on random sequences (hypothesis).

Small alphabets make repeats (and the automaton's clones) frequent. Every check runs
at every prefix of the text, so the online construction is checked after each append.
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from verispec.drafters.automaton import SuffixAutomaton

texts = st.lists(st.integers(0, 3), min_size=1, max_size=50)


def occurrences(text, pattern):
    """End positions (index of the last token) of every occurrence of pattern in text."""
    m = len(pattern)
    return [j for j in range(m - 1, len(text)) if text[j - m + 1:j + 1] == pattern]


def longest_repeat(text):
    """Longest L such that text[-L:] also ends at an earlier position (0: none)."""
    n = len(text)
    for length in range(n - 1, 0, -1):
        if any(j < n - 1 for j in occurrences(text, text[n - length:])):
            return length
    return 0


def follow(text, pattern, steps, recent):
    """The continuation the drafters propose, by brute force: (tokens, frequencies, supports)."""
    n, out, freqs, supports = len(text), [], [], []
    pattern = list(pattern)
    ends = [j for j in occurrences(text, pattern) if j < n - 1]
    if recent:
        if not ends:
            return [], [], []
        copy = text[max(ends) + 1:]
    for i in range(steps):
        ends = [j for j in occurrences(text, pattern) if j < n - 1]
        if not ends:
            break
        following = [text[j + 1] for j in ends]
        if recent:
            if i >= len(copy):
                break
            token = copy[i]
        else:   # most frequent; ties: the one whose latest occurrence is latest
            token = max(set(following), key=lambda t: (following.count(t),
                                                       max(j for j in ends if text[j + 1] == t)))
        out.append(token)
        freqs.append(following.count(token) / len(ends))
        supports.append(len(ends))
        pattern.append(token)
    return out, freqs, supports


@settings(max_examples=150, deadline=None)
@given(texts)
def test_counts_repeats_and_continuations_equal_brute_force_after_every_append(text):
    automaton = SuffixAutomaton()
    for n in range(1, len(text) + 1):
        automaton.append(text[n - 1])
        prefix = text[:n]
        assert automaton.tokens == prefix
        if n >= 2:
            assert automaton.states <= 2 * n - 1
        state, length = automaton.longest_repeat()
        assert length == longest_repeat(prefix)
        for start in range(n):                  # every substring ending at the text's end,
            for m in (1, 2, 3):                 # and a few others: exact occurrence counts
                pattern = prefix[start:start + m]
                assert automaton.occurrences(pattern) == len(occurrences(prefix, pattern))
        assert automaton.occurrences([9]) == 0
        if length:
            for recent in (False, True):
                tokens, states, freqs, supports = automaton.follow(state, 6, recent=recent)
                assert (tokens, freqs, supports) == follow(prefix, prefix[n - length:], 6, recent)
                assert len(states) == len(tokens)


@settings(max_examples=150, deadline=None)
@given(texts, st.lists(st.integers(0, 3), min_size=1, max_size=30))
def test_matching_statistics_of_another_text(text, other):
    """advance(): the longest suffix of other[:i] that occurs in text, for every i."""
    automaton = SuffixAutomaton(text)
    state, matched = 0, 0
    for i, token in enumerate(other, 1):
        state, matched = automaton.advance(state, matched, token)
        expected = max((m for m in range(i + 1) if m == 0 or occurrences(text, other[i - m:i])), default=0)
        assert matched == expected
        if matched:
            assert automaton.length[automaton.link[state]] < matched <= automaton.length[state]


@settings(max_examples=100, deadline=None)
@given(texts, st.integers(1, 4))
def test_shorten_finds_the_state_of_a_shorter_suffix(text, to):
    automaton = SuffixAutomaton(text)
    state, length = automaton.longest_repeat()
    if not length:
        return
    short, m = automaton.shorten(state, length, to)
    assert m == min(length, to)
    assert automaton.length[automaton.link[short]] < m <= automaton.length[short]
    assert automaton.count[short] == len(occurrences(text, text[len(text) - m:]))


def test_separators_end_matches_and_are_never_followed():
    automaton = SuffixAutomaton([1, 2, 3, -1, 1, 2, 4, -2])
    state, matched = 0, 0
    for token in (1, 2):
        state, matched = automaton.advance(state, matched, token)
    tokens, _, freqs, supports = automaton.follow(state, 5)
    assert tokens in ([3], [4]) and freqs == [0.5] and supports == [2]   # stops at the separator
