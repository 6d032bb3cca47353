"""`verispec generate`: one generation, streamed, with statistics (and --compare)."""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer

from .common import (BACKEND, BAD_WORD, BATCH_INVARIANT, DRAFT, DRAFTER, FREQUENCY_PENALTY, K_MAX, LOGIT_BIAS, THREADS,
                     MIN_NEW_TOKENS, MIN_P, PRESENCE_PENALTY, REPETITION_PENALTY, RULE, SUFFIX_CACHE_SIZE, TARGET,
                     bad_words_ids, build_decoder, check_rule, controls_from_options, err, fail, parse_k,
                     sampling_or_fail, stats_table)


def generate(
    prompt: str = typer.Argument(..., help="the prompt (chat template applied for instruct models)"),
    target: Optional[str] = TARGET,
    draft: Optional[str] = DRAFT,
    draft_layers: Optional[int] = typer.Option(None, "--draft-layers", min=1,
                                               help="keep only the draft's first N layers ('--draft self' uses the target's)"),
    k: str = typer.Option("auto", "--k", help="draft length per round, or 'auto' (adaptive, may choose 0)"),
    k_max: int = K_MAX,
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", help="exact token budget (>= 0)"),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy"),
    top_k: int = typer.Option(0, "--top-k", help="0 = off"),
    top_p: float = typer.Option(1.0, "--top-p", help="in (0, 1]; 1 = off"),
    seed: Optional[int] = typer.Option(None, "--seed", help="makes sampled output reproducible "
                                       "(unseeded runs print the seed they drew)"),
    rule: str = RULE,
    min_p: float = MIN_P,
    repetition_penalty: float = REPETITION_PENALTY,
    presence_penalty: float = PRESENCE_PENALTY,
    frequency_penalty: float = FREQUENCY_PENALTY,
    logit_bias: Optional[list[str]] = LOGIT_BIAS,
    bad_word: Optional[list[str]] = BAD_WORD,
    min_new_tokens: int = MIN_NEW_TOKENS,
    stop: Optional[list[str]] = typer.Option(None, "--stop", help="stop string (repeatable)"),
    no_chat_template: bool = typer.Option(False, "--no-chat-template", help="feed the prompt raw"),
    backend: Optional[str] = BACKEND,
    drafter: str = DRAFTER,
    suffix_cache_size: int = SUFFIX_CACHE_SIZE,
    as_json: bool = typer.Option(False, "--json", help="print one JSON object instead of text + table"),
    compare: bool = typer.Option(False, "--compare", help="also run plain decoding twice after it (the "
                                 "A/A pair) and report the speedup with the noise it sits in"),
    batch_invariant: Optional[bool] = BATCH_INVARIANT,
    threads: Optional[int] = THREADS,
) -> None:
    """Generate text exactly as the target would, faster."""
    k_value = parse_k(k)
    if not prompt.strip():   # checked before loading models (seconds to minutes)
        fail("PROMPT is empty: give some text to continue or answer")
    if max_new_tokens < 0:
        fail(f"--max-new-tokens must be >= 0 (0 returns nothing), got {max_new_tokens}")
    controls = controls_from_options(min_p, repetition_penalty, presence_penalty, frequency_penalty,
                                     logit_bias, min_new_tokens)
    sampling_or_fail(temperature, top_k, top_p, **controls)
    if min_new_tokens > max_new_tokens:
        fail(f"--min-new-tokens ({min_new_tokens}) must not exceed --max-new-tokens ({max_new_tokens})")
    check_rule(rule)
    if stop and any(not s for s in stop):
        fail("--stop needs a non-empty string")
    decoder, backend = build_decoder(target, draft, backend, drafter, draft_layers, suffix_cache_size,
                                     batch_invariant, k_max, threads)
    controls["bad_words_ids"] = bad_words_ids(decoder.tokenizer, bad_word)
    warm = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                use_chat_template=False if no_chat_template else None)
    kwargs = dict(warm, max_new_tokens=max_new_tokens, stop_strings=stop, rule=rule, **controls)
    try:
        # warm-up (with k=auto it also times this machine's target cost curve once)
        decoder.generate(prompt, **{**warm, "max_new_tokens": min(2, max_new_tokens), "k": k_value})
        on_text = None if as_json else (lambda t: (sys.stdout.write(t), sys.stdout.flush()))
        result = decoder.generate(prompt, k=k_value, on_text=on_text, **kwargs)
        # the same seed: with the coupled rule a sampled output is then plain's, token for token
        plains = [decoder.generate(prompt, k=0, **{**kwargs, "seed": result.stats.seed})
                  for _ in range(2 if compare else 0)]
        plain = plains[0] if plains else None
    except ValueError as e:
        fail(str(e))
    out = {"backend": backend, "target": decoder.target.name,
           "draft": decoder.draft.name if decoder.draft else None, "k": k_value, **result.as_dict()}
    if plain is not None:
        out["plain"] = {"tokens_per_second": plain.stats.tokens_per_second,
                        "wall_seconds": plain.stats.wall_seconds, "new_tokens": plain.stats.new_tokens,
                        "tokens_per_second_again": plains[1].stats.tokens_per_second}
        from ..bench.summary import compare_noise

        out.update(compare_noise(result.stats.tokens_per_second or 0.0,
                                 [p.stats.tokens_per_second or 0.0 for p in plains]))
        out["identical_to_plain"] = plain.token_ids == result.token_ids
        out["within_noise"] = out["within_noise"] or not result.stats.drafted
    if as_json:
        print(json.dumps(out, default=str))
        return
    sys.stdout.write("\n")
    err.print(f"backend: {backend}; target: {out['target']}; draft: {out['draft']}; k: {k_value}")
    err.print(stats_table(result))
    if plain is not None:
        same = out["identical_to_plain"]
        note = ("token-for-token identical to plain decoding" if same else
                "differs from plain decoding" + (" (sampled with the standard rule: equal in distribution, "
                                                 "not token for token)" if result.stats.rule == "standard"
                                                 and temperature > 0 else " (see docs/exactness.md on numerics)"))
        noise = (f"plain twice: {plain.stats.tokens_per_second:.2f} and "
                 f"{plains[1].stats.tokens_per_second:.2f} tok/s, so ratios within ±{out['noise']:.1%} are noise"
                 + ("; this one is" if out["within_noise"] else ""))
        if not result.stats.drafted:   # every round was plain: no ratio can be a speedup
            noise += "; nothing was drafted, so this run was plain decoding and its ratio is noise"
        err.print(f"speculative: {result.stats.tokens_per_second:.2f} tok/s; speedup "
                  f"{out['speedup']:.2f}x over plain ({noise}); {note}")

