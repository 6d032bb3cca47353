"""The policy's rooms on their own: the online cost model speaks `CostCurve`, and no
estimate ever holds a non-finite value (issue: one request with broken numerics, e.g.
temperature 1e-310, must not change how every later request is drafted)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verispec import theory
from verispec.decoding import RoundRecord
from verispec.drafters import Confidence
from verispec.policy import AdaptivePolicy, make_policy
from verispec.policy.costs import OnlineCostCurve
from verispec.policy.decayed import Decayed
from test_policy import EvidenceDrafter, FakeDrafter, feed, record


def test_the_online_model_prices_a_measured_curve_as_the_curve_itself():
    measured = theory.CostCurve((1.0, 1.1, 1.2, 1.3, 1.4), 0.1)
    online = OnlineCostCurve.from_curve(measured, "model")
    curve = online.curve("model")
    assert isinstance(curve, theory.CostCurve) and curve == measured
    for alpha in (0.3, 0.8, [0.9, 0.7, 0.5, 0.4]):
        assert curve.optimal_k(alpha, 4) == measured.optimal_k(alpha, 4)
        assert [curve.speedup(alpha, k) for k in range(5)] == [measured.speedup(alpha, k) for k in range(5)]
    assert online.measured(0.1) == measured
    for alpha in (0.3, [0.9, 0.7, 0.5, 0.4]):
        assert online.optimal_k(alpha, 4) == measured.optimal_k(alpha, 4)
        assert online.speedup(alpha, 3, "model") == measured.speedup(alpha, 3)
    with pytest.raises(ValueError, match="no prices"):
        OnlineCostCurve(["model"], 5, decay=0.9, explore_slope=0.1, margin=0.03).speedup(0.5, 2)
    assert [online.target(n) for n in range(1, 6)] == list(measured.target_times)


def test_the_online_model_prices_verification_at_the_padded_width_and_a_guarded_single_step():
    online = OnlineCostCurve(["model"], 5, decay=0.9, explore_slope=0.1, margin=0.03)
    assert not online.ready and online.curve("model") is None and online.verify_width(3) == 3
    with pytest.raises(ValueError, match="T_t\\(1\\)"):
        online.target(1)
    for n, t in {1: 3.0, 2: 2.0, 3: 2.9, 4: 1.85}.items():    # T_t(1) caught a 3x hiccup
        online.observe_target(n, t)
    online.observe_draft("model", 0.1)
    curve = online.curve("model")
    assert curve.target_times[0] == max(2 * 2.0 - 2.9, 0.25 * 2.0)     # the guarded T_t(1)
    assert curve.target_times[1:4] == (1.85, 1.85, 1.85)               # w(2) = w(3) = w(4) = 4
    assert curve.target_times[4] == pytest.approx(3.0 * 1.4)           # unmeasured: optimistic guess


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0])
def test_the_online_model_refuses_timings_that_are_not_finite_or_negative(bad):
    online = OnlineCostCurve(["model"], 3, decay=0.9, explore_slope=0.1, margin=0.03)
    assert not online.observe_target(1, bad) and not online.observe_target(1, 0.0)
    assert not online.observe_draft("model", bad) and not online.observe_catchup("model", bad)
    assert not online.ready and online.draft_time("model") is None and online.catchup_time("model") is None
    if not math.isfinite(bad):
        stat = Decayed()
        assert not stat.add(bad, 0.9) and stat.weight == 0


def _all_finite(policy) -> bool:
    stats = [s for ss in policy.estimates.positional.values() for s in ss]
    for table in policy.estimates.evidence.values():
        stats += list(table.cells.values()) + list(table.lengths.values())
    stats += list(policy.costs.target_cost.values()) + list(policy.costs.draft_cost.values())
    stats += list(policy.costs.catchup_cost.values()) + list(policy.budget.probe_loss.values())
    return all(math.isfinite(s.total) and math.isfinite(s.weight) for s in stats) and \
        math.isfinite(policy.budget.spent) and math.isfinite(policy.budget.explored)


def _poisoned():
    """Rounds a request with broken numerics produces: NaN or infinite α, NaN, infinite or
    negative timings."""
    out = [record(3, 2, math.nan, 1.2, 0.1), record(2, 0, math.inf, 1.1, 0.1), record(1, 1, 0.9, math.nan, 0.1),
           record(1, 1, 0.9, math.inf, 0.1), record(2, 1, 0.9, 1.1, math.nan), record(2, 1, 0.9, 1.1, -0.1),
           record(0, 0, 0.0, math.nan, 0.0)]
    late = record(2, 2, 0.9, 1.1, 0.1)
    late.catchup_seconds = math.inf
    mixed = record(3, 2, 0.9, 1.2, 0.1)
    mixed.alphas = torch.tensor([0.9, math.nan, 0.8])
    return out + [late, mixed]


def test_rounds_with_a_non_finite_alpha_or_timing_leave_no_trace():
    curve = lambda n: 1.0 + 0.1 * (n - 1)
    fed, clean_only = (AdaptivePolicy({"model": FakeDrafter()}, k_max=6) for _ in range(2))
    clean = [record(0, 0, 0.0, 1.0, 0.0)] + [record(k, a, 0.7, curve(k + 1), 0.1)
                                              for k, a in ((2, 1), (4, 3), (3, 0), (1, 1), (5, 5))]
    poisoned = _poisoned()
    for i, r in enumerate(clean):
        fed.observe(r)
        for bad in poisoned[2 * i:2 * i + 2]:
            fed.observe(bad)
        clean_only.observe(r)
    assert _all_finite(fed)
    assert [fed.predict("model", k) for k in range(7)] == [clean_only.predict("model", k) for k in range(7)]
    # later choices (and what they learn) are those of a policy that never saw the bad rounds
    assert feed(fed, 0.8, curve, 0.1, rounds=120) == feed(clean_only, 0.8, curve, 0.1, rounds=120)
    assert _all_finite(fed)


def test_a_poisoned_round_of_an_evidence_drafter_stores_nothing():
    curve = lambda n: 1.0 + 0.1 * (n - 1)
    policy = AdaptivePolicy({"suffix": EvidenceDrafter()}, k_max=4)
    for n in range(1, 6):
        policy.observe(record(n - 1, 0, 0.0, curve(n), 0.001, drafter="calibration"))
    policy.observe(record(1, 1, 1.0, 1.1, 0.001, drafter="suffix"))      # T_d known
    for r in range(40):
        seq = [0] * (10 + r)
        _, k = policy.choose(seq)
        bad = RoundRecord(drafter="suffix" if k else "none", k=k, accepted=k, committed=k + 1,
                          alphas=torch.full((k,), math.nan), px=torch.zeros(k), qx=torch.zeros(k),
                          target_seconds=curve(k + 1), draft_seconds=0.001 * k)
        policy.observe(bad)
    assert _all_finite(policy)
    evidence = [Confidence(1.0, 20, 3)] * 4
    assert all(math.isfinite(a) for a in policy.alphas("suffix", 4, evidence))
    assert math.isfinite(policy.predict("suffix", 4, evidence=evidence))


def test_an_alpha_a_rounding_error_above_one_is_learned_as_one():
    """Σ min(p, q) over float32 distributions can exceed 1 by a rounding error; learned as
    is, the estimate would leave [0, 1] and theory's checks would refuse every price."""
    above, exact = (AdaptivePolicy({"model": FakeDrafter()}, k_max=2) for _ in range(2))
    for policy, alpha in ((above, 1.0000001), (exact, 1.0)):
        policy.observe(record(0, 0, 0.0, 1.0, 0.0))
        for _ in range(60):
            policy.observe(record(2, 2, alpha, 1.1, 0.01))
    assert above.alphas("model", 2) == exact.alphas("model", 2)
    assert max(above.alphas("model", 2)) <= 1.0
    assert above.predict("model", 2) == exact.predict("model", 2) > 1.0


def test_a_policy_seeded_with_a_measured_curve_prices_like_that_curve():
    measured = theory.CostCurve((1.0, 1.05, 1.1, 1.15, 1.2), 0.05)
    policy = AdaptivePolicy({"model": FakeDrafter()}, k_max=4, alpha_prior=0.6)
    policy.seed_costs(measured, "model")
    assert policy.calibrated and policy.costs.curve("model") == measured
    for k in range(5):
        assert policy.predict("model", k) == measured.speedup(policy.alphas("model", 4), k)
    with pytest.raises(KeyError):
        policy.seed_costs(measured, "no-such-drafter")


def test_make_policy_checks_k_max_for_a_fixed_k_too():
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="k_max"):
            make_policy(3, {}, k_max=bad)
    assert make_policy("auto", {}, k_max=5).k_max == 5


def _old_curve_times(online: OnlineCostCurve, name: str) -> list[float]:
    """The curve's prices as `OnlineCostCurve.curve` wrote them before it shared the
    drafter-independent part: width by width through `verify_width`."""
    b = online.sequences
    return ([online.single_step() + online.round_overhead(None)]
            + [online.price(b * online.verify_width(n)) + online.round_overhead(name)
               for n in range(2, online.n_max + 1)])


@settings(max_examples=200, deadline=None)
@given(widths=st.dictionaries(st.integers(1, 24), st.floats(0.01, 2.0), min_size=1, max_size=12),
       shared=st.dictionaries(st.integers(2, 24), st.floats(0.01, 2.0), max_size=8),
       sequences=st.integers(1, 3), margin=st.sampled_from([0.0, 0.03, 0.2]),
       overheads=st.lists(st.floats(0.0, 0.01), min_size=2, max_size=2))
def test_one_pass_prices_are_the_floats_of_pricing_each_width(widths, shared, sequences, margin, overheads):
    """`curve` builds T_t(w(n)) for every n in one pass and shares it between drafters;
    a wrong w(n) there (an off-by-one, a tie, the margin) would silently change which k the
    policy drafts. Every price must equal the width-by-width formula, alone and under load,
    and follow the next observation."""
    online = OnlineCostCurve(["model", "suffix"], 9, decay=0.9, explore_slope=0.1, margin=margin)
    online.observe_target(1, widths.pop(1, 0.5))
    for n, seconds in widths.items():
        online.observe_target(n, seconds)
    online.observe_overhead(None, overheads[0])
    online.observe_overhead("suffix", overheads[1])
    for name in ("model", "suffix"):
        online.observe_draft(name, 0.01)
    online.set_load(sequences=sequences, other_rows=0 if sequences == 1 else 1)
    for rows, seconds in shared.items():
        online._file(rows, seconds, alone=False)
    for name in ("model", "suffix"):
        assert list(online.curve(name).target_times) == _old_curve_times(online, name)
    online.observe_target(2, 0.001)                          # a new price: both curves follow it
    for name in ("model", "suffix"):
        assert list(online.curve(name).target_times) == _old_curve_times(online, name)
    online.set_load()                                        # alone again
    assert list(online.curve("model").target_times) == _old_curve_times(online, "model")
