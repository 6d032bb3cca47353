"""The benchmarked methods, in one table used by the CLI's help, its checks and the runner.

A method is verispec's own loop with one drafter choice and k (`kind="verispec"`), or
transformers' `generate` (`kind="hf"`: plain, assisted by the draft model, or prompt
lookup) for comparison. "plain" (verispec's loop with k = 0) is every speedup's baseline.
A new method is one line in `METHODS`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..prompts import DEFAULT_CATEGORIES

__all__ = ["BenchError", "MethodSpec", "METHODS", "QUICK_CATEGORIES", "parse_list", "method_names",
           "default_methods", "quick_methods", "check_methods"]

QUICK_CATEGORIES = DEFAULT_CATEGORIES   # --quick runs every Spec-Bench column, one prompt each


class BenchError(ValueError):
    """A bad benchmark option or input; the message names the option."""


@dataclass(frozen=True)
class MethodSpec:
    """How one benchmarked method decodes.

    Attributes:
        kind: "verispec" (our decode loop) or "hf" (transformers' `generate`).
        drafter: verispec: a `drafter=` choice of `SpeculativeDecoder` ("none", "model",
            "suffix", "lookup", "auto"); HF: "plain", "assisted" or "prompt-lookup".
        k: verispec draft length (int or "auto").
        needs_draft: needs the draft model.
        backends: backends it runs on (None = any).
        description: one line for the report.
        default: run when --methods is not given.
        quick: run by --quick.
    """

    kind: str
    drafter: str
    k: int | str = "auto"
    needs_draft: bool = False
    backends: tuple[str, ...] | None = None
    description: str = ""
    default: bool = True
    quick: bool = False


METHODS: dict[str, MethodSpec] = {
    "plain": MethodSpec("verispec", "none", 0, description="verispec loop, k = 0 (the baseline)",
                        quick=True),
    "plain-again": MethodSpec("verispec", "none", 0, default=False,
                              description="plain decoding again (A/A: the noise any ratio here sits in)"),
    "verispec": MethodSpec("verispec", "model", "auto", True, description="draft model, adaptive k",
                           quick=True),
    "verispec-k4": MethodSpec("verispec", "model", 4, True, description="draft model, fixed k = 4"),
    "verispec-lookup": MethodSpec("verispec", "lookup", "auto",
                                  description="prompt lookup only (no draft model), adaptive k"),
    "verispec-suffix": MethodSpec("verispec", "suffix", "auto",
                                  description="suffix decoding over prompt + output (no draft model, no "
                                  "cross-request cache), adaptive k"),
    "verispec-auto": MethodSpec("verispec", "auto", "auto", True,
                                description="draft model + suffix decoding + plain chosen per round, adaptive k",
                                quick=True),
    "hf-plain": MethodSpec("hf", "plain", backends=("transformers",),
                           description="transformers generate(), no assistant (sanity check)", default=False),
    "hf-assisted": MethodSpec("hf", "assisted", needs_draft=True, backends=("transformers",),
                              description="transformers generate(assistant_model=draft), HF defaults",
                              quick=True),
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


def method_names() -> str:
    """'plain, verispec, ...': every method, for help texts and error messages."""
    return ", ".join(METHODS)


def _runs_on(spec: MethodSpec, backend: str) -> bool:
    return spec.backends is None or backend in spec.backends


def default_methods(backend: str, has_draft: bool = True) -> list[str]:
    """Methods run when --methods is not given: every `default` one the backend (and the
    presence of a draft model) allows: all verispec ones, + HF's assisted and prompt
    lookup on transformers."""
    return [m for m, s in METHODS.items()
            if s.default and _runs_on(s, backend) and (has_draft or not s.needs_draft)]


def quick_methods(backend: str, has_draft: bool = True) -> list[str]:
    """The --quick preset's methods: plain, verispec, verispec-auto (+ hf-assisted on
    transformers); without a draft model, the model-free defaults (prompt lookup, suffix)."""
    if not has_draft:
        return default_methods(backend, has_draft=False)
    return [m for m, s in METHODS.items() if s.quick and _runs_on(s, backend)]


def check_methods(methods: Iterable[str], backend: str, has_draft: bool) -> list[str]:
    """Validate method names for a backend; return them with "plain" first (added if missing).

    Raises:
        BenchError: naming --methods for an empty list, an unknown method, one the
            backend cannot run (HF methods need the transformers backend) or one that
            needs a draft model when there is none.
    """
    methods = list(dict.fromkeys(methods))
    if not methods:
        raise BenchError("--methods is empty; choose from " + method_names())
    for m in methods:
        if m not in METHODS:
            raise BenchError(f"--methods: unknown method {m!r}; choose from {method_names()}")
        spec = METHODS[m]
        if not _runs_on(spec, backend):
            raise BenchError(f"--methods: {m} needs --backend {' or '.join(spec.backends)} "
                             f"(this run uses {backend})")
        if spec.needs_draft and not has_draft:
            raise BenchError(f"--methods: {m} needs a draft model (give --draft, or drop {m})")
    return ["plain"] + [m for m in methods if m != "plain"]
