"""What the llama-server measurement scripts share: their options, the prompts as the server
tokenises them, and the local reference on the served GGUF.

Used by `llama_server_logit_floor.py`, `llama_server_match.py` and `shared_prefix_repro.py`.
"""

from __future__ import annotations

import argparse
import os

import httpx

from verispec.prompts import read_prompt_file


def add_options(ap: argparse.ArgumentParser, *, url: str = "--url", m: int = 64) -> None:
    """The options every script takes: the server (`url`, its flag's name), --target,
    --prompts (files: plain text, one prompt a line, or Spec-Bench JSON lines), --m,
    --threads, --server-args and --out."""
    ap.add_argument(url, required=True, help="a llama-server's root, without /v1")
    ap.add_argument("--target", required=True, help="the served GGUF, loaded locally as the reference")
    ap.add_argument("--prompts", nargs="+", required=True,
                    help="prompt files: plain text (one prompt a line) or Spec-Bench JSON lines")
    ap.add_argument("--m", type=int, default=m, help="greedy tokens per prompt")
    ap.add_argument("--threads", type=int, default=2, help="the local reference's threads")
    ap.add_argument("--server-args", default="", help="how the server was started (recorded in the header)")
    ap.add_argument("--out", required=True, help="the output's path without its suffix")


def server_prompts(http: httpx.Client, url: str, paths: list[str]) -> list[list[int]]:
    """The first turn of every row of `paths` (`verispec.prompts.read_prompt_file`), as ids
    from the server's own ``/tokenize``."""
    texts = [p.text for path in paths for p in read_prompt_file(path)]
    return [http.post(url + "/tokenize", json={"content": t}).json()["tokens"] for t in texts]


def load_reference(target: str, threads: int, **options):
    """The served GGUF on verispec's llama.cpp backend, its weights unrepacked as the
    servers here run them (``--no-repack``; repacked AMX kernels SIGILL on this VM)."""
    os.environ.setdefault("VERISPEC_LLAMACPP_REPACK", "0")
    from verispec.api import load_model

    return load_model(target, backend="llamacpp", n_threads=threads, **options)


def top_logprobs(entry: dict) -> dict[int, float]:
    """{token id: logprob} of one position of a ``/completion`` answer's
    ``completion_probabilities`` (``n_probs`` with ``post_sampling_probs: false``: the
    log-softmax of the raw logits, so a difference of two is a logit gap)."""
    return {int(t["id"]): float(t["logprob"]) for t in entry["top_logprobs"]}
