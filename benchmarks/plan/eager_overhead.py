"""Measure the host-side cost of Hugging Face transformers decoding: per token and per layer.

A GPU running a model in eager PyTorch at batch 1 waits on its host: every layer is a
few dozen operator dispatches, issued by Python one by one, and every generated token
adds `generate()`'s own glue (input preparation, logits processors, stopping criteria,
cache bookkeeping). That cost does not depend on the model's width, so it can be
measured on a CPU with a model too narrow to compute anything: random Llama layers of
hidden size 64 (`LlamaConfig`, no download), L = 1, 2, 4, 8, 16 layers, one host thread.

Two measurements per L, in interleaved rounds:
* `generate`: seconds per new token of greedy `model.generate()` after a 200-token
  prompt, (t(33 tokens) − t(1 token)) / 32 - prefill excluded. This is the planner's
  "eager" stack (HF `generate`, as Spec-Bench and most GPU users run it);
* `forward`: one bare forward through verispec's `HFModel` on a 200-token cache.

Times are the host thread's CPU seconds (`time.thread_time`; with one torch thread all
the work runs on it), so other processes' load on this shared VM does not stretch them
(wall-clock runs minutes apart gave 0.28 to 1.6 ms per layer; thread-time runs agree
within a few %). A least-squares line T(L) = per_forward + per_layer · L through the
median at each L is the result; the fit through the fastest rounds is recorded beside
it. Not measured here (no GPU): CUDA kernel-launch latency, which adds to the host time
on a real GPU.

Usage:
    PYTHONPATH=$PWD .venv/bin/python benchmarks/plan/eager_overhead.py --out benchmarks/plan/eager_overhead.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def line(xs, ys) -> tuple[float, float]:
    import numpy as np

    slope, intercept = np.polyfit(xs, ys, 1)
    return float(intercept), float(slope)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", default="1,2,4,8,16")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--new-tokens", type=int, default=32)
    args = ap.parse_args()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig

    from verispec.models.hf import HFModel
    from verispec.timing import time_forwards

    torch.set_num_threads(1)   # the host thread that would drive a GPU
    torch.manual_seed(0)
    layer_counts = [int(x) for x in args.layers.split(",")]
    prompt = torch.tensor([list(range(1, 201))])
    models, wrapped = {}, {}
    for L in layer_counts:
        cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=L,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                          eos_token_id=None, bos_token_id=None, pad_token_id=0)
        model = AutoModelForCausalLM.from_config(cfg).eval()
        models[L] = model
        wrapped[L] = HFModel(model, None, name=f"llama-64x{L}")
        wrapped[L].forward(prompt[0].tolist(), keep=1)

    def gen_seconds(model, n: int) -> float:
        config = GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        start = time.thread_time()
        with torch.inference_mode():
            model.generate(prompt, generation_config=config)
        return time.thread_time() - start

    before = uptime()
    per_token = {L: [] for L in layer_counts}
    forward = {L: [] for L in layer_counts}
    for r in range(args.rounds + 2):
        for L in layer_counts:
            long, short = gen_seconds(models[L], args.new_tokens + 1), gen_seconds(models[L], 1)
            fwd = time_forwards(wrapped[L], [[7]], repeats=1, warmup=0, clock=time.thread_time)[0][0]
            if r >= 2:
                per_token[L].append((long - short) / args.new_tokens)
                forward[L].append(fwd)
    result = {
        "command": " ".join(["python"] + sys.argv),
        "machine": platform.processor() or platform.machine(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
        "uptime_before": before, "uptime_after": uptime(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "threads": 1, "clock": "time.thread_time", "layers": layer_counts,
    }
    for name, samples in (("generate", per_token), ("forward", forward)):
        best = [min(samples[L]) for L in layer_counts]
        med = [statistics.median(samples[L]) for L in layer_counts]
        f0, fl = line(layer_counts, best)
        m0, ml = line(layer_counts, med)
        result[name] = {"min_seconds": best, "median_seconds": med, "samples": [samples[L] for L in layer_counts],
                        "per_forward_s": m0, "per_layer_s": ml,
                        "min_fit": {"per_forward_s": f0, "per_layer_s": fl}}
        print(f"{name:>8}: per token {m0 * 1e3:.3f} ms + {ml * 1e3:.3f} ms per layer "
              f"(fit through the fastest rounds: {f0 * 1e3:.3f} + {fl * 1e3:.3f})")
    print(f"load: {before} → {result['uptime_after']}")
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
