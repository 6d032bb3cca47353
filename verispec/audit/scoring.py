"""Scoring completions by teacher forcing: the reference's p at every generated position.

The token-level endpoint audit (`verispec.audit.tokens`) treats every generated
token as evidence. For a completion x_1..x_m of a prompt, one forward of the
reference model over prompt + x_1..x_{m−1} gives the logits of every position at
once (teacher forcing); `verispec.sampling.warp` then applies *the request's*
warping and controls to each row, with the history the server saw at that
position (prompt + x_1..x_{t−1}: penalties count the generated tokens, min_new_tokens
bans EOS early, exactly as `verispec.controls.apply_controls` does for drafts).
Row t is p_t = p(· | prompt, x_<t), the law an exact server draws x_t from.

Per token this module keeps what the statistics need (`TokenScores`, arrays [m]):

* ``pit``: the randomized probability integral transform
  u_t = F_t(x_t⁻) + V_t · p_t(x_t), V_t ~ Uniform(0, 1), with the vocabulary
  ordered by decreasing reference probability (ties by id), F_t(x⁻) the mass of
  the tokens before x_t. If x_t ~ p_t given the past, u_t ~ Uniform(0, 1) and the
  u_t are i.i.d. (Rosenblatt 1952, Ann. Math. Statist. 23:470–472; Diebold,
  Gunther & Tay 1998, Int. Econ. Rev. 39:863–883, for sequential forecasts; the
  randomisation for discrete laws is Brockwell 2007, Stat. Probab. Lett. 77:1253).
* ``top1`` (x_t is the reference's most probable token) and ``pmax`` = max p_t:
  E[top1 − pmax | past] = 0, Var = pmax(1 − pmax).
* ``llx``, the log-likelihood excess log p_t(x_t) + H(p_t): mean 0 under H0, with
  conditional variance ``llvar`` = Var_{p_t}(log p_t) = Σ p (log p)² − H².
* ``outside``: p_t(x_t) = 0 (impossible for an exact sampler); ``near_tie``: such a
  token whose logit / T is within `margin` of the support's lowest (a top-k/top-p
  cut-off that another kernel's rounding can move: numerics, not a bug).
* ``margin``: (greedy) the reference's top logit minus the logit of x_t (0 when x_t
  is the argmax): a divergence within the numerics floor is a near-tie.

The V_t come from a generator seeded by (seed, prompt, completion index), so a rerun
gives the same u and different completions get independent V.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..decoding import decoded_logits
from ..models.base import CausalLM
from ..sampling import SamplingConfig, warp

__all__ = ["NEAR_TIE_MARGIN", "TokenScores", "pit_values", "score_completion", "stack"]

#: logits (divided by T) within this of a cut-off or of the argmax are near-ties (numerics):
#: llama.cpp's logits move by up to ~0.4 between forward shapes (`verispec.audit.reference`)
NEAR_TIE_MARGIN = 0.5


@dataclass
class TokenScores:
    """The reference's view of one completion (arrays of length m' <= m; module doc)."""

    prompt_index: int
    tokens: np.ndarray       # [m'] int64
    pit: np.ndarray          # [m'] float64 in [0, 1]
    top1: np.ndarray         # [m'] bool
    pmax: np.ndarray         # [m'] float64
    llx: np.ndarray          # [m'] float64 (nats); 0 where outside
    llvar: np.ndarray        # [m'] float64
    logp: np.ndarray         # [m'] float64, log p_t(x_t) (-inf where outside)
    outside: np.ndarray      # [m'] bool
    near_tie: np.ndarray     # [m'] bool
    margin: np.ndarray       # [m'] float64, top logit/T − logit(x_t)/T (raw logits when greedy)
    argmax: np.ndarray       # [m'] int64
    index: int = -1          # the completion's index within its prompt (the seed's offset)

    @property
    def m(self) -> int:
        return len(self.tokens)


def pit_values(p: np.ndarray, tokens: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Randomized PIT u_t = F_t(x_t⁻) + v_t · p_t(x_t), tokens ordered by decreasing p_t.

    Args:
        p: [m, V] float64 probabilities (rows sum to 1).
        tokens: [m] int ids in 0..V-1.
        v: [m] uniforms in [0, 1).

    Returns:
        [m] float64 in [0, 1]. Ties in p are ordered by token id (any fixed order keeps
        u uniform: the randomisation spreads each token over its own interval).
    """
    rows = np.arange(len(tokens))
    px = p[rows, tokens]
    ids = np.arange(p.shape[1])[None, :]
    before = (p > px[:, None]) | ((p == px[:, None]) & (ids < tokens[:, None]))
    below = np.where(before, p, 0.0).sum(1)
    return np.clip(below + v * px, 0.0, 1.0)


def score_completion(reference: CausalLM, prompt: Sequence[int], completion: Sequence[int],
                     sampling: SamplingConfig, *, prompt_index: int = 0, index: int = 0, seed: int = 0,
                     margin: float = NEAR_TIE_MARGIN) -> TokenScores:
    """Teacher-force `completion` through `reference` and score every token (module doc).

    Args:
        reference: the reference `CausalLM` (its cache is reset). Scored as
            `verispec.decoding.decode` computes (`decoded_logits`: the prompt but its last
            token prefilled, the rest in one decode forward), so a llama.cpp reference in the
            batch-invariant mode computes the very logits verispec's own generation computed
            (a prefill runs on other kernels than a decode). A `stepwise` reference
            (llama-server's kernels) keeps its own order: one batch through the prompt, one
            row per later token.
        prompt: prompt ids (>= 1).
        completion: the generated ids x_1..x_m (m >= 1), as the server returned them.
        sampling: the request's warping and controls (`SamplingConfig`, with the
            reference's EOS ids when min_new_tokens is used).
        prompt_index, index, seed: the prompt's and the completion's indices and the audit's
            seed: they seed the PIT randomisation V (independent across completions).
        margin: the near-tie width in logits / T (`NEAR_TIE_MARGIN`).

    Returns:
        `TokenScores` of the m tokens.

    Raises:
        ValueError: empty prompt or completion, or a token outside 0..V−1 (the message
            names the token and the position: the server and the reference do not share
            a vocabulary).
    """
    prompt, completion = [int(t) for t in prompt], [int(t) for t in completion]
    if not prompt or not completion:
        raise ValueError("score_completion needs a non-empty prompt and completion")
    vocab = reference.vocab_size
    for i, t in enumerate(completion):
        if not 0 <= t < vocab:
            raise ValueError(f"token {t} at position {i + 1} is outside the reference's vocabulary "
                             f"0..{vocab - 1}: the server and the reference do not share a tokenizer; "
                             f"audit with the served model's own weights as --target")
    m = len(completion)
    reference.reset()
    if getattr(reference, "stepwise", False):
        logits = reference.sync(prompt + completion[:-1], keep=m)[-m:].double()
    else:
        logits = decoded_logits(reference, prompt, completion[:-1])[-m:].double()
    reference.reset()
    if sampling.has_controls:
        from ..controls import apply_controls
        controlled = apply_controls(logits, sampling, prompt, len(prompt), completion[:-1])
        plain = SamplingConfig(temperature=sampling.temperature, top_k=sampling.top_k,
                               top_p=sampling.top_p, min_p=sampling.min_p)
        p = warp(controlled, plain)
    else:
        controlled = logits
        p = warp(logits, sampling)
    p = p.double().numpy()
    scaled = (controlled / (sampling.temperature or 1.0)).numpy()
    tokens = np.asarray(completion, dtype=np.int64)
    rows = np.arange(m)
    px = p[rows, tokens]
    outside = px <= 0
    with np.errstate(divide="ignore", invalid="ignore"):
        logp_all = np.where(p > 0, np.log(np.where(p > 0, p, 1.0)), 0.0)
        entropy = -(p * logp_all).sum(1)
        second = (p * logp_all ** 2).sum(1)
        logp = np.where(outside, -np.inf, np.log(np.where(outside, 1.0, px)))
    llx = np.where(outside, 0.0, logp + entropy)
    llvar = np.maximum(second - entropy ** 2, 0.0)
    argmax = p.argmax(1)
    top = scaled[rows, argmax]
    gap = top - scaled[rows, tokens]
    support_low = np.where(p > 0, scaled, np.inf).min(1)
    near = outside & (scaled[rows, tokens] >= support_low - margin)
    v = np.random.default_rng([int(seed), int(prompt_index), int(index)]).random(m)
    return TokenScores(prompt_index, tokens, pit_values(p, tokens, v), tokens == argmax, p.max(1),
                       llx, llvar, logp, outside, near, np.where(tokens == argmax, 0.0, gap),
                       argmax.astype(np.int64), index)


def stack(scores: Sequence[TokenScores]) -> dict[str, np.ndarray]:
    """The per-token arrays of many completions, concatenated (keys of `TokenScores`) plus
    ``completion`` (index of the completion) and ``position`` (1-based)."""
    if not scores:
        return {}
    keys = ("tokens", "pit", "top1", "pmax", "llx", "llvar", "logp", "outside", "near_tie", "margin", "argmax")
    out = {k: np.concatenate([getattr(s, k) for s in scores]) for k in keys}
    out["completion"] = np.concatenate([np.full(s.m, i) for i, s in enumerate(scores)])
    out["prompt"] = np.concatenate([np.full(s.m, s.prompt_index) for s in scores])
    out["position"] = np.concatenate([np.arange(1, s.m + 1) for s in scores])
    return out
