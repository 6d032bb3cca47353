"""Reporting an analysis (`verispec analyze`): rich tables, closing notes and two plots.

Input everywhere is the analysis dict (`verispec.analyze.run_analysis`, analysis.json):
per category the α summary (`alpha`, `alpha_empirical`, `alphas`, `expected_tokens`,
`tau_empirical`, `n_prompts`, `n_points`, `prompt_alphas`) and its `speedup` table
(`verispec.predict.speedup_table`), the `cost_curve` (`verispec.cost.CostMeasurement.as_dict`)
and, with --measure, the `measured` fixed-k decodes.
"""

from __future__ import annotations

import os

import numpy as np

from ..cost import timing_noise
from .format import fmt, new_figure

__all__ = ["render_tables", "closing_notes", "plot_alpha", "plot_speedup_vs_k"]


def _rows(analysis: dict) -> list[tuple[str, dict]]:
    return [*analysis["categories"].items(), ("overall", analysis["overall"])]


def render_tables(analysis: dict) -> list:
    """Three rich tables: α per category and position, the cost curve, predicted S(k) vs k."""
    from rich.table import Table

    K = analysis["k_max"]
    rows = _rows(analysis)
    temperature = analysis["sampling"]["temperature"]
    ta = Table(title=f"acceptance on the target's trajectory ({analysis['drafter']} drafter, "
                     f"{'greedy' if temperature == 0 else 'T=' + str(temperature)})")
    for col in ("category", "prompts", "points", "α exact", "α̂ accepts", "α_i, i = 1..K (exact)",
                f"E({K}) / τ̂({K})"):
        ta.add_column(col, justify="left" if col.startswith(("category", "α_i")) else "right")
    for name, b in rows:
        ta.add_row(name, str(b["n_prompts"]), str(b["n_points"]), fmt(b["alpha"], ".3f"),
                   fmt(b["alpha_empirical"], ".3f"), " ".join(fmt(a) for a in b["alphas"]),
                   f"{fmt(b['expected_tokens'][-1])} / {fmt(b['tau_empirical'][-1])}")

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
    kind = cm["draft_kind"]
    label = {"model": "T_d (draft token)", "none": "T_d"}.get(kind, f"T_d ({kind} round)")
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
    for cat, m in (analysis.get("measured") or {}).items():
        by_k = {r["k"]: r["speedup"] for r in m["points"]}
        ts.add_row(cat, "measured", *[fmt(by_k.get(k)) for k in range(K + 1)], "", "")
    return [ta, tc, ts]


def closing_notes(analysis: dict) -> list[str]:
    """One line per category (how far the constant-c model is from the cost curve), the
    curve's T_t(K+1)/T_t(1), a timing-noise warning, the --measure results, and a note
    when the analysis was made with an older prompt selection."""
    notes = []
    c = analysis["cost_curve"]["c"]
    tt = analysis["cost_curve"]["target_times"]
    K = analysis["k_max"]
    for name, block in _rows(analysis):
        sp = block.get("speedup")
        if not sp:
            continue
        kc, kv = sp["k_star_constant"], sp["k_star_curve"]
        actual = sp["curve_at_k_star_constant"]
        line = (f"{name}: the constant-c model (i.i.d. α = {fmt(block['alpha'], '.3f')}, c = {c:.3f}) picks "
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
    for cat, m in (analysis.get("measured") or {}).items():
        pts = ", ".join(f"k={r['k']}: {fmt(r['speedup'])}x" for r in m["points"] if r["k"])
        notes.append(f"measured on {cat} #{m['id']} (tokens/s over plain, prefill excluded): {pts}")
    selection = analysis.get("prompt_selection") or {}
    if selection.get("version", 2) < 2:
        notes.append(f"made with an older prompt selection ({selection.get('rule')}); rerun analyze "
                     "for the current one")
    return notes


def plot_alpha(analysis: dict, path: str | os.PathLike) -> None:
    """PNG: α per prompt per category (box plot), and α_i per draft position per category."""
    cats = list(analysis["categories"])
    K = analysis["k_max"]
    fig = new_figure(12, 4.5)
    ax1, ax2 = fig.subplots(1, 2)
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
    for c, b in [*analysis["categories"].items(), ("overall", analysis["overall"])]:
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


def plot_speedup_vs_k(analysis: dict, path: str | os.PathLike) -> None:
    """PNG: predicted S(k) per category (cost curve solid, constant c dashed, curve+ dotted),
    k* starred, --measure points as squares."""
    import matplotlib

    K = analysis["k_max"]
    ks = list(range(K + 1))
    fig = new_figure(8, 5)
    ax = fig.subplots()
    colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    measured = analysis.get("measured") or {}
    for i, (c, b) in enumerate(_rows(analysis)):
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
    if any("refeed" in (b.get("speedup") or {}) for _, b in _rows(analysis)):
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
