"""Plain decoding speed: verispec `--k 0` against native `llama-bench`, interleaved in one run.

Each repeat is a sandwich: `llama-bench -p 512 -n 128 -t T -r R` (native prefill of a
512-token prompt and decode of 128 tokens, llama.cpp's defaults), then verispec in this process
with its default settings (no environment variables; the batch-invariant mode as shipped) R
times, then llama-bench again. verispec's ratio is to the mean of the two native runs around
it, so a machine that drifts linearly within a repeat favours neither side (earlier runs that
alternated native-first and verispec-first repeats read whichever side ran second ~7 % slow:
the spread of a run was wider than the gap it measured). The A/A row is the second native run
over the first: the noise the ratios sit in.

    prefill  a 512-token prompt (511 tokens prefilled, the last one is fed by the first
             round, as in every generation): 511 / Stats.prefill_seconds
    decode   128 new tokens, greedy, k = 0, from a short prompt (llama-bench's tg128 starts
             from an empty context): new_tokens / (wall - prefill)

Repacking (`--repack auto`, as `native_bench.py`): llama.cpp's default repacked weights on
both sides unless this CPU reports AMX (there `--repack 0` for llama-bench and
VERISPEC_LLAMACPP_REPACK=0 for verispec: the VMs measured with AMX fault in its tiles).
`--both-layouts` adds verispec and llama-bench without repacking as rows of their own (on
AVX-512 llama.cpp's repacked weights decode faster and prefill slower than the plain layout).
The figures are tokens per second; the ratios are verispec / llama-bench of the same repeat,
reported as median and range over repeats. Run it under the project's lock:

    flock /tmp/verispec-heavy.lock .venv/bin/python benchmarks/llamacpp/native_speed.py \
        --repeats 6 --out benchmarks/llamacpp-native/speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from verispec import registry
from verispec.api import SpeculativeDecoder
from verispec.bench import collect_meta
from verispec.models.llamacpp import LlamaCppModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from native_bench import native_repack, repack_env  # noqa: E402

BUILD = Path(os.environ.get("VERISPEC_BUILD", Path.home() / ".cache/verispec/build")) / "llama.cpp-0c1e570"
CODE = ("Write a complete Python module implementing a red-black tree with insert, delete, search, "
        "in-order traversal and validation methods, each with a docstring and type hints.")


def llama_bench(binary: Path, model: str, threads: int, reps: int, extra: list[str]) -> dict:
    """llama-bench's mean tokens/s for pp512 and tg128 (its JSON output)."""
    out = subprocess.run([str(binary), "-m", model, "-p", "512", "-n", "128", "-t", str(threads),
                          "-r", str(reps), "-o", "json", *extra], check=True, capture_output=True, text=True)
    rows = json.loads(out.stdout)
    got = {}
    for r in rows:
        key = "prefill" if r.get("n_prompt") and not r.get("n_gen") else "decode"
        got[key] = float(r["avg_ts"])
    return got


def bare_speeds(model: LlamaCppModel, long_ids: list[int], short_ids: list[int], n: int = 128) -> dict:
    """The same measurements with the llama.cpp library verispec loads and no verispec code:
    `llama_decode` on the model's own context, a greedy numpy argmax on the logits in place
    (what a minimal llama-cpp-python loop costs; verispec / bare is verispec's own overhead)."""
    ctx, batch, vocab = model.llama._ctx, model._batch, model.vocab_size

    def feed(ids: list[int], pos: int) -> np.ndarray:
        b = batch.batch
        b.n_tokens = len(ids)
        for i, tok in enumerate(ids):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos + i, 1, i == len(ids) - 1
            b.seq_id[i][0] = 0
        ctx.decode(batch)
        return np.ctypeslib.as_array(ctx.get_logits(), shape=(1, vocab))[0]

    model.reset()
    t = time.perf_counter()
    feed(long_ids[:-1], 0)
    prefill = (len(long_ids) - 1) / (time.perf_counter() - t)
    model.reset()
    feed(short_ids[:-1], 0)
    tok, pos = short_ids[-1], len(short_ids) - 1
    t = time.perf_counter()
    for _ in range(n):
        tok = int(np.argmax(feed([tok], pos)))
        pos += 1
    decode = n / (time.perf_counter() - t)
    model.reset()
    return {"prefill": prefill, "decode": decode}


def verispec_speeds(decoder: SpeculativeDecoder, long_ids: list[int], short_ids: list[int],
                    reps: int = 1) -> dict:
    """verispec's prefill and k = 0 decode tokens/s (caches emptied first), each the mean over
    `reps` runs (as llama-bench's avg_ts is the mean over its -r repetitions)."""
    prefills, decodes = [], []
    for _ in range(reps):
        decoder.target.reset()
        r = decoder.generate(long_ids, max_new_tokens=1, k=0)
        prefills.append((len(long_ids) - 1) / r.stats.prefill_seconds)
    for _ in range(reps):
        decoder.target.reset()
        s = decoder.generate(short_ids, max_new_tokens=128, k=0).stats
        decodes.append(s.new_tokens / (s.wall_seconds - s.prefill_seconds))
    return {"prefill": statistics.fmean(prefills), "decode": statistics.fmean(decodes),
            "decode_tokens": s.new_tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=registry.DEFAULT_TARGET)
    ap.add_argument("--bin-dir", default=str(BUILD / "bin"))
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeats", type=int, default=6, help="sandwiches (default %(default)s)")
    ap.add_argument("--bench-reps", type=int, default=2, help="llama-bench -r, and verispec runs, per sandwich")
    ap.add_argument("--native-args", default=[""], action="append",
                    help="more llama-bench arguments; repeat the option for several native rows "
                         "(the first is the reference of the ratios)")
    ap.add_argument("--repack", default="auto", help="repacked weights on both sides: auto (llama.cpp's "
                    "default unless the CPU reports AMX), 1 or 0 (default %(default)s)")
    ap.add_argument("--both-layouts", action="store_true",
                    help="also verispec and llama-bench without repacked weights, as rows of their own")
    ap.add_argument("--bare", action="store_true",
                    help="also measure a bare llama-cpp-python loop on verispec's model (no verispec code)")
    ap.add_argument("--out", default=None, help="write the figures here as JSON")
    args = ap.parse_args()

    repack = native_repack(args.repack)
    t = registry.resolve(args.target, weights=False)
    variants = {}
    for name, layout in [("verispec", repack)] + ([("verispec no-repack", False)] if args.both_layouts else []):
        os.environ.update(repack_env(layout))
        variants[name] = LlamaCppModel.load(str(t.gguf_path), tokenizer_path=t.hf_path, name=t.name)
    decoders = {k: SpeculativeDecoder(m, None, drafter="none") for k, m in variants.items()}
    any_decoder = decoders["verispec"]
    short_ids = any_decoder.encode(CODE)
    filler = any_decoder.target.tokenizer("def f(x):\n    return x + 1\n" * 200)["input_ids"]
    long_ids = (short_ids + filler)[:512]
    assert len(long_ids) == 512
    for d in decoders.values():          # warm-up
        verispec_speeds(d, long_ids[:64], short_ids)
    natives = args.native_args[1:] if len(args.native_args) > 1 else args.native_args
    natives = [a if repack else f"{a} --repack 0".strip() for a in natives]
    if args.both_layouts and repack:
        natives.append("--repack 0")
    names = ["llama-bench" if i == 0 else f"llama-bench {a}" for i, a in enumerate(natives)]

    repeats = []
    def native(row: dict, when: str) -> None:
        for name, extra in zip(names, natives):
            row[f"{name} {when}"] = llama_bench(Path(args.bin_dir) / "llama-bench", str(t.gguf_path),
                                                args.threads, args.bench_reps, extra.split())

    def ours(row: dict) -> None:
        for name, d in decoders.items():
            row[name] = verispec_speeds(d, long_ids, short_ids, args.bench_reps)
        if args.bare:
            row["bare llama-cpp-python"] = bare_speeds(variants["verispec"], long_ids, short_ids)

    for _ in range(args.repeats):
        row = {}
        native(row, "before")
        ours(row)
        native(row, "after")
        for name in names:      # the sandwich's bread: each native row is the mean of its two runs
            b, a = row.pop(f"{name} before"), row.pop(f"{name} after")
            row[name] = {w: (b[w] + a[w]) / 2 for w in ("prefill", "decode")}
            row[f"{name} (A/A: after / before)"] = {w: a[w] / b[w] for w in ("prefill", "decode")}
        repeats.append(row)
        print(json.dumps(row), file=sys.stderr)

    summary = {}
    for what in ("prefill", "decode"):
        aa = [r["llama-bench (A/A: after / before)"][what] for r in repeats]
        summary[f"A/A llama-bench {what}"] = {"median_ratio": statistics.median(aa), "min_ratio": min(aa),
                                              "max_ratio": max(aa)}
    for name in [n for n in repeats[0] if n != "llama-bench" and "A/A" not in n]:
        for what in ("prefill", "decode"):
            ratios = [r[name][what] / r["llama-bench"][what] for r in repeats]
            summary[f"{name} {what}"] = {"median_ratio": statistics.median(ratios),
                                         "ratio_of_means": statistics.fmean(r[name][what] for r in repeats)
                                         / statistics.fmean(r["llama-bench"][what] for r in repeats),
                                         "min_ratio": min(ratios), "max_ratio": max(ratios),
                                         "tok_s": [round(r[name][what], 2) for r in repeats],
                                         "llama_bench_tok_s": [round(r["llama-bench"][what], 2)
                                                               for r in repeats]}
    result = {"meta": collect_meta(command="python " + " ".join(sys.argv), threads=args.threads,
                                   target=t.name, native_args=natives,
                                   extra_buffers={k: m.extra_buffers for k, m in variants.items()},
                                   environment={k: v for k, v in os.environ.items()
                                                               if k.startswith(("OMP_", "GGML_"))}),
              "repeats": repeats, "summary": summary}
    text = json.dumps(result, indent=2, default=str)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    for k, v in summary.items():
        tail = f"; tok/s {v['tok_s']} vs {v['llama_bench_tok_s']}" if "tok_s" in v else ""
        print(f"{k:40s} {v['median_ratio']:.3f}x native (range {v['min_ratio']:.3f}-{v['max_ratio']:.3f}){tail}")


if __name__ == "__main__":
    main()
