"""What every command shares: the error channel, option definitions, model loading, tables."""

from __future__ import annotations

from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

err = Console(stderr=True)


def fail(message: str) -> None:
    """Print `message` as an error on stderr and exit with status 2 (a usage error)."""
    err.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(2)


def sampling_or_fail(temperature: float, top_k: int, top_p: float):
    """SamplingConfig from the CLI options, or a clear error naming the option."""
    from ..sampling import SamplingConfig

    try:
        return SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    except ValueError as e:
        message = str(e)
        for name, flag in (("temperature", "--temperature"), ("top_k", "--top-k"), ("top_p", "--top-p")):
            message = message.replace(name, flag)
        fail(message)


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
BATCH_INVARIANT = typer.Option(None, "--batch-invariant/--no-batch-invariant",
                               help="llama.cpp: score a verification batch exactly as single tokens, so greedy "
                               "speculative output is plain greedy output token for token (default: on when the "
                               "installed llama.cpp allows it; docs/exactness.md)")


def build_decoder(target: Optional[str], draft: Optional[str], backend: Optional[str], drafter: str,
                  draft_layers: Optional[int] = None, batch_invariant: Optional[bool] = None):
    """Load target and draft for the CLI, turning library errors into clear messages."""
    from .. import registry
    from ..api import SpeculativeDecoder, load_model

    if drafter not in ("auto", "model", "lookup", "none"):
        fail(f"--drafter must be auto, model, lookup or none, got {drafter!r}")
    backend = backend or default_backend()
    if backend not in ("transformers", "llamacpp"):
        fail(f"--backend must be transformers or llamacpp, got {backend!r}")
    if batch_invariant and backend != "llamacpp":
        fail("--batch-invariant is a llama.cpp option; use it with --backend llamacpp")
    if draft is None and target in (None, registry.DEFAULT_TARGET) and drafter in ("auto", "model"):
        draft = registry.DEFAULT_DRAFT
    target = target or registry.DEFAULT_TARGET
    if draft in ("none", ""):
        draft = None
    try:
        with err.status(f"loading target {target} ({backend})"):
            target_model = load_model(target, backend=backend, batch_invariant=batch_invariant)
        draft_model = None
        if draft is not None and drafter in ("auto", "model"):
            with err.status(f"loading draft {draft} ({backend})"):
                if draft == "self":   # the target's first layers as its own draft
                    if draft_layers is None:
                        fail("--draft self needs --draft-layers N")
                    draft_model = load_model(target, backend=backend, num_hidden_layers=draft_layers,
                                             batch_invariant=batch_invariant)
                else:
                    draft_model = load_model(draft, backend=backend, num_hidden_layers=draft_layers,
                                             batch_invariant=batch_invariant)
        return SpeculativeDecoder(target_model, draft_model, drafter=drafter), backend
    except typer.Exit:
        raise
    except (ValueError, FileNotFoundError, PermissionError, OSError, RuntimeError, ImportError) as e:
        fail(str(e))


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

