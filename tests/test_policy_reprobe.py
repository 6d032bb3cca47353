"""The adaptive policy never writes a drafter off for one early rejection (decaying prior),
and prices each drafter's rounds at what they took (round overhead), not on acceptance alone.

The policy is driven with scripted `RoundRecord`s and a seeded cost curve (no model, no
wall clock): what it chooses depends only on what it observed.
"""

from __future__ import annotations

import copy

import pytest
import torch

from verispec.decoding import RoundRecord
from verispec.policy import AdaptivePolicy
from verispec.theory import CostCurve

T1 = 0.05                                 # seconds per plain target forward
CURVE = CostCurve(tuple(T1 * (1 + 0.3 * i) for i in range(9)), 0.3 * T1)   # a CPU-like steep curve


class Fake:
    """A drafter that can always draft k_max tokens (no model, no evidence)."""

    point_mass = True
    forwards, seconds, catchup_seconds = 0, 0.0, 0.0

    def __init__(self, name: str, alpha_prior: float = 0.8) -> None:
        self.name, self.alpha_prior = name, alpha_prior

    def available(self, context):
        return 8


def _policy(*names: str, **kw) -> AdaptivePolicy:
    policy = AdaptivePolicy({n: Fake(n) for n in names}, probe_every=10_000, **kw)  # no probes
    for n in names:
        policy.seed_costs(CURVE, n)
    policy.start(None)
    return policy


def _plain(policy) -> None:
    policy.observe(RoundRecord("none", 0, 0, 1, torch.zeros(0), torch.zeros(0), torch.zeros(0), T1, 0.0))


def _drafted(policy, name: str, k: int, alphas: list[float], accepted: int, seconds: float | None = None):
    target = CURVE.target_times[k] if seconds is None else seconds
    a = torch.tensor(alphas[:k])
    policy.observe(RoundRecord(name, k, accepted, accepted + 1, a, a, torch.ones(k), target, k * CURVE.draft_time))


def _run(policy, rounds: int, alpha: float) -> list[str]:
    """`rounds` rounds where every draft has exact α = `alpha` (accepted while α >= 0.5)."""
    seq, chosen = [1, 2, 3], []
    for _ in range(rounds):
        drafter, k = policy.choose(seq)
        if drafter is None or k == 0:
            chosen.append("none")
            _plain(policy)
        else:
            chosen.append(drafter.name)
            _drafted(policy, drafter.name, k, [alpha] * k, k if alpha >= 0.5 else 0)
        seq.append(7)
    return chosen


def _reject_once(policy) -> None:
    drafter, k = policy.choose([1, 2, 3, 4])
    assert drafter is not None and k >= 1                   # the prior says: draft
    _drafted(policy, drafter.name, k, [0.0] * k, 0)          # rejected at once, α = 0


def test_one_early_rejection_is_forgotten_and_the_drafter_comes_back():
    policy = _policy("model")
    _reject_once(policy)
    assert "model" in _run(policy, 60, 0.9)


def test_without_relaxing_one_early_rejection_writes_the_drafter_off():
    policy = _policy("model", relax=1.0)          # the old behaviour: the evidence never fades
    _reject_once(policy)
    assert set(_run(policy, 60, 0.9)) == {"none"}


def test_a_drafter_that_keeps_failing_is_retried_rarely():
    policy = _policy("model")
    _reject_once(policy)
    chosen = _run(policy, 200, 0.0)
    assert 0 < chosen.count("model") <= 20        # re-tried, but most rounds stay plain


class ScriptedClock:
    """Seconds that advance only when told (the wall time of a scripted round)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_round_overhead_raises_a_drafters_price_and_the_other_wins():
    """Two drafters with the same acceptance; "slow"'s rounds take 2 plain steps beyond
    their timed forwards (bookkeeping the curve misses), "fast"'s only what plain rounds
    take: the overhead is priced into each, and "fast" wins."""
    clock = ScriptedClock()
    policy = _policy("slow", "fast", clock=clock)
    assert policy.costs.round_overhead("slow") == policy.costs.round_overhead("fast") == 0.0
    seen = []
    for _ in range(80):
        drafter, k = policy.choose([1, 2, 3])
        if drafter is None:
            clock.now += T1 * 1.2                    # plain rounds: 0.2 T_t(1) of overhead
            _plain(policy)
            continue
        seen.append(drafter.name)
        timed = k * CURVE.draft_time + CURVE.target_times[k]
        clock.now += timed + T1 * (2.0 if drafter.name == "slow" else 0.2)
        _drafted(policy, drafter.name, k, [0.9] * k, k)
    assert set(seen) == {"slow", "fast"}
    assert seen.count("fast") > 3 * seen.count("slow")     # "slow" only re-tried as its cost fades
    assert abs(policy.costs.round_overhead(None) - 0.2 * T1) < 1e-9
    assert abs(policy.costs.round_overhead("fast") - 0.2 * T1) < 1e-9
    assert policy.costs.round_overhead("slow") > policy.costs.round_overhead("fast")
    curve = policy.costs.curve("slow")
    assert curve.target_times[0] == pytest.approx(CURVE.target_times[0] + policy.costs.round_overhead(None))
    assert curve.target_times[4] == pytest.approx(CURVE.target_times[4] + policy.costs.round_overhead("slow"))
    # at equal acceptance estimates, the drafter whose rounds cost what they were priced wins
    policy.estimates.positional["fast"] = copy.deepcopy(policy.estimates.positional["slow"])
    assert policy.predict("fast", 4) > policy.predict("slow", 4)
    assert policy.choose([1, 2, 3])[0].name == "fast"


def test_one_slow_round_is_forgotten_and_the_drafter_comes_back():
    """A first drafted round that took 5 plain steps more than its forwards (lazy set-up)
    prices the drafter out, but the overhead fades back towards the plain rounds' while it
    sits out (it was a ratio kept only by drafted rounds, so such a drafter never came back)."""
    clock = ScriptedClock()
    policy = _policy("model", clock=clock)
    drafter, k = policy.choose([1, 2, 3])
    assert drafter is not None
    clock.now += k * CURVE.draft_time + CURVE.target_times[k] + 5 * T1
    _drafted(policy, "model", k, [0.9] * k, k)
    chosen = []
    for _ in range(120):
        drafter, k = policy.choose([1, 2, 3])
        chosen.append("none" if drafter is None else drafter.name)
        if drafter is None:
            clock.now += T1
            _plain(policy)
        else:
            clock.now += k * CURVE.draft_time + CURVE.target_times[k]
            _drafted(policy, "model", k, [0.9] * k, k)
    assert chosen[0] == "none"                      # priced out right after the slow round
    assert chosen[-20:].count("model") >= 15        # and back once it has faded


def test_without_a_clock_there_is_no_round_overhead():
    policy = _policy("slow")
    _run(policy, 30, 0.9)
    assert policy.costs.round_overhead("slow") == policy.costs.round_overhead(None) == 0.0


def test_overhead_under_load_needs_no_t1():
    """A batched request's plain rounds are filed under 1 + R rows, so T_t(1) may be unknown
    when the first one ends: learning its overhead must not need it (the goodput ratio it
    replaced raised ValueError there, found by the batching driver)."""
    clock = ScriptedClock()
    policy = AdaptivePolicy({"d": Fake("d")}, probe_every=10_000, clock=clock)
    policy.start(None)
    policy.costs.set_load(sequences=2, other_rows=1)
    policy.choose([1, 2, 3])
    clock.now += 2 * T1
    _plain(policy)                                   # T_t(1) unknown: must not raise
    assert not policy.costs.ready
    assert abs(policy.costs.round_overhead(None) - (2 * T1 - T1)) < 1e-9


# -- lock-outs found by replaying the policy on a noisy clock --------------------------------
# (benchmarks/llamacpp-native/replay_policy.py: in half the seeded replays a drafter never
# drafted again in a copy-heavy text it would have sped up 1.3x)

def test_a_well_measured_t1_is_not_capped_by_two_rarely_measured_widths():
    from verispec.policy import OnlineCostCurve
    costs = OnlineCostCurve(["d"], 9, decay=0.9, explore_slope=0.1, margin=0.03)
    for _ in range(30):
        costs.observe_target(1, 1.0)         # plain rounds: most rounds
    costs.observe_target(2, 1.5)
    costs.observe_target(3, 2.2)             # one noisy-high T_t(3): the line gives 0.8
    assert costs.single_step() == pytest.approx(1.0)
    thin = OnlineCostCurve(["d"], 9, decay=0.9, explore_slope=0.1, margin=0.03)
    for n, seconds in ((1, 3.0), (2, 1.5), (3, 2.0)):   # a single hiccup in T_t(1): capped
        thin.observe_target(n, seconds)
    assert thin.single_step() == pytest.approx(1.0)


def test_cells_taught_by_prose_do_not_keep_a_drafter_from_a_copy_heavy_text():
    from verispec.drafters.base import Confidence
    from verispec.policy.alphas import AlphaEstimates
    est = AlphaEstimates({"suffix": 0.6}, 8, decay=0.9, evidence_decay=0.98, prior_weight=3.0)
    match = [Confidence(1.0, 10, 1)] * 3      # a 10-token match seen once
    for _ in range(60):                       # prose: such matches are mostly wrong
        est.observe("suffix", [0.3, 0.3, 0.3], 1, match)
    assert est.estimate("suffix", 1, match)[0] < 0.35
    est.carry_over(0.3)                       # a new text: a copy-heavy edit
    for _ in range(3):                        # three probes, every draft accepted
        est.observe("suffix", [1.0, 1.0, 1.0], 3, match)
    cell_only = est.evidence["suffix"].estimate(match[0], 0.6, 3.0)
    assert cell_only < 0.55                   # the cell alone still says: do not draft
    assert est.estimate("suffix", 1, match)[0] > 0.75      # with the text's own residuals: draft
    for _ in range(200):                      # sitting out: the offset fades, the cell stays
        est.relax("suffix", 0.97)
    assert est.estimate("suffix", 1, match)[0] == pytest.approx(cell_only, abs=0.01)


def test_a_probe_drafts_the_shortest_k_that_would_pay():
    """On a CPU-like curve (each verified row half a step) a probe of a drafter whose α̂ is
    low drafts 1 token, not the k that would pay most: a rejected probe costs its rows."""
    curve = CostCurve(tuple(T1 * (1 + 0.5 * i) for i in range(9)), 0.0)
    policy = AdaptivePolicy({"d": Fake("d", alpha_prior=0.2)}, probe_every=4)
    policy.seed_costs(curve, "d")
    policy.start(None)
    optimistic = [policy.predict("d", k, policy.probe_alpha) for k in range(1, 9)]
    assert max(range(8), key=optimistic.__getitem__) > 0    # the most paying k is longer
    ks = []
    for _ in range(40):
        drafter, k = policy.choose([1, 2, 3])
        if drafter is None:
            _plain(policy)
            continue
        ks.append(k)
        _drafted(policy, "d", k, [0.0] * k, 0, seconds=curve.target_times[k])
    assert ks and set(ks) == {1}
