"""What a shared forward costs when its sequences bring unequal numbers of rows.

    flock /tmp/verispec-heavy.lock .venv/bin/python benchmarks/serve/split_rows.py \
        [--target qwen2.5-coder-1.5b] [--repeats 7] [--threads 2]

`verispec serve --max-seqs N` gives every slot its own KV stream (`kv_unified=False`, which
cross-sequence exactness needs: `LlamaCppBatchModel`). This opens the target with two slots,
once that way and once with one unified KV buffer, fills the slots with 300 and 250 tokens,
and times forwards of a few row shapes ("A4+B1": 4 rows of slot A and 1 of slot B, as when
one request verifies 3 drafts while the other takes a plain step), each rolled back after
timing. Prints the median milliseconds per shape (the first repeat warms up). Weights are not
repacked (VERISPEC_LLAMACPP_REPACK=0 unless set), as in `rows_cost.py`.

`score_rows` groups a forward's rows by block width (one decode per width), so "A4+B1" is
[B1] then [A4]; the "joint" shapes put every row in one `llama_decode`, as before the
grouping, which llama.cpp cuts into ubatches of equal rows per sequence ([A1+B1], [A3]).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from verispec import registry  # noqa: E402
from verispec.models.llamacpp_batch import LlamaCppBatchModel  # noqa: E402

SHAPES = {"A1": (1, 0), "A1+B1": (1, 1), "A2": (2, 0), "A4": (4, 0), "A4+B1": (4, 1), "A4+B1 joint": (4, 1),
          "A4+B4": (4, 4)}


def one_decode(model: LlamaCppBatchModel, plan: dict[int, tuple[list[int], int]]) -> None:
    """Every row of `plan` (slot -> (tokens, keep)) in a single llama_decode, on the kernels
    `score_rows` uses for them (the reference ones where the switch exists)."""
    rows = [(slot, t, len(model._views[slot].tokens) + i, i >= len(tokens) - keep)
            for slot, (tokens, keep) in sorted(plan.items()) for i, t in enumerate(tokens)]
    with model.lock:
        model._run(rows, {slot: [] for slot in plan}, reference=True)


def measure(gguf: str, unified: bool, repeats: int, threads: int) -> dict[str, float]:
    """{shape: median ms} for one KV layout."""
    model = LlamaCppBatchModel.load(gguf, n_seq_max=2, n_ctx_per_seq=1024, n_threads=threads, kv_unified=unified)
    try:
        a, b = model.open(), model.open()
        context = [(i * 37) % 5000 + 100 for i in range(300)]
        a.forward(context, keep=1)
        b.forward(context[:250], keep=1)
        times: dict[str, list[float]] = {name: [] for name in SHAPES}
        for _ in range(repeats):
            for name, (rows_a, rows_b) in SHAPES.items():
                plan = {view.slot: ([1000 + i for i in range(n)], n) for view, n in ((a, rows_a), (b, rows_b)) if n}
                start = time.perf_counter()
                if name.endswith("joint"):
                    one_decode(model, plan)
                else:
                    model.score_rows(plan)
                times[name].append(time.perf_counter() - start)
                for view in (a, b):
                    model._seq_rm(view.slot, len(view.tokens))     # roll the timed rows back
        return {name: 1000 * statistics.median(t[1:]) for name, t in times.items()}
    finally:
        model.free()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=registry.DEFAULT_TARGET)
    ap.add_argument("--repeats", type=int, default=7, help="timed forwards per shape (>= 2; the first warms up)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    if args.repeats < 2:
        raise SystemExit("--repeats must be >= 2 (the first forward of each shape warms up)")
    os.environ.setdefault("VERISPEC_LLAMACPP_REPACK", "0")
    gguf = str(registry.gguf_path(args.target))
    results = {unified: measure(gguf, unified, args.repeats, args.threads) for unified in (False, True)}
    print(f"{args.target}, 2 slots (300 and 250 tokens), {args.threads} threads: ms per forward")
    print("| KV | " + " | ".join(SHAPES) + " |")
    print("|---|" + "---:|" * len(SHAPES))
    for unified, row in results.items():
        label = "one unified buffer" if unified else "one stream per slot (verispec)"
        print(f"| {label} | " + " | ".join(f"{row[name]:.1f}" for name in SHAPES) + " |")


if __name__ == "__main__":
    main()
