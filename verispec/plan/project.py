"""Project an `analyze` run onto other hardware: its measured α, the planner's costs.

`verispec analyze` measures α per draft position on this machine; α belongs to the
model pair and the text, not to the machine (the acceptance test compares p and q,
Leviathan et al. 2023, Definition 3.1), so it carries over. The cost curve does not:
the planner predicts it for the other machine, and S(k), k* follow from both.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..theory import CostCurve
from .planner import Plan, plan

__all__ = ["load_analysis_alphas", "project_analysis"]


def _read(analysis: dict | str | os.PathLike) -> tuple[dict, str]:
    if isinstance(analysis, dict):
        return analysis, "analysis"
    path = Path(analysis)
    if path.is_dir():
        path = path / "analysis.json"
    try:
        return json.loads(path.read_text()), str(path)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--alpha-from: cannot read an analysis.json from {analysis}: {e}") from e


def load_analysis_alphas(analysis: dict | str | os.PathLike, category: str = "overall") -> list[float]:
    """Per-position α_1..α_K of one category of an analysis (unreached positions → 0).

    Raises:
        ValueError: naming ``--alpha-from`` when the file or the category is missing.
    """
    data, label = _read(analysis)
    block = data.get("overall") if category == "overall" else data.get("categories", {}).get(category)
    if not isinstance(block, dict) or not block.get("alphas"):
        cats = ", ".join(["overall", *data.get("categories", {})])
        raise ValueError(f"--alpha-from: {label} has no per-position α for {category!r} (has: {cats})")
    return [0.0 if a is None else min(max(float(a), 0.0), 1.0) for a in block["alphas"]]


def project_analysis(analysis: dict | str | os.PathLike, hardware: Any, *, category: str = "overall",
                     target: Any = None, draft: Any = None, **plan_kwargs: Any) -> Plan:
    """The plan for an analysis's pair and measured α on ``hardware``.

    Args:
        analysis: an analysis.json dict (``verispec.analyze.run_analysis`` output), its
            path, or the ``--out`` directory holding it.
        hardware: as for :func:`verispec.plan.plan`.
        category: "overall" or one of the analysis's categories.
        target, draft: override the analysis's models (default: its ``target``/``draft``;
            no draft model when the analysis used prompt lookup).
        **plan_kwargs: context (default: the analysis's cost-curve context), k_max
            (default: the analysis's), dtype, stack, batch.

    Returns:
        Plan, whose notes also give what the analysis measured on its own machine.

    Raises:
        ValueError: naming ``--alpha-from`` for an unreadable analysis, or the planner's errors.
    """
    data, label = _read(analysis)
    alphas = load_analysis_alphas(data, category)
    cost = data.get("cost_curve") or {}
    plan_kwargs.setdefault("context", int(cost.get("prefix_tokens", 512)))
    plan_kwargs.setdefault("k_max", int(data.get("k_max", len(alphas))))
    if target is None:
        target = data.get("target")
    if draft is None and data.get("drafter", "model") == "model":
        draft = data.get("draft")
    if not target:
        raise ValueError(f"--alpha-from: {label} names no target; pass --target")
    result = plan(target, draft, hardware, alphas=alphas, alpha_source=f"{label} ({category})", **plan_kwargs)
    if cost.get("target_times"):
        here = CostCurve(tuple(cost["target_times"]), float(cost.get("draft_time", 0.0)))
        k = min(result.k_max, here.k_measured)
        k_here, s_here = here.optimal_k(alphas[:k] + [alphas[-1]] * (k - len(alphas)), k)
        result.notes.append(
            f"measured where the analysis ran ({data.get('backend', '?')}): c = {here.constant_c():.3f}, "
            f"T_t({k + 1})/T_t(1) = {here.target(k + 1) / here.target(1):.2f}, k* = {k_here}, S = {s_here:.2f}")
    return result
