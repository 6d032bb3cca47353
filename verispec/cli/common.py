"""What every command shares: the error channel, option definitions, model loading, tables."""

from __future__ import annotations

from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from ..drafters import DRAFTER_CHOICES, DRAFTERS, check_drafter_choice
from ..models import BACKENDS, check_backend, default_backend
from ..verify import RULES

err = Console(stderr=True)


def fail(message: str) -> None:
    """Print `message` as an error on stderr and exit with status 2 (a usage error)."""
    err.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(2)


def sampling_or_fail(temperature: float, top_k: int, top_p: float, **controls):
    """SamplingConfig from the CLI options, or a clear error naming the option.

    Args:
        temperature, top_k, top_p: the warps.
        **controls: `SamplingConfig` control fields (min_p, repetition_penalty, ...),
            as `controls_from_options` returns them.
    """
    from ..sampling import SamplingConfig, SettingError

    try:
        return SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, **controls)
    except SettingError as e:     # names its field: spell it as the option it came from
        option = "--" + e.name.replace("_", "-")
        message = str(e)
        fail(option + message[len(e.name):] if message.startswith(e.name) else f"{option}: {message}")


# The sampling controls' options, shared by every command that samples.
MIN_P = typer.Option(0.0, "--min-p", help="keep tokens with p >= min_p * max p; 0 = off")
REPETITION_PENALTY = typer.Option(1.0, "--repetition-penalty",
                                  help="in [0.01, 100]; divides positive / multiplies negative logits of seen ids; 1 = off")
PRESENCE_PENALTY = typer.Option(0.0, "--presence-penalty", help="in [-2, 2], over generated tokens; 0 = off")
FREQUENCY_PENALTY = typer.Option(0.0, "--frequency-penalty", help="in [-2, 2], over generated tokens; 0 = off")
LOGIT_BIAS = typer.Option(None, "--logit-bias", help="ID=BIAS added to that token's logit (repeatable)")
BAD_WORD = typer.Option(None, "--bad-word", help="text never generated (tokenized; repeatable)")
MIN_NEW_TOKENS = typer.Option(0, "--min-new-tokens", help="no EOS or stop string before this many tokens")


def controls_from_options(min_p: float = 0.0, repetition_penalty: float = 1.0,
                          presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                          logit_bias: Optional[list[str]] = None, min_new_tokens: int = 0) -> dict:
    """The control keyword arguments (for `SpeculativeDecoder.generate` and
    `SamplingConfig`) from CLI options; `--logit-bias ID=BIAS` parsed, or a clear error."""
    bias: dict[int, float] = {}
    for item in logit_bias or []:
        tok, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError
            bias[int(tok)] = float(value)
        except ValueError:
            fail(f"--logit-bias takes ID=BIAS (e.g. 198=-5), got {item!r}")
    return dict(min_p=min_p, repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
                frequency_penalty=frequency_penalty, logit_bias=bias, min_new_tokens=min_new_tokens)


def bad_words_ids(tokenizer, words: Optional[list[str]]) -> list[list[int]]:
    """Token-id sequences banning each word, with and without a leading space (as HF's
    docs advise for `bad_words_ids`); a clear error for an empty word or no tokenizer."""
    out: list[list[int]] = []
    for word in words or []:
        if not word:
            fail("--bad-word needs a non-empty string")
        if tokenizer is None:
            fail("--bad-word needs a model with a tokenizer")
        for text in (word, " " + word):
            ids = tokenizer.encode(text, add_special_tokens=False)
            if ids and ids not in out:
                out.append(ids)
    return out


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


def _choices(names, helps) -> str:
    return "; ".join(f"{n}: {h}" if h else n for n, h in zip(names, helps))


TARGET = typer.Option(None, "--target", help="registered name, HF directory, .gguf file or hub id "
                      "(default: qwen2.5-coder-1.5b)")
DRAFT = typer.Option(None, "--draft", help="draft model (same tokenizer as the target) "
                     "(default: qwen2.5-coder-0.5b when the target is the default); 'none' for no draft model")
BACKEND = typer.Option(None, "--backend", metavar="NAME", help=_choices(
    BACKENDS, [k.help for k in BACKENDS.values()]) + " (default: the one preferred on this device "
    f"and installed: {', '.join(f'{n} on {d}' for n, k in BACKENDS.items() for d in k.preferred_on)})")
DRAFTER = typer.Option("auto", "--drafter", metavar="NAME", help=_choices(
    DRAFTER_CHOICES, ["every usable drafter: " + ", ".join(n for n, k in DRAFTERS.items() if k.in_auto)]
    + [k.help for k in DRAFTERS.values()] + ["plain decoding"]))
RULE = typer.Option("auto", "--rule", metavar="NAME", help="acceptance rule: auto (the coupled rule "
                    "with --k auto or point-mass drafters, else the standard one), or "
                    + ", ".join(RULES) + " (verispec.verify.RULES)")
K_MAX = typer.Option(8, "--k-max", min=1, help="largest draft length --k auto considers")
SUFFIX_CACHE_SIZE = typer.Option(0, "--suffix-cache-size", min=0,
                                 help="tokens of earlier outputs the suffix drafter also drafts from "
                                 "(whole outputs, least recently used evicted; ~1 KB each); 0 = off")


def check_rule(rule: str) -> str:
    """`rule` if it is "auto" or a name in `verispec.verify.RULES`, else a clear error."""
    if rule != "auto" and rule not in RULES:
        fail(f"--rule must be auto or one of {', '.join(RULES)}, got {rule!r}")
    return rule


BATCH_INVARIANT = typer.Option(None, "--batch-invariant/--no-batch-invariant",
                               help="llama.cpp: score a verification batch exactly as single tokens, so greedy "
                               "speculative output is plain greedy output token for token (default: on when the "
                               "installed llama.cpp allows it; docs/exactness.md)")
THREADS = typer.Option(None, "--threads", min=1,
                       help="llama.cpp: CPU threads of the target and draft (default: all cores; on a "
                       "machine shared with other jobs, fewer threads avoid spin-waiting on busy cores)")


def build_decoder(target: Optional[str], draft: Optional[str], backend: Optional[str], drafter: str,
                  draft_layers: Optional[int] = None, suffix_cache_size: int = 0,
                  batch_invariant: Optional[bool] = None, k_max: int = 8, threads: Optional[int] = None):
    """Load target and draft for the CLI, turning library errors into clear messages.

    `threads` (llama.cpp's n_threads, None = all cores) is refused with a clear message on a
    backend that does not take it."""
    from .. import registry
    from ..api import SpeculativeDecoder, load_model

    try:
        check_drafter_choice(drafter, has_draft_model=True)
    except ValueError as e:
        fail(f"--{e}")
    if suffix_cache_size < 0:
        fail(f"--suffix-cache-size must be >= 0 tokens (0 = off), got {suffix_cache_size}")
    backend = backend or default_backend()
    try:
        check_backend(backend)
    except ValueError as e:
        fail(f"--{e}")
    if batch_invariant and "batch_invariant" not in BACKENDS[backend].options:
        fail(f"--batch-invariant is not an option of the {backend} backend; use it with --backend "
             + " or ".join(n for n, k in BACKENDS.items() if "batch_invariant" in k.options))
    if threads is not None and "n_threads" not in BACKENDS[backend].options:
        fail(f"--threads is not an option of the {backend} backend; use it with --backend "
             + " or ".join(n for n, k in BACKENDS.items() if "n_threads" in k.options))
    loading = {} if threads is None else {"n_threads": threads}
    uses_model = drafter == "auto" or (drafter in DRAFTERS and DRAFTERS[drafter].needs_model)
    if draft is None and target in (None, registry.DEFAULT_TARGET) and uses_model:
        draft = registry.DEFAULT_DRAFT
    target = target or registry.DEFAULT_TARGET
    if draft in ("none", ""):
        draft = None
    try:
        with err.status(f"loading target {target} ({backend})"):
            target_model = load_model(target, backend=backend, batch_invariant=batch_invariant, **loading)
        draft_model = None
        if draft is not None and uses_model:
            with err.status(f"loading draft {draft} ({backend})"):
                if draft == "self":   # the target's first layers as its own draft
                    if draft_layers is None:
                        fail("--draft self needs --draft-layers N")
                    draft_model = load_model(target, backend=backend, num_hidden_layers=draft_layers,
                                             batch_invariant=batch_invariant, **loading)
                else:
                    draft_model = load_model(draft, backend=backend, num_hidden_layers=draft_layers,
                                             batch_invariant=batch_invariant, **loading)
        return SpeculativeDecoder(target_model, draft_model, drafter=drafter,
                                  suffix_cache_size=suffix_cache_size, k_max=k_max), backend
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
        ("draft acceptance rate α̂", fmt(s.draft_acceptance_rate)),
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
        ("acceptance rule; seed (replays the sample)", f"{s.rule}; {s.seed}"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table

