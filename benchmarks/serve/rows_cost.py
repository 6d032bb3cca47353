"""What B one-row sequences cost in one llama.cpp forward, with and without the batch-invariant mode.

    flock /tmp/verispec-heavy.lock .venv/bin/python benchmarks/serve/rows_cost.py \
        [--target qwen2.5-coder-1.5b] [--sequences 1,2,4] [--context 300] [--steps 8]

A batched server's decode step is B sequences putting one row each into a shared forward.
This opens the target as `verispec serve --max-seqs` does (`LlamaCppBatchModel`, one KV
stream per slot), prefills every slot with the same `--context` tokens, then times `--steps`
shared forwards of one row per sequence for each B with the batch-invariant mode (reference
kernels for decodes) and without (llama.cpp's default kernels, as llama-server), the two
models open at once and their steps alternated. Weights are not repacked in either mode
(VERISPEC_LLAMACPP_REPACK=0 unless set: `batch_bench.py` runs llama-server with --no-repack
and this VM's AMX repacking crashes; with repacking allowed the default kernels' single row
ran 1.2-1.3x faster than the reference one). Prints the median milliseconds per forward
(the first two steps are warm-up) and the ratio of the two modes.
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


def measure(gguf: str, sequences: list[int], context: int, steps: int, threads: int) -> dict:
    """{B: (median ms with the mode, median ms without)}: both models open at once, their
    steps alternated, so a drift of the machine's speed falls on both alike."""
    n_ctx = context + steps * len(sequences) + 8
    models = [LlamaCppBatchModel.load(gguf, n_seq_max=max(sequences), n_ctx_per_seq=n_ctx,
                                      n_threads=threads, batch_invariant=mode) for mode in (True, False)]
    try:
        out = {}
        for b in sequences:
            views = [[model.open() for _ in range(b)] for model in models]
            for model, vs in zip(models, views):
                for v in vs:
                    model.forward_many({v: ([100 + i for i in range(context)], 1)})
            times: list[list[float]] = [[], []]
            for step in range(steps):
                for i, (model, vs) in enumerate(zip(models, views)):
                    start = time.perf_counter()
                    model.forward_many({v: ([1000 + step], 1) for v in vs})
                    times[i].append(time.perf_counter() - start)
            out[b] = tuple(1000 * statistics.median(t[2:]) for t in times)
            for vs in views:
                for v in vs:
                    v.close()
        return out
    finally:
        for model in models:
            model.free()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=registry.DEFAULT_TARGET)
    ap.add_argument("--sequences", default="1,2,4", help="comma-separated B values, each >= 1")
    ap.add_argument("--context", type=int, default=300, help="tokens each slot holds before the timed steps")
    ap.add_argument("--steps", type=int, default=8, help="timed forwards per B (>= 3; the first two warm up)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    try:
        sequences = [int(b) for b in args.sequences.split(",")]
    except ValueError:
        ap.error(f"--sequences must be comma-separated integers, got {args.sequences!r}")
    if min(sequences) < 1 or args.context < 1 or args.steps < 3:
        ap.error("--sequences values and --context must be >= 1, --steps >= 3")
    os.environ.setdefault("VERISPEC_LLAMACPP_REPACK", "0")     # as llama-server --no-repack
    gguf = str(registry.resolve(args.target, weights=False).gguf_path)
    ms = measure(gguf, sequences, args.context, args.steps, args.threads)
    print(f"{args.target}, {args.context} tokens per slot, {args.threads} threads, VERISPEC_LLAMACPP_REPACK="
          f"{os.environ['VERISPEC_LLAMACPP_REPACK']}: ms per shared forward")
    print("| B (one row each) | batch-invariant (reference kernels) | default kernels | ratio |")
    print("|---:|---:|---:|---:|")
    for b in sequences:
        ref, fast = ms[b]
        print(f"| {b} | {ref:.1f} | {fast:.1f} | {ref / fast:.2f} |")


if __name__ == "__main__":
    main()
