"""Measure T(n), n = 1..N, for the registered models on this machine, both backends.

The planner's CPU validation (benchmarks/plan/validate_cpu.py) fits its per-forward
overhead and efficiencies on SmolLM2-135M and Qwen2.5-Coder-0.5B and predicts the
1.5B target's curve; this script produces the measurements it reads.

Timing is single-threaded by default and counts the timing thread's CPU seconds
(`time.thread_time`): with one thread, llama.cpp and torch compute on the calling thread,
so the clock measures the forward's own work, which the 2-10x load other helpers put on
this shared 2-core VM does not stretch (wall-clock timings under that load swung by 10x).
The machine's ceilings (read bandwidth, matmul FLOP/s) are measured the same way, before
and after each backend.

All models of one backend are loaded together and timed in interleaved rounds
(round r times every n of every model once, via `verispec.timing.time_forwards`), so
a burst of load from other processes on this shared machine hits every point alike.
Each model's cache first holds a `--prefix` token context (the `verispec analyze`
default, 200), rolled back after every timed forward.

Usage:
    PYTHONPATH=$PWD .venv/bin/python benchmarks/plan/cpu_cost_curves.py \
        --out benchmarks/plan/cpu_cost_curves.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return "unknown"


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def no_llamacpp_repack() -> None:
    """Load GGUF weights without llama.cpp's extra buffer types (weight repacking).

    The venv's llama.cpp is built with -march=native; on this VM its repacked (AMX)
    matmul path dies with a general-protection fault on any forward over n > 1
    tokens (dmesg: "general protection fault ... in libggml-cpu.so"). Plain
    buffers avoid that path; every model here is timed the same way.
    """
    import llama_cpp
    import llama_cpp.llama as llama_module

    default = llama_cpp.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    llama_module.llama_cpp.llama_model_default_params = params


def measure_backend(backend: str, models: list[str], n_max: int, prefix: int, rounds: int,
                    warmup: int, threads: int, clock) -> dict:
    from verispec.api import load_model
    from verispec.timing import time_forwards

    if backend == "llamacpp":
        from verispec.models.llamacpp import LlamaCppModel
        from verispec.registry import gguf_path, hf_dir

        loaded = {name: LlamaCppModel.load(str(gguf_path(name)), tokenizer_path=str(hf_dir(name)), name=name,
                                           n_threads=threads) for name in models}
    else:
        import torch

        torch.set_num_threads(threads)
        loaded = {name: load_model(name, backend=backend, fetch_missing=False) for name in models}
    batches = {}
    for name, model in loaded.items():
        vocab = min(model.vocab_size, 30000)
        ids = [(1000 + 37 * i) % vocab for i in range(prefix + n_max)]
        model.truncate(0)
        model.forward(ids[:prefix], keep=1)
        batches[name] = [ids[prefix:prefix + n] for n in range(1, n_max + 1)]
    samples = {name: [[] for _ in range(n_max)] for name in models}
    load_before = uptime()
    start = time.time()
    for r in range(warmup + rounds):
        for name, model in loaded.items():
            one = time_forwards(model, batches[name], repeats=1, warmup=0, clock=clock)
            if r >= warmup:
                for j, s in enumerate(one):
                    samples[name][j].extend(s)
    out = {
        "backend": backend,
        "threads": threads,
        "uptime_before": load_before,
        "uptime_after": uptime(),
        "seconds": time.time() - start,
        "models": {
            name: {"samples": samples[name],
                   "median": [statistics.median(s) for s in samples[name]]}
            for name in models
        },
    }
    del loaded
    gc.collect()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--backends", default="llamacpp,transformers")
    ap.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b,qwen2.5-coder-1.5b")
    ap.add_argument("--n-max", type=int, default=12)
    ap.add_argument("--prefix", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU threads per forward (1: a thread descheduled by another process's load "
                         "cannot stall the others at a barrier, which made 2-thread llama.cpp timings "
                         "on the shared 2-core VM swing by 10x)")
    ap.add_argument("--clock", choices=["thread", "wall"], default="thread",
                    help="thread: CPU seconds of the timing thread (time.thread_time; with one thread the "
                         "forward runs on it, and other processes' load no longer stretches the times); "
                         "wall: time.perf_counter")
    ap.add_argument("--no-repack", action=argparse.BooleanOptionalAction, default=True,
                    help="load GGUFs without llama.cpp's weight repacking (see no_llamacpp_repack)")
    args = ap.parse_args()

    import llama_cpp
    import torch
    import transformers

    result = {
        "command": " ".join(["python"] + sys.argv),
        "machine": f"{cpu_name()}, {os.cpu_count()} logical CPUs",
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "llama_cpp_python": llama_cpp.__version__},
        "prefix_tokens": args.prefix, "n_max": args.n_max, "rounds": args.rounds, "warmup": args.warmup,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "backends": {},
    }
    from verispec.plan.local import measure_bandwidth, measure_flops

    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    if args.clock == "thread" and args.threads != 1:
        sys.exit("--clock thread needs --threads 1 (it counts the calling thread's CPU time only)")
    torch.set_num_threads(args.threads)

    def ceilings() -> dict:
        return {"bandwidth_bytes_s": measure_bandwidth(clock=clock), "flops": measure_flops(clock=clock),
                "uptime": uptime(), "threads": args.threads}

    if args.no_repack:
        no_llamacpp_repack()
    result["llamacpp_extra_buffer_types"] = not args.no_repack
    for backend in args.backends.split(","):
        print(f"measuring {backend} ...", file=sys.stderr, flush=True)
        before = ceilings()
        block = measure_backend(backend, args.models.split(","), args.n_max, args.prefix, args.rounds,
                                args.warmup, args.threads, clock)
        block["clock"] = args.clock
        block["ceilings"] = [before, ceilings()]   # this machine's bandwidth and FLOP/s around the run
        result["backends"][backend] = block
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
