"""The model backends behind the `CausalLM` protocol, in one table.

A new backend is one file in this package plus one line in `BACKENDS`; nothing
outside a backend knows its cache layout.
"""

from __future__ import annotations

import importlib

from .base import CausalLM, eos_token_ids

__all__ = ["BACKENDS", "CausalLM", "backend_class", "check_backend", "eos_token_ids"]

#: backend name -> "module:class" (imported on first use: llama.cpp is an optional extra).
BACKENDS: dict[str, str] = {
    "transformers": "verispec.models.hf:HFModel",
    "llamacpp": "verispec.models.llamacpp:LlamaCppModel",
}


def check_backend(name: str) -> str:
    """Return `name` if it is a backend, else raise ValueError naming `backend`."""
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {name!r}")
    return name


def backend_class(name: str) -> type[CausalLM]:
    """The `CausalLM` class of backend `name`.

    Raises:
        ValueError: for an unknown backend.
        ImportError: with the install command when the backend's package is missing.
    """
    module, cls = BACKENDS[check_backend(name)].split(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError as e:
        extra = "llamacpp" if name == "llamacpp" else ""
        hint = f"pip install 'verispec[{extra}]'" if extra else "pip install verispec"
        raise ImportError(f"backend {name!r} needs packages that are missing ({e}); {hint}") from e
