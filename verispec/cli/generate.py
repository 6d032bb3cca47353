"""`verispec generate`: one generation, streamed, with statistics (and --compare)."""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer

from .common import (BACKEND, BATCH_INVARIANT, DRAFT, DRAFTER, TARGET, build_decoder, err, fail,
                     parse_k, sampling_or_fail, stats_table)


def generate(
    prompt: str = typer.Argument(..., help="the prompt (chat template applied for instruct models)"),
    target: Optional[str] = TARGET,
    draft: Optional[str] = DRAFT,
    draft_layers: Optional[int] = typer.Option(None, "--draft-layers", min=1,
                                               help="keep only the draft's first N layers ('--draft self' uses the target's)"),
    k: str = typer.Option("auto", "--k", help="draft length per round, or 'auto' (adaptive, may choose 0)"),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", help="exact token budget (>= 0)"),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy"),
    top_k: int = typer.Option(0, "--top-k", help="0 = off"),
    top_p: float = typer.Option(1.0, "--top-p", help="in (0, 1]; 1 = off"),
    seed: Optional[int] = typer.Option(None, "--seed", help="makes sampled output reproducible"),
    stop: Optional[list[str]] = typer.Option(None, "--stop", help="stop string (repeatable)"),
    no_chat_template: bool = typer.Option(False, "--no-chat-template", help="feed the prompt raw"),
    backend: Optional[str] = BACKEND,
    drafter: str = DRAFTER,
    as_json: bool = typer.Option(False, "--json", help="print one JSON object instead of text + table"),
    compare: bool = typer.Option(False, "--compare", help="also run plain decoding and report the speedup"),
    batch_invariant: Optional[bool] = BATCH_INVARIANT,
) -> None:
    """Generate text exactly as the target would, faster."""
    k_value = parse_k(k)
    if not prompt.strip():   # checked before loading models (seconds to minutes)
        fail("PROMPT is empty: give some text to continue or answer")
    if max_new_tokens < 0:
        fail(f"--max-new-tokens must be >= 0 (0 returns nothing), got {max_new_tokens}")
    sampling_or_fail(temperature, top_k, top_p)
    if stop and any(not s for s in stop):
        fail("--stop needs a non-empty string")
    decoder, backend = build_decoder(target, draft, backend, drafter, draft_layers, batch_invariant)
    kwargs = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                  seed=seed, stop_strings=stop, use_chat_template=False if no_chat_template else None)
    try:
        # warm-up (with k=auto it also times this machine's target cost curve once)
        decoder.generate(prompt, **{**kwargs, "max_new_tokens": min(2, max_new_tokens), "k": k_value})
        on_text = None if as_json else (lambda t: (sys.stdout.write(t), sys.stdout.flush()))
        result = decoder.generate(prompt, k=k_value, on_text=on_text, **kwargs)
        plain = decoder.generate(prompt, k=0, **kwargs) if compare else None
    except ValueError as e:
        fail(str(e))
    out = {"backend": backend, "target": decoder.target.name,
           "draft": decoder.draft.name if decoder.draft else None, "k": k_value, **result.as_dict()}
    if plain is not None:
        speedup = (result.stats.tokens_per_second or 0) / (plain.stats.tokens_per_second or float("inf"))
        out["plain"] = {"tokens_per_second": plain.stats.tokens_per_second,
                        "wall_seconds": plain.stats.wall_seconds, "new_tokens": plain.stats.new_tokens}
        out["speedup"] = speedup
        out["identical_to_plain"] = plain.token_ids == result.token_ids
    if as_json:
        print(json.dumps(out, default=str))
        return
    sys.stdout.write("\n")
    err.print(f"backend: {backend}; target: {out['target']}; draft: {out['draft']}; k: {k_value}")
    err.print(stats_table(result))
    if plain is not None:
        same = out["identical_to_plain"]
        note = ("token-for-token identical to plain decoding" if same else
                "differs from plain decoding" + ("" if temperature > 0 else " (greedy: see docs on batch numerics)"))
        err.print(f"plain: {plain.stats.tokens_per_second:.2f} tok/s; speculative: "
                  f"{result.stats.tokens_per_second:.2f} tok/s; speedup {out['speedup']:.2f}x; {note}")

