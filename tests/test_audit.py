"""verispec.audit: exact enumeration of the shipped decode loop, and the statistical audit."""

import json
import math

import pytest
import torch

from verispec.audit import (
    AuditError, NAIVE_RULES, always_accept_verify, audit_exact, audit_exact_rules, audit_rules,
    audit_samples, decode_sampler, exact_distribution, exact_table, hf_assisted_sampler,
    marginal, naive_agree_verify, rule_samplers, seed_example, statistical_audit,
    target_distribution, toy_random_model, total_variation, as_rule,
)
from verispec.decoding import Policy, decode
from verispec.drafters.model import ModelDrafter
from verispec.models.toy import FunctionModel
from verispec.policy import FixedPolicy
from verispec.sampling import SamplingConfig, SeededRandomness
from verispec.verify import residual

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


# -- exact enumeration: the naive shortcuts are biased ------------------------------------------

def test_naive_rules_are_biased_on_the_seed_example():
    target, draft = seed_example()
    reports = audit_exact_rules(target, ModelDrafter(draft), [0], 3, 2, T1)
    by_rule = {r.rule: r for r in reports}
    assert set(by_rule) == {"verispec", "naive-agree", "naive-always-accept"}
    assert by_rule["verispec"].verdict == "exact" and by_rule["verispec"].tv <= TOL
    assert not by_rule["verispec"].flagged
    for name in NAIVE_RULES:
        assert by_rule[name].tv > 1e-3 and by_rule[name].verdict == "biased"
        assert by_rule[name].flagged
    json.dumps([r.to_dict() for r in reports])
    exact_table(reports)


def test_naive_rules_first_token_marginals_match_the_analysis():
    target, draft = seed_example()
    p, q = [0.5, 0.3, 0.15, 0.05], [0.6, 0.2, 0.1, 0.1]
    agree = exact_distribution(target, ModelDrafter(draft), [0], 2, 1, T1, naive_agree_verify)
    # accepted iff x = argmax p = 0: P(0) = q(0) + (1 - q(0)) p(0); others (1 - q(0)) p(x)
    want = [q[0] + (1 - q[0]) * p[0]] + [(1 - q[0]) * v for v in p[1:]]
    assert marginal(agree, 0, 4) == pytest.approx(want, abs=1e-15)
    always = exact_distribution(target, ModelDrafter(draft), [0], 2, 1, T1, always_accept_verify)
    assert marginal(always, 0, 4) == pytest.approx(q, abs=1e-15)        # the output follows q
    assert marginal(always, 1, 4) == pytest.approx(p, abs=1e-15)        # bonus from p


def test_the_rule_is_a_parameter_of_decode_not_a_patched_global():
    """An injected rule is used for that call only: the next call runs the shipped one."""
    target, draft = seed_example()
    calls = []

    def spy(p, q, x, u):
        calls.append(int(x.shape[0]))
        return always_accept_verify(p, q, x, u)

    decode(target, [0], FixedPolicy(ModelDrafter(draft), 2), sampling=T1, max_new_tokens=4,
           rng=SeededRandomness(0), rule=as_rule(spy))
    assert calls and all(k > 0 for k in calls)
    calls.clear()
    decode(target, [0], FixedPolicy(ModelDrafter(draft), 2), sampling=T1, max_new_tokens=4,
           rng=SeededRandomness(0))
    assert calls == []


def _rule(accept):
    def rule(p, q, x, u):
        k = x.shape[0]
        px = p[:k].gather(-1, x[:, None]).squeeze(-1)
        qx = q.gather(-1, x[:, None]).squeeze(-1)
        n = int(accept(u, px, qx).to(torch.int64).cumprod(0).sum())
        return (n, p[k]) if n == k else (n, residual(p[n], q[n]))
    return rule


def test_broken_acceptance_rules_are_caught():
    target, draft = toy_random_model(4, seed=1), toy_random_model(4, seed=2)
    # u < p (forgot q) and u < min(1, p/q)^2 have the right shape but the wrong threshold:
    # only boundary representatives (u just inside each side of α) see it
    for accept in (lambda u, p, q: u < p, lambda u, p, q: u < (p / q).clamp(max=1) ** 2,
                   lambda u, p, q: u * p < q):
        with pytest.raises(AuditError, match="inconsistent"):
            exact_distribution(target, ModelDrafter(draft), [0], 3, 2, T1, _rule(accept))
        report = audit_exact(target, ModelDrafter(draft), [0], 3, 2, T1, _rule(accept))
        assert report.verdict == "inconsistent" and report.flagged

    def no_stop(p, q, x, u):   # counts every accepted draft instead of stopping at the first rejection
        k = x.shape[0]
        px = p[:k].gather(-1, x[:, None]).squeeze(-1)
        qx = q.gather(-1, x[:, None]).squeeze(-1)
        n = int((u * qx < px).sum())
        return (n, p[k]) if n == k else (n, residual(p[n], q[n]))

    for reps in ("boundary", "extreme"):
        with pytest.raises(AuditError, match="inconsistent"):
            exact_distribution(target, ModelDrafter(draft), [0], 3, 2, T1, no_stop,
                               representatives=reps)
    # a boundary-only difference (<= instead of <) is a measure-zero change: still exact
    dist = exact_distribution(target, ModelDrafter(draft), [0], 3, 2, T1,
                              _rule(lambda u, p, q: u * q <= p))
    assert total_variation(dist, target_distribution(target, [0], 3, T1)) <= TOL


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


# -- statistical audit ------------------------------------------------------------------------

def _toy_samplers(m):
    target, draft = seed_example()
    return rule_samplers(target, ModelDrafter(draft), [0], m, T1, k=2)


def test_statistical_audit_passes_verispec_and_fails_the_shortcuts():
    m, n = 3, 600
    samplers = _toy_samplers(m)
    reports = audit_rules(samplers, n, m, alpha_level=0.01, progress=False)
    assert reports["verispec"].verdict == "pass", reports["verispec"].to_dict()
    assert reports["naive-agree"].verdict == "FAIL"
    assert reports["naive-always-accept"].verdict == "FAIL"
    rep = reports["verispec"]
    assert rep.n_samples == n and rep.m == m and len(rep.tests) == m + 1
    assert rep.alpha_per_test == pytest.approx(0.01 / (m + 1))
    assert 0 <= rep.tv_ci[0] <= rep.tv_corrected <= rep.tv_ci[1] + 1e-12 and rep.tv_null > 0
    bad = reports["naive-always-accept"]
    assert bad.tv_ci[0] > 0.05 and bad.tv > bad.tv_null and bad.tv_p_value < 0.01
    json.dumps(rep.to_dict())
    table = rep.table()
    assert table.row_count == m + 1


def test_statistical_audit_with_callables_and_seeds():
    m = 2
    samplers = _toy_samplers(m)
    seen = {"ref": [], "cand": []}

    def ref(seed):
        seen["ref"].append(seed)
        return samplers["target"](seed)

    def cand(seed):
        seen["cand"].append(seed)
        return samplers["verispec"](seed)

    rep = statistical_audit(ref, cand, 300, m, progress=False, reference_label="target",
                            candidate_label="verispec")
    assert seen["ref"] == list(range(300)) and seen["cand"] == list(range(300, 600))
    assert rep.verdict == "pass"
    again = statistical_audit(ref, cand, 300, m, progress=False)
    assert [t.p_value for t in again.tests] == [t.p_value for t in rep.tests]   # deterministic
    bad = statistical_audit(ref, samplers["naive-always-accept"], 300, m, progress=False,
                            method="g")
    assert bad.verdict == "FAIL" and bad.method == "G"


def test_homogeneity_pools_rare_categories():
    # 10 common categories and 40 rare ones: rare ones go to "other", counts preserved
    a = [i % 10 for i in range(500)] + list(range(100, 120))
    b = [i % 10 for i in range(500)] + list(range(200, 220))
    rep = audit_samples([[t] for t in a], [[t] for t in b], 1)
    joint = rep.tests[-1]
    assert joint.categories == 11 and joint.pooled == 40
    assert rep.verdict == "pass"
    # every category rare: nothing left to test, reported as such (all-distinct samples carry
    # no evidence either way: even the permutation TV level is 1)
    rep = audit_samples([[i] for i in range(60)], [[100 + i] for i in range(60)], 1)
    assert not rep.tests[0].testable and rep.tests[0].p_value == 1.0
    assert rep.to_dict()["tests"][0]["testable"] is False and rep.tv_null == pytest.approx(1.0)
    rep.table()
    # shorter outputs (EOS) are their own category, not an error
    rep = audit_samples([[1]] * 50 + [[1, 2]] * 50, [[1, 2]] * 100, 2)
    assert rep.tests[1].p_value < 1e-6


def test_hf_assisted_sampler_is_seeded_and_leaves_global_rng_alone():
    from conftest import tiny_llama

    target, draft = tiny_llama(0), tiny_llama(0, noise=0.25)
    sample = hf_assisted_sampler(target.model, draft.model, [3, 17, 42, 5, 9], 4, temperature=1.0)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a, b, c = sample(7), sample(7), sample(8)
    assert torch.equal(before, torch.get_rng_state())
    assert a == b and len(a) == 4 and a != c


def test_hf_assisted_sampler_takes_the_wrappers_and_refuses_other_backends():
    from conftest import tiny_llama

    target, draft = tiny_llama(0), tiny_llama(0, noise=0.25)
    ids = [3, 17, 42, 5, 9]
    wrapped = hf_assisted_sampler(target, draft, ids, 4, temperature=1.0)
    bare = hf_assisted_sampler(target.transformers_model, draft.transformers_model, ids, 4,
                               temperature=1.0)
    assert wrapped(7) == bare(7) and wrapped(8) == bare(8)
    toy_target, toy_draft = seed_example()
    with pytest.raises(ValueError, match="assistant.*toy backend.*--backend transformers"):
        hf_assisted_sampler(target, toy_draft, ids, 4)
    with pytest.raises(ValueError, match="target.*toy backend"):
        hf_assisted_sampler(toy_target, draft, ids, 4)
    with pytest.raises(TypeError, match="assistant must be an HFModel"):
        hf_assisted_sampler(target, object(), ids, 4)


def test_decode_sampler_is_seeded():
    target, draft = seed_example()
    s = decode_sampler(target, ModelDrafter(draft), [0], 6, T1, k=3)
    assert s(5) == s(5) and len(s(5)) == 6


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
