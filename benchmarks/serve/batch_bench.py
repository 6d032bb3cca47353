"""`verispec serve --max-seqs N` against `llama-server -np N`: throughput and latency under N clients.

    PYTHONPATH=. python benchmarks/serve/batch_bench.py --target smollm2-135m --draft none \
        --clients 1,2,4,8 --max-tokens 64 --out benchmarks/serve/batched-smollm2

For each N in --clients, each server is started afresh with N sequence slots (verispec:
`verispec serve --max-seqs N`, the python running this script, same --threads; llama.cpp:
`llama-server -np N -c N*ctx -t T -tb T`, continuous batching, no speculation; `--repack`:
llama.cpp's default repacked weights on both sides unless the CPU reports AMX, then
`--no-repack` and VERISPEC_LLAMACPP_REPACK=0, as `benchmarks/llamacpp/native_bench.py`),
and N client threads share --requests greedy requests, one prompt each (Spec-Bench's first
turns, two per category), each client sending its next one when its last is answered: every
level runs the same prompts on every server. Every
request carries the same prompt token ids (verispec's /tokenize of the chat message, sent
as a token-id prompt to both: no template differences), temperature 0, ignore_eos and
max_tokens m, so every request generates exactly m tokens; llama-server's prompt cache is
off (cache_prompt false) and verispec's too (--no-prefix-reuse; batched mode has none), and
verispec's suffix drafter drafts from each request alone (--suffix-cache-size 0), so at
N = 1 both decode each prompt from an empty cache. Servers run one at a time
(each its own process); nothing else of this script runs while one is measured but the
clients.

With --repeats R every level runs the server list R times, in turn and mirrored (A B, B A,
A B, ...), so a drift of this machine's speed over minutes falls on both alike; the figures
then pool the R runs.

Reported per (server, N): aggregate output tokens/s = Σ tokens / Σ wall seconds of the level's
runs (first request sent to last response received; each run's own figure beside it), the
ratio to llama-server's at the same N, mean and p95 request latency (client side),
and the ids check: how many responses equal that server's own N = 1 response for the same
prompt token for token (verispec's batched mode must give all; llama-server's batching is not
batch-invariant), and how many of llama-server's equal verispec's.

Writes results.jsonl, meta.json and table.md to --out.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from verispec import registry  # noqa: E402
from verispec.bench import collect_meta  # noqa: E402
from verispec.prompts import load_prompts  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks" / "llamacpp"))
from native_bench import free_port, native_repack, repack_env, served  # noqa: E402  (servers; repacking rule)

BIN = Path.home() / ".cache/verispec/build/llama.cpp-0c1e570/bin"


def verispec_cmd(args, n: int, port: int, invariant: bool) -> list[str]:
    return [sys.executable, "-m", "verispec.cli", "serve", "--backend", "llamacpp", "--target", args.target,
            "--draft", args.draft, "--k", args.k, "--port", str(port), "--max-seqs", str(n), "--max-queue", "256",
            "--threads", str(args.threads),
            "--suffix-cache-size", "0", "--no-prefix-reuse", *([] if invariant else ["--no-batch-invariant"]),
            *(["--drafter", args.drafter] if args.drafter else [])]


def llama_cmd(args, n: int, port: int, repack: bool = True) -> list[str]:
    gguf = registry.resolve(args.target, weights=False).gguf_path
    return [str(Path(args.bin_dir) / "llama-server"), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "-t", str(args.threads), "-tb", str(args.threads), "-np", str(n), "-c", str(n * args.ctx),
            *([] if repack else ["--no-repack"]), "--metrics"]


def request(http: httpx.Client, kind: str, url: str, ids: list[int], m: int) -> tuple[list[int], float, dict]:
    """One greedy request of exactly m tokens; (output ids, client seconds, verispec's draft
    tokens drafted and accepted per drafter, name -> [drafted, accepted]: {} for llama-server)."""
    start = time.perf_counter()
    drafted: dict = {}
    if kind == "llama-server":
        resp = http.post(url + "/completion", json={"prompt": ids, "n_predict": m, "temperature": 0,
                                                    "ignore_eos": True, "cache_prompt": False,
                                                    "return_tokens": True})
        resp.raise_for_status()
        out = resp.json()["tokens"]
    else:
        resp = http.post(url + "/v1/completions", json={"prompt": ids, "max_tokens": m, "temperature": 0,
                                                        "ignore_eos": True, "return_token_ids": True})
        resp.raise_for_status()
        body = resp.json()
        out = body["choices"][0]["token_ids"]
        spec = body.get("metrics", {}).get("speculative_decoding", {})
        drafted = {name: [count, spec.get("num_accepted_tokens_by_drafter", {}).get(name, 0)]
                   for name, count in spec.get("num_draft_tokens_by_drafter", {}).items()}
    return out, time.perf_counter() - start, drafted


def level(kind: str, url: str, prompts: list[list[int]], n: int, m: int) -> list[dict]:
    """N clients sharing one request per prompt; one row per request."""
    rows: list[dict] = []
    lock = threading.Lock()
    todo = list(range(len(prompts)))

    def client(c: int) -> None:
        with httpx.Client(timeout=1800) as http:
            while True:
                with lock:
                    if not todo:
                        return
                    p = todo.pop(0)
                ids, seconds, drafted = request(http, kind, url, prompts[p], m)
                with lock:
                    rows.append({"prompt": p, "ids": ids, "seconds": seconds, "drafted": drafted,
                                 "end": time.perf_counter()})

    threads = [threading.Thread(target=client, args=(c,)) for c in range(n)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for row in rows:
        row["level_seconds"] = max(r["end"] for r in rows) - start
    return rows


def batch_time(url: str) -> dict:
    """verispec's batch counters from /metrics (seconds in decode and prefill forwards, seconds
    waiting for the requests to park, forwards, rows); {} where the server has none."""
    from prometheus_client.parser import text_string_to_metric_families

    got: dict = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=60).text):
        for sample in family.samples:
            if sample.name.startswith("verispec:batch_") and sample.name.endswith("_total"):
                key = sample.name[len("verispec:batch_"):-len("_total")]
                if "kind" in sample.labels:
                    key += "_" + sample.labels["kind"]
                got[key] = sample.value
    return got


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--draft", default="none", help="verispec's draft model ('none': suffix decoding only)")
    ap.add_argument("--k", default="auto")
    ap.add_argument("--drafter", default=None, help="verispec serve's --drafter (default: the server's own)")
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=16,
                    help="requests per level: the first N first turns (2 per category, or all of --categories)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--ctx", type=int, default=2048, help="llama-server context per slot")
    ap.add_argument("--servers", default="verispec,llama-server",
                    help="comma list of verispec, verispec-no-invariant, llama-server")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of each server per level, in turn and mirrored (A B, B A, ...): the figures pool them")
    ap.add_argument("--bin-dir", default=str(BIN))
    ap.add_argument("--dataset", default=None)
    ap.add_argument("--categories", default=None,
                    help="comma list of prompt categories (e.g. code-edit); default: every category of the dataset")
    ap.add_argument("--repack", default="auto", help="repacked weights on both sides: auto (llama.cpp's "
                    "default unless the CPU reports AMX), 1 or 0 (--no-repack; default %(default)s)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.repeats < 1:
        raise SystemExit("--repeats must be >= 1")
    clients = [int(c) for c in args.clients.split(",")]
    servers = args.servers.split(",")
    categories = args.categories.split(",") if args.categories else None
    texts = [p.text for p in load_prompts(args.dataset, categories, per_category=2 if categories is None else 0)
             ][:args.requests]
    repack = native_repack(args.repack)     # the same weights layout rule on both sides
    env = {**os.environ, "PYTHONPATH": str(ROOT), **repack_env(repack)}
    rows, commands = [], {}
    meta = collect_meta(command=" ".join(shlex.quote(a) for a in sys.argv), servers=commands,
                        llama_cpp_build=str(args.bin_dir), max_tokens=args.max_tokens,
                        requests=args.requests, threads=args.threads, repeats=args.repeats,
                        repack=native_repack(args.repack))
    prompts: list[list[int]] | None = None
    runs = ((n, r, kind) for n in clients for r in range(args.repeats)
            for kind in (servers if r % 2 == 0 else servers[::-1]))      # A B, B A, A B, ...
    for n, repeat, kind in runs:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = llama_cmd(args, n, port, repack) if kind == "llama-server" else verispec_cmd(
            args, n, port, invariant=kind == "verispec")
        commands[kind] = (f"VERISPEC_LLAMACPP_REPACK={repack_env(repack)['VERISPEC_LLAMACPP_REPACK']} "
                          if kind != "llama-server" else "") + shlex.join(cmd)
        log = out / (f"{kind}-{n}.log" if args.repeats == 1 else f"{kind}-{n}-{repeat + 1}.log")
        with served(cmd, url, log, env=env):
            if prompts is None:          # verispec's chat template, once, for every server
                if kind == "llama-server":
                    raise SystemExit("list a verispec server first in --servers (it tokenizes the prompts)")
                prompts = [httpx.post(url + "/tokenize", json={"messages": [{"role": "user", "content": t}]},
                                      timeout=60).json()["tokens"] for t in texts]
            got = level(kind, url, prompts, n, args.max_tokens)
            spent = batch_time(url) if kind != "llama-server" else {}
        for row in got:
            rows.append({"server": kind, "clients": n, "repeat": repeat, **row, "batch": spent})
        tokens = sum(len(r["ids"]) for r in got)
        print(f"{kind} N={n} run {repeat + 1}: {tokens / got[0]['level_seconds']:.1f} tok/s, mean "
              f"{statistics.mean(r['seconds'] for r in got):.2f} s", flush=True)
        write(out, rows, servers, clients, meta)     # after every level: a cut-short run keeps its rows
    print((out / "table.md").read_text())


def write(out: Path, rows: list[dict], servers: list[str], clients: list[int], meta: dict) -> None:
    with (out / "results.jsonl").open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    (out / "table.md").write_text(table(rows, servers, clients, meta))


def pooled_rate(got: list[dict]) -> tuple[float, list[float]]:
    """Output tokens/s of one (server, N) over its runs (Σ tokens / Σ level seconds), and
    each run's own, in run order."""
    runs: dict[int, list[dict]] = {}
    for r in got:
        runs.setdefault(r.get("repeat", 0), []).append(r)
    tokens = {k: sum(len(r["ids"]) for r in rs) for k, rs in runs.items()}
    seconds = {k: rs[0]["level_seconds"] for k, rs in runs.items()}
    return sum(tokens.values()) / sum(seconds.values()), [tokens[k] / seconds[k] for k in sorted(runs)]


def table(rows: list[dict], servers: list[str], clients: list[int], meta: dict) -> str:
    solo = {(r["server"], r["prompt"]): r["ids"] for r in rows if r["clients"] == clients[0]}
    ref = {r["prompt"]: r["ids"] for r in rows if r["server"] == servers[0] and r["clients"] == clients[0]}
    lines = [f"Command: `{meta['command']}`  ",
             f"Date {meta['date']}; machine {meta['machine']['cpu']}, {meta['machine']['usable_cores']} usable cores, "
             f"load average at start {meta['loadavg_at_start']}; versions {meta['versions']}  ",
             "Servers: " + "; ".join(f"`{k}`: `{v}`" for k, v in meta["servers"].items()) + "  ",
             f"Greedy, ignore_eos, {meta['max_tokens']} tokens per request, {meta['requests']} requests "
             f"(one per prompt) per level shared by the clients, {meta['threads']} threads.", "",
             "Drafted: tokens drafted / accepted per drafter, summed over the level's requests (verispec's "
             "`num_draft_tokens_by_drafter`, `num_accepted_tokens_by_drafter`). Time: verispec's seconds inside decode forwards / "
             "prefill forwards / waiting between forwards for every request to park (its "
             "`verispec:batch_*` counters; the level's wall time is the rest plus idle).", "",
             "| server | clients | requests | output tok/s (each run) | / llama-server | mean latency s | p95 latency s | "
             f"ids = own N={clients[0]} | ids = {servers[0]} | drafted | time s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for n in clients:
        for kind in servers:
            got = [r for r in rows if r["server"] == kind and r["clients"] == n]
            if not got:
                continue
            runs = {r.get("repeat", 0): r for r in got}          # one row per run: its level's figures
            rate, each = pooled_rate(got)
            each = ", ".join(f"{x:.1f}" for x in each) if len(each) > 1 else ""
            native = [r for r in rows if r["server"] == "llama-server" and r["clients"] == n]
            ratio = f"{rate / pooled_rate(native)[0]:.2f}" if native and kind != "llama-server" else "–"
            same = sum(r["ids"] == solo.get((kind, r["prompt"])) for r in got)
            agree = sum(r["ids"] == ref.get(r["prompt"]) for r in got)
            lat = [r["seconds"] for r in got]
            drafted, accepted = Counter(), Counter()
            for r in got:
                for name, counts in r.get("drafted", {}).items():
                    drafted[name] += counts[0]
                    accepted[name] += counts[1]
            shown = ", ".join(f"{name} {count}/{accepted[name]}" for name, count in sorted(drafted.items())) or "–"
            spent = Counter()                       # N = 1: no batched forwards, no figures
            for run in runs.values():
                spent.update(run.get("batch") or {})
            spent = (f"{spent['forward_seconds_decode']:.1f} / {spent['forward_seconds_prefill']:.1f} / "
                     f"{spent['gather_seconds']:.1f} of {sum(r['level_seconds'] for r in runs.values()):.1f}"
                     ) if spent.get("forwards") else "–"
            lines.append(f"| {kind} | {n} | {len(got)} | {rate:.1f}{f' ({each})' if each else ''} | {ratio} | "
                         f"{statistics.mean(lat):.2f} | {p95(lat):.2f} | {same}/{len(got)} | {agree}/{len(got)} | "
                         f"{shown} | {spent} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
