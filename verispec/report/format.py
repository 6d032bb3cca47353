"""What the reports share: number formatting, markdown tables, an off-screen matplotlib figure."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["fmt", "md_table", "new_figure"]


def fmt(value: float | None, spec: str = ".2f", none: str = "-") -> str:
    """`format(value, spec)`, or `none` for a missing figure (None)."""
    return none if value is None else format(value, spec)


def md_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """A GitHub markdown table: first column left-aligned, the others right-aligned."""
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join([":---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def new_figure(width: float, height: float, dpi: int = 100):
    """A matplotlib `Figure` on the Agg canvas: no display and no global pyplot state.

    Args:
        width, height: inches.
        dpi: dots per inch used by `savefig` unless it is given one.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig
