"""Measure the cost curve `replay_policy.py` simulates with: T_t(n) and T_d(1..2) after two
context lengths, and both models' prefill seconds per token, on this machine.

    flock /tmp/verispec-heavy.lock .venv/bin/python benchmarks/llamacpp-native/measure_curve.py \
        --out benchmarks/llamacpp-native/curve.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from verispec import registry
from verispec.api import load_model
from verispec.cost import measure_cost_curve


def prefill_rate(model, tokens: list[int], repeats: int = 3) -> float:
    """Median seconds per token of a keep=1 forward over `tokens` from an empty cache."""
    rates = []
    for _ in range(repeats):
        model.reset()
        start = time.perf_counter()
        model.forward(tokens, keep=1)
        rates.append((time.perf_counter() - start) / len(tokens))
    model.reset()
    return sorted(rates)[len(rates) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--target", default=registry.DEFAULT_TARGET)
    ap.add_argument("--draft", default=registry.DEFAULT_DRAFT)
    ap.add_argument("--k-max", type=int, default=8)
    ap.add_argument("--prefixes", default="100,700")
    args = ap.parse_args()
    try:
        prefixes = [int(p) for p in args.prefixes.split(",")]
    except ValueError:
        ap.error(f"--prefixes {args.prefixes!r}: give comma-separated token counts, e.g. 100,700")
    if args.k_max < 1 or any(p < 1 for p in prefixes):
        ap.error("--k-max and every --prefixes value must be >= 1")
    target = load_model(args.target, backend="llamacpp")
    draft = load_model(args.draft, backend="llamacpp")
    context = [1000 + i % 5000 for i in range(4000)]
    out = {"command": "benchmarks/llamacpp-native/measure_curve.py", "machine": platform.processor(),
           "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "target_model": args.target, "draft_model": args.draft,
           "target": {}, "draft": {}}
    for prefix in prefixes:
        m = measure_cost_curve(target, args.k_max, context, draft=draft, prefix_tokens=prefix, repeats=5)
        out["target"][prefix] = list(m.curve.target_times)
        out["draft"][prefix] = [m.curve.draft_time, m.draft_time_2]
        print(prefix, [round(t * 1000, 1) for t in m.curve.target_times], "T_d",
              round(m.curve.draft_time * 1000, 1), round(m.draft_time_2 * 1000, 1), flush=True)
    out["target_prefill"] = prefill_rate(target, context[:512])
    out["draft_prefill"] = prefill_rate(draft, context[:512])
    print("prefill s/token", out["target_prefill"], out["draft_prefill"])
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
