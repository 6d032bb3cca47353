"""The coupled `gumbel` rule is exact, by exact enumeration; a wrong coupled rule is caught.

The rule draws y_i ~ p_i, accepts x_i iff x_i = y_i and emits y_i at the first
disagreement (`verispec.verify.GumbelRule`). The enumerator branches over every
categorical draw independently, so:

* with a point-mass drafter (prompt lookup, a scripted drafter) it enumerates
  exactly what the rule does at run time;
* with a draft model it enumerates the *independent* coupling of x_i ~ q_i and
  y_i ~ p_i (at run time they share Gumbel noise), which must be exact as well.

Under every non-greedy warp each test also checks that the enumeration saw rounds
drafting k tokens with every acceptance count (0 accepted .. all k accepted), so a
pass is not vacuous.
"""

from collections import Counter

import pytest
import torch

from verispec.audit import audit_exact, exact_distribution, target_distribution, total_variation
from verispec.audit import toy_random_model
from verispec.drafters.lookup import LookupDrafter
from verispec.drafters.model import ModelDrafter
from verispec.models.toy import FunctionModel
from verispec.policy import FixedPolicy
from verispec.sampling import SamplingConfig
from verispec.verify import RULES, gumbel

from test_audit_exact import T1, TOL

COUPLED_WARPS = {
    "T=1": T1,
    "T=0.7,top-k=2": SamplingConfig(temperature=0.7, top_k=2),
    "top-p=0.8": SamplingConfig(temperature=1.0, top_p=0.8),
    "greedy": SamplingConfig(),
}


class Counting:
    """Wraps a rule and counts the (k, accepted) of every round it verifies."""

    def __init__(self, rule):
        self.rule, self.name = rule, rule.name
        self.draft_stream, self.uses_uniforms = rule.draft_stream, rule.uses_uniforms
        self.rounds = Counter()

    def __call__(self, p, q, x, rng, position):
        n, y = self.rule(p, q, x, rng, position)
        self.rounds[int(x.shape[0]), n] += 1
        return n, y


def assert_coupled_exact(target, drafter, n, k, sampling, prompt, rule=gumbel):
    counting = Counting(rule)
    dist = exact_distribution(target, drafter, list(prompt), n, k, sampling, counting)
    tv = total_variation(dist, target_distribution(target, list(prompt), n, sampling))
    assert tv <= TOL, f"TV = {tv:.3g}"
    return counting.rounds


def assert_every_pattern(rounds, k):
    """Rounds drafting k tokens were verified, with every accepted count 0..k."""
    assert {n for (kk, n) in rounds if kk == k} == set(range(k + 1)), rounds


class ScriptedDrafter:
    """A deterministic (point-mass) drafter: proposes the next k tokens of the cycle
    0, 1, .., V-1, 0, 1, .. after the last committed token."""

    name, point_mass, alpha_prior = "scripted", True, 0.5
    forwards, seconds, catchup_seconds = 0, 0.0, 0.0

    def __init__(self, vocab):
        self.vocab = vocab

    def available(self, context):
        return 1 << 20

    def propose(self, context, k, sample=None):
        return [(context[-1] + 1 + i) % self.vocab for i in range(k)], None

    def rollback(self, committed):
        pass

    def reset(self):
        pass


def cyclic_model(vocab, seed=23, strength=1.0):
    """A prefix-dependent toy model that favours continuing the cycle 0, 1, .., V-1
    (seed 23: every acceptance count occurs under each non-greedy warp)."""
    base = toy_random_model(vocab, seed=seed, sharpness=0.5)
    bump = torch.eye(vocab, dtype=torch.float64) * strength

    return FunctionModel(lambda prefix: base.fn(prefix) + bump[(prefix[-1] + 1) % vocab], vocab,
                         name=f"cyclic-{vocab}-{seed}")


@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("warp_name", list(COUPLED_WARPS))
def test_gumbel_is_exact_with_prompt_lookup(warp_name, k):
    # period-4 prompt: the 2-gram match is followed by 4 tokens, so lookup drafts k of them;
    # EOS (id 2) inside drafted blocks; seed 24: every acceptance count occurs
    target = toy_random_model(3, seed=24, eos_token_ids=[2])
    rounds = assert_coupled_exact(target, lambda: FixedPolicy(LookupDrafter(max_ngram=2), k), k + 1,
                                  None, COUPLED_WARPS[warp_name], prompt=(0, 1, 2, 1) * 2 + (0, 1))
    assert any(kk == k for kk, _ in rounds), rounds
    if warp_name != "greedy":
        assert_every_pattern(rounds, k)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("warp_name", list(COUPLED_WARPS))
def test_gumbel_is_exact_with_a_scripted_drafter_on_a_repetitive_prompt(warp_name, k):
    target = cyclic_model(3)
    rounds = assert_coupled_exact(target, lambda: FixedPolicy(ScriptedDrafter(3), k), k + 1, None,
                                  COUPLED_WARPS[warp_name], prompt=(0, 1, 2, 0, 1, 2, 0))
    if warp_name != "greedy":
        assert_every_pattern(rounds, k)


# every k under every warp except (T=1, k=4): 2,700 replays (~2 s on an idle core), and k = 4
# is enumerated under the three other warps
MODEL_CASES = [(w, k) for w in COUPLED_WARPS for k in (1, 2, 3, 4) if (w, k) != ("T=1", 4)]


@pytest.mark.parametrize("warp_name, k", MODEL_CASES)
def test_gumbel_is_exact_with_a_draft_model_independent_coupling(warp_name, k):
    target, draft = toy_random_model(3, seed=1), toy_random_model(3, seed=2)
    rounds = assert_coupled_exact(target, ModelDrafter(draft), k + 1, k, COUPLED_WARPS[warp_name],
                                  prompt=(0, 1))
    if warp_name != "greedy":
        assert_every_pattern(rounds, k)


def test_the_standard_and_gumbel_rules_give_the_same_distribution():
    target, draft = toy_random_model(3, seed=3), toy_random_model(3, seed=4)
    dists = [exact_distribution(target, ModelDrafter(draft), [0], 3, 2, T1, RULES[name])
             for name in ("standard", "gumbel")]
    assert total_variation(*dists) <= TOL


# -- negative controls: wrong coupled rules are flagged ----------------------------------------

class EmitsTheDraft:
    """Wrong coupled rule: at the first disagreement it emits x_i instead of y_i."""

    name, draft_stream, uses_uniforms = "emits-the-draft", "sample", False

    def __call__(self, p, q, x, rng, position):
        k = x.shape[0]
        for i in range(k):
            if rng.categorical(p[i], position + i) != int(x[i]):
                return i, int(x[i])
        return k, rng.categorical(p[k], position + k)


class StaleBonus:
    """Wrong coupled rule: when all k drafts agree, the bonus comes from p_k instead of p_{k+1}."""

    name, draft_stream, uses_uniforms = "stale-bonus", "sample", False

    def __call__(self, p, q, x, rng, position):
        k = x.shape[0]
        for i in range(k):
            y = rng.categorical(p[i], position + i)
            if y != int(x[i]):
                return i, y
        return k, rng.categorical(p[max(k - 1, 0)], position + k)


@pytest.mark.parametrize("wrong", [EmitsTheDraft(), StaleBonus()], ids=lambda r: r.name)
@pytest.mark.parametrize("drafter", ["lookup", "scripted", "model"])
def test_a_wrong_coupled_rule_is_flagged_biased(wrong, drafter):
    if drafter == "lookup":
        target = toy_random_model(3, seed=13)
        make, prompt = (lambda: FixedPolicy(LookupDrafter(max_ngram=2), 2)), (0, 1, 0, 1, 1, 0)
    elif drafter == "scripted":
        target = cyclic_model(3)
        make, prompt = (lambda: FixedPolicy(ScriptedDrafter(3), 2)), (0, 1, 2, 0)
    else:
        target = toy_random_model(3, seed=1)
        make, prompt = (lambda: FixedPolicy(ModelDrafter(toy_random_model(3, seed=2)), 2)), (0, 1)
    report = audit_exact(target, make, prompt, 3, None, T1, wrong)
    assert report.verdict == "biased" and report.flagged and report.tv > 1e-3, report.to_dict()
    assert audit_exact(target, make, prompt, 3, None, T1, gumbel).verdict == "exact"
