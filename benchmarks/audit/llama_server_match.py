"""Can a local reference compute exactly as llama-server does? Flash attention x forward shape.

`llama_server_logit_floor.py` found llama-server's logits up to 1.03 away (a top-2 gap)
from verispec's default local reference. This script asks which difference that is. For
each prompt (a text file, one per line; ids from the server's ``/tokenize``), the server's
greedy path x_1..x_m and its pre-sampling top-10 logprobs per position (1-token decode; a
server without speculation) are compared with a local reference on the same GGUF, loaded
with llama.cpp's flash attention off (verispec's default) or on (llama-server's ``-fa auto``
on a CPU), scoring the path either in one teacher-forced forward (``batch``) or one token
per forward as the server decoded it (``step``). Per configuration: |g_server − g_local|
for the local top-2 pair (logits) and how many positions agree to 1e-4.

    flock /tmp/verispec-heavy.lock python benchmarks/audit/llama_server_match.py \
        --url http://127.0.0.1:8321 --target SMOLLM2.gguf --prompts benchmarks/audit/floor_prompts.txt \
        --out benchmarks/audit/llama-server-match
"""

from __future__ import annotations

import argparse
from pathlib import Path

import httpx
import numpy as np
from llama_server_common import add_options, load_reference, server_prompts, top_logprobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_options(ap, m=48)
    args = ap.parse_args()

    http = httpx.Client(timeout=600)
    served = []
    for prompt in server_prompts(http, args.url, args.prompts):
        r = http.post(args.url + "/completion", json={
            "prompt": prompt, "n_predict": args.m, "temperature": 0.0, "n_probs": 10, "post_sampling_probs": False,
            "cache_prompt": False, "return_tokens": True}).json()
        served.append((prompt, [int(t) for t in r["tokens"]], [top_logprobs(e) for e in r["completion_probabilities"]]))
    lines = [f"# llama-server against a local reference: {Path(args.out).name}",
             (f"# command: python benchmarks/audit/llama_server_match.py --url {args.url} --target {args.target} "
             f"--prompts {' '.join(args.prompts)} --m {args.m} --threads {args.threads} --out {args.out}"),
             f"# server: llama-server {args.server_args}",
             f"# {len(served)} prompts x {args.m} greedy tokens (1-token decode on the server)", "",
             "local reference                        positions   median    p99      max   equal (<1e-4)"]
    for fa in (False, True):
        ref = load_reference(args.target, args.threads, batch_invariant=False, flash_attn=fa)
        for mode in ("batch", "step"):
            d = []
            for prompt, path, top in served:
                ref.reset()
                if mode == "batch":
                    logits = ref.sync(prompt + path[:-1], keep=len(path)).double().numpy()
                else:
                    logits = np.stack([ref.sync(prompt + path[:i], keep=1)[-1].double().numpy()
                                       for i in range(len(path))])
                for i, lp in enumerate(top):
                    a, b = (int(t) for t in np.argsort(-logits[i])[:2])
                    if a in lp and b in lp:
                        d.append(abs((lp[a] - lp[b]) - (logits[i, a] - logits[i, b])))
            d = np.asarray(d)
            lines.append(f"flash attention {'on ' if fa else 'off'}, {mode:<5} scoring        {d.size:>5}   "
                         f"{np.median(d):.4f}  {np.quantile(d, 0.99):.4f}  {d.max():.4f}   {(d < 1e-4).sum()}")
        ref.reset()
    Path(args.out).with_suffix(".txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
