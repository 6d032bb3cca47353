"""The plain-decoding hot path: a greedy k = 0 step takes the raw logits' argmax (no warp,
no rule), and backends hold their hot-path settings (`CausalLM.decoding`) for a generation.

The argmax shortcut must emit exactly what the warp + rule path emits: the check decodes
the same model once through the shortcut and once through the full path (a zero logit
bias is a control, so it forces warp + rule without changing p), on logits built with
ties at the maximum (both must take the lowest id) and a maximum that moves row by row.
"""

from __future__ import annotations

import contextlib
import random
import re

import pytest
import torch

from verispec.decoding import decode
from verispec.models.llamacpp import LlamaCppModel
from verispec.models.toy import FunctionModel
from verispec.policy import FixedPolicy
from verispec.sampling import SamplingConfig, SeededRandomness
from verispec.verify import standard

VOCAB = 11


def _tied(prefix) -> torch.Tensor:
    """Logits with a three-way tie at the max whose members depend on the context."""
    h = (sum(prefix) * 7 + len(prefix)) % VOCAB
    out = torch.linspace(-3, 0, VOCAB, dtype=torch.float32)[torch.randperm(VOCAB, generator=torch.Generator().manual_seed(h))]
    top = sorted({h, (h * 3 + 1) % VOCAB, (h + 5) % VOCAB})
    out[top] = 2.0
    return out


def _decode(model, sampling: SamplingConfig, n: int = 40) -> list[int]:
    return decode(model, [1, 2, 3], FixedPolicy(None, 0), sampling=sampling, max_new_tokens=n,
                  rng=SeededRandomness(0)).tokens


def test_greedy_shortcut_equals_warp_and_rule_with_ties():
    model = FunctionModel(_tied, VOCAB, name="tied")
    fast = _decode(model, SamplingConfig())
    full = _decode(model, SamplingConfig(logit_bias={0: 0.0}))       # a control: the full path
    assert SamplingConfig(logit_bias={0: 0.0}).has_controls
    assert fast == full
    seq = [1, 2, 3]
    for t in fast:     # and each token is the lowest id among the tied maxima
        row = _tied(seq)
        assert t == min(i for i in range(VOCAB) if row[i] == row.max())
        seq.append(t)


def test_greedy_shortcut_records_plain_rounds_as_before():
    records = []
    model = FunctionModel(_tied, VOCAB, name="tied")
    decode(model, [1, 2, 3], FixedPolicy(None, 0), sampling=SamplingConfig(), max_new_tokens=5,
           rng=SeededRandomness(0), observer=records.append)
    assert [r.k for r in records] == [0] * 5 and all(r.committed == 1 for r in records)
    assert all(r.logits.shape == (1, VOCAB) and r.alphas.numel() == 0 for r in records)
    assert [int(r.logits[0].argmax()) for r in records] == [r.tokens[0] for r in records]


class _Flagged(FunctionModel):
    def __init__(self):
        super().__init__(_tied, VOCAB, name="flagged")
        self.inside: list[bool] = []
        self.active = False

    @contextlib.contextmanager
    def decoding(self):
        self.active = True
        try:
            yield
        finally:
            self.active = False

    def _extend(self, tokens, keep):
        self.inside.append(self.active)
        return super()._extend(tokens, keep)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_every_forward_runs_inside_the_backends_decoding_context(temperature):
    model = _Flagged()
    _decode(model, SamplingConfig(temperature=temperature), n=6)
    assert model.inside and all(model.inside) and not model.active


def test_llamacpp_keeps_torch_to_one_thread_while_decoding_and_restores_it():
    model = object.__new__(LlamaCppModel)      # decoding() needs no loaded model
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with model.decoding():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with pytest.raises(KeyError), model.decoding():
            raise KeyError("a failure inside still restores the threads")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("controls", [{}, {"logit_bias": {0: 0.0}}])
def test_nan_logits_raise_on_the_shortcut_as_on_the_full_path(controls):
    """The argmax shortcut skips `warp`, so it must keep warp's NaN guard: argmax over NaN
    logits would otherwise emit an arbitrary token (a silent wrong answer)."""
    def broken(prefix):
        out = _tied(prefix)
        if len(prefix) >= 6:
            out[4] = float("nan")
        return out

    model = FunctionModel(broken, VOCAB)
    with pytest.raises(FloatingPointError, match="NaN logits"):
        _decode(model, SamplingConfig(temperature=0.0, **controls))


# -- the drafted greedy shortcut ----------------------------------------------------------

class _Guesser:
    """A drafter that proposes, position by position, one of the tied maxima of `_tied`
    (often not the lowest id, which greedy must reject), the lowest one, or another id;
    with `soft`, it also reports a q that is not a point mass (as a sampled draft model's)."""

    name, alpha_prior, forwards, seconds, catchup_seconds = "guess", 0.5, 0, 0.0, 0.0

    def __init__(self, soft: bool = False) -> None:
        self.soft = soft
        self.point_mass = not soft

    def available(self, context) -> int:
        return 8

    def propose(self, context, k, sample):
        seq, x = list(context), []
        for i in range(k):
            row = _tied(seq)
            tied = [t for t in range(VOCAB) if row[t] == row.max()]
            pick = random.Random(len(seq)).randrange(4)    # a function of the context
            x.append(tied[0] if pick < 2 else tied[-1] if pick == 2 else (tied[0] + 1) % VOCAB)
            seq.append(x[-1])
        if not self.soft:
            return x, None
        q = torch.full((k, VOCAB), 0.2 / (VOCAB - 1))
        q[torch.arange(k), torch.tensor(x)] = 0.8
        return x, q

    def rollback(self, committed) -> None:
        pass

    def reset(self) -> None:
        pass


def _rounds(model, drafter, rule, k: int, sampling=SamplingConfig()):
    records = []
    out = decode(model, [1, 2, 3], FixedPolicy(drafter, k), sampling=sampling, max_new_tokens=40,
                 rng=SeededRandomness(0), rule=rule, observer=records.append).tokens
    return out, records


@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize("rule_name", ["standard", "gumbel"])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_drafted_greedy_shortcut_equals_warp_and_rule(soft, rule_name, k):
    """A drafted greedy round on the raw argmax (`_greedy_verification`) must accept, emit
    and record exactly what warp + rule do: the same rule without its
    `argmax_under_greedy` promise runs the full path. Drafts hit tied maxima that are not
    the lowest id (to be rejected), the lowest (accepted) and misses."""
    from verispec.verify import RULES, GumbelRule, UniformRule, min_one_p_over_q, verify

    class FullGumbel(GumbelRule):
        argmax_under_greedy = False

    full_rule = (UniformRule(verify, "standard-full", min_one_p_over_q) if rule_name == "standard"
                 else FullGumbel())
    model = FunctionModel(_tied, VOCAB, name="tied")
    fast, fast_records = _rounds(model, _Guesser(soft), RULES[rule_name], k)
    full, full_records = _rounds(model, _Guesser(soft), full_rule, k)
    assert fast == full == _decode(model, SamplingConfig())        # = plain greedy, ties included
    assert [(r.k, r.accepted, r.committed, r.width) for r in fast_records] == \
        [(r.k, r.accepted, r.committed, r.width) for r in full_records]
    assert any(r.accepted > 0 for r in fast_records) and any(r.accepted == 0 for r in fast_records)
    assert k == 1 or any(0 < r.accepted < r.k for r in fast_records)
    for a, b in zip(fast_records, full_records):
        for name in ("alphas", "px", "qx", "logits"):
            x, y = getattr(a, name), getattr(b, name)
            assert x.dtype == y.dtype and torch.equal(x, y), (name, x, y)


def test_a_biased_rule_is_never_shortcut_under_greedy():
    """The audit's biased rules must run as written (an audit of a rule the loop replaced
    by the argmax would pass a broken rule): one that accepts every draft emits them."""
    from verispec.verify import UniformRule

    def accept_all(p, q, x, u):
        return x.shape[0], p[-1]

    model = FunctionModel(_tied, VOCAB, name="tied")
    out, records = _rounds(model, _Guesser(), UniformRule(accept_all, "accept-all"), 3)
    assert all(r.accepted == r.k for r in records)
    assert out != _decode(model, SamplingConfig())


def test_nan_logits_in_a_drafted_row_raise_on_the_shortcut():
    def broken(prefix):
        out = _tied(prefix)
        if len(prefix) >= 6:
            out[4] = float("nan")
        return out

    with pytest.raises(FloatingPointError, match="NaN logits"):
        _rounds(FunctionModel(broken, VOCAB), _Guesser(), standard, 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_argmax_rows_takes_the_lowest_tied_id_and_rejects_nan_on_both_paths(dtype):
    """`_argmax_rows` (numpy on CPU float32/float64, torch's max otherwise, here bfloat16):
    each row's first maximum, and a NaN anywhere in a row raises as `warp` does."""
    from verispec.decoding import NAN_LOGITS, _argmax_rows

    logits = torch.zeros(3, 7, dtype=dtype)
    logits[0, [2, 5]] = 1.0          # tie: 2
    logits[1, 6] = 2.0
    logits[2, [0, 3, 6]] = -1.0      # the maximum 0 first at id 1
    assert _argmax_rows(logits) == [2, 6, 1]
    logits[1, 4] = float("nan")
    with pytest.raises(FloatingPointError, match=re.escape(NAN_LOGITS)):
        _argmax_rows(logits)
