import random

import pytest
import torch

from verispec import theory
from verispec.decoding import RoundRecord, decode
from verispec.drafters.model import ModelDrafter
from verispec.policy import AdaptivePolicy, FixedPolicy, make_policy
from verispec.sampling import SamplingConfig, TorchRandomness


class FakeDrafter:
    """Only what the policy reads of a drafter (the `Drafter` protocol's attributes)."""

    name = "model"
    point_mass = False
    alpha_prior = 0.6
    forwards = 0
    seconds = 0.0
    catchup_seconds = 0.0

    def available(self, context):
        return 1 << 20


def record(k, accepted, alpha, t_target, t_draft_per_token, drafter="model"):
    return RoundRecord(drafter=drafter, k=k, accepted=accepted, committed=accepted + 1,
                       alphas=torch.full((k,), alpha), px=torch.zeros(k), qx=torch.zeros(k),
                       target_seconds=t_target, draft_seconds=t_draft_per_token * k)


def feed(policy, alpha, curve, t_draft, rounds=40, seed=0):
    """Simulate rounds: the policy chooses k, the 'machine' answers with Bernoulli(α)
    acceptance and costs from `curve` (seconds for n new tokens)."""
    coins = random.Random(seed)
    ks = []
    for _ in range(rounds):
        drafter, k = policy.choose([1, 2, 3])
        ks.append(k)
        accepted = 0
        while accepted < k and coins.random() < alpha:
            accepted += 1
        policy.observe(record(k, accepted, alpha, curve(k + 1), t_draft))
    return ks


def test_good_draft_cheap_verification_drafts_the_theoretical_k_star():
    curve = lambda n: 1.0 + 0.1 * (n - 1)          # a GPU-like flat-ish cost curve
    policy = AdaptivePolicy({"model": FakeDrafter()}, k_max=8)
    ks = feed(policy, 0.8, curve, 0.1, rounds=300)
    k_star, _ = theory.optimal_k_cost_curve(0.8, lambda n: curve(n), 0.1, 8)
    assert k_star >= 3
    # α = 0.8 exactly at every position (the exact Σ min(p, q) is fed), so the
    # estimates converge and the choice settles on k* (±1 near a flat optimum)
    drafted = [k for k in ks[-50:] if k]            # k = 0: the periodic T_t(1) refresh
    assert len(drafted) >= 48 and all(abs(k - k_star) <= 1 for k in drafted)


def test_first_round_is_plain_to_measure_the_single_token_cost():
    policy = AdaptivePolicy({"model": FakeDrafter()})
    assert policy.choose([1]) == (None, 0)


def test_finds_a_cheap_batch_size_that_interpolation_would_hide():
    # measured on this CPU with torch float32: M = 8 rows cost less than M = 3
    costs = {1: 1.0, 2: 2.0, 3: 3.0, 4: 1.85, 5: 1.9, 6: 2.1, 7: 3.0, 8: 1.6, 9: 2.2}
    policy = AdaptivePolicy({"model": FakeDrafter()}, k_max=8)
    ks = feed(policy, 0.9, costs.__getitem__, 0.2, rounds=300)
    k_star, _ = theory.optimal_k_cost_curve(0.9, costs.__getitem__, 0.2, 8)
    assert k_star == 7
    assert [k for k in ks[-50:] if k].count(7) >= 40


def test_poor_draft_falls_back_to_plain_decoding_and_reprobes():
    curve = lambda n: 1.0 + 0.6 * (n - 1)          # a CPU-like steep cost curve
    policy = AdaptivePolicy({"model": FakeDrafter()}, k_max=8, probe_every=8)
    ks = feed(policy, 0.1, curve, 0.5, rounds=200)
    tail = ks[50:]
    assert tail.count(0) > 0.9 * len(tail)          # almost always plain
    assert any(k > 0 for k in tail)                 # but it keeps probing


def test_switches_back_when_the_draft_becomes_good():
    curve = lambda n: 1.0 + 0.1 * (n - 1)
    policy = AdaptivePolicy({"model": FakeDrafter()}, k_max=6, probe_every=4)
    feed(policy, 0.0, curve, 0.1, rounds=60)
    ks = feed(policy, 1.0, curve, 0.1, rounds=80)
    drafted = [k for k in ks[-10:] if k]        # k = 0: the periodic T_t(1) refresh
    assert len(drafted) >= 9 and set(drafted) == {6}


def test_make_policy_rejects_bad_k():
    for bad in (-1, 1.5, "fast", True):
        with pytest.raises(ValueError, match="k must be"):
            make_policy(bad, {})
    assert isinstance(make_policy(0, {}), FixedPolicy)
    with pytest.raises(ValueError, match="k_max"):
        AdaptivePolicy({}, k_max=0)


def test_adaptive_k_never_changes_greedy_output(tiny_pair):
    target, draft = tiny_pair
    prompt = [3, 17, 42, 5, 9]
    greedy = SamplingConfig()
    plain = decode(target, prompt, FixedPolicy(None, 0), sampling=greedy, max_new_tokens=150,
                   rng=TorchRandomness(0))
    records = []
    spec = decode(target, prompt, AdaptivePolicy({"model": ModelDrafter(draft)}, k_max=6),
                  sampling=greedy, max_new_tokens=150, rng=TorchRandomness(0), observer=records.append)
    assert spec.tokens == plain.tokens
    assert len({r.k for r in records}) > 1          # k really varied


def test_never_probes_a_drafter_that_cannot_pay_even_when_it_agrees():
    # llama.cpp-like: steep verification cost and a draft that costs 0.6 of a target step
    curve = lambda n: 1.0 + 0.55 * (n - 1)
    policy = AdaptivePolicy({"model": FakeDrafter()}, k_max=8)
    for n in range(1, 10):      # the cost curve as `calibrate` would have measured it
        policy.observe(record(n - 1, 0, 0.0, curve(n), 0.6, drafter="calibration"))
    ks = feed(policy, 1.0, curve, 0.6, rounds=300)
    assert ks[-280:].count(0) == 280


def test_an_inflated_single_token_time_does_not_make_a_poor_draft_look_good():
    curve = lambda n: 1.0 + 0.55 * (n - 1)
    policy = AdaptivePolicy({"model": FakeDrafter()}, k_max=4)
    for n in range(1, 6):   # calibration where T_t(1) caught a 3x hiccup
        policy.observe(record(n - 1, 0, 0.0, 3.0 if n == 1 else curve(n), 0.6, drafter="calibration"))
    policy.observe(record(1, 0, 0.3, curve(2), 0.6))      # the draft: α 0.3, 0.6 of a step
    assert policy.predict("model", 1) < 1.0


def test_start_weakens_alpha_keeps_the_cost_curve_and_follows_the_new_text():
    policy = AdaptivePolicy({"model": FakeDrafter()}, k_max=4, carry=0.3)
    feed(policy, 0.0, lambda n: 1.0 + 0.1 * (n - 1), 0.1, rounds=30)
    costs = {n: c.mean for n, c in policy.target_cost.items()}
    before = policy.alphas("model", 1)[0]
    assert before < 0.3
    policy.start()
    after = policy.alphas("model", 1)[0]
    assert before < after < policy.alpha_prior      # a weak prior from the last text
    assert {n: c.mean for n, c in policy.target_cost.items()} == costs
    for _ in range(6):                              # the new text is easy: it takes over
        policy.observe(record(1, 1, 1.0, 1.1, 0.1))
    assert policy.alphas("model", 1)[0] > 0.7
    reset = AdaptivePolicy({"model": FakeDrafter()}, k_max=4, carry=0.0)
    feed(reset, 0.0, lambda n: 1.0 + 0.1 * (n - 1), 0.1, rounds=30)
    reset.start()
    assert reset.alphas("model", 1)[0] == pytest.approx(reset.alpha_prior)


def test_probes_are_rationed_to_a_fraction_of_the_time_spent():
    # a 0.5-step draft that must first read a long prompt
    # (3 s of catch-up per probe) and never agrees with the target
    curve = lambda n: 1.0 + 0.15 * (n - 1)
    policy = AdaptivePolicy({"model": FakeDrafter()}, k_max=8, explore_fraction=0.1)
    for n in range(1, 10):
        policy.observe(record(n - 1, 0, 0.0, curve(n), 0.5, drafter="calibration"))
    for generation in range(3):
        policy.start()
        probes, spent, lost, spent_at_probe = [], 0.0, 0.0, []
        expected_loss = policy.probe_loss["model"].mean if generation else None
        for i in range(100):
            drafter, k = policy.choose([1, 2, 3])
            if k:
                probes.append(i)
                spent_at_probe.append(spent)
                r = record(k, 0, 0.0, curve(k + 1), 0.5)
                r.catchup_seconds = 3.0
                lost += r.target_seconds + r.draft_seconds + 3.0 - 1.0
            else:
                r = record(0, 0, 0.0, 1.0, 0.0)
            spent += r.target_seconds + r.draft_seconds + r.catchup_seconds
            policy.observe(r)
        assert probes, "it must still probe"
        if generation == 0:
            # nothing known yet: one try to time the draft, then the usual first probe
            assert probes[:2] == [0, 8]
        else:
            # the loss of a probe (4-6 s) is known: none before 10x that was spent
            assert expected_loss > 3.0
            assert spent_at_probe[0] >= expected_loss / 0.1 and probes[0] >= 30
            assert lost <= 0.1 * spent + 5.6         # at most one probe beyond the budget
    unlimited = AdaptivePolicy({"model": FakeDrafter()}, k_max=8, explore_fraction=1.0)
    for n in range(1, 10):
        unlimited.observe(record(n - 1, 0, 0.0, curve(n), 0.5, drafter="calibration"))
    assert feed(unlimited, 0.0, curve, 0.5, rounds=60).count(0) < 60 - 3


def test_rejects_bad_explore_fraction_and_carry():
    for name in ("explore_fraction", "carry"):
        with pytest.raises(ValueError, match=name):
            AdaptivePolicy({}, **{name: 1.5})


def test_verification_is_padded_to_a_cheaper_width_and_priced_at_it():
    costs = {1: 1.0, 2: 2.0, 3: 2.9, 4: 1.85, 5: 1.9, 6: 2.1, 7: 3.0, 8: 1.64, 9: 2.2}
    policy = AdaptivePolicy({"model": FakeDrafter()}, k_max=8)
    for n, t in costs.items():
        policy.observe(record(n - 1, 0, 0.0, t, 0.1, drafter="calibration"))
    assert policy.verify_width(1) == 1
    assert policy.verify_width(2) == 8 and policy.verify_width(3) == 8
    assert policy.verify_width(8) == 8 and policy.verify_width(9) == 9
    padded = record(2, 2, 1.0, 1.64, 0.1)
    padded.width = 8                      # what decode reports for a padded round
    policy.observe(padded)
    assert policy.target_cost[8].mean == pytest.approx(1.64) and policy.target_cost[3].mean == 2.9
    assert policy.predict("model", 2) == pytest.approx(
        theory.expected_tokens_positional(policy.alphas("model", 2)) * 1.0 / (2 * 0.1 + 1.64))
    # a monotone (llama.cpp-like) curve is never padded
    flat = AdaptivePolicy({"model": FakeDrafter()}, k_max=4)
    for n in range(1, 6):
        flat.observe(record(n - 1, 0, 0.0, 1.0 + 0.5 * (n - 1), 0.1, drafter="calibration"))
    assert [flat.verify_width(n) for n in range(1, 6)] == [1, 2, 3, 4, 5]
