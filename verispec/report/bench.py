"""Reporting a benchmark (`verispec bench`): Spec-Bench-style markdown and a bar chart.

Input is `verispec.bench.summary.summarize`'s dict ({"categories", "methods", "cells",
"loadavg", "errors"}) and the run's meta.json (command, machine, versions, settings).
"""

from __future__ import annotations

import os

from .format import fmt, md_table, new_figure

__all__ = ["render_markdown", "plot_speedups"]

OVERALL = "overall"
DASH = "–"   # a figure that is undefined (no prompts, no drafts)


def _f(value: float | None, spec: str) -> str:
    return fmt(value, spec, DASH)


def _alpha_hat(cell: dict) -> float | None:
    """α̂ of a summary cell; summaries written before the rename call it acceptance_rate."""
    return cell["draft_acceptance_rate"] if "draft_acceptance_rate" in cell else cell.get("acceptance_rate")


def _header(summary: dict, meta: dict) -> list[str]:
    """The bullet list under the title: command, machine, load, versions, settings, methods."""
    machine, versions = meta.get("machine", {}), meta.get("versions", {})
    out = []
    if meta.get("command"):
        out.append(f"- command: `{meta['command']}`")
    for r in meta.get("resumed", []):
        out.append(f"- resumed {r.get('date')}: `{r.get('command')}`")
    if meta.get("date"):
        out.append(f"- date: {meta['date']}")
    if machine:
        out.append(f"- machine: {machine.get('cpu')}, {machine.get('cores')} cores "
                   f"({machine.get('usable_cores')} usable), torch threads {machine.get('torch_threads')}"
                   + (f", GPU {machine['gpu']}" if machine.get("gpu") else ", no GPU"))
    if summary.get("loadavg"):
        lo, hi = summary["loadavg"]
        out.append(f"- 1-min load average before each measurement: {lo:.2f} to {hi:.2f} "
                   f"(above the core count means other processes competed for the CPU)")
    if versions:
        out.append("- versions: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v))
    if meta.get("backend"):
        out.append(f"- backend: {meta['backend']}; target: {meta.get('target')}; "
                   f"draft: {meta.get('draft')}")
    settings = [f"{k} {meta[k]}" for k in ("max_new_tokens", "temperature", "seed", "per_category")
                if k in meta]
    if settings:
        greedy = meta.get("temperature") in (0, 0.0)
        out.append("- settings: " + ", ".join(settings) + (" (greedy)" if greedy else " (sampling)"))
    if meta.get("dataset"):
        out.append(f"- dataset: {meta['dataset']}")
    if meta.get("method_descriptions"):
        out.append("- methods: " + "; ".join(f"`{m}` = {d}"
                                             for m, d in meta["method_descriptions"].items()))
    return out


def render_markdown(summary: dict, meta: dict | None = None) -> str:
    """Spec-Bench-style markdown: header (command, machine, versions, settings,
    definitions) and tables of speedup× (τ), tokens/s, α̂ / exact α and greedy-identical counts.

    Args:
        summary: from `verispec.bench.summarize` (or a summary.json's "summary").
        meta: from meta.json (`collect_meta` + settings); missing keys are skipped.

    Returns:
        The markdown, ending in a newline.
    """
    meta = meta or {}
    cats, methods, cells = summary["categories"], summary["methods"], summary["cells"]
    temperature = meta.get("temperature")
    greedy = temperature in (0, 0.0)
    out = ["# verispec on Spec-Bench (first turn only)", "", *_header(summary, meta)]
    prompts = cells.get("plain", {}).get(OVERALL, {}).get("prompts")
    out += [
        "- prompts: the FIRST turn of each Spec-Bench row (multi-turn rows are not continued), "
        "chat template applied, identical token ids for every method; `multi-turn` = the "
        "MT-Bench categories (writing, roleplay, reasoning, math, coding, extraction, stem, "
        "humanities), rows picked round-robin over them in file order"
        + (f"; {prompts} prompts" if prompts is not None else ""),
        "- method order: per prompt, plain first, then "
        + ("the other methods in an order rotated one place from prompt to prompt"
           if meta.get("method_order") == "rotated" else "each method")
        + " (interleaved, models loaded once); KV caches emptied before every generation, so "
        "each wall time includes its prefill"
        + ("; servers (`--endpoint`): each timed request follows an untimed 1-token request of "
           "the same prompt, so every server is timed on a warm prompt cache"
           if meta.get("warm_prompt_cache") else ""),
        "",
        "**Definitions.** For a method m and a category, over the category's prompts where both m "
        "and plain succeeded: speedup = (Σ new tokens_m / Σ wall seconds_m) / (Σ new tokens_plain / "
        "Σ wall seconds_plain), i.e. the ratio of aggregated tokens/s, which is Σ plain seconds / "
        "Σ m seconds when the outputs have the same length. Wall seconds cover the whole generation "
        "(prefill included); new tokens count up to and including EOS. "
        "τ = Σ new tokens / Σ target forwards (mean tokens per target forward; plain = 1.00; "
        "HF methods: forwards of the target module counted with a hook, prefill included; "
        "– = not available). `overall` pools every prompt once.",
        "",
        "## Speedup × (τ)",
        "",
    ]
    header = ["method", *cats]
    out.append(md_table(header, [[m] + [
        (f"{_f(cells[m][c]['speedup'], '.2f')}× ({_f(cells[m][c]['tau'], '.2f')})"
         if cells[m][c]["prompts"] else DASH) for c in cats] for m in methods]))
    out += ["", "## Throughput (tokens/s, aggregated)", ""]
    out.append(md_table(header, [[m] + [_f(cells[m][c]["tokens_per_second"], ".2f")
                                        for c in cats] for m in methods]))
    out += ["", "## Acceptance α̂ / exact α (Σ min(p, q))", ""]
    out.append(md_table(header, [[m] + [
        (f"{_f(_alpha_hat(cells[m][c]), '.2f')} / {_f(cells[m][c]['alpha_exact'], '.2f')}"
         if _alpha_hat(cells[m][c]) is not None else DASH) for c in cats]
        for m in methods if m != "plain"]))
    out += ["", "## Greedy output identical to plain (identical / compared)", ""]
    if greedy or temperature is None:
        out.append(md_table(header, [[m] + [
            (f"{cells[m][c]['identical']}/{cells[m][c]['compared']}"
             if cells[m][c]["compared"] else DASH) for c in cats]
            for m in methods if m != "plain"]))
    else:
        out.append(f"n/a: sampling (temperature {temperature}); exactness is a distributional "
                   "property there (see `verispec audit`).")
    prompt_counts = [f"{c} {cells['plain'][c]['prompts']}" for c in cats] if "plain" in cells else []
    if prompt_counts:
        out += ["", "Prompts per category (with a plain measurement): " + ", ".join(prompt_counts) + "."]
    if summary.get("errors"):
        out += ["", "## Errors", ""]
        out += [f"- q{e['question_id']} ({e['category']}) {e['method']}: {e['error']}"
                for e in summary["errors"]]
    return "\n".join(out) + "\n"


def plot_speedups(summary: dict, path: str | os.PathLike) -> None:
    """PNG bar chart of the speedup per category (+ overall) per non-plain method, line at 1.0."""
    cats = summary["categories"]
    methods = [m for m in summary["methods"] if m != "plain"] or list(summary["methods"])
    fig = new_figure(max(6.0, 1.3 * len(cats) + 1.5), 4.2, dpi=120)
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / max(1, len(methods))
    for i, m in enumerate(methods):
        values = [summary["cells"][m][c]["speedup"] or 0.0 for c in cats]
        xs = [j + (i - (len(methods) - 1) / 2) * width for j in range(len(cats))]
        bars = ax.bar(xs, values, width, label=m)
        for b, v in zip(bars, values):
            if v:
                ax.annotate(f"{v:.2f}", (b.get_x() + b.get_width() / 2, v), ha="center",
                            va="bottom", fontsize=7)
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--")
    ax.set_xticks(range(len(cats)))
    ax.set_xticklabels(cats, rotation=20, ha="right")
    ax.set_ylabel("speedup over plain (×)")
    ax.set_title("verispec on Spec-Bench (first turn)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(str(path))
