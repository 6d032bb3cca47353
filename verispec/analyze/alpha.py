"""α on the target's own trajectory, per draft position (`verispec analyze`, step 1).

Notation as in `verispec.theory`: p = target, q = draft, k drafts, α_i the probability
that draft i is accepted given drafts 1..i-1 were.

The target first generates its own trajectory S (plain decoding, greedy or sampled).
Then every `stride` positions t the drafter proposes K tokens x_1..x_K from S[:t], and
ONE target forward over them gives p_1..p_{K+1} (the decode loop's own round,
`verispec.decoding.propose` / `score`, without committing). For each draft position i
(Leviathan et al. 2023, Definition 3.1 / Corollary 3.6):

    α_i(t)  = Σ_x min(p_i(x), q_i(x))           exact acceptance probability of x_i
    r_i(t)  = min(1, p_i(x_i) / q_i(x_i))       acceptance probability of the x_i drawn
    w_i(t)  = r_1 ··· r_i  (w_0 = 1)            probability that x_1..x_i are all accepted

Position i is only reached in speculative decoding when x_1..x_{i-1} were all accepted,
so the per-position rate is the w-weighted mean

    α_i = Σ_t w_{i-1}(t) α_i(t) / Σ_t w_{i-1}(t)

(the Rao-Blackwellised form of "accepted at i / reached i": lower variance than counting
accepts, and exactly theory.alpha(p, q) when p and q do not depend on the context). The
empirical accepts of the same drafts under the verify rule (uniforms from the injected
randomness) are recorded alongside. The overall α is the mean of α_1(t).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..decoding import decode, propose, score
from ..drafters.base import DraftSampler
from ..models.base import CausalLM
from ..policy import FixedPolicy
from ..sampling import Randomness, SamplingConfig, SeededRandomness
from ..verify import alpha, min_one_p_over_q, standard

__all__ = ["POINTS_PER_PROMPT", "PointRecord", "TrajectoryAlpha", "default_stride", "measure_trajectory_alpha",
           "AlphaSummary", "summarize_points"]

POINTS_PER_PROMPT = 32
GREEDY = SamplingConfig()


@dataclass
class PointRecord:
    """One evaluation point: K drafts from S[:t], scored by one target forward.

    Attributes:
        t: generated position (0 = right after the prompt); the context is
            prompt + trajectory[:t].
        proposed: m, drafts the drafter actually proposed (<= K; lookup may
            propose fewer, or none).
        alphas: [K] exact Σ min(p_i, q_i) at each draft position (0 beyond m).
        accept_probs: [K] r_i = min(1, p_i(x_i) / q_i(x_i)) (0 beyond m).
        accepted: empirical n, drafts accepted by the verify rule (0..m).
    """

    t: int
    proposed: int
    alphas: list[float]
    accept_probs: list[float]
    accepted: int

    def weights(self) -> list[float]:
        """[K] w_{i-1} = r_1 ··· r_{i-1}: the probability that position i is reached."""
        out, w = [], 1.0
        for r in self.accept_probs:
            out.append(w)
            w *= r
        return out


@dataclass
class TrajectoryAlpha:
    """α measured on one prompt's target trajectory.

    Attributes:
        prompt_tokens: prompt length in tokens.
        tokens: the target's trajectory (new tokens; EOS included if it ended there).
        finish_reason: from the plain decode ("eos", "length", ...).
        k_max: K, drafts per evaluation point.
        stride: evaluation every `stride` generated positions.
        points: one record per evaluation point.
    """

    prompt_tokens: int
    tokens: list[int]
    finish_reason: str
    k_max: int
    stride: int
    points: list[PointRecord]

    @property
    def alpha(self) -> float | None:
        """Mean exact α_1 over the evaluation points (None without points)."""
        return statistics.fmean(p.alphas[0] for p in self.points) if self.points else None


def default_stride(n_tokens: int, points: int = POINTS_PER_PROMPT) -> int:
    """Stride giving at most `points` evaluation points over n_tokens positions."""
    return max(1, math.ceil(n_tokens / points))


def measure_trajectory_alpha(
    target: CausalLM,
    drafter,
    prompt: Sequence[int],
    *,
    k_max: int,
    sampling: SamplingConfig = GREEDY,
    max_new_tokens: int = 128,
    rng: Randomness | None = None,
    stride: int | None = None,
    trajectory: Sequence[int] | None = None,
) -> TrajectoryAlpha:
    """Generate the target's trajectory (k = 0) and measure α_i at every `stride`-th position.

    Args:
        target: the target model p.
        drafter: a `Drafter` (ModelDrafter, LookupDrafter), with `propose` and `rollback`.
        prompt: prompt token ids (len >= 1).
        k_max: K, drafts proposed at each evaluation point (>= 1).
        sampling: warps applied to p and q (greedy by default).
        max_new_tokens: trajectory length budget.
        rng: randomness for the trajectory, the drafts and the empirical
            accept test (default SeededRandomness(0)).
        stride: evaluate every `stride` generated positions; None = about
            32 points (`default_stride`).
        trajectory: use these new tokens instead of generating them.

    Returns:
        TrajectoryAlpha with one PointRecord per evaluation point.

    Raises:
        ValueError: for k_max < 1, stride < 1 or an empty prompt.
    """
    if isinstance(k_max, bool) or not isinstance(k_max, int) or k_max < 1:
        raise ValueError(f"k_max must be an integer >= 1, got {k_max!r}")
    if stride is not None and (isinstance(stride, bool) or not isinstance(stride, int) or stride < 1):
        raise ValueError(f"stride must be an integer >= 1, got {stride!r}")
    prompt = [int(t) for t in prompt]
    if not prompt:
        raise ValueError("prompt is empty: give at least one token")
    rng = rng if rng is not None else SeededRandomness(0)
    if trajectory is None:
        result = decode(target, prompt, FixedPolicy(None, 0), sampling=sampling,
                        max_new_tokens=max_new_tokens, rng=rng)
        tokens, finish = list(result.tokens), result.stats.finish_reason
    else:
        tokens, finish = [int(t) for t in trajectory], "given"
    stride = stride or default_stride(len(tokens))
    seq = prompt + tokens
    vocab = target.vocab_size
    points = []
    for t in range(0, len(tokens), stride):
        context = seq[:len(prompt) + t]
        k = min(k_max, target.context_length - len(context))
        if k < 1:
            break
        # the decode loop's own round, without committing: propose, then score
        sample = DraftSampler(sampling, rng, t, standard.draft_stream, vocab, context, len(prompt))
        x, q, _ = propose(drafter, context, k, sample)
        m = len(x)
        # at least m+1 uncached tokens, so the forward returns all m+1 rows
        target.truncate(min(len(target.tokens), len(context) - 1))
        p, _ = score(target, context, x, sampling, n_prompt=len(prompt))
        alphas = [0.0] * k_max
        accept_probs = [0.0] * k_max
        accepted = 0
        if m:
            q = q.to(p.dtype)
            xt = torch.tensor(x, dtype=torch.long)
            alphas[:m] = [float(v) for v in alpha(p[:m].double(), q.double()).clamp(0.0, 1.0)]
            accept_probs[:m] = min_one_p_over_q(p.double(), q.double(), xt)
            accepted, _ = standard(p, q, xt, rng, t)
        drafter.rollback(context)
        points.append(PointRecord(t=t, proposed=m, alphas=alphas, accept_probs=accept_probs,
                                  accepted=int(accepted)))
    return TrajectoryAlpha(prompt_tokens=len(prompt), tokens=tokens, finish_reason=finish,
                           k_max=k_max, stride=stride, points=points)


@dataclass
class AlphaSummary:
    """Pooled α statistics over evaluation points (a prompt, a category, or all).

    Attributes:
        n_points: evaluation points pooled.
        alpha: mean exact α_1 (the overall acceptance rate).
        alphas: [K] per-position α_i, w-weighted means (None where no point reaches i).
        accept_at_least: [K] P(accepted >= i) = mean of w_{i-1}·α_i.
        expected_tokens: [K+1] E(k) = 1 + Σ_{i<=k} P(accepted >= i), measured directly.
        alpha_empirical: accepted / reached at position 1, from the verify rule.
        empirical_per_position: [K] accepted at i / reached i (None where never reached).
        tau_empirical: [K+1] mean of min(n, k) + 1 over points: tokens per round
            had k drafts been used (same drafts, same uniforms).
        mean_proposed: mean drafts proposed per point (K for a draft model).
    """

    n_points: int
    alpha: float | None
    alphas: list[float | None]
    accept_at_least: list[float | None]
    expected_tokens: list[float | None]
    alpha_empirical: float | None
    empirical_per_position: list[float | None]
    tau_empirical: list[float | None]
    mean_proposed: float | None


def summarize_points(points: Sequence[PointRecord], k_max: int) -> AlphaSummary:
    """Pool evaluation points into per-position α (the w-weighted mean of the module docstring).

    Args:
        points: evaluation points of one prompt, a category or all prompts.
        k_max: K, the length of each point's `alphas` / `accept_probs`.

    Returns:
        AlphaSummary; its figures are None where no point reaches a position (and all
        are None for no points).
    """
    n = len(points)
    if n == 0:
        none = [None] * k_max
        return AlphaSummary(0, None, list(none), list(none), [None] * (k_max + 1), None,
                            list(none), [None] * (k_max + 1), None)
    wsum = [0.0] * k_max
    wa = [0.0] * k_max
    reached = [0] * k_max
    accepted_at = [0] * k_max
    for p in points:
        for i, w in enumerate(p.weights()):
            wsum[i] += w
            wa[i] += w * p.alphas[i]
        verified = min(p.accepted + 1, p.proposed)
        for i in range(verified):
            reached[i] += 1
        for i in range(p.accepted):
            accepted_at[i] += 1
    alphas = [wa[i] / wsum[i] if wsum[i] > 0 else None for i in range(k_max)]
    at_least = [wa[i] / n for i in range(k_max)]
    expected = [1.0 + sum(at_least[:k]) for k in range(k_max + 1)]
    per_pos = [accepted_at[i] / reached[i] if reached[i] else None for i in range(k_max)]
    tau = [statistics.fmean(min(p.accepted, k) + 1 for p in points) for k in range(k_max + 1)]
    return AlphaSummary(
        n_points=n, alpha=statistics.fmean(p.alphas[0] for p in points), alphas=alphas,
        accept_at_least=at_least, expected_tokens=expected, alpha_empirical=per_pos[0],
        empirical_per_position=per_pos, tau_empirical=tau,
        mean_proposed=statistics.fmean(p.proposed for p in points))
