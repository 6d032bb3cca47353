"""Trim guidellm's benchmarks.json (about 1 MB) to what the client benchmark reports.

    python benchmarks/serve/clients/trim_guidellm.py RESULTS_DIR/guidellm

Reads benchmarks.json, console.txt, command.txt and ../env.txt there; writes summary.json
(per strategy: request counts by status, requests/s, output tokens/s, and the successful
requests' TTFT, ITL and latency median/p95/max) and summary.md (the header: command,
machine, versions; then guidellm's own console tables, unchanged).
"""

import json
import sys
from pathlib import Path


def dist(m: dict, key: str) -> dict:
    s = m[key]["successful"]
    return {"median": s["median"], "p95": s["percentiles"]["p95"], "max": s["max"],
            "count": s["count"]}


def main() -> None:
    d = Path(sys.argv[1])
    report = json.loads((d / "benchmarks.json").read_text())
    rows = []
    for b in report["benchmarks"]:
        m = b["metrics"]
        rows.append({
            "strategy": b["config"]["strategy"].get("type_", "?")
            + (f"@{b['config']['strategy'].get('rate'):.3g}"
               if b["config"]["strategy"].get("rate") else ""),
            "requests": {k: m["request_totals"][k]
                         for k in ("successful", "incomplete", "errored", "total")},
            "requests_per_second_mean": m["requests_per_second"]["successful"]["mean"],
            "output_tokens_per_second_mean": m["output_tokens_per_second"]["successful"]["mean"],
            "time_to_first_token_ms": dist(m, "time_to_first_token_ms"),
            "inter_token_latency_ms": dist(m, "inter_token_latency_ms"),
            "request_latency_s": dist(m, "request_latency"),
        })
    (d / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    console = (d / "console.txt").read_text().splitlines()
    start = next(i for i, line in enumerate(console) if "Run Summary Info" in line)
    end = next((i for i in range(start + 1, len(console)) if "Run Summary Info" in console[i]),
               len(console))
    header = ["# guidellm against `verispec serve` (SmolLM2-135M, llama.cpp)", "",
              "```", "command: " + (d / "command.txt").read_text().strip(),
              *(d.parent / "env.txt").read_text().splitlines(),
              f"exit code: {(d / 'exit_code.txt').read_text().strip()}", "```", "",
              "guidellm's console tables, unchanged:", "", "```"]
    (d / "summary.md").write_text("\n".join(header + console[start:end] + ["```", ""]))


if __name__ == "__main__":
    main()
