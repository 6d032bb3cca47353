"""Ten known ways speculative decoding silently stops being exact; each test fails if one returns.

They exercise the shipped functions (verify, residual, warp, decode, ModelDrafter,
FixedPolicy, TorchRandomness); distributions are checked by exact enumeration
(`verispec.audit`) on float64 toy models, so "equal" means equal to ~1e-15.
"""

import math

import numpy as np
import pytest
import torch

import verispec.decoding as decoding
from verispec.audit import (
    AuditError, exact_distribution, marginal, target_distribution, toy_random_model,
    total_variation,
)
from verispec.decoding import decode
from verispec.drafters.model import ModelDrafter
from verispec.models.base import CausalLM
from verispec.models.hf import HFModel
from verispec.models.toy import FunctionModel, log_probs
from verispec.policy import FixedPolicy
from verispec.sampling import SamplingConfig, TorchRandomness, warp
from verispec.verify import residual, verify

from conftest import tiny_llama

T1 = SamplingConfig(temperature=1.0)



def fixed(probs_or_logits, *, logits=False, eos=()):
    row = torch.tensor(probs_or_logits, dtype=torch.float64) if logits else log_probs(probs_or_logits)
    return FunctionModel(lambda prefix: row, len(probs_or_logits), eos_token_ids=eos)


def scripted(script, vocab, prompt_len=1, eos=(), fill=0):
    """Deterministic model: after the prompt it produces `script`, then `fill` forever."""
    rows = {}

    def fn(prefix):
        i = len(prefix) - prompt_len
        t = script[i] if 0 <= i < len(script) else fill
        if t not in rows:
            probs = [0.0] * vocab
            probs[t] = 1.0
            rows[t] = log_probs(probs)
        return rows[t]

    return FunctionModel(fn, vocab, eos_token_ids=eos)


class RecordingDrafter(ModelDrafter):
    """ModelDrafter that remembers every proposal."""

    def __init__(self, model):
        super().__init__(model)
        self.proposals = []

    def propose(self, context, k, sample):
        x, q = super().propose(context, k, sample)
        self.proposals.append(list(x))
        return x, q


# 1 ----------------------------------------------------------------------------------------------

class ArgmaxDrafter:
    """Drafts the argmax of its warped distribution; `honest` reports the point mass it
    actually used, otherwise it (wrongly) reports its softmax as q."""

    name = "argmax"
    point_mass = False
    alpha_prior = 0.5
    forwards = 0
    seconds = 0.0
    catchup_seconds = 0.0

    def __init__(self, model, honest):
        self.model, self.honest = model, honest

    def available(self, context):
        return 1 << 20

    def propose(self, context, k, sample):
        xs, qs, ctx = [], [], list(context)
        for _ in range(k):
            q = warp(self.model.fn(tuple(ctx)), sample.sampling)
            x = int(q.argmax())
            qs.append(torch.nn.functional.one_hot(torch.tensor(x), q.shape[-1]).to(q.dtype)
                      if self.honest else q)
            xs.append(x)
            ctx.append(x)
        return xs, torch.stack(qs)

    def rollback(self, committed):
        pass


def test_01_deterministic_drafter_must_report_a_point_mass():
    target, draft = fixed([0.4, 0.6]), fixed([0.6, 0.4])
    honest = exact_distribution(target, ArgmaxDrafter(draft, honest=True), [0], 2, 1, T1)
    assert marginal(honest, 0, 2) == pytest.approx([0.4, 0.6], abs=1e-15)
    assert total_variation(honest, target_distribution(target, [0], 2, T1)) <= 1e-12
    # reporting the softmax while always drafting token 0: accepted w.p. min(1, .4/.6) = 2/3
    dishonest = exact_distribution(target, ArgmaxDrafter(draft, honest=False), [0], 2, 1, T1)
    assert marginal(dishonest, 0, 2) == pytest.approx([2 / 3, 1 / 3], abs=1e-15)


class MisreportingDrafter(ModelDrafter):
    """Samples x from its q but reports the q of another temperature."""

    def propose(self, context, k, sample):
        x, q = super().propose(context, k, sample)
        return x, warp(torch.log(q) * 0.5, SamplingConfig(temperature=1.0))


def test_01b_audit_rejects_a_drafter_whose_q_is_not_what_it_drew_from():
    target, draft = fixed([0.4, 0.6]), fixed([0.6, 0.4])
    with pytest.raises(AuditError, match="drafter reported q"):
        exact_distribution(target, MisreportingDrafter(draft), [0], 3, 2, T1)
    biased = exact_distribution(target, MisreportingDrafter(draft), [0], 3, 2, T1,
                                collapse_drafts=False)
    assert total_variation(biased, target_distribution(target, [0], 3, T1)) > 1e-3


# 2 ----------------------------------------------------------------------------------------------

WARPED = SamplingConfig(temperature=0.5, top_k=2)
P0 = 1 / (1 + math.exp(-2))          # softmax of (2, 1) / 0.5 = (4, 2)


def test_02_warps_apply_to_p_exactly_as_to_q():
    target = fixed([2.0, 1.0, 0.0], logits=True)
    draft = fixed([0.0, 1.0, 2.0], logits=True)          # disagrees: top-2 of q is {1, 2}
    assert warp(torch.tensor([2.0, 1.0, 0.0], dtype=torch.float64), WARPED).tolist() == \
        pytest.approx([P0, 1 - P0, 0.0], abs=1e-15)
    dist = exact_distribution(target, ModelDrafter(draft), [0], 3, 2, WARPED)
    assert all(2 not in s for s in dist)                 # filtered by top-k: never emitted
    for pos in range(3):
        assert marginal(dist, pos, 3) == pytest.approx([P0, 1 - P0, 0.0], abs=1e-14)


def test_02b_the_warp_check_catches_p_left_unwarped(monkeypatch):
    target, draft = fixed([2.0, 1.0, 0.0], logits=True), fixed([0.0, 1.0, 2.0], logits=True)
    real = decoding.warp
    # p gets temperature only (top-k forgotten on the target side); q is still fully warped
    monkeypatch.setattr(decoding, "warp",
                        lambda logits, cfg, *history: real(logits, SamplingConfig(temperature=cfg.temperature)))
    dist = exact_distribution(target, ModelDrafter(draft), [0], 3, 2, WARPED)
    assert marginal(dist, 0, 3)[2] > 1e-3 and marginal(dist, 0, 3)[0] != pytest.approx(P0, abs=1e-6)


class UnwarpedReportDrafter(ModelDrafter):
    """Draws from the warped q but reports the unwarped softmax (warp on one side only)."""

    def propose(self, context, k, sample):
        x, _ = super().propose(context, k, sample)
        ctx, qs = list(context), []
        for t in x:
            qs.append(self.model.fn(tuple(ctx)).softmax(-1))
            ctx.append(t)
        return x, torch.stack(qs)


def test_02c_q_reported_without_the_warps_it_was_drawn_with_is_caught():
    target, draft = fixed([2.0, 1.0, 0.0], logits=True), fixed([0.0, 1.0, 2.0], logits=True)
    with pytest.raises(AuditError, match="drafter reported q"):
        exact_distribution(target, UnwarpedReportDrafter(draft), [0], 3, 2, WARPED)
    dist = exact_distribution(target, UnwarpedReportDrafter(draft), [0], 3, 2, WARPED,
                              collapse_drafts=False)
    assert abs(marginal(dist, 0, 3)[0] - P0) > 1e-3


# 3 ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_03_residual_divides_by_its_sum_no_softmax_no_epsilon(dtype):
    p = torch.tensor([0.5, 0.3, 0.2], dtype=dtype)
    q = torch.tensor([0.2, 0.3, 0.5], dtype=dtype)
    r = residual(p, q)
    assert r.tolist() == [1.0, 0.0, 0.0]                # softmax would give (0.40, 0.30, 0.30)
    assert r.dtype == dtype
    # a tiny positive part stays the whole residual; zeros stay exactly zero
    p = torch.tensor([0.5, 0.5], dtype=torch.float64)
    q = torch.tensor([0.5 - 1e-9, 0.5 + 1e-9], dtype=torch.float64)
    r = residual(p, q)
    assert r[0] == 1.0 and r[1] == 0.0


# 4 ----------------------------------------------------------------------------------------------

def test_04_p_equal_q_no_nan_everything_accepted():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.0, 0.8], [0.1, 0.6, 0.3],
                      [1.0, 0.0, 0.0], [0.3, 0.3, 0.4]], dtype=torch.float32)
    r = residual(p[0], p[0])
    assert not torch.isnan(r).any() and torch.allclose(r.sum(), torch.tensor(1.0))
    x = torch.tensor([1, 2, 1, 0])
    u_max = float(np.nextafter(np.float32(1), np.float32(0)))
    for u in (0.0, 0.5, u_max):
        n, dist = verify(p, p[:4], x, torch.full((4,), u, dtype=torch.float32))
        assert n == 4 and torch.equal(dist, p[4])
    # and in the loop: a self-draft accepts every draft
    model = toy_random_model(6, seed=3)
    res = decode(model, [0], FixedPolicy(ModelDrafter(toy_random_model(6, seed=3)), 3),
                 sampling=T1, max_new_tokens=30, rng=TorchRandomness(0))
    assert res.stats.accepted == res.stats.drafted > 0


# 5 ----------------------------------------------------------------------------------------------

P_ROW = [0.5, 0.3, 0.2]
Q_ROW, Q_ROW_1 = [0.25, 0.5, 0.25], [0.8, 0.1, 0.1]   # x = 0: ratio 2 (accept) / 0.625
U = [0.5, 0.9, 0.1, 0.1]                              # 0.9 * 0.8 > 0.5: reject at position 2


def test_05_accept_count_stops_at_the_first_rejection():
    p = torch.tensor([P_ROW] * 5, dtype=torch.float64)
    q = torch.tensor([Q_ROW, Q_ROW_1, Q_ROW, Q_ROW], dtype=torch.float64)
    x = torch.tensor([0, 0, 0, 0])
    u = torch.tensor(U, dtype=torch.float32)
    px, qx = p[:4, 0], q[:, 0]
    assert (u * qx < px).tolist() == [True, False, True, True]
    n, dist = verify(p, q, x, u)
    assert n == 1
    assert torch.equal(dist, residual(p[1], q[1]))
    assert dist.tolist() == pytest.approx([0.0, 2 / 3, 1 / 3], abs=1e-15)
    assert not torch.equal(dist, p[4])                   # no bonus


class Script:
    """Randomness that replays given draws, then falls back to a seeded generator."""

    def __init__(self, tokens, uniforms):
        self.tokens, self.uniforms, self.fallback = list(tokens), list(uniforms), TorchRandomness(0)

    def categorical(self, probs, position, stream="sample"):
        if self.tokens:
            t = self.tokens.pop(0)
            assert probs[t] > 0
            return t
        return self.fallback.categorical(probs, position, stream)

    def uniform(self, n, position):
        if self.uniforms and n:
            return torch.tensor(self.uniforms.pop(0), dtype=torch.float32)
        return self.fallback.uniform(n, position)


def test_05b_in_the_loop_a_rejection_emits_two_tokens_and_no_bonus():
    target = fixed(P_ROW)
    # the draft's q at its 2nd draft position (prefix length 2) is Q_ROW_1
    draft = FunctionModel(lambda prefix: log_probs(Q_ROW_1 if len(prefix) == 2 else Q_ROW), 3)
    records, blocks = [], []
    decode(target, [0], FixedPolicy(ModelDrafter(draft), 4), sampling=T1, max_new_tokens=8,
           rng=Script([0, 0, 0, 0, 1], [U]), observer=records.append, on_commit=blocks.append)
    assert (records[0].k, records[0].accepted, records[0].committed) == (4, 1, 2)
    assert blocks[0] == [0, 1]


# 6 ----------------------------------------------------------------------------------------------

EOS = 1


def test_06_eos_inside_an_accepted_block_ends_generation_without_bonus():
    script = [5, EOS, 7, 8, 9]
    target = scripted(script, 10, eos=[EOS])
    drafter = RecordingDrafter(scripted(script, 10))
    records = []
    res = decode(target, [0], FixedPolicy(drafter, 4), sampling=T1, max_new_tokens=10,
                 rng=TorchRandomness(0), observer=records.append)
    assert drafter.proposals[0] == [5, EOS, 7, 8]
    assert (records[0].k, records[0].accepted, records[0].committed) == (4, 4, 2)
    assert res.tokens == [5, EOS] and res.stats.finish_reason == "eos"
    assert len(records) == 1
    # exact enumeration agrees (deterministic models: a single output)
    assert exact_distribution(target, ModelDrafter(scripted(script, 10)), [0], 10, 4, T1) == \
        {(5, EOS): 1.0}


# 7 ----------------------------------------------------------------------------------------------

def test_07_budget_is_exact_and_one_token_left_means_no_drafting():
    script = [2, 3, 4, 5, 6, 7, 8, 9]
    target, draft = scripted(script, 10), scripted(script, 10)
    forwards, records = [], []

    def observer(record):
        records.append(record)
        forwards.append(draft.forwards)

    res = decode(target, [0], FixedPolicy(ModelDrafter(draft), 3), sampling=T1, max_new_tokens=5,
                 rng=TorchRandomness(0), observer=observer)
    assert res.tokens == script[:5]
    assert [(r.k, r.accepted, r.committed) for r in records] == [(3, 3, 4), (0, 0, 1)]
    assert forwards[1] == forwards[0]                    # no draft forward in the last round
    # only one token of budget at all: nothing drafted
    before = draft.forwards
    res = decode(target, [0], FixedPolicy(ModelDrafter(draft), 5), sampling=T1,
                 max_new_tokens=1, rng=TorchRandomness(0))
    assert res.tokens == script[:1] and res.stats.drafted == 0 and draft.forwards == before
    # a block longer than the budget is clipped: exactly max_new_tokens tokens
    records.clear()
    res = decode(target, [0], FixedPolicy(ModelDrafter(draft), 5), sampling=T1,
                 max_new_tokens=3, rng=TorchRandomness(0), observer=records.append)
    assert res.tokens == script[:3] and records[0].k == 2


# 8 ----------------------------------------------------------------------------------------------

PROMPT = [3, 17, 42, 5, 9]


def _greedy(target, draft, k, n=40):
    policy = FixedPolicy(ModelDrafter(draft) if draft is not None else None, k)
    return decode(target, PROMPT, policy, sampling=SamplingConfig(), max_new_tokens=n,
                  rng=TorchRandomness(0))


def _diverges_or_fails(plain, run):
    try:
        return run().tokens != plain
    except Exception:                                    # a broken cache may also crash
        return True


def test_08_kv_caches_are_rolled_back_after_partial_acceptance(monkeypatch):
    plain = _greedy(tiny_llama(0), None, 0).tokens
    spec = _greedy(tiny_llama(0), tiny_llama(0, noise=0.25), 3)
    assert spec.tokens == plain
    assert 0 < spec.stats.accepted < spec.stats.drafted   # partial acceptances happened
    # the check has teeth: without rollback greedy speculative output diverges (or crashes)
    with monkeypatch.context() as m:
        m.setattr(CausalLM, "truncate", lambda self, length: None)
        assert _diverges_or_fails(plain, lambda: _greedy(tiny_llama(0), tiny_llama(0, noise=0.25), 3))
    with monkeypatch.context() as m:
        m.setattr(HFModel, "_truncate", lambda self, length: None)   # bookkeeping ok, KV stale
        assert _diverges_or_fails(plain, lambda: _greedy(tiny_llama(0), tiny_llama(0, noise=0.25), 3))


# 9 ----------------------------------------------------------------------------------------------

def _target_with_extra_id():
    base = toy_random_model(3, seed=21)

    def fn(prefix):
        probs = torch.cat([0.9 * base.fn(prefix).softmax(-1),
                           torch.tensor([0.1], dtype=torch.float64)])
        return probs.log()

    return FunctionModel(fn, 4)


def test_09_draft_vocabulary_shorter_than_the_target():
    target = _target_with_extra_id()
    drafter = RecordingDrafter(toy_random_model(3, seed=22))       # ids 0..2 only
    dist = exact_distribution(target, drafter, [0], 3, 2, T1)
    ref = target_distribution(target, [0], 3, T1)
    assert total_variation(dist, ref) <= 1e-12
    assert marginal(dist, 0, 4)[3] == pytest.approx(0.1, abs=1e-15)
    # id 3 is never drafted: it is reachable only through the residual / plain steps
    proposals = [t for x in drafter.proposals for t in x]
    assert proposals and 3 not in proposals
    assert [] in drafter.proposals                       # context holding id 3: no draft round
    p = warp(target.fn((0,)), T1)
    q = torch.nn.functional.pad(warp(drafter.model.fn((0,)), T1), (0, 1))
    assert residual(p, q)[3] > 0


# 10 ---------------------------------------------------------------------------------------------

def test_10_per_call_seed_and_no_global_rng():
    target, draft = toy_random_model(8, seed=31), toy_random_model(8, seed=32)

    def run(seed):
        return decode(target, [0], FixedPolicy(ModelDrafter(draft), 3), sampling=T1,
                      max_new_tokens=30, rng=TorchRandomness(seed)).tokens

    torch.manual_seed(1234)
    before = torch.get_rng_state()
    a, b, c = run(7), run(7), run(8)
    assert torch.equal(before, torch.get_rng_state())
    assert a == b and a != c
