"""From measurement rows to Spec-Bench-style figures per (method, category), and the written report."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..prompts import DEFAULT_CATEGORIES, MT_BENCH_CATEGORIES
from .methods import BenchError
from .results import PLOT, RESULTS, SUMMARY, TABLE, latest_rows, load_results, read_meta

__all__ = ["OVERALL", "summarize", "write_report"]

OVERALL = "overall"
# report order: Spec-Bench's columns, then any raw MT-Bench category selected on its own
_ORDER = {c: i for i, c in enumerate((*DEFAULT_CATEGORIES, *MT_BENCH_CATEGORIES))}


def _category_order(cats: Iterable[str]) -> list[str]:
    cats = list(dict.fromkeys(cats))
    return sorted(cats, key=lambda c: (_ORDER.get(c, len(_ORDER)), cats.index(c)))


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _range(values: Iterable) -> list[float] | None:
    values = [v for v in values if v is not None]
    return [min(values), max(values)] if values else None


def summarize(rows: Iterable[dict], methods: Sequence[str] | None = None) -> dict:
    """Aggregate measurements per (method, category), Spec-Bench style.

    For method m and category c, P is the set of c's prompts where both plain and
    m succeeded (latest row per (question_id, method); "overall" pools every
    prompt once):

        tokens_per_second     = Σ_P new_tokens_m / Σ_P wall_seconds_m
        speedup               = tokens_per_second_m / tokens_per_second_plain   (same P)
                              = Σ wall_plain / Σ wall_m when the outputs have equal length
        tau                   = Σ_P new_tokens_m / Σ_P target_forwards_m   (plain: 1.00)
        draft_acceptance_rate = Σ accepted / Σ drafted (α̂); alpha_exact = Σ alpha_sum / Σ reached

    Args:
        rows: result rows (`run_bench` / `load_results`).
        methods: the row order; default: methods in the rows, plain first.

    Returns:
        {"categories": [..., "overall"], "methods": [...], "cells": {method:
        {category: {prompts, tokens, seconds, tokens_per_second, plain_tokens,
        plain_seconds, plain_tokens_per_second, speedup, tau, draft_acceptance_rate,
        alpha_exact, identical, compared, errors}}}, "loadavg": [min, max] over the rows
        (or None), "errors": [{question_id, category, method, error}]}; figures are None
        when undefined.
    """
    rows = latest_rows(rows)
    if methods is None:
        methods = list(dict.fromkeys(["plain"] + [r["method"] for r in rows]))
        if not any(r["method"] == "plain" for r in rows):
            methods = methods[1:]
    groups_of = {}
    for r in rows:
        groups_of.setdefault(r["question_id"], r.get("groups") or [r["category"]])
    categories = _category_order(g for gs in groups_of.values() for g in gs)
    ok = {(r["question_id"], r["method"]): r for r in rows if not r.get("error")}
    errors = [r for r in rows if r.get("error")]

    cells: dict[str, dict[str, dict]] = {}
    for m in methods:
        cells[m] = {}
        for c in [*categories, OVERALL]:
            qids = [q for q, gs in groups_of.items() if c == OVERALL or c in gs]
            pairs = [(ok[(q, m)], ok[(q, "plain")]) for q in qids
                     if (q, m) in ok and (q, "plain") in ok]
            mine = [r for r, _ in pairs]
            tokens = sum(r["new_tokens"] for r in mine)
            seconds = sum(r["wall_seconds"] for r in mine)
            p_tokens = sum(p["new_tokens"] for _, p in pairs)
            p_seconds = sum(p["wall_seconds"] for _, p in pairs)
            tps, p_tps = _ratio(tokens, seconds), _ratio(p_tokens, p_seconds)
            with_tau = [r for r in mine if r.get("target_forwards")]
            tau = (_ratio(sum(r["new_tokens"] for r in with_tau),
                          sum(r["target_forwards"] for r in with_tau)) if with_tau else None)
            drafted = sum(r.get("drafted") or 0 for r in mine)
            reached = sum(sum(r.get("reached") or []) for r in mine)
            compared = [r for r in mine if r.get("identical_to_plain") is not None]
            cells[m][c] = {
                "prompts": len(pairs), "tokens": tokens, "seconds": seconds,
                "tokens_per_second": tps, "plain_tokens": p_tokens, "plain_seconds": p_seconds,
                "plain_tokens_per_second": p_tps,
                "speedup": tps / p_tps if tps is not None and p_tps else None,
                "tau": tau,
                "draft_acceptance_rate": _ratio(sum(r.get("accepted") or 0 for r in mine), drafted),
                "alpha_exact": _ratio(sum(r.get("alpha_sum") or 0.0 for r in mine), reached),
                "identical": sum(1 for r in compared if r["identical_to_plain"]),
                "compared": len(compared),
                "errors": sum(1 for r in errors if r["method"] == m
                              and (c == OVERALL or c in groups_of.get(r["question_id"], []))),
            }
    return {"categories": [*categories, OVERALL], "methods": list(methods), "cells": cells,
            "loadavg": _range(r.get("loadavg") for r in rows),
            "errors": [{k: r.get(k) for k in ("question_id", "category", "method", "error")}
                       for r in errors]}


def write_report(out_dir: str | os.PathLike) -> str:
    """Rebuild table.md, summary.json and speedup.png in DIR from results.jsonl (+ meta.json).

    Returns:
        The markdown (`verispec.report.bench.render_markdown`).

    Raises:
        BenchError: naming DIR when it holds no results.
    """
    from ..report.bench import plot_speedups, render_markdown

    out = Path(out_dir)
    rows = load_results(out)
    if not rows:
        raise BenchError(f"--report {out}: no {RESULTS} with results there")
    meta = read_meta(out) or {}
    summary = summarize(rows, [m for m in meta.get("methods", [])
                               if any(r["method"] == m for r in rows)] or None)
    markdown = render_markdown(summary, meta)
    (out / TABLE).write_text(markdown, encoding="utf-8")
    (out / SUMMARY).write_text(json.dumps({"meta": meta, "summary": summary}, indent=2,
                                          default=str) + "\n", encoding="utf-8")
    plot_speedups(summary, out / PLOT)
    return markdown


def compare_noise(speculative_tps: float, plain_tps: Sequence[float]) -> dict:
    """The speedup of one speculative run over plain runs, with the noise it sits in.

    Args:
        speculative_tps: tokens/s of the speculative run.
        plain_tps: tokens/s of >= 2 plain runs of the same prompt and settings,
            interleaved with it (the A/A pair: their spread is this machine's noise now).

    Returns:
        {"speedup": speculative / mean(plain), "aa_ratio": plain[-1] / plain[0],
         "noise": max |plain_i / mean(plain) - 1| (a fraction), "within_noise": whether
         |speedup - 1| <= noise (then the ratio does not show a speedup or a slowdown)}.

    Raises:
        ValueError: for fewer than two plain runs or a non-positive speed.
    """
    plain = [float(v) for v in plain_tps]
    if len(plain) < 2:
        raise ValueError("plain_tps needs at least two plain runs (the A/A pair)")
    if not all(v > 0 for v in [*plain, speculative_tps]):
        raise ValueError(f"speeds must be > 0 tokens/s, got {speculative_tps!r} and {plain!r}")
    mean = sum(plain) / len(plain)
    speedup = speculative_tps / mean
    noise = max(abs(v / mean - 1) for v in plain)
    return {"speedup": speedup, "aa_ratio": plain[-1] / plain[0], "noise": noise,
            "within_noise": abs(speedup - 1) <= noise}
