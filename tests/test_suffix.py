"""The suffix drafter: what it proposes, its evidence, its cache of earlier outputs, and
exactness (greedy = plain; exact enumeration with the standard and the coupled rule;
seeded sampling with the coupled rule = the plain seeded sample)."""

import random

import pytest
import torch
from conftest import tiny_llama

from verispec.api import SpeculativeDecoder
from verispec.audit import (
    exact_distribution,
    target_distribution,
    total_variation,
    toy_random_model,
)
from verispec.decoding import RoundRecord, decode
from verispec.drafters import (
    DRAFTERS,
    Confidence,
    LookupDrafter,
    SuffixCache,
    SuffixDrafter,
    build_drafters,
)
from verispec.policy import AdaptivePolicy, FixedPolicy
from verispec.sampling import SamplingConfig, SeededRandomness, TorchRandomness
from verispec.verify import gumbel

TOL = 1e-12
GREEDY = SamplingConfig()
REPETITIVE = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 4, 1, 2]


# -- what it proposes ---------------------------------------------------------------------

def test_most_frequent_continuation_of_the_longest_match():
    # (1, 2) was followed by 3 twice and by 4 once, most recently: lookup copies 4,
    # the suffix drafter follows the majority; then (1, 2, 3) was followed by 9 and
    # by 8 once each: the tie goes to the most recent (8)
    context = [1, 2, 3, 9, 1, 2, 3, 8, 1, 2, 4, 7, 1, 2]
    x, q = SuffixDrafter(min_probability=0.0).propose(context, 3)
    assert q is None and x == [3, 8, 1]
    assert LookupDrafter().propose(context, 3) == ([4, 7, 1], None)


def test_evidence_is_the_empirical_frequency_given_the_match():
    context = [1, 2, 3, 9, 1, 2, 3, 8, 1, 2, 4, 7, 1, 2]
    drafter = SuffixDrafter(min_probability=0.0)
    x = drafter.propose(context, 2)[0]
    conf = drafter.confidences(context)
    assert x[0] == 3
    assert conf[0] == Confidence(frequency=2 / 3, match_length=2, support=3)
    assert conf[1] == Confidence(frequency=1 / 2, match_length=3, support=2)
    assert drafter.available(context) == len(conf)


def test_longest_match_wins_over_a_more_frequent_shorter_one():
    # (5,) is followed by 6 three times, but (7, 5) occurred once, followed by 8
    context = [5, 6, 5, 6, 5, 6, 7, 5, 8, 0, 7, 5]
    drafter = SuffixDrafter(min_probability=0.0)
    assert drafter.propose(context, 1)[0] == [8]
    assert drafter.confidences(context)[0] == Confidence(1.0, 2, 1)


def test_no_repetition_no_proposal():
    drafter = SuffixDrafter()
    assert drafter.available(list(range(40))) == 0
    assert drafter.propose(list(range(40)), 4) == ([], None)
    assert drafter.confidences(list(range(40))) == []


def test_low_probability_tails_are_cut():
    # the longest repeat (0, 1) was followed by 3, 4 and 5 once each: frequency 1/3
    context = [1, 2, 0, 1, 3, 0, 1, 4, 0, 1, 5, 0, 1]
    assert SuffixDrafter(min_probability=0.4).available(context) == 0
    drafter = SuffixDrafter(min_probability=0.3)
    assert drafter.propose(context, 8)[0] == [5, 0, 1]    # 1/3, then 1, 1: product stays 1/3
    assert [c.frequency for c in drafter.confidences(context)] == [1 / 3, 1.0, 1.0]


def test_proposals_are_prefixes_of_one_forecast_and_capped():
    context = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2]
    drafter = SuffixDrafter(max_draft=5)
    full, _ = drafter.forecast(context)
    assert full == [3, 4, 5, 6, 7]
    for k in range(1, 8):
        assert drafter.propose(context, k)[0] == full[:k]


def test_incremental_index_equals_a_fresh_one_and_a_new_text_starts_over():
    rng = random.Random(0)
    context = [rng.randrange(5) for _ in range(300)]
    incremental = SuffixDrafter()
    for end in range(2, 300, 7):
        assert incremental.forecast(context[:end]) == SuffixDrafter().forecast(context[:end])
    other = [rng.randrange(5) for _ in range(50)]     # not an extension: rebuilt
    assert incremental.forecast(other) == SuffixDrafter().forecast(other)
    assert incremental.index.tokens == other


def test_rejects_bad_configuration():
    for kwargs in ({"max_draft": 0}, {"min_probability": 1.5}, {"min_match": 0},
                   {"min_match": 3, "max_match": 2}):
        with pytest.raises(ValueError):
            SuffixDrafter(**kwargs)


# -- the drafter table ------------------------------------------------------------------

def test_auto_uses_suffix_not_lookup_and_lookup_still_works():
    assert list(build_drafters("auto", None)) == ["suffix"]
    assert list(build_drafters("auto", toy_random_model(4))) == ["model", "suffix"]
    assert isinstance(build_drafters("lookup", None)["lookup"], LookupDrafter)
    assert build_drafters("lookup", None)["lookup"].name == "lookup"
    cache = SuffixCache(10)
    assert build_drafters("suffix", None, suffix_cache=cache)["suffix"].cache is cache
    assert not DRAFTERS["suffix"].needs_model


# -- the cache of earlier outputs ----------------------------------------------------------

def test_drafts_from_an_earlier_output():
    cache = SuffixCache(100)
    cache.add([40, 41, 42, 43, 44, 45])
    drafter = SuffixDrafter(cache=cache)
    context = [7, 8, 9, 40, 41]             # nothing repeats within the context itself
    assert SuffixDrafter().available(context) == 0
    assert drafter.propose(context, 8)[0] == [42, 43, 44, 45]   # stops at the output's end
    assert drafter.confidences(context)[0] == Confidence(1.0, 2, 1)
    cache.add([40, 41, 50])                 # the cache changed: the context is rematched
    assert drafter.propose(context, 1)[0] == [50]         # a tie: the most recent
    assert drafter.confidences(context)[0] == Confidence(0.5, 2, 2)


def test_the_cache_is_bounded_and_evicts_the_least_recently_used_output():
    cache = SuffixCache(50)
    rng = random.Random(1)
    outputs = [[rng.randrange(1000) for _ in range(rng.randrange(1, 30))] for _ in range(200)]
    for out in outputs:
        cache.add(out)
        assert cache.live_tokens <= 50
        assert cache.indexed_tokens <= 2 * 50
        separators = len(cache.automaton.tokens) - cache.indexed_tokens
        assert cache.automaton.states <= 2 * (cache.indexed_tokens + separators)
        assert sum(len(t) for t in cache.entries.values()) == cache.live_tokens
    kept = list(cache.entries.values())
    assert kept == [out for out in outputs if out in kept][-len(kept):]   # the newest ones
    cache.add(list(range(5000, 5200)))            # longer than the cache: its tail is kept
    assert list(cache.entries.values()) == [list(range(5150, 5200))]


def test_an_output_that_supplies_drafts_is_kept_longest():
    cache = SuffixCache(12)
    cache.add([1, 2, 3, 4])       # A
    cache.add([5, 6, 7, 8])       # B
    cache.add([9, 10, 11, 12])    # C
    drafter = SuffixDrafter(cache=cache)
    assert drafter.propose([0, 1, 2], 2)[0] == [3, 4]   # A supplies a draft: now the most recent
    cache.add([13, 14, 15])       # evicts B, the least recently used
    assert list(cache.entries.values()) == [[9, 10, 11, 12], [1, 2, 3, 4], [13, 14, 15]]


def test_cache_size_is_checked():
    with pytest.raises(ValueError, match="suffix cache size"):
        SuffixCache(0)
    with pytest.raises(ValueError, match="suffix_cache_size"):
        SpeculativeDecoder(toy_random_model(4), suffix_cache_size=-1)


def test_a_decoder_with_a_cache_drafts_a_repeated_request_from_its_last_output():
    target = tiny_llama(0)
    prompt = [3, 17, 42, 5, 9, 11, 60, 2]
    cold = SpeculativeDecoder(target, drafter="suffix")
    warm = SpeculativeDecoder(target, drafter="suffix", suffix_cache_size=1000)
    plain = cold.generate(prompt, max_new_tokens=40, k=0)
    first = warm.generate(prompt, max_new_tokens=40, k=4)
    assert warm.suffix_cache.live_tokens == 40
    again = warm.generate(prompt, max_new_tokens=40, k=4)
    without = cold.generate(prompt, max_new_tokens=40, k=4)
    assert first.token_ids == again.token_ids == without.token_ids == plain.token_ids
    assert again.stats.accepted > without.stats.accepted
    assert again.stats.target_forwards < without.stats.target_forwards


# -- exactness ----------------------------------------------------------------------------

def test_greedy_with_the_suffix_drafter_equals_plain():
    target = tiny_llama(0)
    prompt = [3, 17, 42, 5, 9, 3, 17, 42, 5, 9, 3, 17]
    plain = decode(target, prompt, FixedPolicy(None, 0), sampling=GREEDY, max_new_tokens=120,
                   rng=TorchRandomness(0))
    for policy in (FixedPolicy(SuffixDrafter(), 4), FixedPolicy(SuffixDrafter(), 1),
                   AdaptivePolicy({"suffix": SuffixDrafter()})):
        spec = decode(target, prompt, policy, sampling=GREEDY, max_new_tokens=120, rng=TorchRandomness(0))
        assert spec.tokens == plain.tokens
        assert spec.stats.by_drafter["suffix"]["accepted"] > 0


class _ScriptedCosts(AdaptivePolicy):
    """The adaptive policy on a fixed, flat cost curve instead of wall-clock times, so its
    choices are a function of the path (exact enumeration replays must be deterministic);
    it records the draft lengths it chose in `seen`."""

    def __init__(self, drafters, seen, **kwargs):
        super().__init__(drafters, **kwargs)
        self.seen = seen
        self.observe(RoundRecord("none", 0, 0, 1, *[torch.zeros(0)] * 3, 0.0, 0.0))   # T_t(1)

    def choose(self, seq):
        drafter, k = super().choose(seq)
        self.seen.add(k)
        return drafter, k

    def observe(self, record):
        record.target_seconds = 1.0 + 0.05 * (record.width - 1)
        record.draft_seconds, record.catchup_seconds = 0.001 * record.k, 0.0
        super().observe(record)


@pytest.mark.parametrize("k", [1, 3])
def test_exact_distribution_with_the_standard_and_the_coupled_rule(k):
    target = toy_random_model(6, seed=60, sharpness=2.5)    # peaked: drafts get accepted
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    cache = SuffixCache(20)
    cache.add([2, 3, 4, 4, 5])
    for sampling in (SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_k=4)):
        reference = target_distribution(target, prompt, 3, sampling)
        for rule in (None, gumbel):
            for drafter in (SuffixDrafter(), SuffixDrafter(cache=cache)):
                drafter.reset()
                dist = exact_distribution(target, drafter, prompt, 3, k, sampling, rule)
                assert total_variation(dist, reference) <= TOL


def test_exact_distribution_with_the_confidence_gated_adaptive_policy():
    target = toy_random_model(6, seed=61, sharpness=2.5)
    prompt = [4, 0, 4, 0, 4, 0, 4]
    sampling = SamplingConfig(temperature=0.9)
    reference = target_distribution(target, prompt, 4, sampling)
    drafted = set()

    def fresh_policy():
        return _ScriptedCosts({"suffix": SuffixDrafter()}, drafted, k_max=3)

    for rule in (None, gumbel):
        assert total_variation(exact_distribution(target, fresh_policy, prompt, 4, sampling=sampling,
                                                  rule=rule), reference) <= TOL
    assert {0, 1, 2} <= drafted               # it drafted several lengths, and also nothing


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=0.8),
                                      SamplingConfig(temperature=1.0, top_p=0.9)])
def test_coupled_sampling_is_the_plain_seeded_sample_for_every_k(sampling):
    target = toy_random_model(8, seed=62, sharpness=3.0)
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]
    expected = decode(target, prompt, FixedPolicy(None, 0), sampling=sampling, max_new_tokens=40,
                      rng=SeededRandomness(5)).tokens
    accepted = 0
    for k in range(1, 9):
        res = decode(target, prompt, FixedPolicy(SuffixDrafter(), k), sampling=sampling,
                     max_new_tokens=40, rng=SeededRandomness(5), rule=gumbel)
        assert res.tokens == expected, f"k={k}"
        accepted += res.stats.accepted
    assert accepted > 0
    sd = SpeculativeDecoder(target, drafter="suffix", suffix_cache_size=100)
    for _ in range(2):   # the second call also drafts from the first one's output
        assert sd.generate(prompt, max_new_tokens=40, temperature=sampling.temperature,
                           top_p=sampling.top_p, seed=5, k="auto").token_ids == expected


def test_a_banned_token_proposed_by_the_suffix_drafter_is_never_emitted():
    target = toy_random_model(6, seed=43)
    prompt = [2, 3, 2, 3, 2, 3, 2]
    sampling = SamplingConfig(temperature=1.0, bad_words_ids=[[3]])
    reference = target_distribution(target, prompt, 3, sampling)
    for rule in (None, gumbel):
        dist = exact_distribution(target, SuffixDrafter(), prompt, 3, 3, sampling, rule)
        assert total_variation(dist, reference) <= TOL
        assert all(3 not in s for s in dist)
