"""The whole analysis: α per category on the target's trajectories, the cost curve, S(k).

`run_analysis` takes prompts (`verispec.prompts`), measures α on each one's trajectory
(`verispec.analyze.alpha`), times the cost curve once on the longest context seen
(`verispec.cost`), and predicts S(k), k = 0..K, per category (`verispec.predict`);
with `measure` it also runs fixed-k decodes to compare with the predictions. The result
is one JSON-ready dict, written with its plots by `write_outputs` (analysis.json,
alpha.png, speedup_vs_k.png) and read back by `load_analysis`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..cost import measure_cost_curve
from ..decoding import decode
from ..drafters import DRAFTERS, Drafter, check_drafter_choice
from ..models.base import CausalLM
from ..policy import FixedPolicy
from ..predict import speedup_table
from ..prompts import Prompt
from ..sampling import SamplingConfig, SeededRandomness
from ..timing import Clock
from .alpha import PointRecord, measure_trajectory_alpha, summarize_points

__all__ = ["AnalyzeConfig", "PROMPT_SELECTION", "run_analysis", "write_outputs", "load_analysis"]

# How the prompts were chosen; analysis.json records it (files without it used version 1).
PROMPT_SELECTION = {
    "version": 2,
    "rule": "verispec.prompts: first N rows per category in file order; multi-turn round-robin "
            "over the MT-Bench categories; N = 0 takes all"}
OLD_PROMPT_SELECTION = {
    "version": 1,
    "rule": "first N rows per category in file order, multi-turn included (for Spec-Bench and "
            "N = 3: writing #81-83 only)"}


@dataclass
class AnalyzeConfig:
    """Knobs of `run_analysis` (CLI flags of `verispec analyze`).

    Attributes:
        k_max: K, drafts per evaluation point; S(k) is predicted for k = 0..K.
        max_new_tokens: trajectory length per prompt (tokens).
        stride: evaluate α every `stride` positions (None: about 32 points a prompt).
        sampling: warps of p and q (greedy by default).
        seed: seed of prompt i's randomness is seed + i.
        prefix_tokens, repeats, warmup: cost-curve timing (`measure_cost_curve`).
        measure: also run fixed-k decodes on one prompt per category.
        measure_ks: the k of those decodes (default 1, 2, 4, K).
    """

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


def _measure_points(target: CausalLM, drafter: Drafter, draft: CausalLM | None, ids: list[int],
                    ks: Sequence[int], config: AnalyzeConfig) -> list[dict]:
    """Run plain and fixed-k decodes on one prompt; speedup = decode tokens/s over plain's."""
    # warm-up: prefill the target (and the draft model), so no measured run pays a prefill
    decode(target, ids, FixedPolicy(None, 0), sampling=config.sampling, max_new_tokens=1,
           rng=SeededRandomness(config.seed))
    if draft is not None:
        draft.sync(ids)
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
        prompts: from `verispec.prompts.load_prompts`; a prompt counts in each of its
            `groups` (its raw category when it has none).
        encode: prompt text -> token ids (e.g. `SpeculativeDecoder.encode`, chat template).
        config: k_max, budget, sampling, timing repeats, --measure.
        drafter_kind: a name in `verispec.drafters.DRAFTERS` ("model" needs `draft`;
            a model-free drafter is built afresh for every prompt).
        draft: the draft model.
        clock: timer for the cost curve (injectable for tests).
        progress: called with a short status line per step.

    Returns:
        A JSON-ready dict (the content of analysis.json).

    Raises:
        ValueError: for a bad drafter kind, a missing draft or no prompts.
    """
    if drafter_kind not in DRAFTERS:
        raise ValueError(f"drafter must be one of {', '.join(DRAFTERS)}, got {drafter_kind!r}")
    kind = DRAFTERS[drafter_kind]
    check_drafter_choice(drafter_kind, has_draft_model=draft is not None)
    if not prompts:
        raise ValueError("no prompts to analyse")
    draft = draft if kind.needs_model else None

    def fresh() -> Drafter:
        return kind.make(draft, None)

    say = progress or (lambda _msg: None)
    K = config.k_max
    drafter = fresh()
    per_prompt: list[dict] = []
    records: dict[str, list[PointRecord]] = {}
    all_points: list[PointRecord] = []   # each prompt's points once, however many groups it is in
    prompt_ids: dict[int, list[int]] = {}
    longest: list[int] = []
    start = time.perf_counter()
    for i, pr in enumerate(prompts):
        groups = pr.groups or (pr.category,)
        say(f"[{i + 1}/{len(prompts)}] {groups[0]} #{pr.id}: trajectory + α")
        ids = encode(pr.text)
        prompt_ids[i] = ids
        if not kind.needs_model:      # its index would hold the earlier prompts
            drafter = fresh()
        traj = measure_trajectory_alpha(
            target, drafter, ids, k_max=K, sampling=config.sampling,
            max_new_tokens=config.max_new_tokens, rng=SeededRandomness(config.seed + i), stride=config.stride)
        for group in groups:
            records.setdefault(group, []).extend(traj.points)
        all_points.extend(traj.points)
        if len(ids) + len(traj.tokens) > len(longest):
            longest = ids + traj.tokens
        s = summarize_points(traj.points, K)
        per_prompt.append({
            "id": str(pr.id), "category": groups[0], "groups": list(groups), "raw_category": pr.category,
            "line": pr.line, "prompt_tokens": len(ids), "new_tokens": len(traj.tokens), "tokens": traj.tokens,
            "finish_reason": traj.finish_reason, "stride": traj.stride, "alpha": s.alpha,
            "alpha_empirical": s.alpha_empirical, "alphas": s.alphas,
            "points": [asdict(p) for p in traj.points]})
    alpha_seconds = time.perf_counter() - start

    say("cost curve: timing T_t(n) and T_d")
    cost = measure_cost_curve(target, K, longest, draft=draft,
                              drafter=None if kind.needs_model else fresh(), prefix_tokens=config.prefix_tokens,
                              repeats=config.repeats, warmup=config.warmup, clock=clock)

    def block(points: list[PointRecord], prompt_alphas: list[float]) -> dict:
        s = summarize_points(points, K)
        out = asdict(s)
        out["n_prompts"] = len(prompt_alphas)
        out["prompt_alphas"] = prompt_alphas
        out["speedup"] = (speedup_table(s.alpha or 0.0, s.alphas, cost.curve, K, cost.draft_time_2)
                          if s.n_points else None)
        return out

    categories = {}
    for cat, pts in records.items():
        pa = [p["alpha"] for p in per_prompt if cat in p["groups"] and p["alpha"] is not None]
        categories[cat] = block(pts, pa)
    overall = block(all_points, [p["alpha"] for p in per_prompt if p["alpha"] is not None])

    measured = None
    if config.measure:
        ks = sorted({k for k in (config.measure_ks or (1, 2, 4, K)) if 1 <= k <= K})
        measured = {}
        for cat in records:
            i = next(j for j, p in enumerate(prompts) if cat in (p.groups or (p.category,)))
            say(f"measuring k = 0, {', '.join(map(str, ks))} on {cat} #{prompts[i].id}")
            if not kind.needs_model:
                drafter = fresh()
            measured[cat] = {"id": prompts[i].id, "points": _measure_points(target, drafter, draft, prompt_ids[i],
                                                                              ks, config)}

    return {
        "version": 1,
        "prompt_selection": dict(PROMPT_SELECTION),
        "target": target.name, "draft": draft.name if draft is not None else None,
        "drafter": drafter_kind, "backend": target.backend or None,
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



def write_outputs(analysis: dict, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write analysis.json, alpha.png and speedup_vs_k.png into out_dir (created).

    Returns:
        {"json": path, "alpha": path, "speedup": path}.

    Raises:
        OSError: when the directory or a file cannot be written.
    """
    from ..report.analysis import plot_alpha, plot_speedup_vs_k

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "analysis.json", "alpha": out / "alpha.png", "speedup": out / "speedup_vs_k.png"}
    paths["json"].write_text(json.dumps(analysis, indent=1, default=float))
    plot_alpha(analysis, paths["alpha"])
    plot_speedup_vs_k(analysis, paths["speedup"])
    return paths


def load_analysis(path: str | os.PathLike) -> dict:
    """Read an analysis.json (a file, or the --out directory holding it).

    An analysis written before prompt selection was shared with `bench` has no
    "prompt_selection"; it is marked with version 1 (`OLD_PROMPT_SELECTION`), so readers
    and `closing_notes` can tell its multi-turn prompts were chosen differently.

    Raises:
        OSError: for a missing file; json.JSONDecodeError for a corrupt one.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "analysis.json"
    analysis = json.loads(path.read_text())
    analysis.setdefault("prompt_selection", dict(OLD_PROMPT_SELECTION))
    return analysis
