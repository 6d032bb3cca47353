"""The drafters, in one table used by the API, the CLI and bench.

A new drafter is one file in this package plus one line in `DRAFTERS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..models.base import CausalLM
from .automaton import SuffixAutomaton
from .base import (Confidence, Drafter, DraftSampler, SupportsCalibrate, SupportsCatchup,
                   SupportsConfidences, point_masses)
from .lookup import LookupDrafter
from .model import ModelDrafter
from .suffix import SERVE_CACHE_TOKENS, SuffixCache, SuffixDrafter

__all__ = [
    "DRAFTERS",
    "DRAFTER_CHOICES",
    "SERVE_CACHE_TOKENS",
    "Confidence",
    "DraftSampler",
    "Drafter",
    "DrafterKind",
    "LookupDrafter",
    "ModelDrafter",
    "SuffixAutomaton",
    "SuffixCache",
    "SuffixDrafter",
    "SupportsCalibrate",
    "SupportsCatchup",
    "SupportsConfidences",
    "build_drafters",
    "check_drafter_choice",
    "drafter_choices",
    "drafter_names",
    "point_masses",
]


@dataclass(frozen=True)
class DrafterKind:
    """A registered drafter.

    Attributes:
        needs_model: whether it drafts with a draft model (`make` gets it).
        make: builds a fresh drafter from the draft model (or None) and the
            decoder's cache of earlier outputs (a `SuffixCache`, or None).
        help: one line for `--drafter`'s help.
        in_auto: whether drafter="auto" uses it.
    """

    needs_model: bool
    make: Callable[[CausalLM | None, SuffixCache | None], Drafter]
    help: str
    in_auto: bool = True


DRAFTERS: dict[str, DrafterKind] = {
    "model": DrafterKind(True, lambda model, cache: ModelDrafter(model),
                         "a draft model sharing the target's tokenizer"),
    "suffix": DrafterKind(False, lambda model, cache: SuffixDrafter(cache=cache),
                          "suffix decoding: the most frequent continuation of the longest "
                          "repeated suffix (prompt, output, earlier outputs; no model)"),
    # prompt lookup is the suffix drafter copying the most recent <= 4-gram match;
    # "auto" uses "suffix", which subsumes it
    "lookup": DrafterKind(False, lambda model, cache: LookupDrafter(),
                          "prompt lookup (copy after the last <= 4 tokens' latest match, no model)",
                          in_auto=False),
}

#: What `drafter=` accepts: one drafter, every usable one ("auto"), or none (plain decoding)
#: (as imported; `drafter_choices()` also lists drafters registered since).
DRAFTER_CHOICES = ("auto", *DRAFTERS, "none")


def drafter_choices() -> tuple[str, ...]:
    """What `drafter=` accepts now: "auto", every name in `DRAFTERS`, "none"."""
    return ("auto", *DRAFTERS, "none")


def check_drafter_choice(choice: str, *, has_draft_model: bool) -> None:
    """Raise ValueError naming `drafter` unless `choice` is usable.

    Raises:
        ValueError: for an unknown name, or a model drafter without a draft model.
    """
    if choice not in drafter_choices():
        raise ValueError(f"drafter must be one of {', '.join(drafter_choices())}; got {choice!r}")
    if choice in DRAFTERS and DRAFTERS[choice].needs_model and not has_draft_model:
        raise ValueError(f"drafter={choice!r} needs a draft model: pass draft=... (--draft)")


def drafter_names(choice: str, *, has_draft_model: bool) -> tuple[str, ...]:
    """The drafters `choice` uses, in `DRAFTERS` order (the first is a fixed k's drafter):
    "auto" is every `in_auto` drafter usable with or without a draft model, "none" none.

    Raises:
        ValueError: as `check_drafter_choice`.
    """
    check_drafter_choice(choice, has_draft_model=has_draft_model)
    if choice == "auto":
        return tuple(n for n, kind in DRAFTERS.items()
                     if kind.in_auto and (has_draft_model or not kind.needs_model))
    return () if choice == "none" else (choice,)


def build_drafters(choice: str, draft_model: CausalLM | None, *,
                   suffix_cache: SuffixCache | None = None) -> dict[str, Drafter]:
    """Fresh drafters for `choice` (those `drafter_names` lists).

    Args:
        choice: one of `DRAFTER_CHOICES`.
        draft_model: the draft model, or None.
        suffix_cache: earlier outputs for the suffix drafter to draft from, or None.

    Returns:
        name -> drafter, in `DRAFTERS` order (the first is a fixed k's drafter).

    Raises:
        ValueError: as `check_drafter_choice`.
    """
    names = drafter_names(choice, has_draft_model=draft_model is not None)
    return {n: DRAFTERS[n].make(draft_model, suffix_cache) for n in names}
