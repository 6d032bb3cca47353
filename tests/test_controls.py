"""Sampling controls (penalties, min-p, bias, bans, min_new_tokens) applied exactly at every draft position.

The definitions are checked on hand-computed rows; exactness is checked by exact
enumeration of the shipped decode loop on float64 toy models (TV <= 1e-12 against
the product of the controlled target conditionals), for each control alone and all
together, k = 1..4, including a control at draft position 2 that depends on draft
token 1, and min_new_tokens ending inside a block.
"""

import math

import pytest
import torch

import verispec.decoding as decoding
from verispec.audit import exact_distribution, target_distribution, toy_random_model, total_variation
from verispec.controls import apply_controls
from verispec.decoding import decode
from verispec.drafters.lookup import LookupDrafter
from verispec.drafters.model import ModelDrafter
from verispec.policy import FixedPolicy
from verispec.sampling import SamplingConfig, SeededRandomness, warp
from verispec.verify import gumbel

TOL = 1e-12
EOS = 5


def row(*values):
    return torch.tensor(values, dtype=torch.float64)


# -- definitions ----------------------------------------------------------------------------

def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_ids():
    cfg = SamplingConfig(repetition_penalty=2.0)
    out = apply_controls(row(4.0, -1.0, 3.0, -2.0), cfg, history=[0, 1], n_prompt=2)
    assert out.tolist() == [2.0, -2.0, 3.0, -2.0]          # ids 0, 1 seen (prompt counts)


def test_presence_and_frequency_penalties_count_generated_tokens_only():
    cfg = SamplingConfig(presence_penalty=0.5, frequency_penalty=0.25)
    # prompt [2], generated [0, 0, 1]: id 2 is prompt-only, so untouched
    out = apply_controls(row(1.0, 1.0, 1.0, 1.0), cfg, history=[2, 0, 0, 1], n_prompt=1)
    assert out.tolist() == [1.0 - 0.5 - 0.5, 1.0 - 0.5 - 0.25, 1.0, 1.0]


def test_logit_bias_bad_words_and_min_new_tokens():
    cfg = SamplingConfig(logit_bias={1: 2.5, "2": -1.0}, bad_words_ids=[[3], [0, 1]],
                         min_new_tokens=2, eos_token_ids={0})
    out = apply_controls(row(0.0, 0.0, 0.0, 0.0), cfg, history=[7, 0], n_prompt=1)
    # 1 generated token < 2: EOS (0) banned; history ends with 0, so [0, 1] bans 1 too
    assert out.tolist() == [-math.inf, -math.inf, -1.0, -math.inf]
    out = apply_controls(row(0.0, 0.0, 0.0, 0.0), cfg, history=[7, 2, 2], n_prompt=1)
    assert out.tolist() == [0.0, 2.5, -1.0, -math.inf]     # 2 generated: EOS allowed again


def test_each_row_sees_the_drafts_before_it():
    """Row i's history is history + drafts[:i]: a penalty on draft 1 changes row 2 only."""
    cfg = SamplingConfig(repetition_penalty=3.0, min_new_tokens=2, eos_token_ids={0})
    logits = torch.tensor([[3.0, 3.0, 3.0]] * 3, dtype=torch.float64)
    out = apply_controls(logits, cfg, history=[9], n_prompt=1, drafts=[1, 2])
    assert out[0].tolist() == [-math.inf, 3.0, 3.0]        # 0 generated: EOS banned
    assert out[1].tolist() == [-math.inf, 1.0, 3.0]        # after x1 = 1 (1 generated)
    assert out[2].tolist() == [3.0, 1.0, 1.0]              # after x1, x2: EOS allowed


def test_min_p_keeps_tokens_above_a_fraction_of_the_top_probability():
    probs = warp(row(0.0, math.log(0.5), math.log(0.05)), SamplingConfig(temperature=1.0, min_p=0.2))
    assert probs.tolist() == pytest.approx([1 / 1.5, 0.5 / 1.5, 0.0], abs=1e-15)


@pytest.mark.parametrize("kwargs, needle", [
    ({"repetition_penalty": 0.0}, "repetition_penalty"), ({"repetition_penalty": math.inf}, "repetition_penalty"),
    ({"presence_penalty": 2.5}, "presence_penalty"), ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"min_p": 1.5}, "min_p"), ({"min_new_tokens": -1}, "min_new_tokens"),
    ({"logit_bias": {1: math.nan}}, "logit_bias"), ({"logit_bias": {-1: 1.0}}, "logit_bias"),
    ({"bad_words_ids": [[]]}, "bad_words_ids"), ({"bad_words_ids": [1, 2]}, "bad_words_ids"),
])
def test_bad_values_are_refused_by_name(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        SamplingConfig(**kwargs)


def test_ids_outside_the_vocabulary_are_refused_by_name():
    with pytest.raises(ValueError, match="logit_bias holds token id 9"):
        SamplingConfig(logit_bias={9: 1.0}).check_vocab(6)
    with pytest.raises(ValueError, match="bad_words_ids holds token id 6"):
        SamplingConfig(bad_words_ids=[[1, 6]]).check_vocab(6)


def test_controls_without_a_history_are_an_error_not_a_silent_skip():
    with pytest.raises(ValueError, match="history"):
        warp(row(0.0, 1.0), SamplingConfig(repetition_penalty=1.2))


# -- exactness by exact enumeration ----------------------------------------------------------

T1 = dict(temperature=1.0)
CONTROLS = {
    "repetition": SamplingConfig(repetition_penalty=1.8, **T1),
    "presence+frequency": SamplingConfig(presence_penalty=1.2, frequency_penalty=0.7, **T1),
    "min_p": SamplingConfig(min_p=0.3, **T1),
    "logit_bias": SamplingConfig(logit_bias={1: 1.5, 3: -2.0}, **T1),
    "bad_words": SamplingConfig(bad_words_ids=[[2], [0, 4]], **T1),
    "min_new_tokens": SamplingConfig(min_new_tokens=2, eos_token_ids={EOS}, **T1),
    "all": SamplingConfig(temperature=0.8, top_k=5, min_p=0.05, repetition_penalty=1.5,
                          presence_penalty=0.4, frequency_penalty=0.3, logit_bias={1: 0.8},
                          bad_words_ids=[[0, 3]], min_new_tokens=2, eos_token_ids={EOS}),
}


def models():
    return (toy_random_model(6, seed=41, eos_token_ids=[EOS]),
            toy_random_model(6, seed=42, eos_token_ids=[EOS]))


@pytest.mark.parametrize("name", list(CONTROLS))
@pytest.mark.parametrize("k", [1, 2, 4])
def test_speculative_output_has_the_controlled_target_distribution(name, k):
    target, draft = models()
    cfg = CONTROLS[name]
    reference = target_distribution(target, [1, 0], 3, cfg)     # loop at k=0 == direct product
    dist = exact_distribution(target, ModelDrafter(draft), [1, 0], 3, k, cfg)
    assert total_variation(dist, reference) <= TOL


def test_min_new_tokens_ending_inside_a_block_and_eos_in_the_drafts():
    target = toy_random_model(4, seed=45, eos_token_ids=[3], sharpness=2.0)
    draft = toy_random_model(4, seed=46, eos_token_ids=[3], sharpness=2.0)
    cfg = SamplingConfig(min_new_tokens=2, eos_token_ids={3}, repetition_penalty=1.3, **T1)
    reference = target_distribution(target, [1], 4, cfg)
    assert all(len(s) >= 3 for s in reference)                 # EOS at the 3rd token at the earliest
    assert any(len(s) == 3 for s in reference)
    dist = exact_distribution(target, ModelDrafter(draft), [1], 4, 3, cfg)
    assert total_variation(dist, reference) <= TOL


def test_target_rows_with_a_stale_history_are_caught(monkeypatch):
    """The peers' bug: every verified row controlled with the committed history only
    (the drafts before it ignored). With a repetition penalty, p_2 depends on x_1, so
    the output moves away from the controlled target's distribution; enumeration sees it."""
    target, draft = models()
    cfg = SamplingConfig(repetition_penalty=4.0, **T1)
    reference = target_distribution(target, [1, 0], 3, cfg)
    assert total_variation(exact_distribution(target, ModelDrafter(draft), [1, 0], 3, 3, cfg),
                           reference) <= TOL
    real = decoding.warp
    monkeypatch.setattr(decoding, "warp", lambda logits, c, history, n_prompt, drafts: torch.stack(
        [real(r, c, history, n_prompt) for r in logits]))
    dist = exact_distribution(target, ModelDrafter(draft), [1, 0], 3, 3, cfg)
    assert total_variation(dist, reference) > 1e-3


def test_a_point_mass_draft_of_a_banned_token_is_rejected_never_emitted():
    """Prompt lookup proposes the repeated token; the ban makes p(x) = 0: it must be rejected."""
    target = toy_random_model(6, seed=43)
    prompt = [2, 3, 2, 3, 2, 3, 2]
    cfg = SamplingConfig(bad_words_ids=[[3]], **T1)
    reference = target_distribution(target, prompt, 3, cfg)
    for rule in (None, gumbel):
        dist = exact_distribution(target, LookupDrafter(), prompt, 3, 3, cfg, rule)
        assert total_variation(dist, reference) <= TOL
        assert all(3 not in s for s in dist)


def test_seeded_controlled_sampling_with_lookup_equals_plain_token_for_token():
    target = toy_random_model(6, seed=44)
    prompt = [2, 3, 4, 2, 3, 4, 2, 3]
    cfg = SamplingConfig(temperature=0.9, repetition_penalty=1.3, presence_penalty=0.2)
    plain = decode(target, prompt, FixedPolicy(None, 0), sampling=cfg, max_new_tokens=40,
                   rng=SeededRandomness(5), rule=gumbel).tokens
    for k in (1, 3, 8):
        spec = decode(target, prompt, FixedPolicy(LookupDrafter(), k), sampling=cfg,
                      max_new_tokens=40, rng=SeededRandomness(5), rule=gumbel)
        assert spec.tokens == plain
