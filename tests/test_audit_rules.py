"""verispec.audit.rules: the biased shortcuts are caught, and rules are parameters of decode.

Exact enumeration must flag every shortcut as biased (or inconsistent, when the
realised acceptance pattern contradicts its probability), and reproduce the
analytic first-token marginals of the naive rules.
"""

import json

import pytest
import torch

from verispec.audit import (
    AuditError, NAIVE_RULES, RULE_NAMES, always_accept_verify, as_rule, audit_exact,
    audit_exact_rules, audited_rule, exact_distribution, exact_table, marginal, naive_agree_verify,
    rule_samplers, seed_example, target_distribution, toy_random_model, total_variation,
)
from verispec.decoding import decode
from verispec.drafters.model import ModelDrafter
from verispec.policy import FixedPolicy
from verispec.sampling import SeededRandomness
from verispec.verify import RULES, gumbel, residual, standard

from test_audit_exact import T1, TOL


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


def test_rule_names_are_verispecs_rule_the_exact_rules_and_the_shortcuts():
    assert RULE_NAMES == ("verispec", "standard", "gumbel", "naive-agree", "naive-always-accept")
    assert audited_rule("verispec") is standard and audited_rule("verispec", gumbel) is gumbel
    assert all(audited_rule(name) is rule for name, rule in {**RULES, **NAIVE_RULES}.items())
    with pytest.raises(ValueError, match="unknown rule 'nope'; choose from verispec, standard"):
        audited_rule("nope")
    target, draft = seed_example()
    samplers = rule_samplers(target, ModelDrafter(draft), [0], 4, T1, k=2, rule=gumbel,
                             rules=("verispec", "standard", "gumbel"))
    assert list(samplers) == ["target", "verispec", "standard", "gumbel"]
    for seed in range(5):
        # verispec runs the rule it was given; the coupled rule emits the plain seeded sample
        assert samplers["verispec"](seed) == samplers["gumbel"](seed) == samplers["target"](seed)
