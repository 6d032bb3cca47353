"""The greedy verification shortcut, measured: drafted rounds on the raw argmax against warp + rule.

Under greedy decoding without controls, `decode` verifies a drafted round on the raw
logits' argmax (`verispec.decoding._greedy_verification`) for the rules that promise the
same answer (`Rule.argmax_under_greedy`), instead of warping k + 1 rows of V logits and
building k one-hot q rows. This script times both in one process, on the same prompts, the
same drafter and the same fixed k (so both make the same decisions and emit the same
tokens; the target's cache is emptied before each, so every wall time includes its
prefill): `shortcut` uses the standard rule, `full` the same test without its promise
(`UniformRule(verify, ...)`, the path every rule took before), and `shortcut-again` the
shortcut once more (A/A: the noise the ratio sits in). Per prompt the order rotates.

    VERISPEC_LLAMACPP_REPACK=1 PYTHONPATH=. .venv/bin/python benchmarks/llamacpp-native/greedy_shortcut.py \\
        --out benchmarks/llamacpp-native/greedy-shortcut

Writes table.md (command, machine, versions in its header) and results.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

from verispec import SpeculativeDecoder
from verispec.api import load_model
from verispec.bench.results import collect_meta
from verispec.prompts import dataset_path, load_prompts
from verispec.verify import UniformRule, min_one_p_over_q, standard, verify

FULL = UniformRule(verify, "standard-full", min_one_p_over_q)   # no argmax promise: warp + rule
METHODS = {"shortcut": standard, "full": FULL, "shortcut-again": standard}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--categories", default="code-edit,summarization")
    ap.add_argument("--per-category", type=int, default=4)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = collect_meta(command=" ".join(sys.argv), k=args.k, max_new_tokens=args.max_new_tokens)
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    decoder = SpeculativeDecoder(load_model(args.target, backend="llamacpp", n_threads=args.threads),
                                 drafter="suffix")
    prompts = load_prompts(dataset_path(), args.categories.split(","), args.per_category)
    rows, names = [], list(METHODS)
    decoder.generate(prompts[0].text, max_new_tokens=8, k=args.k)   # warm-up, untimed
    for i, prompt in enumerate(prompts):
        order = names[i % len(names):] + names[:i % len(names)]
        for method in order:
            decoder.target.reset()          # every method prefills its prompt (no reuse of the last)
            start = time.perf_counter()
            result = decoder.generate(prompt.text, max_new_tokens=args.max_new_tokens, k=args.k,
                                      rule=METHODS[method])
            wall = time.perf_counter() - start
            st = result.stats
            rows.append({"question_id": prompt.id, "category": prompt.category, "method": method,
                         "new_tokens": st.new_tokens, "wall_seconds": wall, "target_seconds": st.target_seconds,
                         "prefill_seconds": st.prefill_seconds, "target_forwards": st.target_forwards,
                         "accepted": st.accepted, "drafted": st.drafted, "token_ids": list(result.token_ids)})
            print(f"q{prompt.id} {prompt.category:14s} {method:15s} {st.new_tokens / wall:6.2f} tok/s "
                  f"tau {st.tau:.2f}", flush=True)
    with open(out / "results.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    write_table(out, rows, args, meta)


def write_table(out: Path, rows: list[dict], args, meta: dict) -> None:
    total = defaultdict(lambda: defaultdict(float))
    ids = defaultdict(dict)
    for r in rows:
        for key in (r["category"], "overall"):
            t = total[(key, r["method"])]
            t["tokens"] += r["new_tokens"]
            t["wall"] += r["wall_seconds"]
            t["target"] += r["target_seconds"] + r["prefill_seconds"]
            t["forwards"] += r["target_forwards"]
        ids[r["question_id"]][r["method"]] = r["token_ids"]
    cats = sorted({c for c, _ in total} - {"overall"}) + ["overall"]
    identical = sum(len({tuple(v) for v in m.values()}) == 1 for m in ids.values())
    lines = [
        "# Greedy verification shortcut: drafted rounds on the raw argmax vs warp + rule",
        "",
        f"- command: `{' '.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])}`"
        f" (VERISPEC_LLAMACPP_REPACK={os.environ.get('VERISPEC_LLAMACPP_REPACK', 'unset')})",
        f"- date: {meta['date']}; machine: {meta['machine']['cpu']}, {meta['machine']['usable_cores']} usable cores, "
        f"1-min load average at start {meta['loadavg_at_start']}",
        f"- versions: {meta['versions']}",
        f"- target {args.target} (llama.cpp), suffix decoding, fixed k = {args.k}, greedy, "
        f"{args.max_new_tokens} new tokens, {args.threads} threads; order rotated per prompt",
        f"- token ids identical across the three methods: {identical}/{len(ids)} prompts",
        "",
        "Speedup = aggregated tokens/s over `full`'s (wall time, prefill included). "
        "Overhead = wall seconds outside the target's forwards, per target forward.",
        "",
        "| method | " + " | ".join(cats) + " | overhead ms / forward (overall) |",
        "|---|" + "---:|" * (len(cats) + 1),
    ]
    for m in METHODS:
        cells = []
        for c in cats:
            t, base = total[(c, m)], total[(c, "full")]
            cells.append(f"{(t['tokens'] / t['wall']) / (base['tokens'] / base['wall']):.3f}×")
        t = total[("overall", m)]
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {1e3 * (t['wall'] - t['target']) / t['forwards']:.2f} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
