"""Pool several `native_bench.py` runs of the same prompts and read issue 25's goals off the
pooled figures: `verispec.bench.summary.summarize` over every run's rows, each run's prompts
kept apart (aggregated tokens/s = Σ new tokens / Σ wall seconds over all runs' generations),
as ratios to native plain llama-server and to verispec plain.

    python benchmarks/llamacpp-native/pool_runs.py benchmarks/llamacpp-native/bench-9 \
        benchmarks/llamacpp-native/bench-10
"""

from __future__ import annotations

import argparse
from pathlib import Path

from verispec.bench.results import load_results
from verispec.bench.summary import summarize

PAYS = ["summarization", "coding", "code-edit"]         # issue 25: "> 1.0x native" where a drafter pays
SINGLE = ["verispec-suffix", "verispec-lookup"]
ROWS = ["plain", "plain-again", *SINGLE, "verispec-auto", "llama-server-ngram", "llama-server-draft"]


def pooled_rows(runs: list[Path]) -> list[dict]:
    """Every run's rows, each question id prefixed by its run (`summarize` keeps one row per
    question id and method, so the same prompt in two runs must not collide)."""
    return [{**r, "question_id": f"{run.name}:{r['question_id']}"} for run in runs for r in load_results(run)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="native_bench.py output directories")
    args = ap.parse_args()
    for run in args.runs:
        methods = {r["method"] for r in load_results(run)}
        if not {"plain", "llama-server", "verispec-auto"} <= methods:
            ap.error(f"{run}: no results.jsonl with plain, llama-server and verispec-auto rows "
                     "(give native_bench.py output directories)")
    s = summarize(pooled_rows(args.runs))
    tps = {(c, m): cell["tokens_per_second"] for m, by in s["cells"].items() for c, cell in by.items()}
    cats = s["categories"]
    print(f"pooled over {', '.join(str(r) for r in args.runs)}\n")
    print("| / native plain | " + " | ".join(cats) + " |\n|---|" + "---:|" * len(cats))
    for m in ROWS:
        print(f"| {m} | " + " | ".join(f"{tps[(c, m)] / tps[(c, 'llama-server')]:.2f}" for c in cats) + " |")
    print()
    for c in cats[:-1]:
        plain = tps[(c, "plain")]
        auto, spread = tps[(c, "verispec-auto")] / plain, abs(tps[(c, "plain-again")] / plain - 1)
        best = max(tps[(c, m)] / plain for m in SINGLE)
        native = tps[(c, "verispec-auto")] / tps[(c, "llama-server")]
        goals = {">=0.98x native": native >= 0.98, ">=best single - A/A": auto >= best - spread,
                 ">=0.98x plain": auto >= 0.98}
        if c in PAYS:
            goals[">1.0x native"] = native > 1.0
        print(f"{c:15s} auto/plain {auto:.3f}  best single {best:.3f}  A/A spread {spread:.3f}  "
              f"auto/native {native:.3f}  " + "  ".join(f"{k}: {'met' if v else 'NOT met'}" for k, v in goals.items()))


if __name__ == "__main__":
    main()
