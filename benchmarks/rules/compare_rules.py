"""Acceptance of the standard rule (min(1, p/q)) vs the coupled gumbel rule, same prompts and seeds.

The coupled rule makes a seeded output independent of which positions were drafted
(drafter-invariant), at a price in acceptance for draft *models* (for point-mass
drafters both rules accept with probability p(x)). This measures that price on the
default pair: α̂ (accepted / drafted), α (mean Σ min(p, q)) and τ, per rule and
temperature, at a fixed k so both rules draft at the same positions.

    python benchmarks/rules/compare_rules.py --backend llamacpp --k 3 --per-category 2 \
        --max-new-tokens 64 --out benchmarks/rules/default-pair-llamacpp.json

Counts, not timings: the result does not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

from verispec import SpeculativeDecoder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="llamacpp")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperatures", default="0.7,1.0")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    try:
        from verispec.prompts import load_prompts as _load   # after the prompts module lands
        questions = _load(None, per_category=args.per_category)
        prompts = [(q.category, q.prompt if isinstance(q.prompt, str) else q.turns[0]) for q in questions]
    except ImportError:
        from verispec.bench import DEFAULT_CATEGORIES, load_questions, resolve_dataset
        questions = load_questions(resolve_dataset(None), [*DEFAULT_CATEGORIES, "coding"], args.per_category)
        prompts = [(q.category, q.prompt) for q in questions]
    sd = SpeculativeDecoder("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", drafter="model", backend=args.backend)
    rows = []
    for temperature in [float(t) for t in args.temperatures.split(",")]:
        for rule in ("standard", "gumbel"):
            for category, prompt in prompts:
                for seed in [int(s) for s in args.seeds.split(",")]:
                    res = sd.generate(prompt, max_new_tokens=args.max_new_tokens, temperature=temperature,
                                      k=args.k, seed=seed, rule=rule)
                    s = res.stats
                    rows.append({"temperature": temperature, "rule": rule, "category": category, "seed": seed,
                                 "drafted": s.drafted, "accepted": s.accepted, "alpha_sum": s.alpha_sum,
                                 "reached": sum(s.reached), "new_tokens": s.new_tokens,
                                 "target_forwards": s.target_forwards})
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    summary = {}
    for temperature in sorted({r["temperature"] for r in rows}):
        for rule in ("standard", "gumbel"):
            mine = [r for r in rows if r["temperature"] == temperature and r["rule"] == rule]
            drafted, accepted = sum(r["drafted"] for r in mine), sum(r["accepted"] for r in mine)
            summary[f"T={temperature} {rule}"] = {
                "draft_acceptance_rate": accepted / drafted if drafted else None,
                "alpha_exact": sum(r["alpha_sum"] for r in mine) / max(1, sum(r["reached"] for r in mine)),
                "tau": sum(r["new_tokens"] for r in mine) / max(1, sum(r["target_forwards"] for r in mine)),
                "drafted": drafted, "generations": len(mine)}
    meta = {"command": "python " + " ".join(sys.argv), "python": platform.python_version(),
            "machine": platform.machine(), "processor": platform.processor() or platform.machine()}
    Path(args.out).write_text(json.dumps({"meta": meta, "summary": summary, "rows": rows}, indent=1))
    for name, row in summary.items():
        print(f"{name:>16}: α̂ {row['draft_acceptance_rate']:.3f}  α {row['alpha_exact']:.3f}  τ {row['tau']:.2f}"
              f"  ({row['drafted']} drafted)")


if __name__ == "__main__":
    main()
