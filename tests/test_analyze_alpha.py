"""verispec.analyze.alpha: exact α_i on the target's trajectory, pooled per position.

Toy models only (FunctionModel): no real models, no timings.
"""

import pytest

from verispec import analyze as an
from verispec import theory
from verispec.drafters.lookup import LookupDrafter
from verispec.drafters.model import ModelDrafter
from verispec.models.toy import FunctionModel, log_probs
from verispec.sampling import SamplingConfig, TorchRandomness

from conftest import successor

V = 6
P = [0.4, 0.3, 0.1, 0.1, 0.05, 0.05]
Q = [0.1, 0.2, 0.4, 0.1, 0.1, 0.1]
SAMPLE = SamplingConfig(temperature=1.0)
GREEDY = SamplingConfig()


def constant(probs, name):
    logits = log_probs(probs)
    return FunctionModel(lambda prefix: logits, V, name=name)


@pytest.mark.parametrize("sampling", [SAMPLE, SamplingConfig(temperature=0.7, top_k=5)])
def test_constant_distributions_give_theory_alpha_at_every_position(sampling):
    from verispec.sampling import warp

    target, draft = constant(P, "p"), constant(Q, "q")
    res = an.measure_trajectory_alpha(target, ModelDrafter(draft), [1, 2], k_max=5, sampling=sampling,
                                      max_new_tokens=40, rng=TorchRandomness(3), stride=1)
    assert len(res.tokens) == 40 and len(res.points) == 40
    p = warp(log_probs(P), sampling).numpy()
    q = warp(log_probs(Q), sampling).numpy()
    expected = theory.alpha(p, q)
    assert 0.3 < expected < 0.9
    for point in res.points:
        assert point.proposed == 5
        assert point.alphas == pytest.approx([expected] * 5, abs=1e-12)
    s = an.summarize_points(res.points, 5)
    assert s.alpha == pytest.approx(expected, abs=1e-12)
    assert s.alphas == pytest.approx([expected] * 5, abs=1e-12)   # w-weighting keeps it exact
    # E(k) measured directly is Σ_i P(acc >= i), not the product form: only check bounds
    assert all(1.0 <= e <= k + 1 for k, e in enumerate(s.expected_tokens))


def test_identical_target_and_draft_give_alpha_one():
    target, draft = constant(P, "p"), constant(P, "p2")
    res = an.measure_trajectory_alpha(target, ModelDrafter(draft), [0], k_max=4, sampling=SAMPLE,
                                      max_new_tokens=30, rng=TorchRandomness(0))
    s = an.summarize_points(res.points, 4)
    assert s.alpha == pytest.approx(1.0, abs=1e-12)
    assert s.alphas == pytest.approx([1.0] * 4, abs=1e-12)
    assert s.alpha_empirical == 1.0 and s.empirical_per_position == [1.0] * 4
    assert s.tau_empirical == [1, 2, 3, 4, 5]
    assert s.expected_tokens == pytest.approx([1, 2, 3, 4, 5])


def test_greedy_exact_alpha_equals_counted_accepts_and_is_conditional():
    # the draft goes wrong after token 2, so a draft run through "2" fails at the next position
    target, draft = successor(name="p"), successor(wrong_after=2, name="q")
    res = an.measure_trajectory_alpha(target, ModelDrafter(draft), [0], k_max=4, sampling=GREEDY,
                                      max_new_tokens=60, stride=1)
    assert res.tokens == [(i + 1) % V for i in range(60)]
    s = an.summarize_points(res.points, 4)
    # greedy: p and q are point masses, so the exact α_i is the counted acceptance
    assert s.alphas == pytest.approx(s.empirical_per_position, abs=1e-12)
    assert s.expected_tokens == pytest.approx(s.tau_empirical, abs=1e-12)
    # context ending in 2 -> x_1 wrong (α_1 = 0 there): 1 point in V
    assert s.alpha == pytest.approx(5 / 6)
    # position i given i-1 accepted: the draft reaches "2" only if it is not yet behind; by hand:
    # last token c, drafts c+1, c+2, ...; position i fails iff c+i-1 == 2 (mod 6)
    assert s.alphas == pytest.approx([5 / 6, 4 / 5, 3 / 4, 2 / 3])
    # unconditional (unweighted) mean at position 2 would count drafts after a miss: it differs
    unweighted = sum(p.alphas[1] for p in res.points) / len(res.points)
    assert unweighted != pytest.approx(s.alphas[1])


def test_sampled_exact_alpha_agrees_with_counted_accepts():
    def fn_p(prefix):
        return log_probs(P if prefix[-1] % 2 else Q)

    def fn_q(prefix):
        return log_probs(Q if prefix[-1] % 3 else P)

    target, draft = FunctionModel(fn_p, V, name="p"), FunctionModel(fn_q, V, name="q")
    res = an.measure_trajectory_alpha(target, ModelDrafter(draft), [1], k_max=3, sampling=SAMPLE,
                                      max_new_tokens=500, rng=TorchRandomness(1), stride=1)
    s = an.summarize_points(res.points, 3)
    for exact, counted in zip(s.alphas, s.empirical_per_position):
        assert exact == pytest.approx(counted, abs=0.06)
    for e, tau in zip(s.expected_tokens, s.tau_empirical):
        assert e == pytest.approx(tau, rel=0.05)


def test_lookup_drafter_and_stride_and_short_proposals():
    target = successor(name="p")
    res = an.measure_trajectory_alpha(target, LookupDrafter(), [0], k_max=4, sampling=GREEDY,
                                      max_new_tokens=24, stride=3)
    assert [p.t for p in res.points] == list(range(0, 24, 3))
    # the first point's context [0] has no earlier occurrence: nothing proposed, α = 0 there
    assert res.points[0].proposed == 0 and res.points[0].alphas == [0.0] * 4
    # once the cycle 0..5 has been seen, lookup predicts the successor exactly
    later = [p for p in res.points if p.t >= V]
    assert later and all(p.proposed == 4 and p.alphas == [1.0] * 4 for p in later)
    assert an.default_stride(48) == 2 and an.default_stride(10) == 1 and an.default_stride(100) == 4


def test_bad_arguments():
    target = successor()
    with pytest.raises(ValueError, match="k_max"):
        an.measure_trajectory_alpha(target, LookupDrafter(), [0], k_max=0)
    with pytest.raises(ValueError, match="stride"):
        an.measure_trajectory_alpha(target, LookupDrafter(), [0], k_max=2, stride=0)
