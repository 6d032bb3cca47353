"""Measuring one generation: a method on one prompt's token ids, timed, with its statistics.

`run_one` is the per-prompt hook every runner uses (`run_bench`, and scripts that set
other programs beside verispec, e.g. benchmarks/llamacpp/llama_speculative.py): it empties
the KV caches first, so every wall time includes its own prefill and no method profits
from a prefix another left behind, then runs the method once and returns the row fields.
"""

from __future__ import annotations

import os
import time

from .hf import hf_generate
from .methods import METHODS, BenchError, MethodSpec

__all__ = ["decoder_for", "run_one", "loadavg", "reset_models"]


def loadavg() -> float | None:
    """1-minute load average (other processes competing for the cores), None if unknown."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # pragma: no cover - not Unix
        return None


def reset_models(*models) -> None:
    """Hard-reset each model's cache (`CausalLM.reset`); None entries are skipped."""
    for model in models:
        if model is not None:
            model.reset()


def _spec(method: str | MethodSpec) -> MethodSpec:
    if isinstance(method, MethodSpec):
        return method
    if method not in METHODS:
        raise BenchError(f"--methods: unknown method {method!r}; choose from {', '.join(METHODS)}")
    return METHODS[method]


def decoder_for(method: str | MethodSpec, target, draft=None):
    """The `SpeculativeDecoder` that `run_one` runs `method` with.

    verispec methods: the method's drafter, with the draft model only when it needs one.
    HF methods: drafter "none", carrying the target and the draft for `generate`.

    Args:
        method: a name of `METHODS` or a `MethodSpec`.
        target, draft: loaded `CausalLM`s (draft may be None).

    Raises:
        BenchError: for an unknown method, or one that needs a draft model without one.
    """
    from ..api import SpeculativeDecoder

    spec = _spec(method)
    if spec.needs_draft and draft is None:
        raise BenchError(f"--methods: {method} needs a draft model (give --draft, or drop it)")
    if spec.kind == "hf":
        return SpeculativeDecoder(target, draft, drafter="none")
    return SpeculativeDecoder(target, draft if spec.needs_draft else None, drafter=spec.drafter)


def _run_verispec(decoder, ids: list[int], spec: MethodSpec, max_new_tokens: int, temperature: float,
                  seed: int) -> dict:
    k_hist: dict[str, int] = {}

    def observe(record) -> None:
        key = f"{record.drafter}:{record.k}" if record.k else "none:0"
        k_hist[key] = k_hist.get(key, 0) + 1

    start = time.perf_counter()
    res = decoder.generate(ids, max_new_tokens=max_new_tokens, temperature=temperature,
                           k=spec.k, seed=seed, observer=observe)
    wall = time.perf_counter() - start
    tokens, s = res.token_ids, res.stats
    return {
        "new_tokens": len(tokens), "wall_seconds": wall,
        "tokens_per_second": len(tokens) / wall if wall > 0 else None,
        "decode_seconds": s.wall_seconds, "prefill_seconds": s.prefill_seconds,
        "target_seconds": s.target_seconds, "draft_seconds": s.draft_seconds,
        "target_forwards": s.target_forwards, "draft_forwards": s.draft_forwards,
        "tau": s.tau, "draft_acceptance_rate": s.draft_acceptance_rate, "alpha_exact": s.alpha_exact,
        "drafted": s.drafted, "accepted": s.accepted, "alpha_sum": s.alpha_sum,
        "reached": list(s.reached), "per_position_acceptance": s.per_position_acceptance,
        "k_hist": dict(sorted(k_hist.items())), "by_drafter": s.by_drafter,
        "finish_reason": s.finish_reason, "token_ids": list(tokens), "text": res.text,
    }


def run_one(decoder, ids: list[int], method: str | MethodSpec, *, max_new_tokens: int,
            temperature: float = 0.0, seed: int = 0) -> dict:
    """One timed generation of `method` on the prompt `ids`, caches emptied first.

    Args:
        decoder: from `decoder_for(method, target, draft)` (a verispec method decodes
            with it, so its drafter must be the method's; an HF method uses its target
            and draft, which must be transformers models).
        ids: prompt token ids (chat template applied), the same for every method.
        method: a name of `METHODS` or a `MethodSpec`.
        max_new_tokens: token budget, >= 1.
        temperature: 0 = greedy; > 0 pure temperature sampling.
        seed: the generation's seed (sampling).

    Returns:
        The measurement's row fields: new_tokens (EOS included), wall_seconds (whole
        generation, prefill included), tokens_per_second, target_forwards,
        draft_forwards, tau (new tokens / target forwards), draft_acceptance_rate (α̂),
        alpha_exact, finish_reason, token_ids, text; verispec methods also drafted,
        accepted, alpha_sum, reached, per_position_acceptance, k_hist ({"drafter:k":
        rounds}), by_drafter and decode/prefill/target/draft seconds.

    Raises:
        BenchError: for an unknown method, a decoder whose drafter is not the method's,
            or an HF method on a model that is not a transformers one.
        Exception: whatever the generation raises (`run_bench` records it in the row).
    """
    spec = _spec(method)
    reset_models(decoder.target, decoder.draft)
    if spec.kind == "hf":
        return hf_generate(decoder.target, ids, mode=spec.drafter,
                           assistant=decoder.draft if spec.drafter == "assisted" else None,
                           max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    if decoder.drafter != spec.drafter:
        raise BenchError(f"method {method} drafts with {spec.drafter!r} but the decoder with "
                         f"{decoder.drafter!r}; build it with decoder_for({method!r}, target, draft)")
    return _run_verispec(decoder, ids, spec, max_new_tokens, temperature, seed)
