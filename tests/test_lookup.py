import torch

from verispec.decoding import decode
from verispec.drafters.lookup import LookupDrafter
from verispec.policy import AdaptivePolicy, FixedPolicy
from verispec.sampling import SamplingConfig, TorchRandomness

from conftest import tiny_llama

NONE = SamplingConfig()


def propose(context, k, **kw):
    x, q = LookupDrafter(**kw).propose(context, k)
    assert q is None          # a point mass: the decode loop builds its one-hot rows
    return x, q


def test_longest_match_wins_over_more_recent_shorter_one():
    # suffix (7, 8, 9): its 3-gram occurred at the start (followed by 1, 2);
    # the 1-gram (9,) occurred more recently (followed by 5) but is shorter
    context = [7, 8, 9, 1, 2, 3, 9, 5, 4, 7, 8, 9]
    x, _ = propose(context, 2)
    assert x == [1, 2]


def test_most_recent_occurrence_of_the_longest_match():
    context = [1, 2, 10, 11, 1, 2, 20, 21, 1, 2]
    assert propose(context, 2)[0] == [20, 21]


def test_no_match_proposes_nothing():
    x, q = propose([1, 2, 3, 4], 4)
    assert x == []
    assert LookupDrafter().available([1, 2, 3, 4]) == 0


def test_match_at_the_very_end_and_k_larger_than_the_continuation():
    context = [5, 6, 5, 6]          # (5, 6) occurred right before the suffix
    drafter = LookupDrafter()
    assert drafter.available(context) == 2
    x, q = drafter.propose(context, 8)
    assert x == [5, 6] and q is None   # capped at what follows the match; a point mass


def test_incremental_index_equals_a_fresh_one():
    torch.manual_seed(0)
    context = torch.randint(0, 6, (300,)).tolist()
    incremental = LookupDrafter()
    for end in range(2, 300, 7):
        fresh = LookupDrafter()
        assert incremental.match(context[:end]) == fresh.match(context[:end])


def test_greedy_with_lookup_equals_plain():
    target = tiny_llama(0)
    prompt = [3, 17, 42, 5, 9, 3, 17, 42, 5, 9, 3, 17]
    plain = decode(target, prompt, FixedPolicy(None, 0), sampling=NONE, max_new_tokens=120,
                   rng=TorchRandomness(0))
    for policy in (FixedPolicy(LookupDrafter(), 4), AdaptivePolicy({"lookup": LookupDrafter()})):
        spec = decode(target, prompt, policy, sampling=NONE, max_new_tokens=120, rng=TorchRandomness(0))
        assert spec.tokens == plain.tokens
        assert spec.stats.by_drafter["lookup"]["accepted"] > 0
