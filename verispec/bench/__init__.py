"""`verispec bench`: Spec-Bench, verispec's methods against plain decoding (and HF's), one process.

Pipeline (each step is a plain function; `verispec bench` only parses options):

    questions = load_prompts(dataset_path(None), ["qa", "multi-turn"], per_category=3)
    rows = run_bench(questions, ["plain", "verispec"], target=..., draft=..., out_dir=DIR)
    summary = summarize(rows)
    markdown = render_markdown(summary, meta)         # verispec.report.bench
    write_report(DIR)     # summary.json, table.md, speedup.png from DIR/results.jsonl + meta.json

Rooms: `methods` (the table of methods, option checks), `measure` (`run_one`: one timed
generation; `hf` for transformers' `generate`), `run` (`run_bench`: scheduling and
rows), `results` (the output directory: results.jsonl, meta.json, resume), `summary`
(figures per method and category, the written report). Prompts: `verispec.prompts`
(multi-turn rows are run on their FIRST turn only).
"""

from .measure import decoder_for, loadavg, reset_models, run_one
from .methods import (
    METHODS,
    QUICK_CATEGORIES,
    BenchError,
    MethodSpec,
    check_methods,
    default_methods,
    method_names,
    parse_list,
    quick_methods,
)
from .results import (
    META,
    PLOT,
    RESULTS,
    SUMMARY,
    TABLE,
    collect_meta,
    done_pairs,
    latest_rows,
    load_results,
    read_meta,
    start_run,
    upgrade_row,
)
from .run import run_bench
from .summary import OVERALL, summarize, write_report

__all__ = [
    "METHODS", "QUICK_CATEGORIES", "BenchError", "MethodSpec", "check_methods", "default_methods",
    "method_names", "parse_list", "quick_methods", "decoder_for", "run_one", "loadavg", "reset_models",
    "run_bench", "RESULTS", "META", "SUMMARY", "TABLE", "PLOT", "load_results", "upgrade_row",
    "latest_rows", "done_pairs", "read_meta", "collect_meta", "start_run", "OVERALL", "summarize",
    "write_report",
]
