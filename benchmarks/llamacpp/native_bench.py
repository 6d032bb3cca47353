"""verispec on llama.cpp against native llama.cpp, in one interleaved `bench` run.

Starts `llama-server` (built by build_llama_tools.sh, the llama.cpp verispec's backend runs)
three times on 127.0.0.1 with the same GGUFs and threads as verispec, and measures them as
bench methods beside verispec's own, prompt by prompt (`run_bench(endpoints=...)`):

    plain                  verispec, k = 0 (every speedup's baseline)
    plain-again            verispec, k = 0 again (A/A: the noise the ratios sit in)
    verispec*, ...         the verispec methods asked for (--methods)
    llama-server           native plain decoding (no speculation)
    llama-server-draft     --spec-type draft-simple --model-draft DRAFT (llama.cpp's defaults)
    llama-server-ngram     --spec-type ngram-simple

Repacking (`--repack auto`, the default): the servers run with llama.cpp's default repacked
weights unless this CPU reports AMX (`amx_tile` in /proc/cpuinfo), where llama.cpp puts the
weights in its AMX buffer and the VMs measured here do not grant the tiles (SIGILL), so there
they run `--no-repack`; verispec follows the same rule by itself (its batch-invariant mode keeps
repacked weights where its reference switch covers them and no AMX buffer would take them,
`verispec.models.llamacpp.exact_repack`). `--repack 0` / `1` forces both sides. Every server gets the chat-templated token ids verispec decodes (`/v1/completions` with a
token list, `cache_prompt: false` so each request is prefilled like every other row) and
greedy decoding; τ and α̂ come from llama-server's `timings` (draft_n, draft_n_accepted).
Servers are stopped on exit. Run it under the project's lock:

    flock /tmp/verispec-heavy.lock .venv/bin/python benchmarks/llamacpp/native_bench.py \
        --out benchmarks/llamacpp-native/bench --per-category 2
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx

from verispec import registry
from verispec.api import SpeculativeDecoder
from verispec.bench import run_bench, write_report
from verispec.bench.endpoint import ServerMethod
from verispec.models.llamacpp import LlamaCppModel
from verispec.prompts import DEFAULT_CATEGORIES, dataset_path, load_prompts

BUILD = Path(os.environ.get("VERISPEC_BUILD", Path.home() / ".cache/verispec/build")) / "llama.cpp-0c1e570"
SERVERS = {
    "llama-server": ([], "native llama.cpp llama-server, no speculation"),
    "llama-server-draft": (["--spec-type", "draft-simple", "--model-draft", "{draft}", "-td", "{threads}"],
                           "native llama-server --spec-type draft-simple --model-draft (draft model, "
                           "llama.cpp's default draft settings)"),
    "llama-server-ngram": (["--spec-type", "ngram-simple"], "native llama-server --spec-type ngram-simple"),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def served(cmd: list[str], url: str, log: Path, env: dict | None = None, ready_timeout: float = 300):
    """Run the server `cmd` (output to `log`) until `url`/health answers 200, and stop it on
    exit (terminate, then kill after 30 s). Raises SystemExit naming the log when it exits
    early or is not ready within `ready_timeout` seconds. Also used by benchmarks/serve/batch_bench.py."""
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + ready_timeout
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"{Path(cmd[0]).name} exited ({proc.returncode}); see {log}: {shlex.join(cmd)}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"{Path(cmd[0]).name} was not ready in {ready_timeout:g} s; see {log}")
            time.sleep(0.5)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def native_repack(choice: str = "auto") -> bool:
    """Whether the native tools run with llama.cpp's repacked weights (their default).

    Args:
        choice: "1" yes, "0" no (`--no-repack`), "auto": yes unless this CPU reports AMX
            (/proc/cpuinfo `amx_tile`), where llama.cpp takes the AMX buffer type and the VMs
            measured here fault on the first AMX instruction (SIGILL).

    Raises:
        SystemExit: naming --repack for any other value.
    """
    if choice not in ("auto", "0", "1"):
        raise SystemExit(f"--repack must be auto, 0 or 1, got {choice!r}")
    if choice != "auto":
        return choice == "1"
    try:
        return "amx_tile" not in Path("/proc/cpuinfo").read_text()
    except OSError:
        return True


def repack_env(repack: bool) -> dict[str, str]:
    """The environment that makes verispec follow the native tools' repacking
    (`VERISPEC_LLAMACPP_REPACK`): "1" lets its batch-invariant mode keep repacked weights
    where they are exact, "0" keeps them off as `--no-repack` does."""
    return {"VERISPEC_LLAMACPP_REPACK": "1" if repack else "0"}


@contextmanager
def llama_server(binary: Path, model: Path, extra: list[str], threads: int, n_ctx: int, log: Path,
                 repack: bool = True):
    """A llama-server on 127.0.0.1 (one slot, metrics on; `--no-repack` unless `repack`),
    stopped on exit; yields its URL and command line."""
    port = free_port()
    cmd = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
           "-tb", str(threads), "-c", str(n_ctx), "-np", "1", "--metrics",
           *([] if repack else ["--no-repack"]), *extra]
    url = f"http://127.0.0.1:{port}"
    with served(cmd, url, log):
        yield url, shlex.join(cmd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output directory (results.jsonl, table.md, ...)")
    ap.add_argument("--dataset", default=None, help="Spec-Bench question.jsonl (default: as `bench`)")
    ap.add_argument("--target", default=registry.DEFAULT_TARGET)
    ap.add_argument("--draft", default=registry.DEFAULT_DRAFT)
    ap.add_argument("--bin-dir", default=str(BUILD / "bin"))
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--categories", default=",".join(DEFAULT_CATEGORIES))
    ap.add_argument("--per-category", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--methods", default="plain-again,verispec,verispec-suffix,verispec-auto")
    ap.add_argument("--servers", default=",".join(SERVERS), help="which native rows (comma-separated)")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--repack", default="auto", help="repacked weights on both sides: auto (llama.cpp's "
                    "default unless the CPU reports AMX), 1 or 0 (--no-repack; default %(default)s)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # stop the servers on a kill too
    repack = native_repack(args.repack)
    os.environ.update(repack_env(repack))      # before verispec loads its models

    questions = load_prompts(dataset_path(args.dataset), args.categories.split(","), args.per_category)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t = registry.resolve(args.target, weights=False)
    d = registry.resolve(args.draft, weights=False)
    target = LlamaCppModel.load(str(t.gguf_path), tokenizer_path=t.hf_path, name=t.name, n_threads=args.threads)
    draft = LlamaCppModel.load(str(d.gguf_path), tokenizer_path=d.hf_path, name=d.name, n_threads=args.threads)
    binary = Path(args.bin_dir) / "llama-server"
    with ExitStack() as stack:
        endpoints, commands = {}, {}
        for name in args.servers.split(","):
            extra, description = SERVERS[name]
            extra = [a.format(draft=d.gguf_path, threads=args.threads) for a in extra]
            url, cmd = stack.enter_context(llama_server(binary, Path(t.gguf_path), extra, args.threads,
                                                        args.n_ctx, out / f"{name}.log", repack))
            endpoints[name] = ServerMethod(url, extra={"cache_prompt": False},
                                           description=description)
            commands[name] = cmd
        meta = {"command": "python " + shlex.join(sys.argv), "server_commands": commands,
                "per_category": args.per_category, "categories": args.categories.split(","),
                "threads": args.threads, "repack": repack, "verispec_extra_buffers": target.extra_buffers}
        run_bench(questions, args.methods.split(","), target=SpeculativeDecoder(target, draft),
                  backend="llamacpp", max_new_tokens=args.max_new_tokens, out_dir=out,
                  resume=args.resume, overwrite=not args.resume, meta=meta, endpoints=endpoints)
    sys.stdout.write(write_report(out))


if __name__ == "__main__":
    main()
