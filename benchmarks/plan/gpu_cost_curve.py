"""Time the default pair's cost curve on a GPU and print it beside `verispec plan`'s prediction.

No weights are downloaded: the models are built from the sizes in the default pair's
config.json (Qwen2.5-Coder-1.5B-Instruct target, Qwen2.5-Coder-0.5B-Instruct draft;
embedded below) with random weights - a forward's time does not depend on the weight
values. transformers, bfloat16, eager PyTorch, batch 1, through verispec's own `HFModel`
and `verispec.timing.time_forwards` (the code `verispec analyze` times with): the cache
holds a 200-token context, a forward scores n = 1..16 new tokens (all n rows of logits
kept, as verification does), the cache is rolled back after each, repeats interleaved
over n, median kept. T_d is one 1-token draft forward on the same context.

The prediction is `verispec.plan` for the same shapes on the detected GPU (catalogue
name from `torch.cuda.get_device_name`, or --hardware) with the `eager` stack; on a CPU
(`--device cpu`, a smoke run) it is `--hardware local` with `eager-cpu`.

Usage:
    python benchmarks/plan/gpu_cost_curve.py                       # any NVIDIA GPU
    python benchmarks/plan/gpu_cost_curve.py --hardware "H100 SXM5" --out gpu.json
    python benchmarks/plan/gpu_cost_curve.py --device cpu --max-layers 2 --n-max 4   # smoke test
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

# From the models' published config.json (Qwen/Qwen2.5-Coder-{1.5B,0.5B}-Instruct): only the sizes matter.
TARGET_CONFIG = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                     num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                     max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6)
DRAFT_CONFIG = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                    num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                    max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6)

# torch.cuda.get_device_name() substrings → catalogue names (verispec/plan/hardware.csv)
GPU_NAMES = [("H200", "H200 SXM"), ("H100 PCIe", "H100 PCIe"), ("H100", "H100 SXM5"),
             ("A100-SXM4-40GB", "A100 40GB SXM4"), ("A100-PCIE", "A100 80GB PCIe"), ("A100", "A100 80GB SXM4"),
             ("L40S", "L40S"), ("RTX 4090", "RTX 4090"), ("RTX 3090", "RTX 3090"), ("L4", "L4"), ("A10", "A10"),
             ("V100", "V100 SXM"), ("T4", "T4")]


def catalogue_name(device_name: str) -> str | None:
    return next((cat for key, cat in GPU_NAMES if key.lower() in device_name.lower()), None)


def build(config: dict, device: str, dtype, max_layers: int | None):
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from verispec.models.hf import HFModel

    cfg = dict(config)
    if max_layers:
        cfg["num_hidden_layers"] = min(cfg["num_hidden_layers"], max_layers)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(Qwen2Config(**cfg), dtype=dtype)
    return HFModel(model, None, name=f"qwen2-{cfg['hidden_size']}x{cfg['num_hidden_layers']}"), cfg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (smoke run)")
    ap.add_argument("--hardware", default=None, help="catalogue name for the prediction (default: detected)")
    ap.add_argument("--n-max", type=int, default=16)
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--max-layers", type=int, default=None, help="keep only N layers per model (smoke runs)")
    ap.add_argument("--out", default=None, help="write the measurements and predictions as JSON")
    args = ap.parse_args()

    import torch
    import transformers

    from verispec.plan import parse_hardware, plan, shape_from_config
    from verispec.timing import time_forwards

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: run on an NVIDIA GPU, or pass --device cpu for a smoke run")
    on_gpu = args.device == "cuda"
    dtype = torch.bfloat16 if on_gpu else torch.float32
    device_name = torch.cuda.get_device_name() if on_gpu else "cpu"
    hw_name = args.hardware or (catalogue_name(device_name) if on_gpu else "local")
    if hw_name is None:
        sys.exit(f"{device_name!r} is not in the catalogue: pass --hardware NAME or a spec 'bw=...,flops=...'")
    hardware = parse_hardware(hw_name)

    target, t_cfg = build(TARGET_CONFIG, args.device, dtype, args.max_layers)
    draft, d_cfg = build(DRAFT_CONFIG, args.device, dtype, args.max_layers)
    ids = [(1000 + 37 * i) % 30000 for i in range(args.context + args.n_max)]
    for model in (target, draft):
        model.forward(ids[:args.context], keep=1)
    batches = [ids[args.context:args.context + n] for n in range(1, args.n_max + 1)]
    samples = time_forwards(target, batches, repeats=args.repeats, warmup=3)
    d_samples = time_forwards(draft, [batches[0]], keep_all=False, repeats=args.repeats, warmup=3)[0]
    measured = [statistics.median(s) for s in samples]
    t_d = statistics.median(d_samples)

    label = "bf16" if on_gpu else "float32"
    t_shape = shape_from_config({**t_cfg, "model_type": "qwen2", "dtype": label}, name="qwen2.5-coder-1.5b (random)")
    d_shape = shape_from_config({**d_cfg, "model_type": "qwen2", "dtype": label}, name="qwen2.5-coder-0.5b (random)")
    p = plan(t_shape, d_shape, hardware, alpha=0.7, k_max=args.n_max - 1, context=args.context,
             stack="eager" if on_gpu else "eager-cpu")

    print(f"# {device_name} · prediction: `verispec plan` on {hardware.label}, stack {p.stack.name}")
    print(f"# torch {torch.__version__}, transformers {transformers.__version__}, {label}, context {args.context}, "
          f"median of {args.repeats}")
    print(f"{'n':>3} {'measured ms':>12} {'ratio':>7} {'predicted ms':>13} {'ratio':>7} {'ratio error':>12}")
    for n in range(1, args.n_max + 1):
        m, q = measured[n - 1], p.target_times[n - 1]
        mr, qr = m / measured[0], q / p.target_times[0]
        print(f"{n:>3} {m * 1e3:>12.3f} {mr:>7.3f} {q * 1e3:>13.3f} {qr:>7.3f} {100 * (qr / mr - 1):>+11.1f}%")
    print(f"T_d {t_d * 1e3:>12.3f} c={t_d / measured[0]:.3f} {p.draft_time * 1e3:>10.3f} c={p.c:.3f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": " ".join(["python"] + sys.argv), "device": device_name, "hardware": hardware.label,
                       "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                                    "python": platform.python_version()},
                       "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "dtype": label, "context": args.context,
                       "measured_target_s": measured, "measured_draft_s": t_d, "target_samples": samples,
                       "draft_samples": d_samples, "plan": p.as_dict()}, f, indent=1)


if __name__ == "__main__":
    main()
