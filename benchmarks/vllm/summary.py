"""One line per vLLM-CPU audit report (benchmarks/audit/vllm-cpu-*.json): verdict, per-position TV̂.

    python benchmarks/vllm/summary.py            # after `make vllm-audit-per-position`
"""

import json
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
reports = sorted((here.parent / "audit").glob("vllm-cpu-*-t*.json"))
if not reports:
    sys.exit("no vLLM audit reports yet: run `make vllm-audit-per-position`")
print(f"{'report':34s} {'verdict':12s} {'N':>4s}  TV̂ per position (then joint) and p-values")
for path in reports:
    try:
        d = json.loads(path.read_text())
    except ValueError:
        print(f"{path.stem:34s} (unreadable: the audit did not finish)")
        continue
    rows = d.get("rows", [])
    tv = " / ".join(f"{r['tv']:.3f}" for r in rows)
    pv = " / ".join(f"{r['p_value']:.2g}" for r in rows)
    print(f"{path.stem:34s} {d.get('verdict', '?'):12s} {d.get('n_samples', 0):4d}  {tv}   p {pv}")
