"""verispec.cost: the cost-curve timing logic, on a fake clock (no sleeps, no real timings)."""

import pytest
import torch

from verispec import cost
from verispec.models.base import CausalLM
from verispec.timing import time_forwards

class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class FakeModel(CausalLM):
    """Each forward advances a fake clock by the next scripted duration (or a default per n)."""

    def __init__(self, clock, script=None, per_token=0.01, base=0.1, name="fake"):
        super().__init__()
        self.clock, self.script = clock, list(script or [])
        self.per_token, self.base = per_token, base
        self.vocab_size, self.context_length, self.name = 8, 4096, name
        self.calls = []          # (cache length before, n new tokens)
        self.truncations = []

    def _extend(self, tokens, keep):
        self.calls.append((len(self.tokens), len(tokens)))
        self.clock.now += self.script.pop(0) if self.script else self.base + self.per_token * len(tokens)
        return torch.zeros(keep, self.vocab_size)

    def _truncate(self, length):
        self.truncations.append(length)


def test_time_forward_drops_warmup_and_rolls_back_after_each_run():
    clock = FakeClock()
    model = FakeModel(clock, script=[9.0, 9.0, 1.0, 5.0, 2.0, 3.0, 4.0])
    model.forward([1, 2, 3])          # a context of 3 tokens (scripted 9.0, untimed)
    samples = cost.time_forward(model, [4, 5], repeats=5, warmup=1, clock=clock)
    assert samples == [1.0, 5.0, 2.0, 3.0, 4.0]     # the warm-up's 9.0 is dropped
    assert model.calls[1:] == [(3, 2)] * 6            # each run starts from the same 3-token cache
    assert model.truncations == [3] * 6 and model.tokens == [1, 2, 3]
    with pytest.raises(ValueError):
        cost.time_forward(model, [4], repeats=0, clock=clock)


def test_time_forwards_interleaves_rounds_over_batches():
    clock = FakeClock()
    model = FakeModel(clock, per_token=1.0, base=0.0)
    model.forward([1])
    model.calls.clear()
    samples = time_forwards(model, [[2], [2, 3], [2, 3, 4]], repeats=2, warmup=1, clock=clock)
    assert [n for _, n in model.calls] == [1, 2, 3] * 3      # round by round, not n by n
    assert samples == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]
    assert model.tokens == [1]


def test_timing_noise_warning():
    quiet = {"target_samples": [[1.0, 1.1], [1.2, 1.3]], "draft_samples": [0.5, 0.5], "target_times": [1.05, 1.25]}
    assert cost.timing_noise(quiet) is None
    spiky = {**quiet, "target_samples": [[1.0, 3.0], [1.2, 1.3]]}
    assert "T_t(1) spread 3.0x" in cost.timing_noise(spiky)
    falling = {**quiet, "target_times": [2.0, 1.0]}
    assert "falls at n = 2" in cost.timing_noise(falling)


def test_measure_cost_curve_medians_prefix_and_draft():
    clock = FakeClock()
    target = FakeModel(clock, per_token=0.01, base=0.1, name="t")
    draft = FakeModel(clock, per_token=0.001, base=0.02, name="d")
    # outliers: every 3rd timed target forward takes 10 s extra -> the median ignores them
    orig = target._extend
    count = {"n": 0}

    def spiky(tokens, keep):
        count["n"] += 1
        if count["n"] > 1 and count["n"] % 3 == 0:
            clock.now += 10.0
        return orig(tokens, keep)

    target._extend = spiky
    m = cost.measure_cost_curve(target, 3, list(range(50)), draft=draft, prefix_tokens=20, repeats=5,
                              warmup=2, clock=clock)
    assert target.calls[0] == (0, 20)                      # prefill of the 20-token prefix
    assert len(target.tokens) == 20 and len(draft.tokens) == 20   # rolled back to the prefix
    assert [len(s) for s in m.target_samples] == [5, 5, 5, 5]
    assert m.curve.target_times == pytest.approx([0.1 + 0.01 * n for n in range(1, 5)])
    assert m.curve.draft_time == pytest.approx(0.021)
    assert m.draft_time_2 == pytest.approx(0.022) and len(m.draft_samples_2) == 5
    assert len(draft.calls) == 1 + 7 * 2 and draft.calls[1:3] == [(20, 1), (20, 2)]   # interleaved
    assert m.curve.constant_c() == pytest.approx(0.021 / 0.11)
    assert max(max(s) for s in m.target_samples) > 10      # the spikes were measured, not used
    # forwards: 1 prefill + (2 + 5) per n
    assert len(target.calls) == 1 + 7 * 4
    d = m.as_dict()
    assert d["draft_kind"] == "model" and d["prefix_tokens"] == 20 and len(d["target_times"]) == 4


def test_measure_cost_curve_lookup_and_none():
    clock = FakeClock()
    target = FakeModel(clock)
    m = cost.measure_cost_curve(target, 2, [1, 2, 3], lookup=True, prefix_tokens=10, repeats=3, warmup=0,
                              clock=clock)
    assert m.draft_kind == "lookup" and m.draft_samples == [0.0, 0.0, 0.0]   # the fake clock stands still
    m = cost.measure_cost_curve(target, 2, [1, 2, 3], prefix_tokens=10, repeats=3, clock=clock)
    assert m.draft_kind == "none" and m.curve.draft_time == 0.0
