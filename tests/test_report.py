"""verispec.report: bench markdown (from a synthetic summary) and the shared formatting."""

import json

from verispec import bench as B
from verispec.report.bench import render_markdown
from verispec.report.format import fmt, md_table

from test_bench_summary import synthetic_rows


def test_render_markdown_tables():
    meta = {"command": "verispec bench --quick", "backend": "llamacpp", "target": "t", "draft": "d",
            "max_new_tokens": 32, "temperature": 0.0, "seed": 0,
            "machine": {"cpu": "AMD EPYC", "cores": 2, "usable_cores": 2, "torch_threads": 2},
            "versions": {"python": "3.11", "torch": "2.13.0"}}
    md = render_markdown(B.summarize(synthetic_rows()), meta)
    assert "first turn only" in md.lower() and "`verispec bench --quick`" in md and "AMD EPYC" in md
    assert "| method | qa | rag | overall |" in md
    assert "| plain | 1.00× (1.00) | 1.00× (1.00) | 1.00× (1.00) |" in md
    assert "| verispec | 1.50× (2.86) | 2.50× (4.00) | 1.83× (3.16) |" in md
    assert "| hf-assisted | – | – | – |" in md
    assert "| verispec | 1/2 | 1/1 | 2/3 |" in md        # greedy-identical table
    assert "RuntimeError: boom" in md
    sampled = render_markdown(B.summarize(synthetic_rows()), {**meta, "temperature": 0.7})
    assert "n/a: sampling" in sampled


def test_an_old_summary_with_acceptance_rate_renders_the_same():
    """summary.json written before the rename names α̂ acceptance_rate; it still renders."""
    summary = B.summarize(synthetic_rows())
    old = json.loads(json.dumps(summary))
    for cells in old["cells"].values():
        for cell in cells.values():
            cell["acceptance_rate"] = cell.pop("draft_acceptance_rate")
    assert render_markdown(old, {"temperature": 0.0}) == render_markdown(summary, {"temperature": 0.0})
    assert "| verispec | 0.81 / 1.00 |" in render_markdown(summary)


def test_fmt_and_md_table():
    assert fmt(None) == "-" and fmt(None, ".2f", "–") == "–" and fmt(1.234) == "1.23"
    assert md_table(["a", "b"], [["x", "1"]]) == "| a | b |\n|:---|---:|\n| x | 1 |"
