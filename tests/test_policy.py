import math
import random

import pytest
import torch

from verispec import theory
from verispec.decoding import RoundRecord, decode
from verispec.drafters import Confidence, SuffixDrafter
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
    costs = {n: c.mean for n, c in policy.costs.target_cost.items()}
    before = policy.alphas("model", 1)[0]
    assert before < 0.3
    policy.start()
    after = policy.alphas("model", 1)[0]
    assert before < after < policy.estimates.priors["model"]      # a weak prior from the last text
    assert {n: c.mean for n, c in policy.costs.target_cost.items()} == costs
    for _ in range(6):                              # the new text is easy: it takes over
        policy.observe(record(1, 1, 1.0, 1.1, 0.1))
    assert policy.alphas("model", 1)[0] > 0.7
    reset = AdaptivePolicy({"model": FakeDrafter()}, k_max=4, carry=0.0)
    feed(reset, 0.0, lambda n: 1.0 + 0.1 * (n - 1), 0.1, rounds=30)
    reset.start()
    assert reset.alphas("model", 1)[0] == pytest.approx(reset.estimates.priors["model"])


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
        expected_loss = policy.budget.probe_loss["model"].mean if generation else None
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
    assert policy.costs.target_cost[8].mean == pytest.approx(1.64) and policy.costs.target_cost[3].mean == 2.9
    assert policy.predict("model", 2) == pytest.approx(
        theory.expected_tokens_positional(policy.alphas("model", 2)) * 1.0 / (2 * 0.1 + 1.64))
    # a monotone (llama.cpp-like) curve is never padded
    flat = AdaptivePolicy({"model": FakeDrafter()}, k_max=4)
    for n in range(1, 6):
        flat.observe(record(n - 1, 0, 0.0, 1.0 + 0.5 * (n - 1), 0.1, drafter="calibration"))
    assert [flat.verify_width(n) for n in range(1, 6)] == [1, 2, 3, 4, 5]


# -- evidence-gated drafting (point-mass drafters that report their confidence) -----------

WEAK = [Confidence(0.4, 1, 5)] * 4                      # a 1-token match, a split vote
STRONG = [Confidence(1.0, 20 + i, 3) for i in range(4)]   # a long match, always followed so


class PooledDrafter:
    """A point-mass drafter that reports no evidence: the policy keeps one α per position."""

    name = "suffix"
    point_mass = True
    alpha_prior = 0.5
    forwards = 0
    seconds = 0.0
    catchup_seconds = 0.0

    def available(self, context):
        return 4


class EvidenceDrafter(PooledDrafter):
    """The same drafter, reporting weak evidence on odd-length contexts, strong on even."""

    def confidences(self, context):
        return STRONG if len(context) % 2 == 0 else WEAK


def run_evidence(policy, rounds, curve, seed=0):
    """Simulated rounds: strong evidence is accepted at α = 0.98, weak at α = 0.05."""
    coins = random.Random(seed)
    chosen = {"weak": [], "strong": []}
    for r in range(rounds):
        seq = [0] * (10 + r)
        strong = len(seq) % 2 == 0
        alpha = 0.98 if strong else 0.05
        _, k = policy.choose(seq)
        chosen["strong" if strong else "weak"].append(k)
        accepted = 0
        while accepted < k and coins.random() < alpha:
            accepted += 1
        policy.observe(RoundRecord(drafter="suffix" if k else "none", k=k, accepted=accepted,
                                   committed=accepted + 1, alphas=torch.full((k,), alpha),
                                   px=torch.zeros(k), qx=torch.zeros(k),
                                   target_seconds=curve(k + 1), draft_seconds=0.001 * k))
    return chosen


def test_learns_alpha_per_evidence_and_drafts_only_the_rounds_that_pay():
    # llama.cpp-like: a 2-token forward costs 1.66 single ones; only near-certain drafts pay
    curve = lambda n: 1.0 + 0.66 * (n - 1)
    policy = AdaptivePolicy({"suffix": EvidenceDrafter()}, k_max=4)
    for n in range(1, 6):
        policy.observe(record(n - 1, 0, 0.0, curve(n), 0.0, drafter="calibration"))
    chosen = run_evidence(policy, 400, curve)
    assert chosen["weak"][-100:].count(0) >= 98             # weak evidence: plain rounds
    strong = [k for k in chosen["strong"][-100:] if k]
    assert len(strong) >= 90 and min(strong) >= 2           # strong evidence: several tokens
    assert policy.alphas("suffix", 1, STRONG)[0] > 0.9
    # its prior min(0.5, frequency) = 0.4, plus the regime offset (the cells' residuals: ~0 here)
    assert policy.alphas("suffix", 1, WEAK)[0] <= 0.41
    assert abs(policy.estimates.offset("suffix")) < 0.01
    # one α for both kinds of round (≈ 0.5) never pays on this curve: no drafting at all
    pooled = AdaptivePolicy({"suffix": PooledDrafter()}, k_max=4)
    for n in range(1, 6):
        pooled.observe(record(n - 1, 0, 0.0, curve(n), 0.0, drafter="calibration"))
    ks = run_evidence(pooled, 400, curve)
    assert sum(1 for k in ks["strong"][-100:] if k) < 10


def test_the_suffix_drafter_on_a_prompt_without_repetition_drafts_nothing():
    curve = lambda n: 1.0 + 0.1 * (n - 1)     # drafting would be cheap: it still has nothing
    policy = AdaptivePolicy({"suffix": SuffixDrafter()}, k_max=8)
    for n in range(1, 10):
        policy.observe(record(n - 1, 0, 0.0, curve(n), 0.0, drafter="calibration"))
    prompt = list(range(100, 160))
    for r in range(40):                       # plain rounds, probes included: nothing to offer
        seq = prompt + list(range(200, 200 + r))
        assert policy.choose(seq) == (None, 0)
        policy.observe(record(0, 0, 0.0, 1.0, 0.0, drafter="none"))
    repeated = prompt + prompt[:5]            # the moment the text repeats, it drafts
    drafter, k = policy.choose(repeated)
    assert drafter is policy.drafters["suffix"] and k > 0


# -- a probe is charged the draft model's catch-up before it is taken ----------------------

class CatchingUpDrafter(FakeDrafter):
    """A draft model that has read nothing yet: its catch-up is the whole context."""

    def __init__(self):
        self.cached = 0

    def catchup_tokens(self, context):
        return len(context) - self.cached

    def calibrate(self, context):
        return 0.05, 0.3     # seconds per caught-up token, per drafted token (T_t(1) = 1)


def first_probe(prompt_tokens, budget, explore_fraction=1.0, rounds=None):
    """Run plain rounds on a GPU-less cost curve; the round of the first draft (or None)."""
    curve = lambda n: 1.0 + 0.3 * (n - 1)
    drafter = CatchingUpDrafter()
    policy = AdaptivePolicy({"model": drafter}, k_max=4, explore_fraction=explore_fraction)
    for n in range(1, 6):
        policy.observe(record(n - 1, 0, 0.0, curve(n), 0.0, drafter="calibration"))
    assert policy.calibrate_drafters([0] * prompt_tokens) == {"model": (0.05, 0.3)}
    policy.start(max_new_tokens=budget)
    prompt = [0] * prompt_tokens
    for r in range(rounds or budget):
        _, k = policy.choose(prompt + [1] * r)
        if k:
            return r, policy
        policy.observe(record(0, 0, 0.0, 1.0, 0.0, drafter="none"))
    return None, policy


def test_a_probe_is_taken_only_when_the_gain_over_the_budget_pays_for_the_catch_up():
    # a good draft would give S ≈ 1.23 here: the 64-token budget saves ≈ 12 s at most;
    # reading the 671-token prompt costs 671 × 0.05 ≈ 34 s: the draft model is never probed,
    never, r = first_probe(671, 64, rounds=63)
    assert never is None
    seq = [0] * (671 + 40)
    charge, missing = r.catchup_charge("model", seq)
    assert missing == 711 and charge == pytest.approx(711 * 0.05)
    assert r.budget.may_probe("model", charge)          # the ration alone would allow it by now,
    assert not r.pays_for(r.predict("model", 2, r.probe_alpha), charge, seq)   # the gain does not
    # ... while a long budget (≈ 370 s to save) pays, once the time spent covers the charge
    # (the ration: a probe may not lose more than was spent), and a short prompt (1 s) at once
    long_budget, _ = first_probe(671, 2000)
    assert 35 <= long_budget <= 48
    assert first_probe(20, 64)[0] == 7      # the 8th plain round in a row: `probe_every`
    # the default ration (10% of the time spent) counts the charge too
    late, _ = first_probe(671, 2000, explore_fraction=0.1)
    assert late is not None and late >= 330


def test_the_catch_up_cost_is_learned_from_catch_ups():
    _, policy = first_probe(20, 64)
    drafted = record(2, 1, 0.9, 1.6, 0.3)
    drafted.catchup_seconds = 19 * 0.2          # it fed 20 + 8 - 1 tokens at 0.2 s each
    policy.observe(drafted)
    assert 0.05 < policy.costs.catchup_cost["model"].mean < 0.2


def test_no_probe_under_load_where_every_other_sequence_would_wait_for_it():
    """A probe learns α for one request, but under a load of B sequences its drafts and
    rows hold up all B: a batching server's policies stop probing there (drafting under 2
    clients lost 20-30 % against --k 0, `benchmarks/serve/README.md`) and probe again
    alone. Here a probe would pay under load were α 0.9 (flat curve, cheap drafts)."""
    curve = lambda n: 1.0 + 0.1 * (n - 1)

    def learnt():                     # α̂ measured low alone (relax 1: it stays low)
        policy = AdaptivePolicy({"model": FakeDrafter()}, k_max=8, probe_every=4, relax=1.0)
        feed(policy, 0.1, curve, 0.05, rounds=40)
        return policy

    alone, loaded = learnt(), learnt()
    assert any(feed(alone, 0.1, curve, 0.05, rounds=80, seed=1))       # probes alone
    loaded.costs.set_load(sequences=2, other_rows=1)
    assert loaded.predict("model", 1, floor=0.9) > 1 + loaded.margin    # a probe would look worth it
    assert not any(feed(loaded, 0.1, curve, 0.05, rounds=80, seed=1))   # never under load
    loaded.costs.set_load()                                              # alone again: probes resume
    assert any(feed(loaded, 0.1, curve, 0.05, rounds=80, seed=1))


def test_under_load_a_catch_up_nobody_has_timed_is_not_taken():
    """Alone, a draft model whose catch-up cost is unknown is tried (charged 0 s); under a
    load of B sequences every other request would wait for its whole-prompt catch-up, so
    an unknown catch-up is not taken there, and a timed one is charged B times over."""
    curve = lambda n: 1.0 + 0.1 * (n - 1)
    policy = AdaptivePolicy({"model": CatchingUpDrafter()}, k_max=4)
    for n in range(1, 6):                                   # T_t known, T_d known, catch-up not
        policy.observe(record(n - 1, 0, 0.0, curve(n), 0.0, drafter="calibration"))
    policy.costs.observe_draft("model", 0.01)
    policy.estimates.observe("model", [0.95] * 4, 4)       # a draft that pays when priced
    prompt = [0] * 700
    assert policy.catchup_charge("model", prompt) == (0.0, 700)
    assert policy.choose(prompt)[1] > 0                     # alone: tried
    policy.costs.set_load(sequences=2, other_rows=1)
    assert policy.catchup_charge("model", prompt) == (math.inf, 700)
    assert policy.choose(prompt)[1] == 0                    # under load: not taken
    policy.costs.observe_catchup("model", 0.0001)
    assert policy.catchup_charge("model", prompt)[0] == pytest.approx(2 * 700 * 0.0001)
    assert policy.choose(prompt)[1] > 0                     # timed and cheap: taken again
