"""The paired spec-on vs spec-off comparison (both arms on the same seeds).

Its validity must not rest on how the shared seed couples the arms: here the two arms
draw by inverse CDF from one shared uniform per position, but over token orders that
differ, so the coupling is partial (like a server whose speculative path consumes its
random stream differently) while both laws are exact. Its level must hold there, it
must see a sharpened law, and it must need fewer tokens than the unpaired test when
the coupling is strong.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verispec.audit.scoring import score_completion
from verispec.audit.twosample import paired_effects, two_sample_effects
from verispec.models.toy import FunctionModel
from verispec.sampling import SamplingConfig, warp

V = 8
S = SamplingConfig(temperature=1.0)


def toy() -> FunctionModel:
    def fn(prefix):
        g = torch.Generator().manual_seed(prefix[-1] * 7 + len(prefix) % 3)
        return torch.randn(V, generator=g, dtype=torch.float64) * 1.5
    return FunctionModel(fn, V, name="toy")


def arm(model, prompt, seeds, m, order=None, distort=None, fresh_from=None):
    """One completion per seed: token t by inverse CDF of the uniform keyed (seed, t),
    over `order` (a permutation of the vocabulary; None: 0..V-1); from position
    `fresh_from` on, uniforms from another key (the arms decouple there)."""
    out = []
    for seed in seeds:
        ids = list(prompt)
        for t in range(m):
            p = warp(model.fn(tuple(ids))[None], S, history=ids, n_prompt=len(prompt))[0].numpy()
            if distort is not None:
                p = distort(p) / distort(p).sum()
            perm = np.arange(V) if order is None else order
            other = fresh_from is not None and t >= fresh_from
            u = np.random.default_rng([seed, t, 1] if other else [seed, t]).random()
            k = int(np.searchsorted(np.cumsum(p[perm]), u * p.sum(), side="right"))
            ids.append(int(perm[min(k, V - 1)]))
        out.append(ids[len(prompt):])
    return out


def scored(model, prompt, completions, prompt_index=0):
    return [score_completion(model, prompt, c, S, prompt_index=prompt_index, index=i)
            for i, c in enumerate(completions)]


def run(model, n, m, on_order, distort=None, base=0, fresh_from=None):
    on, off, keys = [], [], []
    for j, prompt in enumerate(([1, 2], [5, 6])):
        seeds = range(base, base + n)
        on += scored(model, prompt, arm(model, prompt, seeds, m, on_order, distort, fresh_from), j)
        off += scored(model, prompt, arm(model, prompt, seeds, m), j)
        keys += [(j, i) for i in range(n)]
    return on, off, keys


def test_the_paired_level_holds_under_a_partial_coupling():
    model = toy()
    swapped = np.array([1, 0, 2, 3, 4, 5, 7, 6])        # both exact; the coupling is partial
    rejections = 0
    for r in range(40):
        on, off, keys = run(model, 30, 12, swapped, base=1000 * r)
        rejections += paired_effects(on, off, 0.05, keys)[1].p_value < 0.05
    # 40 runs at level 0.05: the binomial 99.9 % bound is 7
    assert rejections <= 7


def test_identical_arms_give_a_zero_effect_and_an_empty_completion_counts_as_zero():
    model = toy()
    on, off, keys = run(model, 10, 8, None)
    top, omni = paired_effects(on, off, 0.01, keys)
    assert top.estimate == 0 and top.ci == (0.0, 0.0) and omni.estimate == 0
    top, _ = paired_effects(on[1:], off, 0.01, keys)    # completion (0, 0) empty on the spec-on arm
    assert top.estimate == pytest.approx(-float(np.mean(off[0].top1 - off[0].pmax)) / len(keys))


def test_the_paired_test_sees_a_sharpened_law():
    model = toy()
    on, off, keys = run(model, 40, 16, None, distort=lambda p: p ** 3)
    top, omni = paired_effects(on, off, 0.01 / 2, keys)
    assert omni.p_value < 0.005 and top.estimate > 0 and top.ci[0] > 0


def test_a_strong_coupling_narrows_the_interval_against_the_unpaired_test():
    model = toy()
    on, off, keys = run(model, 40, 16, None, fresh_from=13)    # shared noise for 13 of 16 tokens
    paired = paired_effects(on, off, 0.01 / 2, keys)[0]
    unpaired = two_sample_effects(on, scored_disjoint(model, 40, 16), 0.01 / 2)[0]
    assert paired.se < unpaired.se / 2


def scored_disjoint(model, n, m):
    return [sc for j, prompt in enumerate(([1, 2], [5, 6]))
            for sc in scored(model, prompt, arm(model, prompt, range(10**6, 10**6 + n), m), j)]


def test_fewer_than_two_pairs_is_a_clear_error():
    with pytest.raises(ValueError, match="at least 2 pairs"):
        paired_effects([], [], 0.01, [(0, 0)])
