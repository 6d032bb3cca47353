"""Flash attention under the batch-invariant mode: does it pay, and can it stay exact?

llama-bench's default (`-fa auto`, i.e. on for the CPU) decodes ~10 % faster than
verispec, whose batch-invariant mode keeps flash attention off: llama.cpp's CPU
flash attention scores a single query over >= 512 KV cells by splitting the KV
across threads and merging partial softmaxes, while a forward of 2..63 queries
scores each row in one pass, so one-token decode steps and verification rows
would differ. A forward of >= 2 rows never takes the split path. This script
measures, interleaved, on verispec's llama.cpp library (no extra buffer types):

    off      flash attention off, one-token decode steps (verispec today)
    on       flash attention on, one-token decode steps (llama-bench's default)
    on-pad2  flash attention on, every decode step padded with a filler row
             (its cache cell removed after), so no forward is ever one row

prefill (511 tokens), decode of 128 tokens from a short prompt, and decode of 64
tokens after the 511-token prompt (KV >= 512: the split path for `on`). It also
checks each configuration's exactness: a 5-token forward after 505 tokens of context
(512 KV cells) against 5 single steps (padded for on-pad2), bit for bit.

    flock /tmp/verispec-heavy.lock flock /tmp/verispec-quiet.lock \
        .venv/bin/python benchmarks/llamacpp-native/fa_probe.py --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
from llama_cpp import Llama

from verispec import registry
from verispec.models.llamacpp import _model_params

CODE = ("Write a complete Python module implementing a red-black tree with insert, delete, search, "
        "in-order traversal and validation methods, each with a docstring and type hints.")


class Ctx:
    def __init__(self, path: str, fa: bool, pad: bool, threads: int):
        with _model_params(use_extra_bufts=False):
            self.llama = Llama(model_path=path, n_ctx=4096, n_batch=512, n_threads=threads,
                               n_threads_batch=threads, logits_all=False, verbose=False, flash_attn=fa)
        self.ctx, self.batch, self.vocab, self.pad = self.llama._ctx, self.llama._batch, self.llama.n_vocab(), pad

    def feed(self, ids: list[int], pos: int, keep: int = 1) -> np.ndarray:
        rows = list(ids)
        padded = self.pad and len(rows) == 1
        if padded:
            rows.append(rows[0])
        b = self.batch.batch
        b.n_tokens = len(rows)
        for i, tok in enumerate(rows):
            b.token[i], b.pos[i], b.n_seq_id[i] = tok, pos + i, 1
            b.logits[i] = len(ids) - keep <= i < len(ids)
            b.seq_id[i][0] = 0
        self.ctx.decode(self.batch)
        out = np.ctypeslib.as_array(self.ctx.get_logits(), shape=(keep, self.vocab)).copy()
        if padded:
            self.ctx.kv_cache_seq_rm(0, pos + 1, -1)
        return out

    def reset(self):
        self.ctx.kv_cache_seq_rm(0, 0, -1)

    def speeds(self, long_ids, short_ids):
        self.reset()
        t = time.perf_counter()
        self.feed(long_ids[:-1], 0)
        prefill = (len(long_ids) - 1) / (time.perf_counter() - t)
        tok, pos = long_ids[-1], len(long_ids) - 1
        t = time.perf_counter()
        for _ in range(64):
            tok = int(np.argmax(self.feed([tok], pos)[0]))
            pos += 1
        long_decode = 64 / (time.perf_counter() - t)
        self.reset()
        self.feed(short_ids[:-1], 0)
        tok, pos = short_ids[-1], len(short_ids) - 1
        t = time.perf_counter()
        for _ in range(128):
            tok = int(np.argmax(self.feed([tok], pos)[0]))
            pos += 1
        decode = 128 / (time.perf_counter() - t)
        self.reset()
        return {"prefill": prefill, "decode": decode, "decode_after_511": long_decode}

    def invariant(self, ids: list[int], n: int = 5) -> float:
        """Max |logit difference| between an n-row forward and n padded single steps."""
        ctx_len = len(ids) - n
        self.reset()
        self.feed(ids[:ctx_len], 0)
        single = np.concatenate([self.feed([t], ctx_len + i) for i, t in enumerate(ids[ctx_len:])])
        self.ctx.kv_cache_seq_rm(0, ctx_len, -1)
        batch = self.feed(ids[ctx_len:], ctx_len, keep=n)
        self.reset()
        return float(np.abs(single - batch).max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=registry.DEFAULT_TARGET)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    t = registry.resolve(args.target, weights=False)
    configs = {"off": Ctx(str(t.gguf_path), False, False, args.threads),
               "on": Ctx(str(t.gguf_path), True, False, args.threads),
               "on-pad2": Ctx(str(t.gguf_path), True, True, args.threads)}
    tok = configs["off"].llama
    short_ids = tok.tokenize(CODE.encode())
    filler = tok.tokenize(("def f(x):\n    return x + 1\n" * 200).encode(), add_bos=False)
    long_ids = (short_ids + filler)[:512]
    checks = {name: c.invariant((short_ids + filler)[:510]) for name, c in configs.items()}
    print("max |batch - single| after 505 tokens (512 KV cells), 5 rows:", checks, flush=True)
    for c in configs.values():
        c.speeds(long_ids[:64], short_ids[:8])
    rows = []
    for i in range(args.repeats):
        order = list(configs) if i % 2 == 0 else list(reversed(configs))
        row = {name: configs[name].speeds(long_ids, short_ids) for name in order}
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary = {f"{name} {what}": statistics.median(r[name][what] / r["off"][what] for r in rows)
               for name in configs for what in rows[0]["off"]}
    for k, v in summary.items():
        print(f"{k:30s} {v:.3f}x off")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"invariance": checks, "repeats": rows, "ratio_to_off": summary}, f, indent=2)


if __name__ == "__main__":
    main()
