"""Rendering for the measuring tools: tables, notes, markdown and plots.

One room per report, sharing `format`:

* `report.analysis`: `verispec analyze` (rich tables, closing notes, α and S(k) plots);
* `report.bench`: `verispec bench` (Spec-Bench-style markdown, speedup bar chart).

Nothing here measures or computes a prediction: every figure comes in the dict given.
"""

from .analysis import closing_notes, plot_alpha, plot_speedup_vs_k, render_tables
from .bench import plot_speedups, render_markdown

__all__ = ["render_tables", "closing_notes", "plot_alpha", "plot_speedup_vs_k", "render_markdown",
           "plot_speedups"]
