"""Benchmark `verispec serve` against in-process `SpeculativeDecoder.generate`.

    PYTHONPATH=. python benchmarks/serve/serve_bench.py --backend llamacpp --k 3 \
        --per-category 1 --max-new-tokens 128 --out benchmarks/serve

Three measurements, each as ratios taken in one run (other processes share the CPU):

1. Throughput: the same Spec-Bench prompts (first turn, chat template), greedy, the
   same fixed k, through the server (`verispec.serve.create_app` around the same
   decoder, run by uvicorn in this process and reached over 127.0.0.1 with httpx;
   non-streaming and streaming) and in process. One process: the same weights and
   threads serve both sides (on a loaded 2-core machine a second, idle process's
   thread pools steal time), and the server pays for the client sharing its GIL. Runs are
   interleaved per prompt (the order rotates), and both sides empty their KV caches
   before every generation (the server runs with --no-prefix-reuse), so each time
   includes its prefill and the two sides do the same work. tokens/s = Σ tokens / Σ
   client-side wall seconds (request sent to last byte received).
2. Acceptance counters: per prompt, the server's `metrics.speculative_decoding`
   (drafted, accepted, per position) and token ids against the in-process `Stats`.
3. Time to first token of a second chat turn (a long shared context: a document, a
   question, the answer, a follow-up question), on a server with prefix reuse (the
   default) and on one without, measured by the client (request sent to first text
   chunk) and reported by the server (`metrics.time_to_first_token_ms`).

Writes results.jsonl (one row per run), meta.json and table.md to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from verispec.api import SpeculativeDecoder, load_model
from verispec.bench import collect_meta
from verispec.prompts import dataset_path, load_prompts
from verispec.serve import BackgroundServer, create_app


def start_server(decoder: SpeculativeDecoder, k: int, reuse: bool) -> tuple[BackgroundServer, str]:
    """The server layer around the same decoder (same weights, same threads), on 127.0.0.1."""
    server = BackgroundServer(create_app(decoder, k=k, prefix_reuse=reuse, max_queue=4))
    return server, server.__enter__() + "/v1"


def stop_server(server: BackgroundServer) -> None:
    server.__exit__(None, None, None)


def via_server(http: httpx.Client, url: str, messages: list[dict], max_tokens: int, k: int, stream: bool) -> dict:
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "k": k, "return_token_ids": True}
    start = time.perf_counter()
    first = None
    if not stream:
        data = http.post(url + "/chat/completions", json=body).json()
        wall = time.perf_counter() - start
        return {"wall": wall, "ttft": None, "ids": data["choices"][0]["token_ids"],
                "text": data["choices"][0]["message"]["content"], "metrics": data["metrics"],
                "cached": data["usage"]["prompt_tokens_details"]["cached_tokens"]}
    body.update(stream=True, stream_options={"include_usage": True})
    ids, text, final = [], [], None
    with http.stream("POST", url + "/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event["choices"]:
                piece = event["choices"][0]["delta"].get("content") or ""
                if piece and first is None:
                    first = time.perf_counter() - start
                text.append(piece)
                ids += event["choices"][0].get("token_ids", [])
            else:
                final = event
    wall = time.perf_counter() - start
    return {"wall": wall, "ttft": first, "ids": ids, "text": "".join(text), "metrics": final["metrics"],
            "cached": final["usage"]["prompt_tokens_details"]["cached_tokens"]}


def in_process(decoder: SpeculativeDecoder, prompt: str, max_tokens: int, k: int) -> dict:
    for model in (decoder.target, decoder.draft):
        if model is not None:
            model.reset()
    start = time.perf_counter()
    out = decoder.generate(prompt, max_new_tokens=max_tokens, temperature=0, k=k)
    wall = time.perf_counter() - start
    s = out.stats
    return {"wall": wall, "ids": out.token_ids, "text": out.text,
            "counters": {"num_draft_tokens": s.drafted, "num_accepted_draft_tokens": s.accepted,
                         "num_accepted_tokens_per_pos": list(s.accepted_at),
                         "num_verified_tokens_per_pos": list(s.reached), "num_rounds": s.target_forwards}}


def server_counters(metrics: dict) -> dict:
    spec = metrics["speculative_decoding"]
    return {key: spec[key] for key in ("num_draft_tokens", "num_accepted_draft_tokens", "num_accepted_tokens_per_pos",
                                       "num_verified_tokens_per_pos", "num_rounds")}


def throughput(args, decoder, questions, out) -> list[dict]:
    proc, url = start_server(decoder, args.k, reuse=False)
    rows = []
    try:
        with httpx.Client(timeout=3600) as http:
            via_server(http, url, [{"role": "user", "content": "Hi"}], 4, args.k, False)       # warm-up
            in_process(decoder, "Hi", 4, args.k)
            for i, q in enumerate(questions):
                messages = [{"role": "user", "content": q.text}]
                order = ["inproc", "server", "server-stream"]
                order = order[i % 3:] + order[:i % 3]
                runs = {}
                for method in order:
                    load = os.getloadavg()[0]
                    if method == "inproc":
                        runs[method] = in_process(decoder, q.text, args.max_new_tokens, args.k)
                    else:
                        runs[method] = via_server(http, url, messages, args.max_new_tokens, args.k,
                                                  method == "server-stream")
                    runs[method]["load"] = load
                ref = runs["inproc"]
                for method, r in runs.items():
                    row = {"part": "throughput", "question_id": q.id, "category": q.category,
                           "method": method, "tokens": len(r["ids"]), "wall_seconds": r["wall"],
                           "loadavg": r["load"], "same_ids_as_inproc": r["ids"] == ref["ids"],
                           "counters": r["counters"] if method == "inproc" else server_counters(r["metrics"])}
                    row["same_counters_as_inproc"] = row["counters"] == ref["counters"]
                    rows.append(row)
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                print(f"{q.category}: " + ", ".join(f"{m} {len(r['ids']) / r['wall']:.2f} tok/s"
                                                     for m, r in runs.items()), flush=True)
    finally:
        stop_server(proc)
    return rows


def conversation(doc: str) -> tuple[list[dict], list[dict]]:
    turn1 = [{"role": "system", "content": "Answer questions about this document.\n\n" + doc},
             {"role": "user", "content": "Summarise the document in one sentence."}]
    return turn1, [{"role": "user", "content": "Now give one more detail from it."}]


def second_turn_ttft(args, decoder, docs: list[str], out) -> list[dict]:
    rows = []
    for reuse in (True, False):
        proc, url = start_server(decoder, args.k, reuse=reuse)
        try:
            with httpx.Client(timeout=3600) as http:
                via_server(http, url, [{"role": "user", "content": "Hi"}], 4, args.k, False)   # warm-up
                for i, doc in enumerate(docs):
                    turn1, follow = conversation(doc)
                    first = via_server(http, url, turn1, 32, args.k, False)
                    turn2 = turn1 + [{"role": "assistant", "content": first["text"]}] + follow
                    load = os.getloadavg()[0]
                    second = via_server(http, url, turn2, 16, args.k, True)
                    row = {"part": "ttft", "doc": i, "prefix_reuse": reuse, "client_ttft_seconds": second["ttft"],
                           "server_ttft_ms": second["metrics"]["time_to_first_token_ms"],
                           "cached_tokens": second["cached"], "loadavg": load,
                           "prompt_tokens": None, "ids": second["ids"]}
                    rows.append(row)
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    print(f"ttft reuse={reuse} doc {i}: {second['ttft']:.3f} s, cached {second['cached']}", flush=True)
        finally:
            stop_server(proc)
    return rows


def render(meta: dict, tp: list[dict], ttft: list[dict]) -> str:
    def agg(method):
        rows = [r for r in tp if r["method"] == method]
        return sum(r["tokens"] for r in rows) / sum(r["wall_seconds"] for r in rows)

    base = agg("inproc")
    lines = ["# verispec serve vs in-process generate", "",
             f"- command: `{meta['command']}`", f"- date: {meta['date']}",
             f"- machine: {meta['machine']['cpu']}, {meta['machine']['usable_cores']} usable cores, no GPU",
             "- versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()),
             f"- backend: {meta['backend']}; target: {meta['target']}; draft: {meta['draft']}; fixed k = {meta['k']}; "
             f"greedy; max_new_tokens {meta['max_new_tokens']}",
             f"- prompts: Spec-Bench first turns, {meta['per_category']} per category ({len(tp) // 3} prompts), "
             "chat template; both sides empty their caches before each generation",
             f"- 1-min load average during the runs: {min(r['loadavg'] for r in tp + ttft):.1f} to "
             f"{max(r['loadavg'] for r in tp + ttft):.1f} (2 cores: above 2 means other processes competed)",
             "", "## Throughput (Σ tokens / Σ client wall seconds, interleaved per prompt)", "",
             "| method | tokens/s | ratio to in-process | same token ids | same acceptance counters |",
             "|:---|---:|---:|---:|---:|"]
    for method, name in (("inproc", "in-process `generate`"), ("server", "server, non-streaming"),
                         ("server-stream", "server, streaming (SSE)")):
        rows = [r for r in tp if r["method"] == method]
        lines.append(f"| {name} | {agg(method):.2f} | {agg(method) / base:.3f}× | "
                     f"{sum(r['same_ids_as_inproc'] for r in rows)}/{len(rows)} | "
                     f"{sum(r['same_counters_as_inproc'] for r in rows)}/{len(rows)} |")
    drafted = sum(r["counters"]["num_draft_tokens"] for r in tp if r["method"] == "server")
    accepted = sum(r["counters"]["num_accepted_draft_tokens"] for r in tp if r["method"] == "server")
    lines += ["", f"Acceptance through the server (non-streaming): {accepted} of {drafted} drafts accepted "
              f"(α̂ = {accepted / max(drafted, 1):.3f}); the in-process run counted the same per prompt where the "
              "last column says so.", "", "## Time to first token of a second chat turn", "",
              "| prefix reuse | client TTFT (median s) | server TTFT (median ms) | cached prompt tokens (median) |",
              "|:---|---:|---:|---:|"]
    med = {}
    for reuse in (True, False):
        rows = [r for r in ttft if r["prefix_reuse"] == reuse]
        med[reuse] = statistics.median(r["client_ttft_seconds"] for r in rows)
        lines.append(f"| {'on (default)' if reuse else 'off (--no-prefix-reuse)'} | {med[reuse]:.3f} | "
                     f"{statistics.median(r['server_ttft_ms'] for r in rows):.0f} | "
                     f"{statistics.median(r['cached_tokens'] for r in rows):.0f} |")
    same = sum(a["ids"] == b["ids"] for a, b in zip([r for r in ttft if r["prefix_reuse"]],
                                                    [r for r in ttft if not r["prefix_reuse"]]))
    lines += ["", f"With reuse the second turn's first token came {med[False] / med[True]:.2f}× sooner; "
              f"second-turn token ids identical with and without reuse: {same}/{len(ttft) // 2}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="llamacpp")
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b")
    parser.add_argument("--draft-layers", type=int, default=None,
                        help="keep the draft's first N layers ('--draft self': the target's own)")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--ttft-docs", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "serve"))
    parser.add_argument("--dataset", default=None, help="Spec-Bench question.jsonl (default: as `verispec bench`)")
    args = parser.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    command = "PYTHONPATH=. python benchmarks/serve/serve_bench.py " + " ".join(sys.argv[1:])
    draft_name = args.draft + (f"[:{args.draft_layers} layers]" if args.draft_layers else "")
    meta = collect_meta(command=command, backend=args.backend, target=args.target, draft=draft_name, k=args.k,
                        per_category=args.per_category, max_new_tokens=args.max_new_tokens)
    dataset = dataset_path(args.dataset)
    questions = load_prompts(dataset, per_category=args.per_category)
    docs = [q.text for q in load_prompts(dataset, ["summarization"], args.ttft_docs)]
    target = load_model(args.target, backend=args.backend)
    draft = load_model(args.target if args.draft == "self" else args.draft, backend=args.backend,
                       num_hidden_layers=args.draft_layers)
    decoder = SpeculativeDecoder(target, draft)
    with open(out_dir / "results.jsonl", "w", encoding="utf-8") as out:
        tp = throughput(args, decoder, questions, out)
        ttft = second_turn_ttft(args, decoder, docs, out)
    meta["loadavg_at_end"] = os.getloadavg()[0]
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    table = render(meta, tp, ttft)
    (out_dir / "table.md").write_text(table)
    print(table)


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    main()
