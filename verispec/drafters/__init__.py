"""The drafters, in one table used by the API, the CLI and bench.

A new drafter is one file in this package plus one line in `DRAFTERS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..models.base import CausalLM
from .base import Drafter, DraftSampler, point_masses
from .lookup import LookupDrafter
from .model import ModelDrafter

__all__ = ["DRAFTERS", "DRAFTER_CHOICES", "Drafter", "DraftSampler", "DrafterKind",
           "LookupDrafter", "ModelDrafter", "build_drafters", "check_drafter_choice", "point_masses"]


@dataclass(frozen=True)
class DrafterKind:
    """A registered drafter.

    Attributes:
        needs_model: whether it drafts with a draft model (`make` gets it).
        make: builds a fresh drafter from the draft model (or None).
        help: one line for `--drafter`'s help.
    """

    needs_model: bool
    make: Callable[[CausalLM | None], Drafter]
    help: str


DRAFTERS: dict[str, DrafterKind] = {
    "model": DrafterKind(True, ModelDrafter, "a draft model sharing the target's tokenizer"),
    "lookup": DrafterKind(False, lambda _: LookupDrafter(), "prompt lookup (n-gram match, no model)"),
}

#: What `drafter=` accepts: one drafter, every usable one ("auto"), or none (plain decoding).
DRAFTER_CHOICES = ("auto", *DRAFTERS, "none")


def check_drafter_choice(choice: str, *, has_draft_model: bool) -> None:
    """Raise ValueError naming `drafter` unless `choice` is usable.

    Raises:
        ValueError: for an unknown name, or a model drafter without a draft model.
    """
    if choice not in DRAFTER_CHOICES:
        raise ValueError(f"drafter must be one of {', '.join(DRAFTER_CHOICES)}; got {choice!r}")
    if choice in DRAFTERS and DRAFTERS[choice].needs_model and not has_draft_model:
        raise ValueError(f"drafter={choice!r} needs a draft model: pass draft=... (--draft)")


def build_drafters(choice: str, draft_model: CausalLM | None) -> dict[str, Drafter]:
    """Fresh drafters for `choice` ("auto": every drafter usable with `draft_model`).

    Returns:
        name -> drafter, in `DRAFTERS` order (the first is a fixed k's drafter).

    Raises:
        ValueError: as `check_drafter_choice`.
    """
    check_drafter_choice(choice, has_draft_model=draft_model is not None)
    names = [n for n, kind in DRAFTERS.items() if not kind.needs_model or draft_model is not None] \
        if choice == "auto" else [] if choice == "none" else [choice]
    return {n: DRAFTERS[n].make(draft_model) for n in names}
