"""Measure α and the cost curve on this machine, and predict the speedup for every k.

Notation as in `verispec.theory`: p = target, q = draft, k drafts, α_i the
probability that draft i is accepted given drafts 1..i-1 were, T_t(n) seconds of
a target forward over n new tokens, T_d seconds per draft token.

Three measurements, each reusing the shipped model protocol and drafters:

1. The target's own trajectory S (plain decoding, greedy or sampled).
2. α on that trajectory. Every `stride` positions t the drafter proposes K tokens
   x_1..x_K from S[:t]; ONE target forward over them gives p_1..p_{K+1}. For each
   draft position i (Leviathan et al. 2023, Definition 3.1 / Corollary 3.6):

       α_i(t)  = Σ_x min(p_i(x), q_i(x))           exact acceptance probability of x_i
       r_i(t)  = min(1, p_i(x_i) / q_i(x_i))       acceptance probability of the x_i drawn
       w_i(t)  = r_1 ··· r_i  (w_0 = 1)            probability that x_1..x_i are all accepted

   Position i is only reached in speculative decoding when x_1..x_{i-1} were all
   accepted, so the per-position rate is the w-weighted mean

       α_i = Σ_t w_{i-1}(t) α_i(t) / Σ_t w_{i-1}(t)

   (the Rao-Blackwellised form of "accepted at i / reached i": lower variance
   than counting accepts, and exactly theory.alpha(p, q) when p and q do not
   depend on the context). The empirical accepts of the same drafts under the
   verify rule (uniforms from the injected randomness) are recorded alongside.
   The overall α is the mean of α_1(t).
3. The cost curve: T_t(n), n = 1..K+1, after a realistic prefix (median of
   repeats after warm-up, the cache rolled back with `truncate` between repeats),
   and T_d (one draft forward; for prompt lookup the matching time per round).

The predictions are S(k) = E·T_t(1) / (k·T_d + T_t(k+1)) (cost curve, per-position
α) next to Leviathan et al.'s S(k) = E(α, k) / (k·c + 1) with c = T_d / T_t(1), and,
for a draft model, "curve+" (`speedup_refeed`): the curve plus the 2-token draft
forward `ModelDrafter` runs after a fully accepted round (it never feeds x_k).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from .decoding import decode, propose, score
from .drafters.base import DraftSampler
from .models.base import CausalLM
from .policy import FixedPolicy
from .sampling import Randomness, SamplingConfig, SeededRandomness
from .timing import Clock, time_forwards
from .theory import (
    CostCurve,
    expected_tokens_positional,
    optimal_k_constant,
    speedup_constant_cost,
)
from .verify import alpha, min_one_p_over_q, standard

__all__ = [
    "ENV_VAR", "MT_BENCH_CATEGORIES", "MULTI_TURN", "PLAIN_CATEGORY",
    "Prompt", "PromptFileError", "default_prompts_path", "load_prompts",
    "PointRecord", "TrajectoryAlpha", "measure_trajectory_alpha", "default_stride",
    "AlphaSummary", "summarize_points",
    "CostMeasurement", "time_forward", "time_forwards", "measure_cost_curve",
    "predict_speedup", "optimal_k", "speedup_table", "speedup_refeed", "predict_from_analysis", "load_analysis",
    "AnalyzeConfig", "run_analysis", "write_outputs", "render_tables", "closing_notes", "timing_noise",
]

ENV_VAR = "VERISPEC_SPEC_BENCH"
MULTI_TURN = "multi-turn"
PLAIN_CATEGORY = "prompts"
# MT-Bench's eight categories, which Spec-Bench reports together as "multi-turn conversation".
MT_BENCH_CATEGORIES = frozenset(
    {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"})
POINTS_PER_PROMPT = 32
GREEDY = SamplingConfig()


# --------------------------------------------------------------------------- prompt files


class PromptFileError(ValueError):
    """A prompt file that cannot be used (empty, bad JSON line, missing fields)."""


@dataclass(frozen=True)
class Prompt:
    """One prompt to analyse.

    Attributes:
        id: question_id (JSON lines) or the line number (plain text), as a string.
        category: the category used for grouping ("multi-turn" for MT-Bench rows
            unless raw categories were asked for; "prompts" for plain text).
        raw_category: the category as written in the file.
        text: the first user turn.
        line: 1-based line number in the file.
    """

    id: str
    category: str
    raw_category: str
    text: str
    line: int


def default_prompts_path() -> Path:
    """The Spec-Bench question file: $VERISPEC_SPEC_BENCH, else shared/data/spec_bench nearby.

    $VERISPEC_SPEC_BENCH may name the file or a directory holding question.jsonl.
    Without it, ../shared/data/spec_bench/question.jsonl and shared/data/... are
    tried relative to the working directory and to the source checkout.

    Raises:
        FileNotFoundError: listing the places tried.
    """
    env = os.environ.get(ENV_VAR)
    if env:
        path = Path(env).expanduser()
        if path.is_dir():
            path = path / "question.jsonl"
        if not path.is_file():
            raise FileNotFoundError(f"${ENV_VAR} is set to {env!r} but {path} is not a file")
        return path
    rel = Path("data") / "spec_bench" / "question.jsonl"
    roots = [Path.cwd(), Path(__file__).resolve().parent.parent]
    tried = []
    for root in roots:
        for base in (root / ".." / "shared", root / "shared"):
            candidate = (base / rel).resolve()
            if candidate.is_file():
                return candidate
            tried.append(str(candidate))
    raise FileNotFoundError(
        "no Spec-Bench question file found (tried " + ", ".join(dict.fromkeys(tried))
        + f"); pass --prompts FILE or set ${ENV_VAR}")


def _group(category: str, raw_categories: bool) -> str:
    if not raw_categories and category in MT_BENCH_CATEGORIES:
        return MULTI_TURN
    return category


def load_prompts(path: str | os.PathLike | None = None, *, per_category: int = 3,
                 raw_categories: bool = False) -> list[Prompt]:
    """Read prompts from a Spec-Bench JSON-lines file or a plain text file.

    JSON lines (a .jsonl/.json file, or a file whose first non-blank line starts
    with "{"): one object a line with `turns` (list of strings; the first turn is
    used), `category` (default "uncategorized") and `question_id` (default: the
    line number). Plain text: one prompt a line, category "prompts". Blank lines
    are skipped.

    Args:
        path: the file; None = `default_prompts_path()`.
        per_category: keep the first N prompts of each category in file order
            (0 keeps all).
        raw_categories: keep MT-Bench's eight categories apart instead of
            grouping them as "multi-turn".

    Returns:
        Prompts grouped by category (categories in order of first appearance).

    Raises:
        FileNotFoundError: naming the path.
        PromptFileError: for an empty file, a bad JSON line (naming its line
            number) or a row without a usable first turn.
        ValueError: for per_category < 0.
    """
    if isinstance(per_category, bool) or not isinstance(per_category, int) or per_category < 0:
        raise ValueError(f"per_category must be an integer >= 0 (0 = all), got {per_category!r}")
    path = default_prompts_path() if path is None else Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"prompt file {path} does not exist")
    if path.is_dir():
        raise PromptFileError(f"prompt file {path} is a directory; give a .jsonl or text file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise PromptFileError(f"{path} is not UTF-8 text: {e}") from None
    lines = [(i + 1, line) for i, line in enumerate(text.splitlines()) if line.strip()]
    if not lines:
        raise PromptFileError(f"prompt file {path} is empty: give one prompt a line, or Spec-Bench JSON lines")
    is_json = path.suffix.lower() in (".jsonl", ".json") or lines[0][1].lstrip().startswith("{")
    prompts: list[Prompt] = []
    for number, line in lines:
        if not is_json:
            prompts.append(Prompt(str(number), PLAIN_CATEGORY, PLAIN_CATEGORY, line.strip(), number))
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptFileError(f"{path}, line {number}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(row, dict):
            raise PromptFileError(f"{path}, line {number}: expected a JSON object, got {type(row).__name__}")
        turns = row.get("turns")
        if isinstance(turns, str):
            turns = [turns]
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str) or not turns[0].strip():
            raise PromptFileError(f"{path}, line {number}: needs \"turns\", a list whose first item is "
                                  "a non-empty string")
        raw = str(row.get("category") or "uncategorized")
        qid = row.get("question_id", number)
        prompts.append(Prompt(str(qid), _group(raw, raw_categories), raw, turns[0], number))
    if per_category:
        counts: dict[str, int] = {}
        kept = []
        for p in prompts:
            if counts.get(p.category, 0) < per_category:
                counts[p.category] = counts.get(p.category, 0) + 1
                kept.append(p)
        prompts = kept
    order = list(dict.fromkeys(p.category for p in prompts))
    return sorted(prompts, key=lambda p: order.index(p.category))


# --------------------------------------------------------------------------- α on the trajectory


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

    def alphas_filled(self) -> list[float]:
        """α_1..α_K with unreached positions set to 0 (they never add to E)."""
        return [0.0 if a is None else min(max(a, 0.0), 1.0) for a in self.alphas]


def summarize_points(points: Sequence[PointRecord], k_max: int) -> AlphaSummary:
    """Pool evaluation points into per-position α (see the module docstring)."""
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


# --------------------------------------------------------------------------- cost curve


def _fill(model: CausalLM, prefix: Sequence[int]) -> None:
    """Make the model's cache hold exactly `prefix`."""
    prefix = list(prefix)
    model.rollback_to(prefix + [0])   # keeps at most len(prefix) tokens, the common prefix
    rest = prefix[len(model.tokens):]
    if rest:
        model.forward(rest, keep=1)


def time_forward(model: CausalLM, tokens: Sequence[int], *, keep_all: bool = True, repeats: int = 5,
                 warmup: int = 1, clock: Clock = time.perf_counter) -> list[float]:
    """`time_forwards` for one batch: `repeats` durations in seconds."""
    return time_forwards(model, [tokens], keep_all=keep_all, repeats=repeats, warmup=warmup, clock=clock)[0]


def _cycle(tokens: Sequence[int], n: int) -> list[int]:
    tokens = list(tokens) or [0]
    reps = -(-n // len(tokens))
    return (tokens * reps)[:n]


@dataclass
class CostMeasurement:
    """The measured cost curve and every sample behind it.

    Attributes:
        curve: medians: T_t(n) for n = 1..K+1 and T_d.
        target_samples: [K+1] lists of seconds, one list per n.
        draft_samples: seconds per draft token (model) or per lookup round.
        draft_samples_2: seconds of a 2-token draft forward (model only, else None):
            after a fully accepted round `ModelDrafter` feeds x_k and the bonus token.
        draft_kind: "model", "lookup" or "none".
        prefix_tokens: context length the forwards were timed after.
        repeats, warmup: timed and untimed runs per point.
    """

    curve: CostCurve
    target_samples: list[list[float]]
    draft_samples: list[float]
    draft_kind: str
    prefix_tokens: int
    repeats: int
    warmup: int
    draft_samples_2: list[float] | None = None

    @property
    def draft_time_2(self) -> float | None:
        """T_d(2): median seconds of a 2-token draft forward (None unless a draft model)."""
        return statistics.median(self.draft_samples_2) if self.draft_samples_2 else None

    def as_dict(self) -> dict:
        return {"target_times": list(self.curve.target_times), "draft_time": self.curve.draft_time,
                "draft_time_2": self.draft_time_2,
                "c": self.curve.constant_c(), "target_samples": self.target_samples,
                "draft_samples": self.draft_samples, "draft_samples_2": self.draft_samples_2,
                "draft_kind": self.draft_kind,
                "prefix_tokens": self.prefix_tokens, "repeats": self.repeats, "warmup": self.warmup}


def measure_cost_curve(
    target: CausalLM,
    k_max: int,
    context_tokens: Sequence[int],
    *,
    draft: CausalLM | None = None,
    lookup: bool = False,
    prefix_tokens: int = 200,
    repeats: int = 5,
    warmup: int = 1,
    clock: Clock = time.perf_counter,
) -> CostMeasurement:
    """Measure T_t(n), n = 1..K+1, and T_d on this machine.

    The target's cache is filled with `prefix_tokens` tokens of `context_tokens`
    (cycled if shorter); then a forward over the next n tokens is timed
    `repeats` times after `warmup` runs (rounds interleaved over n, see
    `time_forwards`), rolled back with `truncate` after each; the median is used.
    T_d is one single-token draft forward on the same prefix (draft model; a
    2-token forward, T_d(2), is timed alongside), or
    one `LookupDrafter.propose` after the index holds the prefix (lookup,
    one new token per round); 0 when neither is given.

    Returns:
        CostMeasurement (medians in `.curve`, raw samples alongside).
    """
    if isinstance(k_max, bool) or not isinstance(k_max, int) or k_max < 0:
        raise ValueError(f"k_max must be an integer >= 0, got {k_max!r}")
    prefix_tokens = max(1, min(prefix_tokens, target.context_length - (k_max + 1) - 1))
    seq = _cycle(context_tokens, prefix_tokens + k_max + 1 + warmup + repeats)
    prefix, new = seq[:prefix_tokens], seq[prefix_tokens:]
    _fill(target, prefix)
    target_samples = time_forwards(target, [new[:n] for n in range(1, k_max + 2)], repeats=repeats,
                                   warmup=warmup, clock=clock)
    draft_samples: list[float]
    draft_samples_2 = None
    if draft is not None:
        kind = "model"
        _fill(draft, prefix)
        draft_samples, draft_samples_2 = time_forwards(draft, [new[:1], new[:2]], keep_all=False,
                                                       repeats=repeats, warmup=warmup, clock=clock)
    elif lookup:
        from .drafters.lookup import LookupDrafter

        kind = "lookup"
        drafter = LookupDrafter()
        drafter.match(prefix)   # build the index (untimed)
        draft_samples = []
        for i in range(warmup + repeats):
            context = prefix + new[:i + 1]
            start = clock()
            drafter.propose(context, max(k_max, 1))
            elapsed = clock() - start
            if i >= warmup:
                draft_samples.append(elapsed)
    else:
        kind, draft_samples = "none", [0.0]
    curve = CostCurve.from_measurements(target_samples, draft_samples)
    return CostMeasurement(curve, target_samples, draft_samples, kind, prefix_tokens, repeats, warmup,
                           draft_samples_2)


# --------------------------------------------------------------------------- predictions


def predict_speedup(alpha_per_position: Sequence[float], cost_curve: CostCurve,
                    k: int | str = "auto", k_max: int | None = None) -> float:
    """Predicted speedup over plain decoding under the measured cost curve.

    S(k) = E(α_1..α_k)·T_t(1) / (k·T_d + T_t(k+1))  (cost-curve form of
    Leviathan et al. 2023, Theorem 3.8).

    Args:
        alpha_per_position: α_1..α_K (None entries count as 0).
        cost_curve: measured T_t(n) and T_d.
        k: a draft length 0..K, or "auto": the best k (what an adaptive policy
            that knew these α and costs would pick), searched over 0..k_max.
        k_max: search bound for "auto" (default K = len(alpha_per_position)).

    Returns:
        S, dimensionless (1.0 at k = 0).
    """
    alphas = [0.0 if a is None else float(a) for a in alpha_per_position]
    if k == "auto":
        return optimal_k(alphas, cost_curve, k_max)[1]
    return cost_curve.speedup(alphas, k)


def optimal_k(alpha_per_position: Sequence[float], cost_curve: CostCurve,
              k_max: int | None = None) -> tuple[int, float]:
    """(k*, S(k*)) under the cost curve, k searched over 0..k_max (default K)."""
    alphas = [0.0 if a is None else float(a) for a in alpha_per_position]
    return cost_curve.optimal_k(alphas, len(alphas) if k_max is None else k_max)


def speedup_refeed(alpha_per_position: Sequence[float], k: int, cost_curve: CostCurve,
                   draft_time_2: float) -> float:
    """Cost-curve speedup that also charges `ModelDrafter`'s 2-token re-feed.

    The draft model never feeds its last draft x_k; after a fully accepted round
    (probability Π_{i<=k} α_i) the next round's first draft forward scores x_k and
    the bonus token, T_d(2) instead of T_d. Per round:

        draft seconds = (k − 1)·T_d + Π α_i · T_d(2) + (1 − Π α_i)·T_d
        S(k)          = E(α_1..α_k)·T_t(1) / (draft seconds + T_t(k+1)),   S(0) = 1.
    """
    if k == 0:
        return 1.0
    alphas = [0.0 if a is None else float(a) for a in alpha_per_position][:k]
    all_accepted = float(np.prod(alphas))
    t_d = cost_curve.draft_time
    draft = (k - 1) * t_d + all_accepted * draft_time_2 + (1.0 - all_accepted) * t_d
    return expected_tokens_positional(alphas) * cost_curve.target(1) / (draft + cost_curve.target(k + 1))


def speedup_table(alpha: float, alpha_per_position: Sequence[float | None], cost_curve: CostCurve,
                  k_max: int, draft_time_2: float | None = None) -> dict:
    """Predicted S(k), k = 0..k_max, under both models, and each model's k*.

    Returns:
        {"constant": [S], "curve": [S], "c": c, "k_star_constant", "S_star_constant",
         "k_star_curve", "S_star_curve", "curve_at_k_star_constant"}: the constant-c
        column uses the scalar α and c = T_d / T_t(1); the curve column the
        per-position α and measured T_t(n). With `draft_time_2` (T_d(2)) also
        "refeed", "k_star_refeed", "S_star_refeed" (`speedup_refeed`).
    """
    a = min(max(float(alpha), 0.0), 1.0)
    alphas = [0.0 if x is None else min(max(float(x), 0.0), 1.0) for x in alpha_per_position][:k_max]
    c = cost_curve.constant_c()
    constant = [speedup_constant_cost(a, k, c) for k in range(k_max + 1)]
    curve = [cost_curve.speedup(alphas, k) for k in range(k_max + 1)]
    kc, sc = optimal_k_constant(a, c, k_max)
    kv, sv = cost_curve.optimal_k(alphas, k_max)
    out = {"constant": constant, "curve": curve, "c": c, "k_star_constant": kc, "S_star_constant": sc,
           "k_star_curve": kv, "S_star_curve": sv, "curve_at_k_star_constant": curve[kc]}
    if draft_time_2 is not None:
        refeed = [speedup_refeed(alphas, k, cost_curve, draft_time_2) for k in range(k_max + 1)]
        kr = 0
        for k in range(1, k_max + 1):   # ties go to the smaller k, as in theory.optimal_k_*
            if refeed[k] > refeed[kr] * (1 + 1e-12):
                kr = k
        out.update(refeed=refeed, k_star_refeed=kr, S_star_refeed=refeed[kr])
    return out


def load_analysis(path: str | os.PathLike) -> dict:
    """Read an analysis.json (a file, or the --out directory holding it)."""
    path = Path(path)
    if path.is_dir():
        path = path / "analysis.json"
    return json.loads(path.read_text())


def predict_from_analysis(analysis: dict, category: str = "overall", k: int | str = "auto",
                          model: str = "curve") -> dict:
    """Predicted speedup for one category of an analysis.

    Args:
        analysis: `run_analysis` output (or `load_analysis`).
        category: a category name or "overall".
        k: draft length, or "auto" for k* (the adaptive policy's target).
        model: "curve" (measured T_t(n), per-position α), "constant" (c = T_d/T_t(1),
            scalar α) or "curve+" (curve plus the draft's 2-token re-feed; needs T_d(2)).

    Returns:
        {"k": k, "speedup": S}.

    Raises:
        KeyError: for an unknown category; ValueError for a bad model or k.
    """
    summary = analysis["overall"] if category == "overall" else analysis["categories"][category]
    cm = analysis["cost_curve"]
    curve = CostCurve(tuple(cm["target_times"]), cm["draft_time"])
    k_max = analysis["k_max"]
    alpha = summary["alpha"] or 0.0
    if model == "curve":
        if k == "auto":
            kk, s = optimal_k(summary["alphas"], curve, k_max)
            return {"k": kk, "speedup": s}
        return {"k": k, "speedup": predict_speedup(summary["alphas"], curve, k)}
    if model == "constant":
        c = curve.constant_c()
        if k == "auto":
            kk, s = optimal_k_constant(alpha, c, k_max)
            return {"k": kk, "speedup": s}
        return {"k": k, "speedup": speedup_constant_cost(alpha, k, c)}
    if model == "curve+":
        t_d2 = cm.get("draft_time_2")
        if t_d2 is None:
            raise ValueError("model 'curve+' needs the draft's T_d(2) (a draft-model analysis)")
        table = speedup_table(alpha, summary["alphas"], curve, k_max, t_d2)
        kk = table["k_star_refeed"] if k == "auto" else k
        return {"k": kk, "speedup": table["refeed"][kk]}
    raise ValueError(f"model must be 'curve', 'constant' or 'curve+', got {model!r}")


# --------------------------------------------------------------------------- the whole analysis


@dataclass
class AnalyzeConfig:
    """Knobs of `run_analysis` (CLI flags of `verispec analyze`)."""

    k_max: int = 6
    max_new_tokens: int = 128
    stride: int | None = None
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    seed: int = 0
    prefix_tokens: int = 200
    repeats: int = 5
    warmup: int = 2
    measure: bool = False
    measure_ks: tuple[int, ...] | None = None


def _summary_dict(s: AlphaSummary) -> dict:
    return asdict(s)


def _measure_points(target: CausalLM, drafter, ids: list[int], ks: Sequence[int],
                    config: AnalyzeConfig) -> list[dict]:
    """Run plain and fixed-k decodes on one prompt; speedup = decode tokens/s over plain's."""
    # warm-up: prefill the target (and the draft), so no measured run pays a prefill
    decode(target, ids, FixedPolicy(None, 0), sampling=config.sampling, max_new_tokens=1,
           rng=SeededRandomness(config.seed))
    model = getattr(drafter, "model", None)
    if model is not None:
        model.sync(ids)
    rows = []
    for k in [0, *ks]:
        policy = FixedPolicy(drafter if k else None, k)
        res = decode(target, ids, policy, sampling=config.sampling, max_new_tokens=config.max_new_tokens,
                     rng=SeededRandomness(config.seed))
        s = res.stats
        seconds = s.wall_seconds - s.prefill_seconds
        rows.append({"k": k, "new_tokens": s.new_tokens, "seconds": seconds,
                     "tokens_per_second": s.new_tokens / seconds if seconds > 0 else None,
                     "tau": s.tau, "draft_acceptance_rate": s.draft_acceptance_rate})
    base = rows[0]["tokens_per_second"]
    for r in rows:
        r["speedup"] = r["tokens_per_second"] / base if base and r["tokens_per_second"] else None
    return rows


def run_analysis(
    target: CausalLM,
    prompts: Sequence[Prompt],
    encode: Callable[[str], list[int]],
    config: AnalyzeConfig,
    *,
    drafter_kind: str = "model",
    draft: CausalLM | None = None,
    clock: Clock = time.perf_counter,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """α per category on the target's trajectories, the cost curve, and predicted S(k).

    Args:
        target: the target model.
        prompts: from `load_prompts`.
        encode: prompt text -> token ids (e.g. `SpeculativeDecoder.encode`, chat template).
        config: k_max, budget, sampling, timing repeats, --measure.
        drafter_kind: "model" (needs `draft`) or "lookup".
        draft: the draft model.
        clock: timer for the cost curve (injectable for tests).
        progress: called with a short status line per step.

    Returns:
        A JSON-ready dict (the content of analysis.json).

    Raises:
        ValueError: for a bad drafter kind, a missing draft or no prompts.
    """
    from .drafters.lookup import LookupDrafter
    from .drafters.model import ModelDrafter

    if drafter_kind not in ("model", "lookup"):
        raise ValueError(f"drafter must be 'model' or 'lookup', got {drafter_kind!r}")
    if drafter_kind == "model" and draft is None:
        raise ValueError("drafter 'model' needs a draft model (or use --drafter lookup)")
    if not prompts:
        raise ValueError("no prompts to analyse")
    say = progress or (lambda _msg: None)
    K = config.k_max
    drafter = ModelDrafter(draft) if drafter_kind == "model" else LookupDrafter()
    per_prompt: list[dict] = []
    records: dict[str, list[PointRecord]] = {}
    prompt_ids: dict[int, list[int]] = {}
    longest: list[int] = []
    start = time.perf_counter()
    for i, pr in enumerate(prompts):
        say(f"[{i + 1}/{len(prompts)}] {pr.category} #{pr.id}: trajectory + α")
        ids = encode(pr.text)
        prompt_ids[i] = ids
        if drafter_kind == "lookup":
            drafter = LookupDrafter()
        traj = measure_trajectory_alpha(
            target, drafter, ids, k_max=K, sampling=config.sampling,
            max_new_tokens=config.max_new_tokens, rng=SeededRandomness(config.seed + i), stride=config.stride)
        records.setdefault(pr.category, []).extend(traj.points)
        if len(ids) + len(traj.tokens) > len(longest):
            longest = ids + traj.tokens
        s = summarize_points(traj.points, K)
        per_prompt.append({
            "id": pr.id, "category": pr.category, "raw_category": pr.raw_category, "line": pr.line,
            "prompt_tokens": len(ids), "new_tokens": len(traj.tokens), "tokens": traj.tokens,
            "finish_reason": traj.finish_reason, "stride": traj.stride, "alpha": s.alpha,
            "alpha_empirical": s.alpha_empirical, "alphas": s.alphas,
            "points": [asdict(p) for p in traj.points]})
    alpha_seconds = time.perf_counter() - start

    say("cost curve: timing T_t(n) and T_d")
    cost = measure_cost_curve(target, K, longest, draft=draft if drafter_kind == "model" else None,
                              lookup=drafter_kind == "lookup", prefix_tokens=config.prefix_tokens,
                              repeats=config.repeats, warmup=config.warmup, clock=clock)

    def block(points: list[PointRecord], prompt_alphas: list[float]) -> dict:
        s = summarize_points(points, K)
        out = _summary_dict(s)
        out["n_prompts"] = len(prompt_alphas)
        out["prompt_alphas"] = prompt_alphas
        out["speedup"] = (speedup_table(s.alpha or 0.0, s.alphas, cost.curve, K, cost.draft_time_2)
                          if s.n_points else None)
        return out

    categories = {}
    for cat, pts in records.items():
        pa = [p["alpha"] for p in per_prompt if p["category"] == cat and p["alpha"] is not None]
        categories[cat] = block(pts, pa)
    all_points = [p for pts in records.values() for p in pts]
    overall = block(all_points, [p["alpha"] for p in per_prompt if p["alpha"] is not None])

    measured = None
    if config.measure:
        ks = sorted({k for k in (config.measure_ks or (1, 2, 4, K)) if 1 <= k <= K})
        measured = {}
        for cat in records:
            i = next(j for j, p in enumerate(prompts) if p.category == cat)
            say(f"measuring k = 0, {', '.join(map(str, ks))} on {cat} #{prompts[i].id}")
            if drafter_kind == "lookup":
                drafter = LookupDrafter()
            measured[cat] = {"id": prompts[i].id, "points": _measure_points(target, drafter, prompt_ids[i],
                                                                              ks, config)}

    return {
        "version": 1,
        "target": target.name, "draft": draft.name if draft is not None and drafter_kind == "model" else None,
        "drafter": drafter_kind, "backend": getattr(target, "backend", None),
        "sampling": asdict(config.sampling), "seed": config.seed, "k_max": K,
        "max_new_tokens": config.max_new_tokens, "stride": config.stride,
        "alpha_method": "exact sum min(p_i, q_i) on the target's trajectory, w-weighted by the "
                        "probability of reaching position i",
        "alpha_seconds": alpha_seconds,
        "cost_curve": cost.as_dict(),
        "categories": categories,
        "overall": overall,
        "prompts": per_prompt,
        "measured": measured,
    }


# --------------------------------------------------------------------------- output


def _fmt(v: float | None, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def timing_noise(cost_curve: dict, spread: float = 1.5) -> str | None:
    """A warning when the cost-curve samples look disturbed, else None.

    Flags a point whose slowest sample exceeds `spread` x its fastest, and a
    curve that is not non-decreasing in n (a longer forward measured cheaper
    by more than 10%): both mean other work shared the machine.
    """
    problems = []
    series = [(f"T_t({n})", s) for n, s in enumerate(cost_curve["target_samples"], start=1)]
    series.append(("T_d", cost_curve["draft_samples"]))
    worst = max(((max(s) / min(s), name) for name, s in series if s and min(s) > 0), default=None)
    if worst and worst[0] > spread:
        problems.append(f"samples of {worst[1]} spread {worst[0]:.1f}x")
    tt = cost_curve["target_times"]
    drops = [n for n in range(1, len(tt)) if tt[n] < 0.9 * tt[n - 1]]
    if drops:
        problems.append("T_t(n) falls at n = " + ", ".join(str(n + 1) for n in drops))
    if not problems:
        return None
    return ("timings look noisy (" + "; ".join(problems) + "): other work probably shared the CPU/GPU; "
            "rerun on an idle machine or with more --repeats")


def closing_notes(analysis: dict) -> list[str]:
    """One line per category: how far the constant-c model is from the cost curve."""
    notes = []
    c = analysis["cost_curve"]["c"]
    tt = analysis["cost_curve"]["target_times"]
    K = analysis["k_max"]
    for name, block in [*analysis["categories"].items(), ("overall", analysis["overall"])]:
        sp = block.get("speedup")
        if not sp:
            continue
        kc, kv = sp["k_star_constant"], sp["k_star_curve"]
        actual = sp["curve_at_k_star_constant"]
        line = (f"{name}: the constant-c model (i.i.d. α = {_fmt(block['alpha'], '.3f')}, c = {c:.3f}) picks "
                f"k* = {kc} predicting {sp['S_star_constant']:.2f}x; the measured cost curve with "
                f"per-position α gives that k {actual:.2f}x")
        if actual > 0 and kc > 0:
            line += f" (constant-c off by {sp['S_star_constant'] / actual - 1:+.0%})"
        line += (f"; both pick k* = {kv}" if kc == kv else
                 f"; the curve's best is k* = {kv} at {sp['S_star_curve']:.2f}x")
        if "refeed" in sp:
            line += (f"; with the draft's 2-token re-feed (curve+) k = {kc} gives {sp['refeed'][kc]:.2f}x, "
                     f"best k* = {sp['k_star_refeed']} at {sp['S_star_refeed']:.2f}x")
        notes.append(line)
    if len(tt) > 1:
        notes.append(f"T_t(K+1)/T_t(1) = {tt[-1] / tt[0]:.2f} for K = {K}: the constant-c model "
                     "assumes 1.00 (verifying k+1 tokens as cheap as one)")
    noise = timing_noise(analysis["cost_curve"])
    if noise:
        notes.append(noise)
    measured = analysis.get("measured") or {}
    for cat, m in measured.items():
        pts = ", ".join(f"k={r['k']}: {_fmt(r['speedup'])}x" for r in m["points"] if r["k"])
        notes.append(f"measured on {cat} #{m['id']} (tokens/s over plain, prefill excluded): {pts}")
    return notes


def render_tables(analysis: dict) -> list:
    """Rich tables: α per category, the cost curve, predicted speedup vs k."""
    from rich.table import Table

    K = analysis["k_max"]
    rows = [*analysis["categories"].items(), ("overall", analysis["overall"])]
    ta = Table(title=f"acceptance on the target's trajectory ({analysis['drafter']} drafter, "
                     f"{'greedy' if analysis['sampling']['temperature'] == 0 else 'T=' + str(analysis['sampling']['temperature'])})")
    for col in ("category", "prompts", "points", "α exact", "α̂ accepts", "α_i, i = 1..K (exact)",
                f"E({K}) / τ̂({K})"):
        ta.add_column(col, justify="left" if col.startswith(("category", "α_i")) else "right")
    for name, b in rows:
        ta.add_row(name, str(b["n_prompts"]), str(b["n_points"]), _fmt(b["alpha"], ".3f"),
                   _fmt(b["alpha_empirical"], ".3f"), " ".join(_fmt(a) for a in b["alphas"]),
                   f"{_fmt(b['expected_tokens'][-1])} / {_fmt(b['tau_empirical'][-1])}")

    cm = analysis["cost_curve"]
    t1 = cm["target_times"][0]
    tc = Table(title=f"cost curve (after {cm['prefix_tokens']} tokens; median of {cm['repeats']})")
    tc.add_column("n")
    tc.add_column("T_t(n) ms", justify="right")
    tc.add_column("T_t(n)/T_t(1)", justify="right")
    tc.add_column("min - max ms", justify="right")
    for n, (t, samples) in enumerate(zip(cm["target_times"], cm["target_samples"]), start=1):
        tc.add_row(str(n), f"{t * 1e3:.2f}", f"{t / t1:.2f}",
                   f"{min(samples) * 1e3:.1f} - {max(samples) * 1e3:.1f}")
    label = {"model": "T_d (draft token)", "lookup": "T_d (lookup round)", "none": "T_d"}[cm["draft_kind"]]
    ds = cm["draft_samples"]
    tc.add_row(label, f"{cm['draft_time'] * 1e3:.3f}", f"c = {cm['c']:.3f}",
               f"{min(ds) * 1e3:.3f} - {max(ds) * 1e3:.3f}")
    if cm.get("draft_time_2") is not None:
        d2 = cm["draft_samples_2"]
        tc.add_row("T_d(2) (2-token draft)", f"{cm['draft_time_2'] * 1e3:.3f}",
                   f"{cm['draft_time_2'] / cm['draft_time']:.2f} T_d" if cm["draft_time"] else "-",
                   f"{min(d2) * 1e3:.3f} - {max(d2) * 1e3:.3f}")

    title = "predicted speedup vs k (constant: E(α,k)/(k·c+1); curve: E·T_t(1)/(k·T_d+T_t(k+1))"
    if cm.get("draft_time_2") is not None:
        title += "; curve+: also the draft's 2-token re-feed after a fully accepted round"
    ts = Table(title=title + ")")
    ts.add_column("category")
    ts.add_column("model")
    for k in range(K + 1):
        ts.add_column(f"k={k}", justify="right")
    ts.add_column("k*", justify="right")
    ts.add_column("S(k*)", justify="right")
    for name, b in rows:
        sp = b.get("speedup")
        if not sp:
            continue
        ts.add_row(name, "constant", *[f"{s:.2f}" for s in sp["constant"]],
                   str(sp["k_star_constant"]), f"{sp['S_star_constant']:.2f}")
        ts.add_row("", "curve", *[f"{s:.2f}" for s in sp["curve"]],
                   str(sp["k_star_curve"]), f"{sp['S_star_curve']:.2f}", end_section="refeed" not in sp)
        if "refeed" in sp:
            ts.add_row("", "curve+", *[f"{s:.2f}" for s in sp["refeed"]],
                       str(sp["k_star_refeed"]), f"{sp['S_star_refeed']:.2f}", end_section=True)
    measured = analysis.get("measured") or {}
    for cat, m in measured.items():
        by_k = {r["k"]: r["speedup"] for r in m["points"]}
        ts.add_row(cat, "measured", *[_fmt(by_k.get(k)) for k in range(K + 1)], "", "")
    return [ta, tc, ts]


def _plot_alpha(analysis: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cats = list(analysis["categories"])
    K = analysis["k_max"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    data = [analysis["categories"][c]["prompt_alphas"] or [float("nan")] for c in cats]
    ax1.boxplot(data, widths=0.5)
    ax1.set_xticks(range(1, len(cats) + 1), cats, rotation=30, ha="right")
    for i, d in enumerate(data, start=1):
        jitter = np.linspace(-0.12, 0.12, len(d)) if len(d) > 1 else [0.0]
        ax1.scatter(np.add(i, jitter), d, s=18, alpha=0.7, zorder=3)
    ax1.set_ylabel("α per prompt (mean exact Σ min(p, q), position 1)")
    ax1.set_ylim(-0.02, 1.02)
    ax1.set_title("acceptance rate per prompt")
    ax1.grid(axis="y", alpha=0.3)
    xs = list(range(1, K + 1))
    for c in [*cats, "overall"]:
        b = analysis["overall"] if c == "overall" else analysis["categories"][c]
        ys = [np.nan if a is None else a for a in b["alphas"]]
        style = dict(color="black", linewidth=2.5) if c == "overall" else {}
        ax2.plot(xs, ys, marker="o", label=c, **style)
    ax2.set_xlabel("draft position i")
    ax2.set_ylabel("α_i (given drafts 1..i-1 accepted)")
    ax2.set_ylim(-0.02, 1.02)
    ax2.set_xticks(xs)
    ax2.set_title("per-position acceptance")
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8)
    fig.suptitle(f"{analysis['target']} / {analysis['draft'] or analysis['drafter']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_speedup(analysis: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    K = analysis["k_max"]
    ks = list(range(K + 1))
    fig, ax = plt.subplots(figsize=(8, 5))
    cats = list(analysis["categories"])
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    measured = analysis.get("measured") or {}
    for i, c in enumerate([*cats, "overall"]):
        b = analysis["overall"] if c == "overall" else analysis["categories"][c]
        sp = b.get("speedup")
        if not sp:
            continue
        color = "black" if c == "overall" else colors[i % len(colors)]
        lw = 2.5 if c == "overall" else 1.5
        ax.plot(ks, sp["curve"], color=color, linewidth=lw, marker="o", label=f"{c} (cost curve)")
        ax.plot(ks, sp["constant"], color=color, linewidth=1, linestyle="--", alpha=0.8)
        if "refeed" in sp:
            ax.plot(ks, sp["refeed"], color=color, linewidth=1, linestyle=":", alpha=0.9)
        ax.scatter([sp["k_star_curve"]], [sp["S_star_curve"]], color=color, marker="*", s=140, zorder=4)
        if c in measured:
            pts = [(r["k"], r["speedup"]) for r in measured[c]["points"] if r["speedup"] is not None]
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], color=color, marker="s", s=45,
                       edgecolors="black", zorder=5)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.plot([], [], color="grey", linestyle="--", label="constant c (Leviathan Thm 3.8)")
    if any("refeed" in (b.get("speedup") or {}) for b in [analysis["overall"], *analysis["categories"].values()]):
        ax.plot([], [], color="grey", linestyle=":", label="curve + draft 2-token re-feed")
    ax.scatter([], [], color="grey", marker="*", s=140, label="k* (cost curve)")
    if measured:
        ax.scatter([], [], color="grey", marker="s", edgecolors="black", label="measured")
    ax.set_xlabel("draft length k")
    ax.set_ylabel("speedup over plain decoding")
    ax.set_xticks(ks)
    ax.set_title(f"predicted speedup vs k: {analysis['target']} / {analysis['draft'] or analysis['drafter']} "
                 f"(c = {analysis['cost_curve']['c']:.3f})", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(analysis: dict, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write analysis.json, alpha.png and speedup_vs_k.png into out_dir (created)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "analysis.json", "alpha": out / "alpha.png", "speedup": out / "speedup_vs_k.png"}
    paths["json"].write_text(json.dumps(analysis, indent=1, default=float))
    _plot_alpha(analysis, paths["alpha"])
    _plot_speedup(analysis, paths["speedup"])
    return paths
