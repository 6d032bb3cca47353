"""`verispec bench`: Spec-Bench side by side with plain decoding."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from .common import BACKEND, BATCH_INVARIANT, DRAFT, TARGET, build_decoder, default_backend, err, fail, sampling_or_fail

from ..bench.endpoint import ServerError, ServerMethod  # noqa: E402
from ..bench.methods import METHODS, default_methods, method_names, quick_methods  # noqa: E402 - help texts
from ..prompts import CATEGORY_FILES, DEFAULT_CATEGORIES, MT_BENCH_CATEGORIES


def bench(
    dataset: Optional[str] = typer.Option(None, "--dataset", help="Spec-Bench question.jsonl (default: "
                                          "$VERISPEC_SPEC_BENCH, else ../shared/data/spec_bench/question.jsonl "
                                          "next to the repository)"),
    categories: Optional[str] = typer.Option(None, "--categories", help="comma-separated: "
                                             f"{', '.join(DEFAULT_CATEGORIES)}, {', '.join(CATEGORY_FILES)} (shipped "
                                             "with verispec), or a raw MT-Bench category "
                                             f"({', '.join(MT_BENCH_CATEGORIES)}) (default: the first six)"),
    per_category: Optional[int] = typer.Option(None, "--per-category", help="prompts per category, "
                                               "first N in file order, multi-turn round-robin over MT-Bench's "
                                               "categories; 0 = all (default: 3; --quick: 1)"),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens",
                                                 help="budget per generation (default: 128; --quick: 64)"),
    methods: Optional[str] = typer.Option(None, "--methods", help=f"comma-separated: {method_names()} "
                                          f"(default: {', '.join(default_methods('llamacpp'))}, + "
                                          f"{', '.join(m for m in default_methods('transformers') if METHODS[m].kind == 'hf')}"
                                          " on transformers); plain is always run"),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy (outputs compared with plain)"),
    seed: int = typer.Option(0, "--seed", help="seed of every generation (sampling)"),
    out: Optional[str] = typer.Option(None, "--out", help="output directory (default: "
                                      "benchmarks/<backend>-<date>)"),
    backend: Optional[str] = BACKEND,
    target: Optional[str] = TARGET,
    draft: Optional[str] = DRAFT,
    quick: bool = typer.Option(False, "--quick", help="1 prompt per category, 64 new tokens, methods "
                               f"{','.join(quick_methods('llamacpp'))} (+"
                               f"{','.join(m for m in quick_methods('transformers') if METHODS[m].kind == 'hf')}"
                               " on transformers)"),
    resume: bool = typer.Option(False, "--resume", help="continue --out: skip (prompt, method) pairs "
                                "already measured"),
    force: bool = typer.Option(False, "--force", help="start over when --out already holds results"),
    report: Optional[str] = typer.Option(None, "--report", help="only rebuild table.md, summary.json and "
                                         "speedup.png in DIR from its results.jsonl (no models)"),
    table_only: bool = typer.Option(False, "--table-only", help="like --report, for the --out directory"),
    no_progress: bool = typer.Option(False, "--no-progress", help="no progress bar"),
    batch_invariant: Optional[bool] = BATCH_INVARIANT,
    endpoint: Optional[str] = typer.Option(None, "--endpoint", help="benchmark an OpenAI-compatible "
                                           "server (speculation on) at this URL instead of a local model"),
    reference_endpoint: Optional[str] = typer.Option(None, "--reference-endpoint", help="the same "
                                                     "server without speculation (the baseline); default: "
                                                     "--endpoint itself (an A/A run)"),
    endpoint_model: Optional[str] = typer.Option(None, "--endpoint-model", help="`model` field of "
                                                 "requests (default: the server's first /v1/models id)"),
) -> None:
    """Benchmark verispec against plain decoding on Spec-Bench (first turns), Spec-Bench-style tables."""
    import datetime
    import shlex
    from pathlib import Path

    from .. import bench as B
    from .. import registry
    from ..models import BACKENDS
    from .. import prompts

    if report is not None or table_only:
        where = report if report is not None else out
        if where is None:
            fail("--table-only needs --out DIR (or use --report DIR)")
        try:
            markdown = B.write_report(where)
        except B.BenchError as e:
            fail(str(e))
        sys.stdout.write(markdown)
        err.print(f"wrote {Path(where) / B.TABLE}, {B.SUMMARY}, {B.PLOT}")
        return

    if endpoint is None and reference_endpoint is not None:
        fail("--reference-endpoint needs --endpoint URL (the server with speculation on)")
    if endpoint is not None:
        backend = "endpoint"
    backend = backend or default_backend()
    if backend not in BACKENDS and endpoint is None:
        fail(f"--backend must be {' or '.join(BACKENDS)}, got {backend!r}")
    if per_category is None:
        per_category = 1 if quick else 3
    if max_new_tokens is None:
        max_new_tokens = 64 if quick else 128
    if max_new_tokens < 1:
        fail(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    sampling_or_fail(temperature, 0, 1.0)
    if resume and force:
        fail("--resume and --force contradict each other; choose one")
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        fail(f"--out {out} is a file; give a directory (it is created if missing)")
    if draft is None and target in (None, registry.DEFAULT_TARGET):
        draft = registry.DEFAULT_DRAFT
    if draft in ("none", ""):
        draft = None
    target = target or registry.DEFAULT_TARGET
    try:
        method_list = B.parse_list(methods)
        if endpoint is not None:
            method_list = ["plain", "plain-again", "endpoint"]
        else:
            if method_list is None:
                method_list = (B.quick_methods(backend, draft is not None) if quick
                               else B.default_methods(backend, draft is not None))
            method_list = B.check_methods(method_list, backend, draft is not None)
        category_list = B.parse_list(categories) or list(B.QUICK_CATEGORIES if quick else DEFAULT_CATEGORIES)
        dataset_path = prompts.dataset_path(dataset)
        questions = prompts.load_prompts(dataset_path, category_list, per_category)
    except FileNotFoundError as e:
        fail(f"--dataset: {e}")
    except ValueError as e:   # BenchError, PromptError: the message names the option
        fail(str(e))
    out_dir = Path(out) if out else Path("benchmarks") / f"{backend}-{datetime.date.today().isoformat()}"
    if (out_dir / B.RESULTS).is_file() and not (resume or force) and B.load_results(out_dir):
        fail(f"--out {out_dir} already holds {B.RESULTS}; pass --resume to continue that run, "
              "--force to start over, or another --out")
    err.print(f"bench: {len(questions)} prompts x {len(method_list)} methods ({', '.join(method_list)}), "
              f"{max_new_tokens} new tokens, backend {backend} -> {out_dir}")
    command = "verispec " + shlex.join(sys.argv[1:])
    meta = {"command": command, "dataset": str(dataset_path), "per_category": per_category,
            "categories": category_list, "quick": quick}
    endpoints = None
    if endpoint is not None:
        try:
            endpoints = _endpoints(endpoint, reference_endpoint, endpoint_model)
        except ValueError as e:
            fail(f"--endpoint: {e}")
        decoder = None
    else:
        decoder, backend = build_decoder(target, draft or "none", backend, "auto",
                                         batch_invariant=batch_invariant)
    try:
        B.run_bench(questions, method_list, target=decoder, backend=backend, endpoints=endpoints,
                    max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                    out_dir=out_dir, resume=resume, overwrite=force, meta=meta,
                    progress=not no_progress, log=lambda msg: err.print(f"[yellow]{msg}[/]"))
    except (B.BenchError, ServerError) as e:
        fail(str(e))
    except KeyboardInterrupt:
        err.print(f"interrupted; finished measurements are in {out_dir / B.RESULTS} (use --resume)")
        if B.load_results(out_dir):
            B.write_report(out_dir)
        raise typer.Exit(130)
    markdown = B.write_report(out_dir)
    sys.stdout.write(markdown)
    err.print(f"wrote {out_dir / B.RESULTS}, {B.TABLE}, {B.SUMMARY}, {B.PLOT}")



def _endpoints(url: str, reference: str | None, model: str | None) -> dict:
    """{"plain": the reference (or `url` again), "plain-again": the same (A/A), "endpoint": url}.

    Raises:
        ValueError: for a URL that is not http(s).
    """
    base = reference or url
    return {"plain": ServerMethod(base, model, description=f"{base} (the baseline: speculation off)"
                              if reference else f"{base} (the endpoint itself: no reference given)"),
            "plain-again": ServerMethod(base, model, description="the baseline again (A/A: the noise "
                                    "any ratio here sits in)"),
            "endpoint": ServerMethod(url, model, description=f"{url} (speculation on)")}
