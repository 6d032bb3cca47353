"""verispec.audit.exact / enumeration: the shipped decode loop is exact, by exact enumeration.

Every execution path of `decode` is replayed on float64 toy models and weighed; the
output distribution must equal the target's to TV <= 1e-12 (rounding is ~1e-16).
The helpers here (`assert_exact`, `WARPS`) are shared by the other audit test files.
"""

import math

import pytest
import torch

from verispec.audit import (
    AuditError, exact_distribution, marginal, seed_example, target_distribution,
    toy_random_model, total_variation,
)
from verispec.decoding import Policy
from verispec.drafters.model import ModelDrafter
from verispec.models.toy import FunctionModel
from verispec.policy import FixedPolicy
from verispec.sampling import SamplingConfig

TOL = 1e-12
T1 = SamplingConfig(temperature=1.0)
WARPS = {
    "T=0.7": SamplingConfig(temperature=0.7),
    "T=1.3": SamplingConfig(temperature=1.3),
    "top-k=3": SamplingConfig(temperature=1.0, top_k=3),
    "top-p=0.8": SamplingConfig(temperature=1.0, top_p=0.8),
    "T=0.7,top-k=4,top-p=0.9": SamplingConfig(temperature=0.7, top_k=4, top_p=0.9),
    "greedy": SamplingConfig(),
}


def assert_exact(target, drafter, n, k, sampling, prompt=(0,), **kw):
    dist = exact_distribution(target, drafter, list(prompt), n, k, sampling, **kw)
    ref = target_distribution(target, list(prompt), n, sampling)
    tv = total_variation(dist, ref)
    assert tv <= TOL, f"TV = {tv:.3g}"
    assert math.fsum(dist.values()) == pytest.approx(1.0, abs=1e-12)
    return dist, ref


# -- exact enumeration: verispec is exact ------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_seed_example_is_exact_for_k_1_to_4(k):
    target, draft = seed_example()
    n = min(k + 1, 4)                   # k = 4 is exercised in the V = 3 cases below
    dist, _ = assert_exact(target, ModelDrafter(draft), n, k, T1)
    assert len(dist) == 4 ** n
    assert marginal(dist, 0, 4) == pytest.approx([0.5, 0.3, 0.15, 0.05], abs=1e-15)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("warp_name", list(WARPS))
def test_prefix_dependent_models_every_warp_k_1_to_4(warp_name, k):
    sampling = WARPS[warp_name]
    # V = 4, n = 4 for k <= 3; k = 4 needs n = 5 (k is clipped to the budget - 1), so V = 3
    vocab, n = (4, 4) if k < 4 else (3, 5)
    target, draft = toy_random_model(vocab, seed=1), toy_random_model(vocab, seed=2)
    assert_exact(target, ModelDrafter(draft), n, k, sampling, prompt=(3, 1))


def test_prefix_dependence_is_real():
    target = toy_random_model(5, seed=1)
    assert not torch.equal(target.fn((0, 1)), target.fn((1, 1)))
    assert not torch.equal(target.fn((0, 1)), target.fn((0, 2)))
    assert target.fn((0, 1)).dtype == torch.float64


def test_draft_vocab_shorter_than_target():
    target = toy_random_model(5, seed=3)
    draft = toy_random_model(3, seed=4)           # ids 3, 4 exist only in the target
    dist, _ = assert_exact(target, ModelDrafter(draft), 4, 3, T1)
    assert any(3 in s or 4 in s for s in dist)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_eos_inside_blocks(k):
    target = toy_random_model(4, seed=5, eos_token_ids=[1], sharpness=1.0)
    draft = toy_random_model(4, seed=6, sharpness=1.0)
    dist, _ = assert_exact(target, ModelDrafter(draft), 4, k, T1)
    ended = [s for s in dist if s[-1] == 1 and len(s) < 4]
    assert ended and all(1 not in s[:-1] for s in dist)   # nothing after EOS


class CyclingPolicy(Policy):
    """k follows a cycle (0 = plain round); the loop must be exact whatever k is."""

    def __init__(self, drafter, ks):
        self.drafter, self.ks, self.round = drafter, ks, 0

    def choose(self, seq=None):
        k = self.ks[self.round % len(self.ks)]
        return (self.drafter if k else None), k

    def observe(self, record):
        self.round += 1


class ContextPolicy(CyclingPolicy):
    """k chosen from the committed context (the last token)."""

    def choose(self, seq=None):
        k = (seq[-1] % 4) if seq is not None else 2
        return (self.drafter if k else None), k


@pytest.mark.parametrize("ks", [(3, 1, 2), (1, 0, 4), (2,)])
def test_varying_k_per_round_keeps_the_distribution(ks):
    target, draft = toy_random_model(3, seed=7), toy_random_model(3, seed=8)
    assert_exact(target, lambda: CyclingPolicy(ModelDrafter(draft), ks), 5, None, T1)


def test_context_dependent_k_keeps_the_distribution():
    target, draft = toy_random_model(3, seed=7), toy_random_model(3, seed=8)
    assert_exact(target, lambda: ContextPolicy(ModelDrafter(draft), ()), 5, None,
                 SamplingConfig(temperature=0.8))


def test_lookup_drafter_is_exact():
    from verispec.drafters.lookup import LookupDrafter

    target = toy_random_model(3, seed=13, eos_token_ids=[2])
    for sampling in (T1, SamplingConfig(temperature=0.6, top_k=2)):
        # a fresh drafter per replay (it indexes the committed text)
        assert_exact(target, lambda: FixedPolicy(LookupDrafter(max_ngram=2), 3), 5, None, sampling,
                     prompt=(0, 1, 0, 1, 1, 0))


def test_padded_verification_is_exact():
    from test_decoding import WideVerification

    target, draft = toy_random_model(3, seed=7), toy_random_model(3, seed=8)
    assert_exact(target, lambda: WideVerification(ModelDrafter(draft), 2, 3), 4, None, T1)


# -- the enumerator itself -------------------------------------------------------------------

def test_enumeration_shortcuts_do_not_change_the_result():
    target, draft = toy_random_model(3, seed=9, eos_token_ids=[2]), toy_random_model(3, seed=10)
    full = exact_distribution(target, ModelDrafter(draft), [0], 4, 3, T1, memo=False,
                              collapse_drafts=False)
    for memo in (True, False):
        for collapse in (True, False):
            for reps in ("boundary", "extreme"):
                fast = exact_distribution(target, ModelDrafter(draft), [0], 4, 3, T1, memo=memo,
                                          collapse_drafts=collapse, representatives=reps)
                assert total_variation(fast, full) <= 1e-14


def test_target_distribution_both_ways_agree():
    target = toy_random_model(4, seed=11, eos_token_ids=[0])
    for sampling in WARPS.values():
        direct = target_distribution(target, [1], 4, sampling, method="direct")
        loop = target_distribution(target, [1], 4, sampling, method="decode")
        assert total_variation(direct, loop) <= TOL
        assert math.fsum(direct.values()) == pytest.approx(1.0, abs=1e-13)


def test_stats_and_float64():
    target, draft = seed_example()
    stats = {}
    exact_distribution(target, ModelDrafter(draft), [0], 3, 2, T1, stats=stats)
    assert stats["dtype"] == "float64" and stats["replays"] > 0 and stats["probes"] > 0


def test_total_variation():
    assert total_variation({(0,): 0.5, (1,): 0.5}, {(0,): 1.0}) == 0.5
    assert total_variation({(0,): 1.0}, {(1,): 1.0}) == 1.0
    assert total_variation({}, {}) == 0.0


def test_nondeterministic_model_is_reported():
    calls = []

    def fn(prefix):
        calls.append(1)
        return torch.tensor([0.0, 0.1 * len(calls)], dtype=torch.float64)  # drifts

    flaky = FunctionModel(fn, 2)
    with pytest.raises(AuditError, match="deterministic"):
        exact_distribution(flaky, None, [0], 3, 0, T1)


def test_big_trees_are_refused_not_hung():
    target, draft = toy_random_model(8, seed=1), toy_random_model(8, seed=2)
    with pytest.raises(AuditError, match="too large"):
        exact_distribution(target, ModelDrafter(draft), [0], 4, 3, T1, max_paths=50)
