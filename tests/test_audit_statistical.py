"""verispec.audit.statistical / homogeneity / samplers: the statistical audit of sampled runs."""

import json

import pytest
import torch

from verispec.audit import (
    audit_rules, audit_samples, decode_sampler, hf_assisted_sampler, rule_samplers, seed_example,
    statistical_audit,
)
from verispec.drafters.model import ModelDrafter

from test_audit_exact import T1


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


def test_decode_sampler_is_seeded():
    target, draft = seed_example()
    s = decode_sampler(target, ModelDrafter(draft), [0], 6, T1, k=3)
    assert s(5) == s(5) and len(s(5)) == 6


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
