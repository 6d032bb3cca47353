"""Which llama.cpp kernels make a batch of n tokens score differently from n single tokens.

For each configuration (a llama.cpp library x runtime switches) and model, a
child process prefills `--context` tokens, scores the next 9 tokens one at a
time, then (after rolling the cache back) as one batch of n for several n, and
reports the largest absolute logit difference of the batch rows against the
single-token rows, and how many rows change their argmax. Each configuration
runs in its own process: the library is chosen by LLAMA_CPP_LIB_PATH, and
GGML_CPU_TILED_MM is read once per process. A crash (the AMX kernels fault on
some virtual machines) is reported as such.

    python benchmarks/llamacpp-batch-invariant/logit_gap.py \\
        --lib stock=<site-packages>/llama_cpp/lib --lib nollamafile=~/.cache/verispec/build/nollamafile/bin \\
        --out benchmarks/llamacpp-batch-invariant/logit_gap.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROWS = (2, 4, 5, 8, 9)
TEXT = ("def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
        "    return a\n\nprint([fibonacci(i) for i in range(10)])\n") * 60


def child(model: str, context: int, extra_bufts: bool, flash_attn: bool) -> dict:
    import numpy as np
    from llama_cpp import Llama

    from verispec.models.llamacpp import _model_params

    with _model_params(use_extra_bufts=extra_bufts):
        llm = Llama(model_path=model, n_ctx=2048, n_batch=512, n_threads=2, n_threads_batch=2,
                    logits_all=False, verbose=False, flash_attn=flash_attn)
    vocab = llm.n_vocab()
    ids = llm.tokenize(TEXT.encode())
    prompt, cont = ids[:context], ids[context:context + max(ROWS)]

    def decode(tokens, pos0, all_logits=True):
        b = llm._batch.batch
        b.n_tokens = len(tokens)
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i] = t, pos0 + i, 1
            b.seq_id[i][0] = 0
            b.logits[i] = all_logits or i == len(tokens) - 1
        llm._ctx.decode(llm._batch)
        rows = len(tokens) if all_logits else 1
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(rows, vocab)).copy()

    def prefill():
        llm._ctx.kv_cache_seq_rm(0, 0, -1)
        for start in range(0, len(prompt), 256):
            decode(prompt[start:start + 256], start, all_logits=False)

    prefill()
    single = np.concatenate([decode([t], context + i) for i, t in enumerate(cont)])
    gaps = {}
    for n in ROWS:
        prefill()
        batch = decode(cont[:n], context)
        gaps[n] = [float(np.abs(batch - single[:n]).max()),
                   int((batch.argmax(1) != single[:n].argmax(1)).sum())]
    return gaps


CONFIGS = [  # (label, library key, use_extra_bufts, GGML_CPU_TILED_MM, flash_attn)
    ("llama.cpp defaults (AMX/repack weights, tiled, sgemm)", "stock", True, "1", False),
    ("use_extra_bufts=False", "stock", False, "1", False),
    ("use_extra_bufts=False, GGML_CPU_TILED_MM=0", "stock", False, "0", False),
    ("use_extra_bufts=False, GGML_CPU_TILED_MM=0, flash_attn=True", "stock", False, "0", True),
    ("GGML_LLAMAFILE=OFF build, use_extra_bufts=False (the batch-invariant mode's kernels; it scores "
     "verification forwards in pieces of <= 7 tokens)", "nollamafile", False, "1", False),
    ("GGML_LLAMAFILE=OFF build, use_extra_bufts=False, GGML_CPU_TILED_MM=0", "nollamafile", False, "0", False),
    ("GGML_LLAMAFILE=OFF, AMX compiled out (repack weights), GGML_CPU_TILED_MM=0", "noamx", True, "0", False),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", action="append", default=[], help="KEY=DIR of a llama.cpp build (stock, nollamafile, noamx)")
    ap.add_argument("--model", action="append", default=[], help="GGUF path (repeatable)")
    ap.add_argument("--context", type=int, action="append", default=[], help="context tokens before the scored ones")
    ap.add_argument("--out", required=True)
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        model, context, extra, fa = args.child
        print(json.dumps(child(model, int(context), extra == "1", fa == "1")))
        return
    libs = dict(item.split("=", 1) for item in args.lib)
    models = args.model or [os.path.expanduser(f"~/.cache/verispec/gguf/{m}.gguf")
                            for m in ("smollm2-135m", "qwen2.5-coder-1.5b")]
    contexts = args.context or [100, 600]
    lines = []
    for label, key, extra, tiled, fa in CONFIGS:
        if key not in libs:
            continue
        for model in models:
            for context in contexts:
                env = {**os.environ, "LLAMA_CPP_LIB_PATH": os.path.expanduser(libs[key]), "GGML_CPU_TILED_MM": tiled}
                proc = subprocess.run([sys.executable, __file__, "--out", "-", "--child", model, str(context),
                                       "1" if extra else "0", "1" if fa else "0"],
                                      env=env, capture_output=True, text=True)
                if proc.returncode == 0:
                    gaps = json.loads(proc.stdout.strip().splitlines()[-1])
                    cells = [f"{gaps[str(n)][0]:.3g}" + (f" ({gaps[str(n)][1]} flip)" if gaps[str(n)][1] else "")
                             for n in ROWS]
                else:
                    cells = [f"crash (exit {proc.returncode})"] + [""] * (len(ROWS) - 1)
                row = f"| {label} | {os.path.basename(model)} | {context} | " + " | ".join(cells) + " |"
                print(row, flush=True)
                lines.append(row)
    header = ["| configuration | model | context | " + " | ".join(f"n = {n}" for n in ROWS) + " |",
              "|---|---|---|" + "---|" * len(ROWS)]
    with open(args.out, "w") as f:
        f.write("\n".join(header + lines) + "\n")


if __name__ == "__main__":
    main()
