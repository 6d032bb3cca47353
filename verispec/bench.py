"""Spec-Bench benchmark: verispec's methods against plain decoding (and HF's), one process.

All methods run on the same prompts with the same models, loaded once, interleaved
prompt by prompt (plain first, then each method), so machine drift hits all alike.
Every measurement resets the target's and the draft's KV caches first, so no
method profits from a prompt prefix another method left in the cache: every wall
time includes its own prefill.

Pipeline (each step is a plain function; `verispec bench` only parses options):

    questions = load_questions(resolve_dataset(None), ["qa", "multi-turn"], per_category=3)
    rows = run_bench(questions, ["plain", "verispec"], target=..., draft=..., out_dir=DIR)
    summary = summarize(rows)
    markdown = render_markdown(summary, meta)
    plot(summary, "speedup.png")
    write_report(DIR)           # the three above, from DIR/results.jsonl + DIR/meta.json

Files in the output directory:

* ``results.jsonl``: one JSON object per (prompt, method) measurement, appended and
  flushed right after it finishes (see `run_bench` for the fields). A later row for
  the same (question_id, method) supersedes an earlier one (resume after an error).
* ``meta.json``: command, machine, versions, models and settings of the run.
* ``summary.json``: ``{"meta": ..., "summary": summarize(rows)}``.
* ``table.md``: Spec-Bench-style tables (`render_markdown`).
* ``speedup.png``: bar chart of the speedups (`plot`).

Prompts: Spec-Bench's multi-turn (MT-Bench) rows are run on their FIRST turn only.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "SPEC_BENCH_CATEGORIES", "MT_BENCH_CATEGORIES", "MULTI_TURN", "DEFAULT_CATEGORIES",
    "METHODS", "QUICK_CATEGORIES", "Question", "MethodSpec", "BenchError",
    "resolve_dataset", "load_questions", "parse_list", "check_methods", "default_methods",
    "quick_methods", "run_bench", "load_results", "latest_rows", "done_pairs", "summarize",
    "render_markdown", "plot", "write_report", "collect_meta",
]

SPEC_BENCH_CATEGORIES = ("translation", "summarization", "qa", "math_reasoning", "rag")
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
                       "humanities")
MULTI_TURN = "multi-turn"
DEFAULT_CATEGORIES = (*SPEC_BENCH_CATEGORIES, MULTI_TURN)
QUICK_CATEGORIES = DEFAULT_CATEGORIES
_ALIASES = {"multi_turn": MULTI_TURN, "multiturn": MULTI_TURN, "mt-bench": MULTI_TURN,
            "mt_bench": MULTI_TURN}
# report order: Spec-Bench's columns, then any raw MT-Bench category selected on its own
_ORDER = {c: i for i, c in enumerate((*DEFAULT_CATEGORIES, *MT_BENCH_CATEGORIES))}
OVERALL = "overall"
DATASET_ENV = "VERISPEC_SPEC_BENCH"
RESULTS, META, SUMMARY, TABLE, PLOT = ("results.jsonl", "meta.json", "summary.json", "table.md",
                                       "speedup.png")


class BenchError(ValueError):
    """A bad benchmark option or input; the message names the option."""


# --------------------------------------------------------------------------- methods
@dataclass(frozen=True)
class MethodSpec:
    """How one benchmarked method decodes.

    Attributes:
        kind: "verispec" (our decode loop) or "hf" (transformers' `generate`).
        drafter: verispec drafter ("none", "model", "lookup", "auto"); HF: "plain",
            "assisted" or "prompt-lookup".
        k: verispec draft length (int or "auto").
        needs_draft: needs the draft model.
        backends: backends it runs on (None = any).
        description: one line for the report.
    """

    kind: str
    drafter: str
    k: int | str = "auto"
    needs_draft: bool = False
    backends: tuple[str, ...] | None = None
    description: str = ""


METHODS: dict[str, MethodSpec] = {
    "plain": MethodSpec("verispec", "none", 0, description="verispec loop, k = 0 (the baseline)"),
    "verispec": MethodSpec("verispec", "model", "auto", True,
                           description="draft model, adaptive k"),
    "verispec-k4": MethodSpec("verispec", "model", 4, True, description="draft model, fixed k = 4"),
    "verispec-lookup": MethodSpec("verispec", "lookup", "auto",
                                  description="prompt lookup only (no draft model), adaptive k"),
    "verispec-auto": MethodSpec("verispec", "auto", "auto", True,
                                description="model + lookup + plain chosen per round, adaptive k"),
    "hf-plain": MethodSpec("hf", "plain", backends=("transformers",),
                           description="transformers generate(), no assistant (sanity check)"),
    "hf-assisted": MethodSpec("hf", "assisted", needs_draft=True, backends=("transformers",),
                              description="transformers generate(assistant_model=draft), HF defaults"),
    "hf-prompt-lookup": MethodSpec("hf", "prompt-lookup", backends=("transformers",),
                                   description="transformers generate(prompt_lookup_num_tokens=10)"),
}


def parse_list(value: str | Sequence[str] | None) -> list[str] | None:
    """'a,b, c' (or a list of such strings) -> ['a', 'b', 'c']; None stays None."""
    if value is None:
        return None
    items = [value] if isinstance(value, str) else list(value)
    out = [part.strip() for item in items for part in item.split(",")]
    return [p for p in out if p]


def default_methods(backend: str, has_draft: bool = True) -> list[str]:
    """Methods run when --methods is not given: all verispec ones (+ HF's on transformers)."""
    names = ["plain", "verispec", "verispec-k4", "verispec-lookup", "verispec-auto"]
    if backend == "transformers":
        names += ["hf-assisted", "hf-prompt-lookup"]
    return [m for m in names if has_draft or not METHODS[m].needs_draft]


def quick_methods(backend: str) -> list[str]:
    """The --quick preset's methods: plain, verispec, verispec-auto (+ hf-assisted on transformers)."""
    names = ["plain", "verispec", "verispec-auto"]
    return names + (["hf-assisted"] if backend == "transformers" else [])


def check_methods(methods: Iterable[str], backend: str, has_draft: bool) -> list[str]:
    """Validate method names for a backend; return them with "plain" first (added if missing).

    Raises:
        BenchError: naming --methods for an unknown method, one the backend cannot
            run (HF methods need the transformers backend) or one that needs a
            draft model when there is none.
    """
    methods = list(dict.fromkeys(methods))
    if not methods:
        raise BenchError("--methods is empty; choose from " + ", ".join(METHODS))
    for m in methods:
        if m not in METHODS:
            raise BenchError(f"--methods: unknown method {m!r}; choose from {', '.join(METHODS)}")
        spec = METHODS[m]
        if spec.backends is not None and backend not in spec.backends:
            raise BenchError(f"--methods: {m} needs --backend {' or '.join(spec.backends)} "
                             f"(this run uses {backend})")
        if spec.needs_draft and not has_draft:
            raise BenchError(f"--methods: {m} needs a draft model (give --draft, or drop {m})")
    return ["plain"] + [m for m in methods if m != "plain"]


# --------------------------------------------------------------------------- questions
@dataclass(frozen=True)
class Question:
    """One selected Spec-Bench row.

    Attributes:
        question_id: the dataset's id.
        category: the dataset's (raw) category, e.g. "coding".
        turns: all user turns; only ``turns[0]`` is benchmarked.
        groups: the reported categories this row counts in (e.g. ("multi-turn",)
            or ("coding",), or both when both were selected).
    """

    question_id: int
    category: str
    turns: tuple[str, ...]
    groups: tuple[str, ...] = ()

    @property
    def prompt(self) -> str:
        """The benchmarked prompt: the first turn."""
        return self.turns[0]


def resolve_dataset(path: str | os.PathLike | None = None) -> Path:
    """Find Spec-Bench's question.jsonl.

    Order: `path` (the --dataset option), else the environment variable
    VERISPEC_SPEC_BENCH, else ``../shared/data/spec_bench/question.jsonl`` next to
    the repository holding this package (or next to the current directory).

    Raises:
        BenchError: naming --dataset and VERISPEC_SPEC_BENCH when no file exists.
    """
    if path is not None:
        p = Path(path).expanduser()
        if not p.is_file():
            raise BenchError(f"--dataset {path}: no such file")
        return p
    env = os.environ.get(DATASET_ENV)
    if env:
        p = Path(env).expanduser()
        if not p.is_file():
            raise BenchError(f"{DATASET_ENV}={env}: no such file (unset it or pass --dataset FILE)")
        return p
    relative = Path("..", "shared", "data", "spec_bench", "question.jsonl")
    candidates = [Path(__file__).resolve().parents[1] / relative, Path.cwd() / relative]
    for p in candidates:
        if p.is_file():
            return p.resolve()
    raise BenchError("no Spec-Bench dataset found: pass --dataset FILE (Spec-Bench's question.jsonl) "
                     f"or set {DATASET_ENV}; looked in " + ", ".join(str(c) for c in candidates))


def _canonical_category(name: str) -> str:
    name = name.strip()
    return _ALIASES.get(name.lower(), name)


def load_questions(path: str | os.PathLike, categories: Sequence[str] | None = None,
                   per_category: int = 3) -> list[Question]:
    """Read Spec-Bench rows and select the first `per_category` of each category.

    Args:
        path: a JSON-lines file with question_id, category and turns per row.
        categories: reported categories, in any order; Spec-Bench's five
            (translation, summarization, qa, math_reasoning, rag), "multi-turn"
            (the eight MT-Bench categories together) or any raw category of the
            file (e.g. "coding" on its own). None: the six Spec-Bench columns.
        per_category: rows per category, >= 1. Plain categories take their first
            rows in file order; "multi-turn" takes them round-robin over its
            sub-categories in file order (writing #1, roleplay #1, ..., humanities
            #1, writing #2, ...), so N <= 8 rows come from N different sub-categories.

    Returns:
        The selected questions, each once (grouped by category, in the order asked);
        a row selected by two categories (e.g. "coding" and "multi-turn") lists
        both in `groups`.

    Raises:
        BenchError: naming --per-category (N < 1), --categories (unknown, or
            absent from the file) or --dataset (unreadable, bad JSON, missing fields).
    """
    if isinstance(per_category, bool) or not isinstance(per_category, int) or per_category < 1:
        raise BenchError(f"--per-category must be an integer >= 1, got {per_category!r}")
    path = Path(path)
    if not path.is_file():
        raise BenchError(f"--dataset {path}: no such file")
    rows = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                turns = r["turns"]
                if isinstance(turns, str):
                    turns = [turns]
                if not turns or not all(isinstance(t, str) for t in turns):
                    raise ValueError("turns must be a non-empty list of strings")
                rows.append(Question(int(r["question_id"]), str(r["category"]), tuple(turns)))
            except (ValueError, KeyError, TypeError) as e:
                raise BenchError(f"--dataset {path}, line {lineno}: not a Spec-Bench row "
                                 f"(need question_id, category, turns): {e}") from e
    present = list(dict.fromkeys(r.category for r in rows))
    known = set(SPEC_BENCH_CATEGORIES) | set(MT_BENCH_CATEGORIES) | set(present) | {MULTI_TURN}
    asked = list(dict.fromkeys(_canonical_category(c) for c in (categories or DEFAULT_CATEGORIES)))
    if not asked:
        raise BenchError("--categories is empty")
    for c in asked:
        if c not in known:
            raise BenchError(f"--categories: unknown category {c!r}; choose from "
                             f"{', '.join((*DEFAULT_CATEGORIES, *MT_BENCH_CATEGORIES))}")

    chosen: dict[int, list[str]] = {}    # question_id -> groups, in selection order
    by_id = {r.question_id: r for r in rows}
    for c in asked:
        if c == MULTI_TURN:
            subs = [s for s in present if s in MT_BENCH_CATEGORIES]
            queues = [[r for r in rows if r.category == s] for s in subs]
            picked = []
            while len(picked) < per_category and any(queues):
                for q in queues:
                    if q and len(picked) < per_category:
                        picked.append(q.pop(0))
        else:
            picked = [r for r in rows if r.category == c][:per_category]
        if not picked:
            raise BenchError(f"--categories: {c!r} has no rows in {path}")
        for r in picked:
            chosen.setdefault(r.question_id, []).append(c)
    return [Question(qid, by_id[qid].category, by_id[qid].turns, tuple(groups))
            for qid, groups in chosen.items()]


# --------------------------------------------------------------------------- results files
def load_results(out_dir: str | os.PathLike) -> list[dict]:
    """All rows of DIR/results.jsonl in file order ([] when there is none).

    A truncated last line (an interrupted write) is skipped.

    Raises:
        BenchError: for a malformed line before the last.
    """
    path = Path(out_dir) / RESULTS
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:
                continue
            raise BenchError(f"{path}, line {i + 1}: not JSON ({e})") from e
    return rows


def latest_rows(rows: Iterable[dict]) -> list[dict]:
    """Keep the last row per (question_id, method), in first-appearance order."""
    latest: dict[tuple, dict] = {}
    for r in rows:
        latest[(r["question_id"], r["method"])] = r
    return list(latest.values())


def done_pairs(rows: Iterable[dict]) -> set[tuple[int, str]]:
    """(question_id, method) pairs with a successful measurement (latest row has no error)."""
    return {(r["question_id"], r["method"]) for r in latest_rows(rows) if not r.get("error")}


# --------------------------------------------------------------------------- metadata
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # noqa: BLE001 - not installed
        return None


def collect_meta(**settings: Any) -> dict:
    """Command-independent facts about this machine and software, plus `settings`.

    Returns:
        {"date", "loadavg_at_start", "machine": {cpu, cores, usable_cores, torch_threads, gpu, platform},
         "versions": {python, torch, transformers, llama-cpp-python, verispec}, **settings}.
    """
    import torch

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        usable = os.cpu_count()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    from . import __version__

    return {
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "loadavg_at_start": _loadavg(),
        "machine": {"cpu": _cpu_model(), "cores": os.cpu_count(), "usable_cores": usable,
                    "torch_threads": torch.get_num_threads(), "gpu": gpu,
                    "platform": platform.platform()},
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": _version("transformers"),
                     "llama-cpp-python": _version("llama-cpp-python"),
                     "verispec": _version("verispec") or __version__},
        **settings,
    }


# settings that must agree between a run and its --resume
_RESUME_KEYS = {"backend": "--backend", "target": "--target", "draft": "--draft",
                "max_new_tokens": "--max-new-tokens", "temperature": "--temperature",
                "seed": "--seed"}


# --------------------------------------------------------------------------- running
def _backend_of(model) -> str:
    return getattr(model, "backend", None) or type(model).__name__


class _ForwardCounter:
    """Counts calls of an nn.Module (HF generate's model forwards) while active."""

    def __init__(self, module) -> None:
        self.module, self.count, self.handle = module, 0, None

    def __enter__(self):
        if self.module is not None:
            self.handle = self.module.register_forward_pre_hook(self._hook)
        return self

    def _hook(self, *args) -> None:
        self.count += 1

    def __exit__(self, *exc) -> None:
        if self.handle is not None:
            self.handle.remove()


def _verispec_run(decoder, ids: list[int], spec: MethodSpec, max_new_tokens: int,
                  temperature: float, seed: int) -> dict:
    """One timed generation with our loop; returns the measurement fields."""
    k_hist: dict[str, int] = {}

    def observe(record) -> None:
        key = f"{record.drafter}:{record.k}" if record.k else "none:0"
        k_hist[key] = k_hist.get(key, 0) + 1

    for model in (decoder.target, decoder.draft):
        if model is not None:
            model.reset()
    start = time.perf_counter()
    res = decoder.generate(ids, max_new_tokens=max_new_tokens, temperature=temperature,
                           k=spec.k, seed=seed, observer=observe)
    wall = time.perf_counter() - start
    tokens, stats, text = res.token_ids, res.stats, res.text
    s = stats
    return {
        "new_tokens": len(tokens), "wall_seconds": wall,
        "tokens_per_second": len(tokens) / wall if wall > 0 else None,
        "decode_seconds": s.wall_seconds, "prefill_seconds": s.prefill_seconds,
        "target_seconds": s.target_seconds, "draft_seconds": s.draft_seconds,
        "target_forwards": s.target_forwards, "draft_forwards": s.draft_forwards,
        "tau": s.tau, "acceptance_rate": s.draft_acceptance_rate, "alpha_exact": s.alpha_exact,
        "drafted": s.drafted, "accepted": s.accepted, "alpha_sum": s.alpha_sum,
        "reached": list(s.reached), "per_position_acceptance": s.per_position_acceptance,
        "k_hist": dict(sorted(k_hist.items())), "by_drafter": s.by_drafter,
        "finish_reason": s.finish_reason, "token_ids": list(tokens), "text": text,
    }


def _hf_run(target, draft, ids: list[int], spec: MethodSpec, max_new_tokens: int,
            temperature: float, seed: int) -> dict:
    """One timed transformers `generate` call (greedy, or pure temperature sampling)."""
    import torch

    model = target.model
    eos = sorted(target.eos_token_ids)
    # explicit values: HF fills unset ones from the model's generation_config (e.g.
    # Qwen's sampling defaults, repetition_penalty) and its global top_k=50
    kwargs: dict[str, Any] = dict(
        max_new_tokens=max_new_tokens, do_sample=temperature > 0, repetition_penalty=1.0,
        eos_token_id=eos or None, pad_token_id=eos[0] if eos else None)
    if temperature > 0:   # pure temperature sampling, like ours with top_k=0, top_p=1
        kwargs.update(temperature=float(temperature), top_k=0, top_p=1.0)
    if spec.drafter == "assisted":
        kwargs["assistant_model"] = draft.model
    elif spec.drafter == "prompt-lookup":
        kwargs["prompt_lookup_num_tokens"] = 10
    device = getattr(target, "device", None) or next(model.parameters()).device
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)
    mask = torch.ones_like(input_ids)
    if temperature > 0:
        torch.manual_seed(seed)
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()   # HF's own deprecation notes would break the progress bar
    try:
        with _ForwardCounter(model) as t_count, \
                _ForwardCounter(draft.model if spec.drafter == "assisted" else None) as d_count, \
                torch.inference_mode():
            start = time.perf_counter()
            out = model.generate(input_ids, attention_mask=mask, **kwargs)
            wall = time.perf_counter() - start
    finally:
        hf_logging.set_verbosity(verbosity)
    new = [int(t) for t in out[0, len(ids):].tolist()]
    finish = "length"
    for i, t in enumerate(new):
        if t in target.eos_token_ids:
            new, finish = new[:i + 1], "eos"
            break
    tok = target.tokenizer
    return {
        "new_tokens": len(new), "wall_seconds": wall,
        "tokens_per_second": len(new) / wall if wall > 0 else None,
        "target_forwards": t_count.count, "draft_forwards": d_count.count,
        "tau": len(new) / t_count.count if t_count.count else None,
        "acceptance_rate": None, "alpha_exact": None, "k_hist": None, "by_drafter": None,
        "finish_reason": finish, "token_ids": new,
        "text": tok.decode(new, skip_special_tokens=True) if tok is not None else "",
    }


def run_bench(questions: Sequence[Question], methods: Sequence[str] | None = None, *,
              target, draft=None, backend: str | None = None, max_new_tokens: int = 128,
              temperature: float = 0.0, seed: int = 0, out_dir: str | os.PathLike | None = None,
              resume: bool = False, overwrite: bool = False, meta: dict | None = None,
              warmup: bool = True, progress: bool = True,
              log: Callable[[str], None] | None = None) -> list[dict]:
    """Benchmark `methods` on `questions`, interleaved prompt by prompt.

    Args:
        questions: from `load_questions` (the first turn of each is the prompt; it
            is encoded once with the target's chat template, and all methods get
            the same token ids).
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

    Returns:
        The latest row per (question_id, method), previous ones included on resume.
        Row fields: question_id, category (raw), groups (reported categories),
        method, prompt_tokens, new_tokens (EOS included), wall_seconds (whole
        generation, prefill included), tokens_per_second, target_forwards,
        draft_forwards, tau (new tokens / target forwards), acceptance_rate (α̂),
        alpha_exact, drafted, accepted, alpha_sum, reached, per_position_acceptance,
        k_hist ({"drafter:k": rounds}), by_drafter, decode/prefill/target/draft
        seconds (verispec methods), finish_reason, identical_to_plain (greedy:
        token ids equal plain's; else None), token_ids, text, seed, turn (always 1),
        loadavg (1-minute load average just before the measurement), error (None, or
        "Type: message" when this measurement raised; the run goes on).

    Raises:
        BenchError: for bad options (methods, budget, existing results without
            resume/overwrite, resume with different settings).
    """
    from .api import SpeculativeDecoder, load_model

    log = log or (lambda msg: print(msg, file=sys.stderr))
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise BenchError(f"--max-new-tokens must be an integer >= 1, got {max_new_tokens!r}")
    if temperature < 0:
        raise BenchError(f"--temperature must be >= 0, got {temperature!r}")
    if not questions:
        raise BenchError("no questions selected")

    if isinstance(target, SpeculativeDecoder):
        target_model, draft_model = target.target, target.draft if draft is None else draft
    else:
        target_model, draft_model = target, draft
    if isinstance(target_model, (str, os.PathLike)) and backend is None:
        raise BenchError("--backend is needed to load a model by name")
    target_model = load_model(target_model, backend=backend or "transformers")
    if draft_model is not None:
        draft_model = load_model(draft_model, backend=backend or "transformers")
    backend = _backend_of(target_model)
    methods = check_methods(methods if methods is not None
                            else default_methods(backend, draft_model is not None),
                            backend, draft_model is not None)

    decoders = {}
    for m in methods:
        spec = METHODS[m]
        if spec.kind == "verispec":
            decoders[m] = SpeculativeDecoder(target_model, draft_model if spec.needs_draft else None,
                                             drafter=spec.drafter)

    # -- output directory, resume ----------------------------------------------------
    previous: list[dict] = []
    out = Path(out_dir) if out_dir is not None else None
    settings = {"backend": backend, "target": target_model.name,
                "draft": draft_model.name if draft_model is not None else None,
                "max_new_tokens": max_new_tokens, "temperature": temperature, "seed": seed}
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        existing = load_results(out)
        if existing and not resume and not overwrite:
            raise BenchError(f"--out {out} already holds {RESULTS}; pass --resume to continue that "
                             "run, --force to start over, or another --out")
        old_meta = _read_json(out / META) if resume else None
        if resume and old_meta:
            for key, option in _RESUME_KEYS.items():
                if key in old_meta and old_meta[key] != settings[key]:
                    raise BenchError(f"--resume: {out} was run with {option} {old_meta[key]!r}, "
                                     f"not {settings[key]!r}; use the same settings or another --out")
        if resume:
            previous = existing
        else:
            (out / RESULTS).unlink(missing_ok=True)
        new_meta = collect_meta(**settings, **(meta or {}))
        new_meta["methods"] = list(dict.fromkeys((old_meta or {}).get("methods", []) + methods))
        new_meta["method_descriptions"] = {m: METHODS[m].description for m in new_meta["methods"]}
        new_meta["prompts"] = "first turn only"
        if old_meta:
            first = {k: v for k, v in old_meta.items() if k != "resumed"}
            new_meta = {**first, "methods": new_meta["methods"],
                        "method_descriptions": new_meta["method_descriptions"],
                        "resumed": old_meta.get("resumed", []) + [
                            {"date": new_meta["date"], "command": (meta or {}).get("command")}]}
        (out / META).write_text(json.dumps(new_meta, indent=2, default=str) + "\n", encoding="utf-8")

    done = done_pairs(previous) if resume else set()
    plain_tokens = {r["question_id"]: r["token_ids"] for r in latest_rows(previous)
                    if r["method"] == "plain" and not r.get("error") and "token_ids" in r}
    rows = list(previous)
    results_file = (out / RESULTS).open("a", encoding="utf-8") if out is not None else None

    # -- prompts --------------------------------------------------------------------
    encoder = decoders["plain"]
    encoded: dict[int, list[int] | str] = {}
    for q in questions:
        try:
            encoded[q.question_id] = encoder.encode(q.prompt)
        except Exception as e:  # noqa: BLE001 - recorded per prompt
            encoded[q.question_id] = f"{type(e).__name__}: {e}"

    def measure(ids: list[int], m: str, budget: int) -> dict:
        spec = METHODS[m]
        if spec.kind == "hf":
            for model in (target_model, draft_model):
                if model is not None:
                    model.reset()
            return _hf_run(target_model, draft_model, ids, spec, budget, temperature, seed)
        return _verispec_run(decoders[m], ids, spec, budget, temperature, seed)

    todo = [(q, m) for q in questions for m in methods if (q.question_id, m) not in done]
    try:
        if warmup and todo:
            good = [v for v in encoded.values() if isinstance(v, list)]
            if good:
                ids = min(good, key=len)
                for m in methods:
                    if any(mm == m for _, mm in todo):
                        try:
                            measure(ids, m, min(8, max_new_tokens))
                        except Exception as e:  # noqa: BLE001
                            log(f"warm-up of {m} failed: {type(e).__name__}: {e}")
                            _reset_all(target_model, draft_model)

        bar = _progress(len(todo), progress)
        for q, m in todo:
            bar.set_postfix_str(f"q{q.question_id} {q.category} {m}", refresh=False)
            ids = encoded[q.question_id]
            row: dict[str, Any] = {"question_id": q.question_id, "category": q.category,
                                   "groups": list(q.groups), "method": m, "turn": 1,
                                   "prompt_tokens": len(ids) if isinstance(ids, list) else None,
                                   "loadavg": _loadavg()}
            try:
                if not isinstance(ids, list):
                    raise ValueError(ids)
                row.update(measure(ids, m, max_new_tokens))
                row["error"] = None
            except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                row.update({"new_tokens": 0, "wall_seconds": None, "tokens_per_second": None,
                            "error": f"{type(e).__name__}: {e}"})
                _reset_all(target_model, draft_model)
            if m == "plain" and not row["error"]:
                plain_tokens[q.question_id] = row["token_ids"]
            reference = plain_tokens.get(q.question_id)
            row["identical_to_plain"] = (row["token_ids"] == reference
                                         if m != "plain" and temperature == 0 and not row["error"]
                                         and reference is not None else None)
            row["seed"] = seed
            rows.append(row)
            if results_file is not None:
                results_file.write(json.dumps(row, default=str) + "\n")
                results_file.flush()
            tps = row.get("tokens_per_second")
            bar.set_postfix_str(f"q{q.question_id} {m} " + (f"{tps:.1f} tok/s" if tps else "error"),
                                refresh=False)
            bar.update(1)
        bar.close()
    finally:
        if results_file is not None:
            results_file.close()
    return latest_rows(rows)


def _loadavg() -> float | None:
    """1-minute load average (other processes competing for the cores), None if unknown."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # pragma: no cover - not Unix
        return None


def _reset_all(*models) -> None:
    for model in models:
        if model is not None:
            try:
                model.reset()
            except Exception:  # noqa: BLE001 - best effort after a failure
                pass


def _progress(total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, file=sys.stderr, disable=not enabled, unit="gen", dynamic_ncols=True,
                desc="bench")


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


# --------------------------------------------------------------------------- summary
def _category_order(cats: Iterable[str]) -> list[str]:
    cats = list(dict.fromkeys(cats))
    return sorted(cats, key=lambda c: (_ORDER.get(c, len(_ORDER)), cats.index(c)))


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def summarize(rows: Iterable[dict], methods: Sequence[str] | None = None) -> dict:
    """Aggregate measurements per (method, category), Spec-Bench style.

    For method m and category c, P is the set of c's prompts where both plain and
    m succeeded (latest row per (question_id, method); "overall" pools every
    prompt once):

        tokens_per_second = Σ_P new_tokens_m / Σ_P wall_seconds_m
        speedup           = tokens_per_second_m / tokens_per_second_plain   (same P)
                          = Σ wall_plain / Σ wall_m when the outputs have equal length
        tau               = Σ_P new_tokens_m / Σ_P target_forwards_m   (plain: 1.00)
        acceptance_rate   = Σ accepted / Σ drafted (α̂); alpha_exact = Σ alpha_sum / Σ reached

    Args:
        rows: result rows (`run_bench` / results.jsonl).
        methods: the row order; default: methods in the rows, plain first.

    Returns:
        {"categories": [..., "overall"], "methods": [...], "cells": {method:
        {category: {prompts, tokens, seconds, tokens_per_second, plain_tokens,
        plain_seconds, plain_tokens_per_second, speedup, tau, acceptance_rate,
        alpha_exact, identical, compared, errors}}}, "loadavg": [min, max] over the rows
        (or None), "errors": [{question_id, category, method, error}]}; figures are None
        when undefined.
    """
    rows = latest_rows(rows)
    if methods is None:
        methods = list(dict.fromkeys(["plain"] + [r["method"] for r in rows]))
        if not any(r["method"] == "plain" for r in rows):
            methods = methods[1:]
    groups_of = {}
    for r in rows:
        groups_of.setdefault(r["question_id"], r.get("groups") or [r["category"]])
    categories = _category_order(g for gs in groups_of.values() for g in gs)
    ok = {(r["question_id"], r["method"]): r for r in rows if not r.get("error")}
    errors = [r for r in rows if r.get("error")]

    cells: dict[str, dict[str, dict]] = {}
    for m in methods:
        cells[m] = {}
        for c in [*categories, OVERALL]:
            qids = [q for q, gs in groups_of.items() if c == OVERALL or c in gs]
            pairs = [(ok[(q, m)], ok[(q, "plain")]) for q in qids
                     if (q, m) in ok and (q, "plain") in ok]
            mine = [r for r, _ in pairs]
            tokens = sum(r["new_tokens"] for r in mine)
            seconds = sum(r["wall_seconds"] for r in mine)
            p_tokens = sum(p["new_tokens"] for _, p in pairs)
            p_seconds = sum(p["wall_seconds"] for _, p in pairs)
            tps, p_tps = _ratio(tokens, seconds), _ratio(p_tokens, p_seconds)
            with_tau = [r for r in mine if r.get("target_forwards")]
            tau = (_ratio(sum(r["new_tokens"] for r in with_tau),
                          sum(r["target_forwards"] for r in with_tau)) if with_tau else None)
            drafted = sum(r.get("drafted") or 0 for r in mine)
            reached = sum(sum(r.get("reached") or []) for r in mine)
            compared = [r for r in mine if r.get("identical_to_plain") is not None]
            cells[m][c] = {
                "prompts": len(pairs), "tokens": tokens, "seconds": seconds,
                "tokens_per_second": tps, "plain_tokens": p_tokens, "plain_seconds": p_seconds,
                "plain_tokens_per_second": p_tps,
                "speedup": tps / p_tps if tps is not None and p_tps else None,
                "tau": tau,
                "acceptance_rate": _ratio(sum(r.get("accepted") or 0 for r in mine), drafted),
                "alpha_exact": _ratio(sum(r.get("alpha_sum") or 0.0 for r in mine), reached),
                "identical": sum(1 for r in compared if r["identical_to_plain"]),
                "compared": len(compared),
                "errors": sum(1 for r in errors if r["method"] == m
                              and (c == OVERALL or c in groups_of.get(r["question_id"], []))),
            }
    return {"categories": [*categories, OVERALL], "methods": list(methods), "cells": cells,
            "loadavg": _range(r.get("loadavg") for r in rows),
            "errors": [{k: r.get(k) for k in ("question_id", "category", "method", "error")}
                       for r in errors]}


def _range(values: Iterable) -> list[float] | None:
    values = [v for v in values if v is not None]
    return [min(values), max(values)] if values else None


def _fmt(v, spec: str, none: str = "–") -> str:
    return none if v is None else format(v, spec)


def _md_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join([":---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def render_markdown(summary: dict, meta: dict | None = None) -> str:
    """Spec-Bench-style markdown: header (command, machine, versions, settings,
    definitions) and tables of speedup× (τ), tokens/s, α and greedy-identical counts.

    Args:
        summary: from `summarize`.
        meta: from meta.json (`collect_meta` + settings); missing keys are skipped.
    """
    meta = meta or {}
    cats, methods, cells = summary["categories"], summary["methods"], summary["cells"]
    machine, versions = meta.get("machine", {}), meta.get("versions", {})
    temperature = meta.get("temperature")
    greedy = temperature in (0, 0.0)
    out = ["# verispec on Spec-Bench (first turn only)", ""]
    if meta.get("command"):
        out.append(f"- command: `{meta['command']}`")
    for r in meta.get("resumed", []):
        out.append(f"- resumed {r.get('date')}: `{r.get('command')}`")
    if meta.get("date"):
        out.append(f"- date: {meta['date']}")
    if machine:
        out.append(f"- machine: {machine.get('cpu')}, {machine.get('cores')} cores "
                   f"({machine.get('usable_cores')} usable), torch threads {machine.get('torch_threads')}"
                   + (f", GPU {machine['gpu']}" if machine.get("gpu") else ", no GPU"))
    if summary.get("loadavg"):
        lo, hi = summary["loadavg"]
        out.append(f"- 1-min load average before each measurement: {lo:.2f} to {hi:.2f} "
                   f"(above the core count means other processes competed for the CPU)")
    if versions:
        out.append("- versions: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v))
    if meta.get("backend"):
        out.append(f"- backend: {meta['backend']}; target: {meta.get('target')}; "
                   f"draft: {meta.get('draft')}")
    settings = [f"{k} {meta[k]}" for k in ("max_new_tokens", "temperature", "seed", "per_category")
                if k in meta]
    if settings:
        out.append("- settings: " + ", ".join(settings) + (" (greedy)" if greedy else " (sampling)"))
    if meta.get("dataset"):
        out.append(f"- dataset: {meta['dataset']}")
    if meta.get("method_descriptions"):
        out.append("- methods: " + "; ".join(f"`{m}` = {d}"
                                             for m, d in meta["method_descriptions"].items()))
    prompts = cells.get("plain", {}).get(OVERALL, {}).get("prompts")
    out += [
        "- prompts: the FIRST turn of each Spec-Bench row (multi-turn rows are not continued), "
        "chat template applied, identical token ids for every method; `multi-turn` = the "
        "MT-Bench categories (writing, roleplay, reasoning, math, coding, extraction, stem, "
        "humanities), rows picked round-robin over them in file order"
        + (f"; {prompts} prompts" if prompts is not None else ""),
        "- method order: per prompt, plain first, then each method (interleaved, models loaded "
        "once); KV caches emptied before every generation, so each wall time includes its prefill",
        "",
        "**Definitions.** For a method m and a category, over the category's prompts where both m "
        "and plain succeeded: speedup = (Σ new tokens_m / Σ wall seconds_m) / (Σ new tokens_plain / "
        "Σ wall seconds_plain), i.e. the ratio of aggregated tokens/s, which is Σ plain seconds / "
        "Σ m seconds when the outputs have the same length. Wall seconds cover the whole generation "
        "(prefill included); new tokens count up to and including EOS. "
        "τ = Σ new tokens / Σ target forwards (mean tokens per target forward; plain = 1.00; "
        "HF methods: forwards of the target module counted with a hook, prefill included; "
        "– = not available). `overall` pools every prompt once.",
        "",
        "## Speedup × (τ)",
        "",
    ]
    header = ["method", *cats]
    out.append(_md_table(header, [[m] + [
        (f"{_fmt(cells[m][c]['speedup'], '.2f')}× ({_fmt(cells[m][c]['tau'], '.2f')})"
         if cells[m][c]["prompts"] else "–") for c in cats] for m in methods]))
    out += ["", "## Throughput (tokens/s, aggregated)", ""]
    out.append(_md_table(header, [[m] + [_fmt(cells[m][c]["tokens_per_second"], ".2f")
                                         for c in cats] for m in methods]))
    out += ["", "## Acceptance α̂ / exact α (Σ min(p, q))", ""]
    out.append(_md_table(header, [[m] + [
        (f"{_fmt(cells[m][c]['acceptance_rate'], '.2f')} / {_fmt(cells[m][c]['alpha_exact'], '.2f')}"
         if cells[m][c]["acceptance_rate"] is not None else "–") for c in cats]
        for m in methods if m != "plain"]))
    out += ["", "## Greedy output identical to plain (identical / compared)", ""]
    if greedy or temperature is None:
        out.append(_md_table(header, [[m] + [
            (f"{cells[m][c]['identical']}/{cells[m][c]['compared']}"
             if cells[m][c]["compared"] else "–") for c in cats]
            for m in methods if m != "plain"]))
    else:
        out.append(f"n/a: sampling (temperature {temperature}); exactness is a distributional "
                   "property there (see `verispec audit`).")
    prompt_counts = [f"{c} {cells['plain'][c]['prompts']}" for c in cats] if "plain" in cells else []
    if prompt_counts:
        out += ["", "Prompts per category (with a plain measurement): " + ", ".join(prompt_counts) + "."]
    if summary.get("errors"):
        out += ["", "## Errors", ""]
        out += [f"- q{e['question_id']} ({e['category']}) {e['method']}: {e['error']}"
                for e in summary["errors"]]
    return "\n".join(out) + "\n"


def plot(summary: dict, path: str | os.PathLike) -> None:
    """Bar chart of speedup per category (+ overall) per non-plain method, line at 1.0.

    Uses matplotlib's Agg canvas directly (no display, no global pyplot state).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cats = summary["categories"]
    methods = [m for m in summary["methods"] if m != "plain"] or list(summary["methods"])
    fig = Figure(figsize=(max(6.0, 1.3 * len(cats) + 1.5), 4.2), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / max(1, len(methods))
    for i, m in enumerate(methods):
        values = [summary["cells"][m][c]["speedup"] or 0.0 for c in cats]
        xs = [j + (i - (len(methods) - 1) / 2) * width for j in range(len(cats))]
        bars = ax.bar(xs, values, width, label=m)
        for b, v in zip(bars, values):
            if v:
                ax.annotate(f"{v:.2f}", (b.get_x() + b.get_width() / 2, v), ha="center",
                            va="bottom", fontsize=7)
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--")
    ax.set_xticks(range(len(cats)))
    ax.set_xticklabels(cats, rotation=20, ha="right")
    ax.set_ylabel("speedup over plain (×)")
    ax.set_title("verispec on Spec-Bench (first turn)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(str(path))


def write_report(out_dir: str | os.PathLike) -> str:
    """Rebuild table.md, summary.json and speedup.png in DIR from results.jsonl (+ meta.json).

    Returns:
        The markdown.

    Raises:
        BenchError: naming DIR when it holds no results.
    """
    out = Path(out_dir)
    rows = load_results(out)
    if not rows:
        raise BenchError(f"--report {out}: no {RESULTS} with results there")
    meta = _read_json(out / META) or {}
    summary = summarize(rows, [m for m in meta.get("methods", [])
                               if any(r["method"] == m for r in rows)] or None)
    markdown = render_markdown(summary, meta)
    (out / TABLE).write_text(markdown, encoding="utf-8")
    (out / SUMMARY).write_text(json.dumps({"meta": meta, "summary": summary}, indent=2,
                                          default=str) + "\n", encoding="utf-8")
    plot(summary, out / PLOT)
    return markdown
