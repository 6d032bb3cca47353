"""The plain-decoding hot path: a greedy k = 0 step takes the raw logits' argmax (no warp,
no rule), and backends hold their hot-path settings (`CausalLM.decoding`) for a generation.

The argmax shortcut must emit exactly what the warp + rule path emits: the check decodes
the same model once through the shortcut and once through the full path (a zero logit
bias is a control, so it forces warp + rule without changing p), on logits built with
ties at the maximum (both must take the lowest id) and a maximum that moves row by row.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from verispec.decoding import decode
from verispec.models.llamacpp import LlamaCppModel
from verispec.models.toy import FunctionModel
from verispec.policy import FixedPolicy
from verispec.sampling import SamplingConfig, SeededRandomness

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
