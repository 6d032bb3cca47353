"""llama-server's logit floor: how far its kernels move a top-2 logit gap, per forward shape.

The token audit's greedy checks (the argmax path, the stateful probes) call a token that is
not the local reference's argmax a near-tie, not a bug, when the reference's logit gap
between the two tokens is at most ``--numerics-margin`` (default 0.5, measured on verispec's
batch-invariant backend). llama-server is built with llamafile's sgemm, whose batched matmuls
sum in another order than its one-row path, so its gaps move with the forward's shape, and a
server that verifies drafted tokens in a batch may flip a greedy token that its spec-off run,
decoding one row at a time, does not. This script measures that movement directly.

For each prompt (a text file, one per line; ids from the server's ``/tokenize``), the server's
greedy path x_1..x_m is drawn, then the logits at every position i are read back from the
server in three forward shapes, as ``top_logprobs`` (``n_probs``, pre-sampling: log-softmax
of the raw logits, so a difference of two is a logit gap):

* ``step``: the greedy request itself (positions 2..m decoded one row per forward);
* ``batch``: prompt + x_<i with ``n_predict = 1`` and ``cache_prompt = false``: the last row
  of a (len(prompt) + i − 1)-row prompt forward;
* ``suffix``: prompt + x_<i−5 first (cached), then prompt + x_<i with ``cache_prompt = true``:
  the last row of a 5-row forward over a cached prefix, the shape of a verification block
  of 4 drafts (``timings.prompt_n`` records the rows actually computed).

The local reference (``--target``, verispec's llama.cpp backend, one teacher-forced forward)
gives the same gap g_i = logit(a_i) − logit(b_i) for its own top-2 pair (a_i, b_i). The report
is the distribution of |g_server − g_local| per shape and of |g_batch − g_step| (the server
against itself), and the floor a greedy audit of this server needs: a token at local margin g
can be the server's argmax only if some shape moved the gap by at least g.

    flock /tmp/verispec-heavy.lock python benchmarks/audit/llama_server_logit_floor.py \
        --url http://127.0.0.1:8321 --target ~/.cache/verispec/gguf/smollm2-135m.gguf \
        --prompts benchmarks/audit/server_prompts.txt --m 64 --out benchmarks/audit/llama-server-logit-floor
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import httpx
import numpy as np
from llama_server_common import add_options, load_reference, server_prompts, top_logprobs

SUFFIX_ROWS = 5       # rows of the suffix forward: a verification block of 4 drafts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_options(ap)
    args = ap.parse_args()

    http = httpx.Client(timeout=600)
    ref = load_reference(args.target, args.threads)
    prompts = server_prompts(http, args.url, args.prompts)
    common = {"temperature": 0.0, "n_probs": 10, "post_sampling_probs": False, "return_tokens": True}
    rows, t0 = [], time.time()

    def ask(ids: list[int], n: int, cache: bool) -> dict:
        r = http.post(args.url + "/completion", json={**common, "prompt": ids, "n_predict": n, "cache_prompt": cache})
        r.raise_for_status()
        return r.json()

    for pi, prompt in enumerate(prompts):
        greedy = ask(prompt, args.m, False)
        path = [int(t) for t in greedy["tokens"]]
        step = [top_logprobs(e) for e in greedy["completion_probabilities"]]
        ref.reset()
        local = ref.sync(prompt + path[:-1], keep=len(path))[-len(path):].double().numpy()
        ref.reset()
        for i in range(len(path)):
            batch = top_logprobs(ask(prompt + path[:i], 1, False)["completion_probabilities"][0])
            ask(prompt + path[:max(0, i - SUFFIX_ROWS)], 1, True)
            r = ask(prompt + path[:i], 1, True)
            suffix, suffix_rows = top_logprobs(r["completion_probabilities"][0]), int(r["timings"]["prompt_n"])
            a, b = (int(t) for t in np.argsort(-local[i])[:2])
            g_local = float(local[i, a] - local[i, b])
            row = {"prompt": pi, "position": i + 1, "token": path[i], "local_argmax": a, "local_second": b,
                   "local_gap": g_local, "local_margin_of_token": float(local[i, a] - local[i, path[i]]),
                   "suffix_rows": suffix_rows}
            for name, lp in (("step", step[i]), ("batch", batch), ("suffix", suffix)):
                row[name] = lp[a] - lp[b] if a in lp and b in lp else None
            rows.append(row)
        print(f"prompt {pi + 1}/{len(prompts)}: {len(path)} positions, {time.time() - t0:.0f} s", flush=True)

    def dist(vals: list[float]) -> dict:
        v = np.abs(np.asarray([x for x in vals if x is not None and math.isfinite(x)]))
        return {"n": int(v.size), "median": float(np.median(v)), "p99": float(np.quantile(v, 0.99)),
                "max": float(v.max())}

    summary = {name: dist([r[name] - r["local_gap"] if r[name] is not None else None for r in rows])
               for name in ("step", "batch", "suffix")}
    summary["batch_vs_step"] = dist([r["batch"] - r["step"] if None not in (r["batch"], r["step"]) else None
                                     for r in rows])
    summary["suffix_vs_step"] = dist([r["suffix"] - r["step"] if None not in (r["suffix"], r["step"]) else None
                                      for r in rows])
    off = [r for r in rows if r["token"] != r["local_argmax"]]
    worst = max(summary[k]["max"] for k in ("step", "batch", "suffix"))
    floor = math.ceil(worst * 10) / 10
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    lines = [
        f"# llama-server logit floor: {out.name}",
        (f"# command: python benchmarks/audit/llama_server_logit_floor.py --url {args.url} --target {args.target} "
        f"--prompts {' '.join(args.prompts)} --m {args.m} --out {args.out}"),
        f"# server: llama-server {args.server_args} ({http.get(args.url + '/props').json().get('build_info', '?')})",
        f"# {len(prompts)} prompts x {args.m} greedy tokens = {len(rows)} positions, {time.time() - t0:.0f} s",
        "",
        "|g_server − g_local| for the local top-2 pair, logits (median / p99 / max over positions):",
    ]
    for k in ("step", "batch", "suffix", "batch_vs_step", "suffix_vs_step"):
        s = summary[k]
        lines.append(f"  {k:<15} n {s['n']:>4}   {s['median']:.3f} / {s['p99']:.3f} / {s['max']:.3f}")
    lines += ["", f"greedy tokens that are not the local argmax: {len(off)} of {len(rows)}; their local margins: "
              + ", ".join(f"{r['local_margin_of_token']:.3f}" for r in off),
              f"suffix forward rows computed (timings.prompt_n): {sorted({r['suffix_rows'] for r in rows})}",
              "", f"floor for a greedy audit of this server (the largest move, up to the next 0.1): {floor:.1f}"]
    out.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
