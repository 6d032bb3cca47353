"""Several sequences in one llama.cpp forward: logit gap against solo forwards, and throughput.

Part 1 (exactness): three sequences of different lengths decode together in one
`LlamaCppBatchModel` (staggered joins, a prefill beside verification rows, rollbacks); every
forward is replayed on a solo `LlamaCppModel` (batch-invariant mode) and the largest
absolute logit difference is reported, for one KV stream per sequence (kv_unified=False,
the default), one unified buffer (kv_unified=True), and rows per decode above the
7-row bound (max_rows=16: the tiled K-quant matmul).

Part 2 (speed, not a test): N greedy requests of `--tokens` tokens each, decoded one after
the other on the solo model vs together by `BatchedRounds`; aggregate output tokens/s.

    flock /tmp/verispec-heavy.lock python benchmarks/llamacpp-batch/cross_sequence.py \\
        --model smollm2-135m --out benchmarks/llamacpp-batch/smollm2-135m.md
"""

from __future__ import annotations

import argparse
import time

TEXT = ("def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
        "    return a\n\nprint([fibonacci(i) for i in range(10)])\n") * 40
PROMPTS = ["Write a Python function that returns the sum of a list of numbers.",
           "Count from one to twenty in words, separated by commas.",
           "Repeat this list exactly twice: apple, banana, cherry, date, elderberry.",
           "Explain what a hash map is in two sentences.",
           "Write a haiku about the sea.", "List five prime numbers.",
           "What is the capital of Japan?", "Translate 'good morning' into French."]


def gap(solo, batch, ids) -> float:
    """Largest |logit difference| over every forward of a staggered three-sequence script."""
    script = [("open", 0), ("fwd", {0: (ids[:37], 1)}), ("fwd", {0: ids[37:42]}), ("open", 1),
              ("fwd", {0: ids[42:46], 1: (ids[100:353], 1)}), ("trunc", 0, 44),
              ("fwd", {0: ids[44:47], 1: ids[353:360]}), ("open", 2), ("fwd", {2: (ids[5:18], 1)})]
    for step in range(3):
        script.append(("fwd", {0: ids[47 + 4 * step:51 + 4 * step], 1: ids[360 + step:361 + step],
                               2: ids[18 + 6 * step:24 + 6 * step]}))
    views, history, worst = {}, {}, 0.0
    for op in script:
        if op[0] == "open":
            views[op[1]] = batch.open()
            history[op[1]] = []
        elif op[0] == "trunc":
            views[op[1]].truncate(op[2])
            history[op[1]].append(("trunc", op[2], None))
        else:
            out = batch.forward_many({views[s]: v for s, v in op[1].items()})
            for s, v in op[1].items():
                tokens, keep = v if isinstance(v, tuple) else (v, None)
                history[s].append((tokens, keep, out[views[s]]))
    for s, ops in history.items():
        solo.reset()
        for tokens, keep, got in ops:
            if tokens == "trunc":
                solo.truncate(keep)
            else:
                worst = max(worst, float((solo.forward(tokens, keep=keep) - got).abs().max()))
    for view in views.values():
        view.close()
    return worst


def throughput(solo, batch, tokens: int, n: int) -> tuple[float, float, bool]:
    from verispec.batching import BatchedRounds
    from verispec.decoding import decode
    from verispec.policy import make_policy
    from verispec.sampling import SamplingConfig, SeededRandomness

    prompts = [solo.tokenizer.encode(p) for p in PROMPTS[:n]]
    sampling = SamplingConfig(temperature=0.0, eos_token_ids=frozenset())
    start = time.perf_counter()
    serial = [decode(solo, p, make_policy(0, {}), sampling=sampling, max_new_tokens=tokens,
                     rng=SeededRandomness(0)).tokens for p in prompts]
    t_serial = time.perf_counter() - start
    driver = BatchedRounds(batch)
    start = time.perf_counter()
    handles = [driver.submit(p, make_policy(0, {}), sampling=sampling, max_new_tokens=tokens,
                             rng=SeededRandomness(0)) for p in prompts]
    together = [h.result().tokens for h in handles]
    t_batch = time.perf_counter() - start
    driver.close()
    total = sum(len(t) for t in serial)
    return total / t_serial, total / t_batch, together == serial


def main() -> None:
    from verispec import registry
    from verispec.api import load_model
    from verispec.models.llamacpp_batch import LlamaCppBatchModel

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-speed", action="store_true", help="part 1 only")
    args = ap.parse_args()
    solo = load_model(args.model, backend="llamacpp", batch_invariant=True, n_threads=args.threads)
    ids = solo.tokenizer.encode(TEXT)
    path = str(registry.gguf_path(args.model))
    lines = [f"# {args.model}: several sequences in one forward ({args.threads} threads)", "",
             "| configuration | max abs logit gap vs solo forwards |", "|---|---|"]
    for label, kw in (("one KV stream per sequence, <= 7 rows per decode (default)", {}),
                      ("one unified KV buffer (kv_unified=True)", {"kv_unified": True}),
                      ("one KV stream per sequence, 16 rows per decode", {"max_rows": 16})):
        batch = LlamaCppBatchModel.load(path, n_seq_max=4, n_ctx_per_seq=1024, n_threads=args.threads, **kw)
        lines.append(f"| {label} | {gap(solo, batch, ids):.3g} |")
        batch.free()
        print(lines[-1], flush=True)
    if args.no_speed:
        return _write(lines, args.out)
    lines += ["", f"Aggregate greedy output tokens/s, plain decoding, {args.tokens} tokens per request "
              "(solo one after the other vs BatchedRounds):", "",
              "| requests | solo, serial | batched | outputs equal |", "|---|---|---|---|"]
    batch = LlamaCppBatchModel.load(path, n_seq_max=8, n_ctx_per_seq=512, n_threads=args.threads)
    for n in (1, 2, 4, 8):
        serial, together, same = throughput(solo, batch, args.tokens, n)
        lines.append(f"| {n} | {serial:.1f} | {together:.1f} | {same} |")
        print(lines[-1], flush=True)
    batch.free()
    _write(lines, args.out)


def _write(lines: list[str], out: str | None) -> None:
    text = "\n".join(lines) + "\n"
    if out:
        with open(out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
