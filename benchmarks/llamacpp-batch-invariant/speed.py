"""Price of the batch-invariant mode: plain decode and prefill tokens/s, with and without it.

Each configuration runs in a child process (the llama.cpp library is chosen by
LLAMA_CPP_LIB_PATH, GGML_CPU_TILED_MM is read once per process); rounds
interleave the configurations so that a change of machine load hits all of them,
and ratios are taken within a round. Plain decoding = one token per
`llama_decode`, greedy; prefill = one `--prompt-tokens` forward (logits of the
last row only), as verispec does them.

    python benchmarks/llamacpp-batch-invariant/speed.py --rounds 3 \\
        --config without=<stock lib dir>:extra=0:tiled=1 \\
        --config with=~/.cache/verispec/build/nollamafile/bin:invariant \\
        --out benchmarks/llamacpp-batch-invariant/speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

TEXT = ("Speculative decoding drafts several tokens cheaply and verifies them with one forward of the "
        "target model; the output is distributed exactly as the target's own. ") * 80


def child(model_path: str, mode: str, prompt_tokens: int, decode_tokens: int, repeats: int) -> dict:
    import torch
    from llama_cpp import Llama

    from verispec.models.llamacpp import LlamaCppModel, _model_params

    if mode == "invariant":
        model = LlamaCppModel.load(model_path, batch_invariant=True)
    else:
        extra = dict(kv.split("=") for kv in mode.split(","))
        with _model_params(use_extra_bufts=extra["extra"] == "1"):
            llama = Llama(model_path=model_path, n_ctx=8192, n_batch=512, n_threads=os.cpu_count(),
                          n_threads_batch=os.cpu_count(), logits_all=False, verbose=False)
        model = LlamaCppModel(llama, None, name=os.path.basename(model_path))
    ids = model.llama.tokenize(TEXT.encode())[:prompt_tokens]
    assert len(ids) == prompt_tokens
    model.reset()
    model.forward(ids[:32], keep=1)          # warm-up
    model.forward([ids[32]])
    prefill, decode = [], []
    for _ in range(repeats):
        model.reset()
        start = time.perf_counter()
        logits = model.forward(ids, keep=1)
        prefill.append(prompt_tokens / (time.perf_counter() - start))
        token = int(torch.argmax(logits[-1]))
        start = time.perf_counter()
        for _ in range(decode_tokens):
            token = int(torch.argmax(model.forward([token])[-1]))
        decode.append(decode_tokens / (time.perf_counter() - start))
    return {"prefill_tps": statistics.median(prefill), "decode_tps": statistics.median(decode),
            "batch_invariant": model.batch_invariant, "loadavg": os.getloadavg()[0]}


def write_report(json_path: str, md_path: str, header: str) -> None:
    """Markdown: per configuration, median tokens/s over rounds and the median within-round ratio to the first."""
    data = json.load(open(json_path))
    names = list(data["configs"])
    base = names[0]
    lines = [header, "", f"| configuration | library, mode | plain decode tok/s | ratio to {base} | "
             f"prefill tok/s ({data['prompt_tokens']} tokens) | ratio to {base} |", "|---|---|---|---|---|---|"]
    for name in names:
        ok = [r for r in data["rounds"] if "error" not in r[name] and "error" not in r[base]]
        if not ok:
            lines.append(f"| {name} | {' '.join(data['configs'][name])} | failed | | | |")
            continue
        cells = []
        for key in ("decode_tps", "prefill_tps"):
            cells.append(f"{statistics.median(r[name][key] for r in ok):.2f}")
            cells.append(f"{statistics.median(r[name][key] / r[base][key] for r in ok):.3f}")
        lib, mode = data["configs"][name]
        lines.append(f"| {name} | `{lib.replace(os.path.expanduser('~'), '~')}`, {mode} | " + " | ".join(cells) + " |")
    loads = [r[n]["loadavg"] for r in data["rounds"] for n in names if "loadavg" in r[n]]
    lines += ["", f"{len(data['rounds'])} rounds (configurations interleaved, order reversed every other "
              f"round); load average seen by the children: {min(loads):.1f}-{max(loads):.1f}."]
    with open(md_path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", action="append", default=[],
                    help="NAME=LIBDIR:MODE, MODE 'invariant' or 'extra=0|1,tiled=0|1'")
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/verispec/gguf/qwen2.5-coder-1.5b.gguf"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2, help="prefill+decode repeats per child (median)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--report", metavar="JSON", help="only write the markdown table of a finished run (to --out)")
    ap.add_argument("--header", default="", help="text put above the table by --report (command, machine, ...)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.report:
        write_report(args.report, args.out, args.header)
        return
    if args.child:
        print(json.dumps(child(args.model, args.child[1], args.prompt_tokens, args.decode_tokens, args.repeats)))
        return
    if not args.config:
        ap.error("give at least one --config NAME=LIBDIR:MODE")
    configs = {}
    for item in args.config:
        name, rest = item.split("=", 1)
        lib, mode = rest.rsplit(":", 1)
        configs[name] = (os.path.expanduser(lib), mode)
    rounds = []
    for r in range(args.rounds):
        names = list(configs) if r % 2 == 0 else list(reversed(configs))
        row = {}
        for name in names:
            lib, mode = configs[name]
            env = {**os.environ, "LLAMA_CPP_LIB_PATH": lib}
            if mode != "invariant":
                env["GGML_CPU_TILED_MM"] = dict(kv.split("=") for kv in mode.split(","))["tiled"]
            proc = subprocess.run([sys.executable, __file__, "--out", "-", "--model", args.model,
                                   "--prompt-tokens", str(args.prompt_tokens), "--decode-tokens",
                                   str(args.decode_tokens), "--repeats", str(args.repeats), "--child", name, mode],
                                  env=env, capture_output=True, text=True)
            row[name] = (json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0
                         else {"error": f"exit {proc.returncode}", "stderr": proc.stderr[-400:]})
            print(r, name, row[name], flush=True)
        rounds.append(row)
    with open(args.out, "w") as f:
        json.dump({"model": args.model, "prompt_tokens": args.prompt_tokens, "decode_tokens": args.decode_tokens,
                   "configs": {k: list(v) for k, v in configs.items()}, "rounds": rounds}, f, indent=1)


if __name__ == "__main__":
    main()
