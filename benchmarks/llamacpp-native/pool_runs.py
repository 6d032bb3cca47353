"""Pool several `native_bench.py` runs of the same prompts: aggregated tokens/s per method and
category (Σ new tokens / Σ wall seconds over every run's generations), as ratios to native plain
llama-server and to verispec plain, and the issue-25 goals read on the pooled figures.

    python benchmarks/llamacpp-native/pool_runs.py benchmarks/llamacpp-native/bench-9 \
        benchmarks/llamacpp-native/bench-10

A generation counts in its category and in each of its groups (`multi-turn` rows are also
`coding`, ...), as in the runs' own tables; failed generations are left out.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

CATEGORIES = ["translation", "summarization", "qa", "math_reasoning", "rag", "multi-turn", "coding", "code-edit"]
PAYS = ["summarization", "coding", "code-edit"]         # issue 25: "> 1.0x native" where a drafter pays
SINGLE = ["verispec-suffix", "verispec-lookup"]
ROWS = ["plain", "plain-again", *SINGLE, "verispec-auto", "llama-server-ngram", "llama-server-draft"]


def pooled(runs: list[Path]) -> dict[tuple[str, str], float]:
    """{(category or "overall", method): aggregated tokens/s} over every run's results.jsonl."""
    tokens, seconds = collections.defaultdict(float), collections.defaultdict(float)
    for run in runs:
        for line in (run / "results.jsonl").read_text().splitlines():
            r = json.loads(line)
            if r.get("error") or not r.get("wall_seconds"):
                continue
            groups = set(r.get("groups") or []) | {r["category"], "overall"}
            for c in groups:
                tokens[(c, r["method"])] += r["new_tokens"]
                seconds[(c, r["method"])] += r["wall_seconds"]
    return {key: tokens[key] / seconds[key] for key in tokens if seconds[key] > 0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="native_bench.py output directories")
    args = ap.parse_args()
    tps = pooled(args.runs)
    cats = CATEGORIES + ["overall"]
    print(f"pooled over {', '.join(str(r) for r in args.runs)}\n")
    print("| / native plain | " + " | ".join(cats) + " |\n|---|" + "---:|" * len(cats))
    for m in ROWS:
        print(f"| {m} | " + " | ".join(f"{tps[(c, m)] / tps[(c, 'llama-server')]:.2f}" for c in cats) + " |")
    print()
    for c in CATEGORIES:
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
