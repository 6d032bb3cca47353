"""The numerics floor of llama-server itself, and the audit verdicts re-read with it.

`verispec audit --endpoint --target` measures the numerics floor with the weights loaded
locally, by verispec's llama.cpp backend: built without llamafile's sgemm (and, on this
machine, always batch-invariant), so it finds TV = 0. llama-server is built with llamafile's
sgemm on, whose batched matmuls sum in another order than the one-row path. This script
measures the floor on the server: for the audit's most common m-token path and a seed that
produced it (from the audit's JSONL),

* p at position i from a *batched* forward: ``POST /completion`` with prompt + path[:i-1],
  ``n_predict = 1``, ``cache_prompt = false``: the last row of a (len(prompt) + i − 1)-row
  prompt forward;
* p at position i from *1-token* forwards: ``POST /completion`` with the prompt,
  ``n_predict = m`` and that seed (which reproduces the path), positions 2..m decoded one
  token per forward (use a server without a draft);

both as ``n_probs = 10, post_sampling_probs = true`` (the warped p over the top-k support),
and their total variation per position. It then re-decides each given audit report
(``verispec.audit.reference``'s rules) with this floor and writes NAME-server-floor.json/.txt.

    python benchmarks/audit/llama_server_floor.py --url http://127.0.0.1:8103 \
        --samples benchmarks/audit/endpoint-llama-server-nodraft-p1.jsonl \
        --reports benchmarks/audit/endpoint-llama-server-draft-p1.json ...
"""

import argparse
import json
from collections import Counter
from pathlib import Path

import httpx
from rich.console import Console

from verispec.audit.reference import EndpointReport, _decide

ap = argparse.ArgumentParser()
ap.add_argument("--url", required=True, help="llama-server root, without /v1 (a server without a draft)")
ap.add_argument("--samples", required=True, help="an audit's JSONL (prompt, settings, seeds)")
ap.add_argument("--reports", nargs="*", default=[], help="audit --json reports to re-decide")
args = ap.parse_args()

rows = [json.loads(line) for line in Path(args.samples).read_text().splitlines() if line.strip()]
st = rows[0]["settings"]
prompt, m = list(st["prompt"]), st["m"]
full = [tuple(r["token_ids"]) for r in rows if len(r["token_ids"]) == m]
path = Counter(full).most_common(1)[0][0]
seed = next(r["seed"] for r in rows if tuple(r["token_ids"]) == path)
common = {"temperature": st["temperature"], "top_k": st["top_k"], "top_p": st["top_p"], "min_p": 0.0,
          "n_probs": max(10, st["top_k"]), "post_sampling_probs": True, "cache_prompt": False,
          "return_tokens": True, "seed": seed}
http = httpx.Client(timeout=300)


def probs(entry) -> dict[int, float]:
    return {int(t["id"]): float(t["prob"]) for t in entry["top_probs"]}


batched = []
for i in range(m):
    r = http.post(args.url + "/completion", json={**common, "prompt": prompt + list(path[:i]), "n_predict": 1}).json()
    batched.append(probs(r["completion_probabilities"][0]))
r = http.post(args.url + "/completion", json={**common, "prompt": prompt, "n_predict": m}).json()
if tuple(r["tokens"]) != path:
    raise SystemExit(f"seed {seed} gave {r['tokens']}, not the path {list(path)}: the server is not seed-reproducible")
single = [probs(e) for e in r["completion_probabilities"]]
tv = [0.5 * sum(abs(a.get(t, 0.0) - b.get(t, 0.0)) for t in set(a) | set(b)) for a, b in zip(batched, single)]
floor = {"path": list(path), "seed": seed, "tv_batched_vs_single": tv,
         "note": "position 1 is the prompt's last row in both requests (TV 0 by construction)"}
print(json.dumps(floor))
for name in args.reports:
    d = json.loads(Path(name).read_text())
    rep = EndpointReport.from_dict(d)
    for i, row in enumerate(rep.rows):
        row.floor = sum(tv) if i == m else tv[i]
    _decide(rep)
    rep.info["numerics_kernels"] = f"llama-server at {args.url} (batched prompt row vs 1-token decode)"
    rep.info["numerics_path"] = list(path)
    rep.info["server_floor"] = floor
    out = Path(name).with_name(Path(name).stem + "-server-floor")
    out.with_suffix(".json").write_text(json.dumps(rep.to_dict(), default=str))
    with out.with_suffix(".txt").open("w") as fh:
        Console(file=fh, width=170, color_system=None).print(rep.table())
        fh.write(f"server numerics floor: {json.dumps(floor)}\n")
    print(out, rep.verdict, rep.reasons)
