"""Running the benchmark: every method on every prompt, interleaved, one row each.

All methods run on the same prompts with the same models, loaded once, interleaved prompt
by prompt (plain first, the reference every greedy output is compared with; then the other
methods in an order rotated one place from prompt to prompt), so machine drift hits all
alike: with a fixed order, a method always fifth in a prompt's turn ran 8-14 % slower per
target forward than plain in two runs on a 2-core VM, which an interleaved rerun with the
order reversed did not reproduce (benchmarks/llamacpp-native/, bench-3 and bench-4). Measuring is
`run_one`'s (caches emptied first); this module only schedules, records errors, compares
greedy outputs with plain's and appends rows to the output directory (`results`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..prompts import Prompt
from .endpoint import ServerMethod
from .measure import decoder_for, loadavg, run_one
from .methods import BenchError, check_methods, default_methods
from .results import RESULTS, append_row, done_pairs, latest_rows, start_run

__all__ = ["run_bench"]


def _reset_quietly(*models) -> None:
    """Best-effort cache reset after a failed measurement (a second failure is ignored)."""
    for model in models:
        if model is not None:
            try:
                model.reset()
            except Exception:  # noqa: BLE001 - best effort after a failure
                pass


def _same_output(row: dict, plain_ids: list[int] | None, plain_text: str | None) -> bool | None:
    """Greedy identity with plain's output: token ids when both rows have them, else the
    texts (a server's rows carry text only), outer whitespace ignored; None if unknown."""
    if row.get("token_ids") is not None and plain_ids is not None:
        return row["token_ids"] == plain_ids
    if row.get("text") is not None and plain_text is not None:
        return row["text"].strip() == plain_text.strip()
    return None


def _progress(total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, file=sys.stderr, disable=not enabled, unit="gen", dynamic_ncols=True,
                desc="bench")


def _models(target, draft, backend: str | None):
    """(target, draft) as loaded `CausalLM`s from a decoder, models or specs."""
    from ..api import SpeculativeDecoder, load_model

    if isinstance(target, SpeculativeDecoder):
        target, draft = target.target, target.draft if draft is None else draft
    if isinstance(target, (str, os.PathLike)) and backend is None:
        raise BenchError("--backend is needed to load a model by name")
    target = load_model(target, backend=backend or "transformers")
    if draft is not None:
        draft = load_model(draft, backend=backend or "transformers")
    return target, draft


def method_order(methods: list[str], turn: int) -> list[str]:
    """The order `methods` run in on the `turn`-th prompt (0-based): "plain" first when
    present (every greedy output is compared with it), then the others rotated `turn`
    places, so over len(others) prompts each one runs in every position once.

    >>> method_order(["plain", "a", "b", "c"], 1)
    ['plain', 'b', 'c', 'a']
    """
    head = ["plain"] if "plain" in methods else []
    others = [m for m in methods if m != "plain"]
    shift = turn % len(others) if others else 0
    return head + others[shift:] + others[:shift]


def run_bench(questions: Sequence[Prompt], methods: Sequence[str] | None = None, *,
              target, draft=None, backend: str | None = None, max_new_tokens: int = 128,
              temperature: float = 0.0, seed: int = 0, out_dir: str | os.PathLike | None = None,
              resume: bool = False, overwrite: bool = False, meta: dict | None = None,
              warmup: bool = True, progress: bool = True,
              log: Callable[[str], None] | None = None,
              endpoints: Mapping[str, ServerMethod] | None = None) -> list[dict]:
    """Benchmark `methods` on `questions`, interleaved prompt by prompt.

    Args:
        questions: from `verispec.prompts.load_prompts` (the first turn of each is the
            prompt; it is encoded once with the target's chat template, and all methods
            get the same token ids).
        methods: names from `METHODS`; "plain" is added first if missing (it is
            every speedup's baseline). None: `default_methods(backend)`.
        target: a `SpeculativeDecoder` (its target and draft are used), a `CausalLM`
            or a model spec for `verispec.api.load_model`.
        draft: a `CausalLM`, a spec, or None (then methods needing it are refused).
        backend: for specs: "transformers" or "llamacpp"; for loaded models it is
            read from the model.
        max_new_tokens: token budget per generation, >= 1.
        temperature: 0 = greedy (then each method's output is compared with plain's).
        seed: seed of every generation (sampling only).
        out_dir: where results.jsonl / meta.json go (rows appended and flushed as
            they finish); None keeps results in memory only.
        resume: skip (question_id, method) pairs already measured successfully in
            out_dir (a prompt whose plain row exists runs only its missing methods).
        overwrite: start over when out_dir already holds results.
        meta: extra metadata for meta.json (e.g. {"command": ...}).
        warmup: one short unmeasured generation per method first.
        progress: a tqdm bar on stderr.
        log: called with notes (warm-up failures); default prints to stderr.
        endpoints: {method name: `ServerMethod`}: servers measured as more methods,
            interleaved with the others on the same prompts (token ids when a target
            is loaded; else the question's text as one chat message). With
            target=None only endpoints run, and one of them must be named "plain"
            (the baseline: the server without speculation).

    Returns:
        The latest row per (question_id, method), previous ones included on resume.
        Row fields: question_id, category (raw), groups (reported categories),
        method, turn (always 1), prompt_tokens, loadavg (1-minute load average just
        before the measurement), `run_one`'s fields (new_tokens, wall_seconds,
        tokens_per_second, target/draft forwards, tau, draft_acceptance_rate (α̂),
        alpha_exact, ..., token_ids, text), identical_to_plain (greedy: token ids
        equal plain's; else None), seed, error (None, or "Type: message" when this
        measurement raised; the run goes on).

    Raises:
        BenchError: for bad options (methods, budget, existing results without
            resume/overwrite, resume with different settings).
    """
    log = log or (lambda msg: print(msg, file=sys.stderr))
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise BenchError(f"--max-new-tokens must be an integer >= 1, got {max_new_tokens!r}")
    if temperature < 0:
        raise BenchError(f"--temperature must be >= 0, got {temperature!r}")
    if not questions:
        raise BenchError("no questions selected")
    endpoints = dict(endpoints or {})
    if target is None:      # only servers: no model in this process
        if "plain" not in endpoints:
            raise BenchError("--reference-endpoint (the endpoint named 'plain') is needed: "
                             "every speedup is measured against it")
        target_model = draft_model = None
        backend = "endpoint"
        methods = list(dict.fromkeys(["plain", *(m for m in methods or endpoints if m in endpoints)]))
        decoders: dict = {}
    else:
        if "plain" in endpoints:
            raise BenchError("an endpoint cannot be named 'plain' beside a loaded target "
                             "(plain is verispec's own k = 0 loop); rename it")
        target_model, draft_model = _models(target, draft, backend)
        backend = target_model.backend or type(target_model).__name__
        methods = check_methods([m for m in (methods if methods is not None
                                             else default_methods(backend, draft_model is not None))
                                 if m not in endpoints],
                                backend, draft_model is not None) + [m for m in endpoints if m != "plain"]
        decoders = {m: decoder_for(m, target_model, draft_model) for m in methods if m not in endpoints}

    out = Path(out_dir) if out_dir is not None else None
    settings = {"backend": backend,
                "target": target_model.name if target_model is not None else endpoints["plain"].url,
                "draft": draft_model.name if draft_model is not None else None,
                "max_new_tokens": max_new_tokens, "temperature": temperature, "seed": seed}
    if endpoints:
        settings["warm_prompt_cache"] = True     # see measure(): the report says so
    described = {m: e.description for m, e in endpoints.items() if e.description}
    if described:
        meta = {**(meta or {}), "method_descriptions": {**(meta or {}).get("method_descriptions", {}),
                                                        **described}}
    meta = {**(meta or {}), "method_order": "rotated"}     # `method_order`: the report says so
    previous = (start_run(out, settings, methods, resume=resume, overwrite=overwrite, meta=meta)
                if out is not None else [])
    done = done_pairs(previous)
    plain_tokens = {r["question_id"]: r["token_ids"] for r in latest_rows(previous)
                    if r["method"] == "plain" and not r.get("error") and "token_ids" in r}
    plain_texts = {r["question_id"]: r.get("text") for r in latest_rows(previous)
                   if r["method"] == "plain" and not r.get("error")}
    rows = list(previous)

    encoded: dict[int | str, list[int] | str] = {}
    errs: list[str] = []
    for q in questions:
        try:
            encoded[q.id] = decoders["plain"].encode(q.text) if decoders else q.text
        except Exception as e:  # noqa: BLE001 - recorded per prompt
            encoded[q.id] = f"{type(e).__name__}: {e}"
            errs.append(encoded[q.id])

    def measure(ids: list[int] | str, m: str, budget: int) -> dict:
        if m in endpoints:
            # an untimed 1-token request first: a server with a prefix cache (vLLM, llama-server,
            # verispec serve) then serves every timed request on a warm prompt, so plain,
            # plain-again and the spec-on server are timed alike and the A/A row measures noise,
            # not the cache (it read 1.25x on vLLM and 2.87x on verispec serve before)
            endpoints[m].generate(ids, max_new_tokens=1, temperature=temperature, seed=seed)
            return endpoints[m].generate(ids, max_new_tokens=budget, temperature=temperature, seed=seed)
        return run_one(decoders[m], ids, m, max_new_tokens=budget, temperature=temperature, seed=seed)

    todo = [(q, m) for i, q in enumerate(questions) for m in method_order(methods, i)
            if (q.id, m) not in done]
    results_file = (out / RESULTS).open("a", encoding="utf-8") if out is not None else None
    try:
        if warmup and todo:
            good = [v for v in encoded.values() if isinstance(v, (list, str)) and v not in errs]
            if good:
                ids = min(good, key=len)
                for m in methods:
                    if any(mm == m for _, mm in todo):
                        try:
                            measure(ids, m, min(8, max_new_tokens))
                        except Exception as e:  # noqa: BLE001
                            log(f"warm-up of {m} failed: {type(e).__name__}: {e}")
                            _reset_quietly(target_model, draft_model)

        bar = _progress(len(todo), progress)
        for q, m in todo:
            bar.set_postfix_str(f"q{q.id} {q.category} {m}", refresh=False)
            ids = encoded[q.id]
            row: dict[str, Any] = {"question_id": q.id, "category": q.category,
                                   "groups": list(q.groups), "method": m, "turn": 1,
                                   "prompt_tokens": len(ids) if isinstance(ids, list) else None,
                                   "endpoint": endpoints[m].url if m in endpoints else None,
                                   "loadavg": loadavg()}
            try:
                if ids in errs:
                    raise ValueError(ids)
                row.update(measure(ids, m, max_new_tokens))
                row["error"] = None
            except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                row.update({"new_tokens": 0, "wall_seconds": None, "tokens_per_second": None,
                            "error": f"{type(e).__name__}: {e}"})
                _reset_quietly(target_model, draft_model)
            if m == "plain" and not row["error"]:
                plain_tokens[q.id] = row.get("token_ids")
                plain_texts[q.id] = row.get("text")
            row["identical_to_plain"] = (_same_output(row, plain_tokens.get(q.id), plain_texts.get(q.id))
                                         if m != "plain" and temperature == 0 and not row["error"]
                                         else None)
            row["seed"] = seed
            rows.append(row)
            if results_file is not None:
                append_row(results_file, row)
            tps = row.get("tokens_per_second")
            bar.set_postfix_str(f"q{q.id} {m} " + (f"{tps:.1f} tok/s" if tps else "error"), refresh=False)
            bar.update(1)
        bar.close()
    finally:
        if results_file is not None:
            results_file.close()
    return latest_rows(rows)
