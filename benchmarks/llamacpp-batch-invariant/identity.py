"""Greedy identity with drafting forced on: speculative output vs plain output, prompt by prompt.

`verispec bench` runs prompt lookup with adaptive k, which on llama.cpp often
chooses not to draft; this script forces k = 4 for both drafters so every round
verifies a batch of 5 tokens, on the same Spec-Bench prompts as the bench (first
turns, chat template). One process, models loaded once; for each prompt: plain
(k = 0), the draft model at k = 4, prompt lookup at k = 4. The caches are
emptied before each prompt's plain run only: the speculative runs reuse the
prompt's cached keys and values (the decoder rolls back to the prompt and scores
its last token again), which saves two prefills per prompt and is exact in the
batch-invariant mode, where a row's values do not depend on the batch it was in.

    python benchmarks/llamacpp-batch-invariant/identity.py --max-new-tokens 64 \\
        --out benchmarks/llamacpp-batch-invariant/identity
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

CATEGORIES = ["translation", "summarization", "qa", "math_reasoning", "rag", "multi-turn", "coding"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--dataset", default=None)
    ap.add_argument("--per-category", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--batch-invariant", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--out", required=True)
    ap.add_argument("--report", action="store_true", help="only rewrite --out/table.md from its results.jsonl")
    args = ap.parse_args()
    if args.report:
        write_table(Path(args.out), header_lines(args, args.batch_invariant == "on"))
        return

    from verispec import bench as B
    from verispec.api import SpeculativeDecoder, load_model

    mode = {"auto": None, "on": True, "off": False}[args.batch_invariant]
    questions = B.load_questions(B.resolve_dataset(args.dataset), CATEGORIES, args.per_category)
    target = load_model(args.target, backend="llamacpp", batch_invariant=mode)
    draft = load_model(args.draft, backend="llamacpp", batch_invariant=mode)
    decoders = {"model-k4": SpeculativeDecoder(target, draft, drafter="model"),
                "lookup-k4": SpeculativeDecoder(target, None, drafter="lookup")}
    plain_decoder = SpeculativeDecoder(target, None, drafter="none")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with (out / "results.jsonl").open("w") as f:
        for q in questions:
            ids = plain_decoder.encode(q.prompt)
            runs = {}
            for model in (target, draft):
                model.reset()
            for name, decoder in [("plain", plain_decoder), *decoders.items()]:
                start = time.perf_counter()
                res = decoder.generate(ids, max_new_tokens=args.max_new_tokens, k=0 if name == "plain" else args.k)
                wall = time.perf_counter() - start
                runs[name] = {"token_ids": res.token_ids, "tokens_per_second": len(res.token_ids) / wall,
                              "drafted": res.stats.drafted, "accepted": res.stats.accepted}
            row = {"question_id": q.question_id, "category": q.groups[0] if q.groups else q.category,
                   "prompt_tokens": len(ids), "loadavg": os.getloadavg()[0]}
            for name in decoders:
                first = next((i for i, (a, b) in enumerate(zip(runs[name]["token_ids"], runs["plain"]["token_ids"]))
                              if a != b), None)
                same = runs[name]["token_ids"] == runs["plain"]["token_ids"]
                row[name] = {"identical": same, "first_difference": None if same else
                             (first if first is not None else min(len(runs[name]["token_ids"]),
                                                                  len(runs["plain"]["token_ids"]))),
                             "drafted": runs[name]["drafted"], "accepted": runs[name]["accepted"],
                             "speedup": runs[name]["tokens_per_second"] / runs["plain"]["tokens_per_second"]}
            row["plain_tokens"] = len(runs["plain"]["token_ids"])
            rows.append(row)
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(json.dumps(row), flush=True)

    write_table(out, header_lines(args, target.batch_invariant))


def header_lines(args, batch_invariant: bool) -> list[str]:
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode().strip()
    return [
        f"- command: `{' '.join(shlex.quote(a) for a in ['python', *sys.argv])}`",
        f"- date: {datetime.date.today().isoformat()}; machine: {platform.machine()}, {os.cpu_count()} cores",
        f"- llama-cpp-python {llama_cpp.__version__}, library {os.environ.get('LLAMA_CPP_LIB_PATH', 'installed')}; "
        f"`{info}`",
        f"- target {args.target}, draft {args.draft} (GGUF Q4_K_M), batch-invariant mode: "
        f"{'on' if batch_invariant else 'off'}; {args.max_new_tokens} new tokens, greedy, k = {args.k}",
    ]


def write_table(out: Path, header: list[str]) -> None:
    """table.md from out/results.jsonl (also for a run that stopped early)."""
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    names = ["model-k4", "lookup-k4"]
    lines = ["# Greedy identity with drafting forced on (llama.cpp)", "", *header,
             f"- load average during the run {min(r['loadavg'] for r in rows):.1f}-"
             f"{max(r['loadavg'] for r in rows):.1f}; {len(rows)} prompts measured",
             "", "| category | prompts | draft model k=4: identical | accepted / drafted | prompt lookup k=4: "
             "identical | accepted / drafted |", "|---|---|---|---|---|---|"]
    cats = []
    for r in rows:
        if r["category"] not in cats:
            cats.append(r["category"])
    for cat in cats + ["all"]:
        mine = [r for r in rows if cat == "all" or r["category"] == cat]
        cells = []
        for name in names:
            cells.append(f"{sum(r[name]['identical'] for r in mine)}/{len(mine)}")
            cells.append(f"{sum(r[name]['accepted'] for r in mine)} / {sum(r[name]['drafted'] for r in mine)}")
        lines.append(f"| {cat} | {len(mine)} | " + " | ".join(cells) + " |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
