"""The token-level audit's report: an 80-column text table, markdown, PNG plots, JSON.

`text(audit)` is what the terminal shows (every line <= 80 characters); `write_report(
audit, directory)` writes ``report.md`` (the same tables, the probe table and the
per-position effects), ``pit.png`` (the PIT histogram against the uniform),
``positions.png`` (top-1 excess per position with its interval) and ``audit.json``.
A total variation is never printed: the effects are the top-1 excess (probability),
the log-likelihood excess (nats/token) and the PIT's Kolmogorov distance, each in [−1, 1]
or [0, 1] by construction.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from .tokens import TokenAudit

__all__ = ["markdown", "text", "write_report"]

WIDTH = 80


def _fmt(x: float | None, digits: int = 4) -> str:
    return "—" if x is None else f"{x:+.{digits}f}" if x < 0 or digits == 4 else f"{x:.{digits}f}"


def _rows(audit: TokenAudit) -> list[tuple[str, str, str, str, str]]:
    rows = []
    for tag, effects in (("", audit.decisive), ("(beside) ", audit.beside)):
        for e in effects:
            name = tag + e.name.split(" (")[0]
            rows.append((name[:26], f"{e.estimate:+.4f}", f"[{e.ci[0]:+.4f}, {e.ci[1]:+.4f}]",
                         f"{e.p_value:.2g}", "—" if e.detectable is None else f"{e.detectable:.4f}"))
    return rows


def _wrap(line: str, indent: str = "  ") -> list[str]:
    return textwrap.wrap(line, WIDTH, subsequent_indent=indent) or [""]


def text(audit: TokenAudit) -> str:
    """The terminal report, every line at most 80 characters."""
    s = audit.sampling
    out = _wrap(f"{audit.endpoint} vs {audit.reference}")
    out += _wrap(f"{audit.prompts} prompt(s) × {audit.n} completions × m ≤ {audit.m}: {audit.tokens:,} "
                 f"tokens; T = {s['temperature']:g}, top-k {s['top_k']}, top-p {s['top_p']:g}"
                 + (f", controls {s['controls']}" if s["controls"] else ""))
    out += _wrap(f"significance {audit.significance:g} for the whole verdict; tolerance ±{audit.tolerance:g} "
                 f"on the top-1 excess")
    rows = _rows(audit)
    if rows:
        out.append("")
        out.append(f"{'statistic':<26} {'effect':>8} {'interval':>19} {'p':>7} {'detect':>8}")
        out.append("-" * 72)
        out += [f"{a:<26} {b:>8} {c:>19} {d:>7} {e:>8}" for a, b, c, d, e in rows]
        out += _wrap("interval: the top-1 excess (and its Δ) at 1 − 2·significance, the one its "
                     "pass uses (two one-sided tests); the others at 1 − significance/F (F deciding "
                     "statistics); 'detect': smallest effect found with 80 % power (KS distance for "
                     "the PIT)")
    out.append("")
    out += _wrap(f"tokens outside the reference's support: {audit.impossible} impossible, "
                 f"{audit.near_ties} near-ties at the cut-off (numerics)")
    local = audit.info.get("greedy_vs_local_argmax")
    if audit.greedy:
        bugs = sum(g["kind"] == "bug" for g in audit.greedy)
        out += _wrap(f"greedy divergences{' from spec-off' if local else ''}: {len(audit.greedy)} "
                     f"({bugs} beyond the numerics floor {audit.info.get('margin', 0):g})")
    if local:
        out += _wrap(f"(beside) greedy tokens that are not the local reference's argmax: "
                     f"{local['divergences']} ({local['beyond_floor']} beyond the floor; other kernels)")
    if audit.probes:
        out.append("")
        out.append(f"{'probe':<15} {'status':<12} detail")
        for p in audit.probes:
            out += _wrap(f"{p.name:<15} {p.status:<12} {p.detail}", " " * 29)
    out.append("")
    out += _wrap(f"verdict: {audit.verdict}")
    for r in audit.reasons:
        out += _wrap("- " + r, "    ")
    out += _wrap(f"error rate: {audit.error_rate}", "    ")
    for key in ("warning", "seed_warning"):
        if key in audit.info:
            out += _wrap("warning: " + audit.info[key], "    ")
    return "\n".join(out)


def markdown(audit: TokenAudit) -> str:
    """The report as markdown (tables: statistics, probes, per-position effects)."""
    lines = [f"# Endpoint audit: {audit.verdict}", "", f"`{audit.endpoint}` vs {audit.reference}: "
             f"{audit.prompts} prompts × {audit.n} completions × m ≤ {audit.m} = {audit.tokens:,} tokens, "
             f"sampling {audit.sampling}, significance {audit.significance:g} (whole verdict), tolerance "
             f"±{audit.tolerance:g} on the top-1 excess.", ""]
    lines += [f"- {r}" for r in audit.reasons] + [f"- error rate: {audit.error_rate}", ""]
    lines += ["| statistic | effect | interval | p | detectable (80 %) |", "|---|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in _rows(audit)]
    lines += ["", f"Tokens outside the reference's support: {audit.impossible} impossible, {audit.near_ties} "
              "near-ties (numerics).", ""]
    if audit.probes:
        lines += ["| probe | status | requests | detail |", "|---|---|---|---|"]
        lines += [f"| {p.name} | {p.status} | {p.requests} | {p.detail} |" for p in audit.probes]
        lines.append("")
    if audit.positions:
        lines += ["![PIT histogram](pit.png) ![top-1 excess per position](positions.png)", "",
                  "| position | tokens | top-1 excess | interval |", "|---|---|---|---|"]
        lines += [f"| {r['position']} | {r['n']} | {r['estimate']:+.4f} | [{r['ci'][0]:+.4f}, {r['ci'][1]:+.4f}] |"
                  for r in audit.positions]
    lines += ["", "```", json.dumps(audit.info, default=str), "```", ""]
    return "\n".join(lines)


def write_report(audit: TokenAudit, directory: str | Path) -> list[Path]:
    """Write report.md, audit.json, pit.png and positions.png (plots when there are sampled
    tokens) into `directory` (created); returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    paths = [d / "report.md", d / "audit.json"]
    paths[0].write_text(markdown(audit))
    paths[1].write_text(json.dumps(audit.to_dict(), default=str, indent=1))
    if audit.pit and sum(audit.pit):
        fig, ax = plt.subplots(figsize=(6, 3.2))
        bins = len(audit.pit)
        total = sum(audit.pit)
        ax.bar([(i + 0.5) / bins for i in range(bins)], audit.pit, width=1 / bins, edgecolor="white")
        ax.axhline(total / bins, color="black", linestyle="--", label="uniform (exact server)")
        ax.set(xlabel="randomized PIT u", ylabel="tokens", title=f"PIT histogram ({audit.verdict})")
        ax.legend()
        fig.tight_layout()
        fig.savefig(d / "pit.png", dpi=100)
        plt.close(fig)
        paths.append(d / "pit.png")
    if audit.positions:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        x = [r["position"] for r in audit.positions]
        y = [r["estimate"] for r in audit.positions]
        lo = [r["estimate"] - r["ci"][0] for r in audit.positions]
        hi = [r["ci"][1] - r["estimate"] for r in audit.positions]
        ax.errorbar(x, y, yerr=[lo, hi], fmt="o", markersize=3)
        ax.axhline(0, color="black", linewidth=0.8)
        for t in (audit.tolerance, -audit.tolerance):
            ax.axhline(t, color="grey", linestyle=":")
        ax.set(xlabel="position", ylabel="top-1 excess", title="top-1 excess per position")
        fig.tight_layout()
        fig.savefig(d / "positions.png", dpi=100)
        plt.close(fig)
        paths.append(d / "positions.png")
    return paths
