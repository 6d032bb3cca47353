"""Seeded sampling is reproducible whatever the policy does (position-keyed randomness), and the
coupled rule makes speculative output the plain seeded sample itself, token for token.

Toy models compute exact logits at any batch width, so equality here is exact; real-model
versions are in test_real_models.py.
"""

import collections

import pytest
import torch
from scipy import stats as scipy_stats

from verispec.api import SpeculativeDecoder, resolve_rule
from verispec.audit import toy_random_model
from verispec.decoding import decode
from verispec.drafters.lookup import LookupDrafter
from verispec.drafters.model import ModelDrafter
from verispec.policy import AdaptivePolicy, FixedPolicy
from verispec.sampling import SamplingConfig, SeededRandomness
from verispec.verify import gumbel, standard

WARPS = [SamplingConfig(temperature=0.8), SamplingConfig(temperature=1.0),
         SamplingConfig(temperature=1.0, top_k=4), SamplingConfig(temperature=0.9, top_p=0.8)]
REPETITIVE = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]


def plain(target, prompt, sampling, seed, n=40):
    return decode(target, prompt, FixedPolicy(None, 0), sampling=sampling, max_new_tokens=n,
                  rng=SeededRandomness(seed)).tokens


@pytest.mark.parametrize("sampling", WARPS)
def test_lookup_with_the_coupled_rule_is_the_plain_seeded_sample_for_every_k(sampling):
    target = toy_random_model(8, seed=50, sharpness=3.0)     # peaked: lookup drafts get accepted
    expected = plain(target, REPETITIVE, sampling, seed=11)
    accepted = 0
    for k in range(1, 9):
        res = decode(target, REPETITIVE, FixedPolicy(LookupDrafter(), k), sampling=sampling,
                     max_new_tokens=40, rng=SeededRandomness(11), rule=gumbel)
        assert res.tokens == expected, f"k={k}"
        accepted += res.stats.accepted
    assert accepted > 0


@pytest.mark.parametrize("sampling", WARPS[:2])
def test_a_draft_model_with_the_coupled_rule_is_the_plain_seeded_sample_for_every_k(sampling):
    target, draft = toy_random_model(8, seed=51), toy_random_model(8, seed=52)
    expected = plain(target, [0], sampling, seed=3)
    for k in (1, 2, 4, 8):
        res = decode(target, [0], FixedPolicy(ModelDrafter(draft), k), sampling=sampling,
                     max_new_tokens=40, rng=SeededRandomness(3), rule=gumbel)
        assert res.tokens == expected, f"k={k}"


def test_the_standard_rule_reproduces_the_same_seed_and_k():
    target, draft = toy_random_model(8, seed=53), toy_random_model(8, seed=54)
    runs = [decode(target, [0], FixedPolicy(ModelDrafter(draft), k), sampling=WARPS[1],
                   max_new_tokens=30, rng=SeededRandomness(9)).tokens for k in (3, 3, 0, 0)]
    assert runs[0] == runs[1] and runs[2] == runs[3]
    assert runs[2] == plain(target, [0], WARPS[1], seed=9, n=30)   # k = 0 is plain whatever the rule


def test_an_adaptive_policy_with_history_does_not_change_a_seeded_coupled_output():
    """The policy's choices depend on what it measured before (times, α); the output must not."""
    target, draft = toy_random_model(8, seed=55), toy_random_model(8, seed=56)
    policy = AdaptivePolicy({"model": ModelDrafter(draft), "lookup": LookupDrafter()}, k_max=4)
    expected = plain(target, REPETITIVE, WARPS[0], seed=7)
    outputs, ks = [], set()
    for prompt, seed in ((REPETITIVE, 7), ([5, 6, 7], 1), (REPETITIVE, 7), ([3] * 9, 2), (REPETITIVE, 7)):
        policy.start()
        res = decode(target, prompt, policy, sampling=WARPS[0], max_new_tokens=40,
                     rng=SeededRandomness(seed), rule=gumbel,
                     observer=lambda r: ks.add((r.drafter, r.k)))
        if prompt == REPETITIVE:
            outputs.append(res.tokens)
    assert outputs == [expected] * 3
    assert len(ks) > 1          # the policy did vary what it drafted


def test_the_api_reproduces_k_auto_with_other_generations_in_between_and_reports_the_seed():
    target, draft = toy_random_model(8, seed=57), toy_random_model(8, seed=58)
    sd = SpeculativeDecoder(target, draft)
    first = sd.generate(REPETITIVE, max_new_tokens=30, temperature=0.8, k="auto", seed=7)
    sd.generate([4, 4, 4], max_new_tokens=20, temperature=1.0, k="auto")
    sd.generate(REPETITIVE, max_new_tokens=20, temperature=0.8, k=3, seed=8)
    again = sd.generate(REPETITIVE, max_new_tokens=30, temperature=0.8, k="auto", seed=7)
    assert again.token_ids == first.token_ids and first.stats.rule == "gumbel"
    for k in (0, 2, 5):
        assert sd.generate(REPETITIVE, max_new_tokens=30, temperature=0.8, k=k, seed=7,
                           rule="gumbel").token_ids == first.token_ids
    unseeded = sd.generate(REPETITIVE, max_new_tokens=30, temperature=0.8, k=2)
    assert isinstance(unseeded.stats.seed, int)
    replay = sd.generate(REPETITIVE, max_new_tokens=30, temperature=0.8, k=2, seed=unseeded.stats.seed)
    assert replay.token_ids == unseeded.token_ids
    assert unseeded.as_dict()["seed"] == unseeded.stats.seed


def test_auto_rule_choice():
    model, lookup = ModelDrafter(toy_random_model(4)), LookupDrafter()
    assert resolve_rule("auto", "auto", {"model": model, "lookup": lookup}) is gumbel
    assert resolve_rule("auto", 3, {"model": model, "lookup": lookup}) is standard
    assert resolve_rule("auto", 3, {"lookup": lookup}) is gumbel
    assert resolve_rule("standard", "auto", {}) is standard
    with pytest.raises(ValueError, match="rule must be"):
        resolve_rule("sloppy", 3, {})


def test_draws_are_keyed_by_position_not_by_call_order():
    rng = SeededRandomness(123)
    p = torch.softmax(torch.randn(50, generator=torch.Generator().manual_seed(0)), -1)
    forward = [rng.categorical(p, t) for t in range(20)]
    backward = [rng.categorical(p, t) for t in reversed(range(20))][::-1]
    assert forward == backward
    assert rng.uniform(3, 5).tolist() == rng.uniform(5, 3)[2:].tolist()
    assert [rng.categorical(p, t, "draft") for t in range(20)] != forward   # streams differ
    assert [SeededRandomness(124).categorical(p, t) for t in range(20)] != forward   # seeds differ


def test_keyed_categorical_draws_follow_the_distribution():
    """The exponential race is a sampler of p: chi-square goodness of fit over positions."""
    p = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0], dtype=torch.float64)
    rng = SeededRandomness(2024)
    counts = collections.Counter(rng.categorical(p, t) for t in range(20000))
    assert counts[4] == 0
    observed = [counts[i] for i in range(4)]
    assert scipy_stats.chisquare(observed, [20000 * float(v) for v in p[:4]]).pvalue > 1e-4
    # shared noise couples two distributions: close ones agree far more often than independent draws
    q = torch.tensor([0.45, 0.35, 0.15, 0.05, 0.0], dtype=torch.float64)
    agree = sum(rng.categorical(p, t) == rng.categorical(q, t) for t in range(2000)) / 2000
    assert agree > 0.9           # independent draws would agree with probability ~0.40


def test_an_unknown_seed_type_is_refused():
    with pytest.raises(ValueError, match="seed"):
        SeededRandomness("7")
