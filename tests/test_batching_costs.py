"""k chosen for the load: the one cost model prices a shared forward with the planner's batch maths.

T_t is learned by the forward's total rows; with B sequences sharing it, a round of k drafts
is priced T_t(B(k+1)) against T_t(B) for a plain step. On a curve that is flat up to 10 rows
and then linear (memory-bound, then compute-bound), k* must fall as B rises and reach 0.
"""

import pytest

from verispec.policy.costs import OnlineCostCurve
from verispec.theory import expected_tokens


def flat_then_linear(rows: int) -> float:
    """Seconds for a forward of `rows` rows: 1.0 up to 10 rows, then 0.1 per row."""
    return max(1.0, 0.1 * rows)


def model(n_max: int = 9) -> OnlineCostCurve:
    costs = OnlineCostCurve(["lookup"], n_max, decay=0.9, explore_slope=0.1, margin=0.03)
    for rows in range(1, 8 * n_max + 1):       # every total width a load of up to 8 can reach
        costs.observe_target(rows, flat_then_linear(rows))
    costs.observe_draft("lookup", 0.0)
    return costs


def test_alone_the_prices_are_the_single_sequence_curve():
    costs = model()
    assert costs.curve("lookup").target_times == tuple(flat_then_linear(n) for n in range(1, 10))


@pytest.mark.parametrize("alpha", [0.5, 0.7, 0.9])
def test_speculation_turns_down_as_sequences_share_the_forward(alpha):
    costs = model()
    best = []
    for b in (1, 2, 4, 8):
        costs.set_load(sequences=b)
        k, s = costs.optimal_k(alpha, 8)
        best.append(k)
        times = costs.curve("lookup").target_times
        assert times[1:] == tuple(flat_then_linear(b * n) for n in range(2, 10))   # T_t(B n)
        assert times[0] <= flat_then_linear(b)    # T_t(B), guarded as T_t(1) is (single_step)
        assert s == pytest.approx(expected_tokens(alpha, k) * times[0] / times[k])
    assert best == sorted(best, reverse=True) and best[0] > best[-1]
    assert best[0] >= 4                         # alone, drafting is free up to 10 rows
    costs.set_load(sequences=16)
    assert costs.optimal_k(alpha, 8)[0] == 0    # every row is compute: plain decoding
    costs.set_load()
    assert costs.optimal_k(alpha, 8)[0] == best[0]   # alone again: up again


def test_observations_are_filed_by_the_rows_of_the_whole_forward():
    costs = OnlineCostCurve(["lookup"], 4, decay=0.5, explore_slope=0.1, margin=0.03)
    costs.set_load(sequences=3, other_rows=7)
    costs.observe_target(2, 0.25)               # this sequence's 2 rows + 7 others'
    assert set(costs.loaded_cost) == {9} and costs.loaded_cost[9].mean == 0.25
    assert not costs.target_cost                # the single-sequence curve is left alone
    costs.reset_target(1, 0.1)                  # calibration measures one row alone
    assert costs.target_cost[1].mean == 0.1


def test_shared_forwards_dearer_than_one_sequences_rows_scale_the_widths_not_yet_shared():
    """Rows of several sequences cost more than as many rows of one (2-core CPU: two
    sequences' single rows 93 ms, one sequence's two rows 73 ms). Priced from the solo
    calibration, a k = 1 round of two sequences (4 rows, solo 103 ms) looked 8 % dearer than
    a plain one (2 rows shared, 95 ms measured) and the policy drafted on a prior α of 0.6
    (`benchmarks/serve/README.md`). Widths not yet shared are scaled by the measured ratio,
    and the solo prices are not touched by shared forwards."""
    solo = {1: 0.036, 2: 0.073, 3: 0.085, 4: 0.103, 5: 0.120, 6: 0.152, 7: 0.155, 8: 0.175, 9: 0.247}
    costs = OnlineCostCurve(["model"], 9, decay=0.9, explore_slope=0.1, margin=0.03)
    for rows, seconds in solo.items():
        costs.reset_target(rows, seconds)
    costs.observe_draft("model", 0.0174)
    costs.set_load(sequences=2, other_rows=1)
    assert costs.price(4) == solo[4]             # nothing shared measured yet: the solo curve
    costs.observe_target(1, 0.095)               # one plain row + the other's: 2 shared rows
    assert costs.price(2) == pytest.approx(0.095)
    assert costs.price(4) == pytest.approx(solo[4] * 0.095 / solo[2])
    # priced as before (shared T_t(2) against the solo T_t(4)), k = 1 at α 0.6 looked to pay
    assert expected_tokens(0.6, 1) * 0.095 / (solo[4] + 2 * 0.0174) > 1.03
    assert costs.optimal_k(0.6, 8)[0] == 0
    costs.set_load()
    assert costs.curve("model").target_times[:4] == (solo[1], solo[2], solo[3], solo[4])


@pytest.mark.parametrize("bad", [dict(sequences=0), dict(other_rows=-1), dict(sequences=1.5),
                                 dict(other_rows=True)])
def test_bad_load_is_refused_naming_the_argument(bad):
    costs = OnlineCostCurve(["lookup"], 4, decay=0.5, explore_slope=0.1, margin=0.03)
    with pytest.raises(ValueError, match=next(iter(bad))):
        costs.set_load(**bad)


# The default pair on a 2-core CPU (benchmarks/llamacpp-native/curve.json): T_t(n) of
# Qwen2.5-Coder-1.5B for n = 1..9 rows, then about linear; its 0.5B draft at T_d = 37 ms.
QWEN_ROWS = (0.081, 0.124, 0.164, 0.188, 0.237, 0.275, 0.284, 0.339, 0.378)
QWEN_DRAFT = 0.037


def qwen_like(rows: int) -> float:
    return QWEN_ROWS[rows - 1] if rows <= len(QWEN_ROWS) else QWEN_ROWS[-1] + 0.04 * (rows - len(QWEN_ROWS))


def test_serial_drafts_are_priced_for_every_sequence_they_hold_up():
    """Each request drafts in its own thread, one after another, while the shared forward
    waits: with B sequences a draft model's k tokens cost B·k·T_d of everyone's time. Priced
    once (as before), a 0.5B draft at alpha 0.99 still looked worth a token at B = 2 (S = 1.10),
    and the default pair ran slower with company than alone (benchmarks/serve/)."""
    costs = OnlineCostCurve(["model"], 9, decay=0.9, explore_slope=0.1, margin=0.03)
    for rows in range(1, 37):
        costs.observe_target(rows, qwen_like(rows))
    costs.observe_draft("model", QWEN_DRAFT)
    assert costs.optimal_k(0.99, 8)[0] >= 1                 # alone a near-perfect draft model pays
    for b in (2, 4):
        costs.set_load(sequences=b)
        assert costs.curve("model").draft_time == pytest.approx(b * QWEN_DRAFT)
        assert costs.optimal_k(0.99, 8)[0] == 0             # with company it does not
    costs.set_load()
    assert costs.curve("model").draft_time == pytest.approx(QWEN_DRAFT)


def test_a_catch_up_is_charged_for_every_sequence_it_holds_up():
    from verispec.policy import AdaptivePolicy

    class CatchingUp:
        alpha_prior = 0.6

        def available(self, seq):
            return 8

        def catchup_tokens(self, seq):
            return 100

    policy = AdaptivePolicy({"model": CatchingUp()})
    policy.costs.observe_catchup("model", 0.005)
    policy.catching_up = {"model"}
    assert policy.catchup_charge("model", [1, 2]) == (pytest.approx(0.5), 100)
    policy.costs.set_load(sequences=3)
    assert policy.catchup_charge("model", [1, 2]) == (pytest.approx(1.5), 100)


@pytest.mark.parametrize("alpha", [0.5, 0.7, 0.9])
@pytest.mark.parametrize("b", [2, 4])
def test_a_solo_calibration_prices_wide_batched_rounds_no_cheaper_than_its_widest_row(alpha, b):
    """A batched request starts from the solo calibration, T_t(1..9) (`serve`'s copy of the
    decoder's curve), and prices k drafts at T_t(B(k+1)), mostly beyond it. Guessed from T_t(1)
    alone, T_t(10) came out at 1.9 T_t(1), under the measured T_t(9) = 4.7 T_t(1): every
    request drafted k >= 4 almost every round (benchmarks/serve/batched-qwen-serial-drafts, 50-90
    drafted tokens per 64-token response against 2-26 alone) at a third of llama-server's rate.
    Guessed from the measured curve (its widest width and least-squares slope), the choice is
    the one the whole curve makes."""
    solo = OnlineCostCurve(["suffix"], 9, decay=0.9, explore_slope=0.1, margin=0.03)
    whole = OnlineCostCurve(["suffix"], 9, decay=0.9, explore_slope=0.1, margin=0.03)
    for rows in range(1, 10):
        solo.observe_target(rows, qwen_like(rows))
    for rows in range(1, 9 * b + 1):
        whole.observe_target(rows, qwen_like(rows))
    for costs in (solo, whole):
        costs.observe_draft("suffix", 0.0)
        costs.set_load(sequences=b)
    for n in range(10, 9 * b + 1):
        assert solo.target(n) >= solo.target(9)
    assert solo.optimal_k(alpha, 8)[0] == whole.optimal_k(alpha, 8)[0]
