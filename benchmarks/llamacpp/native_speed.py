"""Plain decoding speed: verispec `--k 0` against native `llama-bench`, interleaved in one run.

Each repeat runs, in turn: `llama-bench -p 512 -n 128 -t T --repack 0` (native prefill of a
512-token prompt and decode of 128 tokens), then verispec in this process with its default
settings (no environment variables; batch-invariant mode as shipped, which loads without
extra buffer types, i.e. without repacking):

    prefill  a 512-token prompt (511 tokens prefilled, the last one is fed by the first
             round, as in every generation): 511 / Stats.prefill_seconds
    decode   128 new tokens, greedy, k = 0, from a short prompt (llama-bench's tg128 starts
             from an empty context): new_tokens / (wall - prefill)

`--repack 0` (`--native-args`): on the VM this was measured on, llama.cpp's default extra
buffer types use AMX tiles, which its kernel does not grant (SIGILL in `tilezero`), so the
native tools cannot run with their defaults there; without repacking they run the same
weights layout verispec does. The figures are tokens per second; the ratios are verispec / llama-bench of the same
repeat, reported as median and range over repeats. Run it under the project's lock:

    flock /tmp/verispec-heavy.lock .venv/bin/python benchmarks/llamacpp/native_speed.py \
        --repeats 3 --out benchmarks/llamacpp-native/speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from verispec import registry
from verispec.api import SpeculativeDecoder
from verispec.bench import collect_meta
from verispec.models.llamacpp import LlamaCppModel

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


def verispec_speeds(decoder: SpeculativeDecoder, long_ids: list[int], short_ids: list[int]) -> dict:
    """verispec's prefill and k = 0 decode tokens/s (caches emptied first)."""
    decoder.target.reset()
    r = decoder.generate(long_ids, max_new_tokens=1, k=0)
    prefill = (len(long_ids) - 1) / r.stats.prefill_seconds
    decoder.target.reset()
    r = decoder.generate(short_ids, max_new_tokens=128, k=0)
    s = r.stats
    return {"prefill": prefill, "decode": s.new_tokens / (s.wall_seconds - s.prefill_seconds),
            "decode_tokens": s.new_tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=registry.DEFAULT_TARGET)
    ap.add_argument("--bin-dir", default=str(BUILD / "bin"))
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--bench-reps", type=int, default=2, help="llama-bench -r per repeat")
    ap.add_argument("--native-args", default="--repack 0", help="more llama-bench arguments")
    ap.add_argument("--out", default=None, help="write the figures here as JSON")
    args = ap.parse_args()

    t = registry.resolve(args.target, weights=False)
    variants = {"verispec": LlamaCppModel.load(str(t.gguf_path), tokenizer_path=t.hf_path, name=t.name)}
    decoders = {k: SpeculativeDecoder(m, None, drafter="none") for k, m in variants.items()}
    any_decoder = decoders["verispec"]
    short_ids = any_decoder.encode(CODE)
    filler = any_decoder.target.tokenizer(("def f(x):\n    return x + 1\n" * 200))["input_ids"]
    long_ids = (short_ids + filler)[:512]
    assert len(long_ids) == 512
    for d in decoders.values():          # warm-up
        verispec_speeds(d, long_ids[:64], short_ids)

    repeats = []
    for i in range(args.repeats):
        row = {"llama-bench": llama_bench(Path(args.bin_dir) / "llama-bench", str(t.gguf_path),
                                          args.threads, args.bench_reps, args.native_args.split())}
        for name, d in decoders.items():
            row[name] = verispec_speeds(d, long_ids, short_ids)
        repeats.append(row)
        print(json.dumps(row), file=sys.stderr)

    summary = {}
    for name in decoders:
        for what in ("prefill", "decode"):
            ratios = [r[name][what] / r["llama-bench"][what] for r in repeats]
            summary[f"{name} {what}"] = {"median_ratio": statistics.median(ratios),
                                         "min_ratio": min(ratios), "max_ratio": max(ratios),
                                         "tok_s": [round(r[name][what], 2) for r in repeats],
                                         "llama_bench_tok_s": [round(r["llama-bench"][what], 2)
                                                               for r in repeats]}
    result = {"meta": collect_meta(command="python " + " ".join(sys.argv), threads=args.threads,
                                   target=t.name, environment={k: v for k, v in os.environ.items()
                                                               if k.startswith(("OMP_", "GGML_"))}),
              "repeats": repeats, "summary": summary}
    text = json.dumps(result, indent=2, default=str)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    for k, v in summary.items():
        print(f"{k:40s} {v['median_ratio']:.3f}x native (range {v['min_ratio']:.3f}-{v['max_ratio']:.3f}); "
              f"tok/s {v['tok_s']} vs {v['llama_bench_tok_s']}")


if __name__ == "__main__":
    main()
