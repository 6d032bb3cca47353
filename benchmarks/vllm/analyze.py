"""Score probe.py's raw vLLM samples with SmolLM2's exact p (no server needed).

    python benchmarks/vllm/analyze.py CONFIG [CONFIG ...]  > benchmarks/audit/vllm-cpu-probes.txt

For every config's runs/CONFIG/grid.jsonl and every grid setting (temperature, top-k,
top-p), per position t = 1..3 of the N samples:

* impossible: tokens with p_t(x) = 0 under the setting's warping (outside top-k/top-p),
  near-ties at the cut-off (logit/T within 0.5 of the support's lowest) counted apart;
* top-1 excess: observed rate of the reference's most probable token minus its expected
  rate Σ p_t(top) / N, with z = excess / sd (sd from Σ p(1-p), exact under H0);
* log-likelihood excess: mean of log p_t(x_t) + H(p_t) in nats/token (0 under H0), with
  z from its exact per-token variance Var[log p] under p_t;
* the first sample that shows an impossible token: the smallest request found.

Greedy (T = 0): each of greedy.json's completions against the reference's argmax path,
with the top-2 logit margin at the first divergence. Seeds: seeds.json's repeats.
Writes the same numbers as JSON next to the text (benchmarks/audit/vllm-cpu-probes.json).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import torch

from verispec.api import load_model
from verispec.audit.reference import target_next_probs
from verispec.sampling import SamplingConfig

here = Path(__file__).resolve().parent
PROMPT_IDS = [48010, 990, 549, 42, 2382, 28, 2654, 28, 4461, 28, 2382, 28, 2654, 28, 4461, 28, 2382, 28, 2654]


def score(model, rows: list[dict], temperature: float, top_k: int, top_p: float) -> dict:
    cfg = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    probs = target_next_probs(model, PROMPT_IDS, cfg)
    out = []
    first_bad = None
    for t in range(3):
        n = imp = near = top1 = 0
        exp_top1 = var_top1 = ll = var_ll = 0.0
        for r in rows:
            ids = r["token_ids"] or []
            if len(ids) <= t:
                continue
            prefix, x = tuple(ids[:t]), ids[t]
            p = probs(prefix)
            n += 1
            if p[x] <= 0:
                if x in probs.near_support(prefix):
                    near += 1
                else:
                    imp += 1
                    if first_bad is None or len(ids[:t + 1]) < len(first_bad["token_ids"]):
                        first_bad = {"seed": r["seed"], "position": t + 1, "token_ids": ids[:t + 1],
                                     "token": x, "p": 0.0, "support_size": int((p > 0).sum())}
                continue
            top = int(np.argmax(p))
            top1 += x == top
            exp_top1 += p[top]
            var_top1 += p[top] * (1 - p[top])
            nz = p[p > 0]
            lp = np.log(nz)
            h = -(nz * lp).sum()
            ll += math.log(p[x]) + h
            var_ll += (nz * lp ** 2).sum() - h ** 2
        k = n - imp - near
        out.append({"position": t + 1, "n": n, "impossible": imp, "near_tie": near,
                    "top1_observed": top1 / k if k else None, "top1_expected": exp_top1 / k if k else None,
                    "top1_z": (top1 - exp_top1) / math.sqrt(var_top1) if var_top1 > 0 else None,
                    "ll_excess": ll / k if k else None,
                    "ll_z": ll / math.sqrt(var_ll) if var_ll > 0 else None})
    return {"temperature": temperature, "top_k": top_k, "top_p": top_p, "positions": out,
            "first_impossible": first_bad}


def greedy(model, rows: list[dict]) -> list[dict]:
    res = []
    for g in rows:
        ids = g.get("prompt_token_ids") or model.tokenizer.encode(g["prompt"])
        got = g["token_ids"]
        model.reset()                                           # every row recomputed
        logits = model.sync(list(ids) + got, keep=len(got) + 1)  # row i predicts got[i]
        div = None
        for i, x in enumerate(got):
            row = logits[i].double()
            top2 = torch.topk(row, 2)
            if int(top2.indices[0]) != x:
                div = {"index": i, "server": x, "reference": int(top2.indices[0]),
                       "margin": float(top2.values[0] - row[x])}
                break
        res.append({"prompt": g["prompt"], "tokens": len(got), "first_divergence": div})
    return res


def main(configs: list[str]) -> None:
    model = load_model("smollm2-135m", backend="transformers")
    report = {}
    for c in configs:
        d = here / "runs" / c
        rows = [json.loads(line) for line in (d / "grid.jsonl").read_text().splitlines() if line.strip()]
        settings = sorted({(r["temperature"], r["top_k"], r["top_p"]) for r in rows if r["temperature"] > 0})
        report[c] = {"grid": [score(model, [r for r in rows if (r["temperature"], r["top_k"], r["top_p"]) == s], *s)
                              for s in settings]}
        if (d / "greedy.json").exists():
            report[c]["greedy"] = greedy(model, json.loads((d / "greedy.json").read_text()))
        t0 = [r["token_ids"] for r in rows if r["temperature"] == 0]
        report[c]["greedy_grid_identical"] = bool(t0) and all(x == t0[0] for x in t0)
        if (d / "seeds.json").exists():
            s = json.loads((d / "seeds.json").read_text())["token_ids"]
            report[c]["seed_repeats_identical"] = sum(x == s[0] for x in s)
            report[c]["seed_repeats"] = len(s)
    print("# exact reference: smollm2-135m (transformers, float32: the weights vLLM serves); prompt ids "
          + ",".join(map(str, PROMPT_IDS)) + "; m = 3; seeds 0..N-1, 4 requests in flight")
    print(f"{'config':14s} {'T':>4s} {'k':>3s} {'p':>4s} {'pos':>3s} {'N':>4s} {'imposs.':>7s} {'near':>4s} "
          f"{'top1 obs/exp':>13s} {'z':>6s} {'LL excess':>9s} {'z':>6s}")
    for c, r in report.items():
        for g in r["grid"]:
            for q in g["positions"]:
                f = lambda v, w=6, d=2: f"{v:{w}.{d}f}" if v is not None else " " * (w - 1) + "-"
                print(f"{c:14s} {g['temperature']:4.1f} {g['top_k']:3d} {g['top_p']:4.2f} {q['position']:3d} {q['n']:4d} "
                      f"{q['impossible']:7d} {q['near_tie']:4d} {f(q['top1_observed'], 6, 3)}/{f(q['top1_expected'], 6, 3)} "
                      f"{f(q['top1_z'])} {f(q['ll_excess'], 9, 3)} {f(q['ll_z'])}")
            if g["first_impossible"]:
                print(f"{'':14s} first impossible: {g['first_impossible']}")
        for gr in r.get("greedy", []):
            print(f"{c:14s} greedy {gr['prompt']!r}: {gr['tokens']} tokens, first divergence from the "
                  f"reference's argmax: {gr['first_divergence']}")
        print(f"{c:14s} T = 0 grid samples identical: {r['greedy_grid_identical']}; seed 7 repeated: "
              f"{r.get('seed_repeats_identical')}/{r.get('seed_repeats')} identical")
    (here.parent / "audit" / "vllm-cpu-probes.json").write_text(json.dumps(report, indent=1, default=float))


if __name__ == "__main__":
    main(sys.argv[1:])
