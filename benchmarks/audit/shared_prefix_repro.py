"""The shared-prefix probe, repeated on many prompts, on a speculating llama-server and its spec-off twin.

The token audit's ``shared-prefix`` probe (`verispec.audit.probes`) asks a server, greedy,
P+a, then P+b (sharing P with the cached P+a), then P+a again, and FAILs when an output is not
the local reference's argmax path beyond the numerics floor. One audit of llama-server with
``--spec-type ngram-simple`` FAILed it once (P+b, local margin 0.849) and another passed it.
This script asks whether that is the server's state (a prefix cache holding rows of rejected
drafts, the vLLM PR #57128 class), its batched numerics, or chance: for N fixed prompts it
sends the probe's three requests plus P+b cold (``cache_prompt = false``) to both servers, and
reports, per request kind,

* how often the speculating server's output differs from the spec-off server's, and the
  local reference's logit gap between the two tokens at the first difference;
* how often each server's output leaves the local argmax path, with the largest local margin
  of a token that is not the local argmax (what the probe compares with its floor).

A difference that shows warm but not cold, and at gaps beyond the server's measured logit
floor (``llama_server_logit_floor.py``), would be state; differences at gaps within the floor,
cold as often as warm, are numerics.

    flock /tmp/verispec-heavy.lock python benchmarks/audit/shared_prefix_repro.py \
        --spec http://127.0.0.1:8322 --off http://127.0.0.1:8321 --target SMOLLM2.gguf \
        --prompts benchmarks/audit/floor_prompts.txt --n 40 --m 64 --out benchmarks/audit/shared-prefix-ngram
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import httpx
import numpy as np
from llama_server_common import add_options, load_reference, server_prompts

KINDS = ("P+a", "P+b", "P+a again", "P+b cold")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", required=True, help="the speculating llama-server's root (no /v1)")
    add_options(ap, url="--off")
    ap.add_argument("--n", type=int, default=40, help="prompts P (each: a line plus 6 of its own tokens, seeded)")
    args = ap.parse_args()

    http = httpx.Client(timeout=600)
    ref = load_reference(args.target, args.threads)
    lines = server_prompts(http, args.off, args.prompts)
    t0, rows = time.time(), []

    def ask(url: str, ids: list[int], cache: bool) -> list[int]:
        r = http.post(url + "/completion", json={"prompt": ids, "n_predict": args.m, "temperature": 0.0,
                                                 "cache_prompt": cache, "return_tokens": True})
        r.raise_for_status()
        return [int(t) for t in r.json()["tokens"]]

    def logits(ids: list[int], out: list[int]) -> np.ndarray:
        ref.reset()
        x = ref.sync(ids + out[:-1], keep=len(out))[-len(out):].double().numpy()
        ref.reset()
        return x

    for j in range(args.n):
        line = lines[j % len(lines)]
        rng = np.random.default_rng(j)
        base = line + [int(t) for t in rng.choice(np.asarray(line), size=min(6, len(line)))]
        reqs = {"P+a": base + [base[0]], "P+b": base + [base[-1]]}
        got = {}
        for name, url in (("spec", args.spec), ("off", args.off)):
            got[name] = {"P+a": ask(url, reqs["P+a"], True), "P+b": ask(url, reqs["P+b"], True),
                         "P+a again": ask(url, reqs["P+a"], True), "P+b cold": ask(url, reqs["P+b"], False)}
        for kind in KINDS:
            prompt = reqs[kind.split()[0]]
            row = {"prompt": j, "kind": kind}
            for name in ("spec", "off"):
                out = got[name][kind]
                x = logits(prompt, out)
                off_path = [float(x[t].max() - x[t, out[t]]) for t in range(len(out)) if out[t] != int(x[t].argmax())]
                # only the first leaves the path comparably: later tokens follow another prefix
                row[name] = {"tokens": out, "first_off_argmax_margin": off_path[0] if off_path else None,
                             "off_argmax": len(off_path)}
            s, o = got["spec"][kind], got["off"][kind]
            t = next((i for i in range(min(len(s), len(o))) if s[i] != o[i]), None)
            if t is not None:
                x = logits(prompt, s[:t + 1])
                row["differ_at"], row["differ_gap"] = t + 1, float(abs(x[t, s[t]] - x[t, o[t]]))
            rows.append(row)
        print(f"prompt {j + 1}/{args.n}: {time.time() - t0:.0f} s", flush=True)

    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    text = [f"# shared-prefix probe repeated: {out.name}",
            (f"# command: python benchmarks/audit/shared_prefix_repro.py --spec {args.spec} --off {args.off} "
            f"--target {args.target} --prompts {' '.join(args.prompts)} --n {args.n} --m {args.m} --out {args.out}"),
            f"# servers: llama-server {args.server_args}",
            f"# {args.n} prompts x 4 requests x {args.m} greedy tokens per server, {time.time() - t0:.0f} s", "",
            ("request     spec≠off  gaps at the first difference (local logits)   spec leaves path (largest first margin)"
            "   off leaves path (largest)")]
    for kind in KINDS:
        rs = [r for r in rows if r["kind"] == kind]
        diff = [r for r in rs if "differ_at" in r]
        gaps = ", ".join(f"{r['differ_gap']:.3f}@{r['differ_at']}" for r in diff) or "-"

        def leaves(name: str, rs: list = rs) -> str:
            ms = [r[name]["first_off_argmax_margin"] for r in rs if r[name]["first_off_argmax_margin"] is not None]
            return f"{len(ms)}/{len(rs)} ({max(ms):.3f})" if ms else f"0/{len(rs)}"
        text.append(f"{kind:<11} {len(diff):>3}/{len(rs):<4} {gaps:<45} {leaves('spec'):<40} {leaves('off')}")
    out.with_suffix(".txt").write_text("\n".join(text) + "\n")
    print("\n".join(text))


if __name__ == "__main__":
    main()
