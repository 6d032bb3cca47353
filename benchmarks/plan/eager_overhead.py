"""Measure the host-side cost of a transformers (PyTorch eager) forward: per forward and per layer.

A GPU running a model in eager PyTorch at batch 1 waits on its host: every layer is
a few dozen operator dispatches and kernel launches, issued by Python one by one. That
cost does not depend on the model's width, so it can be measured on any CPU with a
model too narrow to compute anything: random Llama layers of hidden size 64
(`LlamaConfig`, no download), L = 1, 2, 4, 8, 16 layers, one new token after a
200-token cache, through verispec's `HFModel` (the same forward `analyze` times).
A least-squares line T(L) = per_forward + per_layer · L through the fastest of the
rounds at each L gives the planner's "eager" stack (`verispec/plan/stacks.py`).

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", default="1,2,4,8,16")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--arch", default="llama", choices=["llama", "qwen2"])
    args = ap.parse_args()

    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    from verispec.models.hf import HFModel
    from verispec.timing import time_forwards

    torch.set_num_threads(1)   # the host thread that would drive a GPU
    torch.manual_seed(0)
    layer_counts = [int(x) for x in args.layers.split(",")]
    cfg_cls = LlamaConfig if args.arch == "llama" else Qwen2Config
    models = {}
    for L in layer_counts:
        cfg = cfg_cls(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=L,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
        model = HFModel(AutoModelForCausalLM.from_config(cfg), None, name=f"{args.arch}-64x{L}")
        model.forward(list(range(1, 201)), keep=1)
        models[L] = model
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    samples = {L: [] for L in layer_counts}
    for r in range(args.rounds + 2):
        for L, model in models.items():
            s = time_forwards(model, [[7]], repeats=1, warmup=0)[0][0]
            if r >= 2:
                samples[L].append(s)
    med = {L: statistics.median(s) for L, s in samples.items()}
    best = {L: min(s) for L, s in samples.items()}
    # other processes only ever slow a forward down: the fastest of many rounds is the
    # unloaded cost; the median fit is recorded beside it to show how much load added
    slope, intercept = np.polyfit(layer_counts, [best[L] for L in layer_counts], 1)
    slope_med, intercept_med = np.polyfit(layer_counts, [med[L] for L in layer_counts], 1)
    out = {
        "command": " ".join(["python"] + sys.argv),
        "machine": platform.processor() or platform.machine(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
        "uptime_before": uptime,
        "uptime_after": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "arch": args.arch, "threads": 1,
        "median_seconds": {str(L): v for L, v in med.items()},
        "min_seconds": {str(L): v for L, v in best.items()},
        "median_fit": {"per_forward_s": float(intercept_med), "per_layer_s": float(slope_med)},
        "samples": {str(L): v for L, v in samples.items()},
        "per_forward_s": float(intercept), "per_layer_s": float(slope),
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"per forward {intercept * 1e3:.3f} ms, per layer {slope * 1e3:.3f} ms (median fit: "
          f"{intercept_med * 1e3:.3f} ms, {slope_med * 1e3:.3f} ms)  ({uptime})")


if __name__ == "__main__":
    main()
