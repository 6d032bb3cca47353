"""The model backends behind the `CausalLM` protocol, in one table.

A new backend is one file in this package (a `CausalLM` subclass with an `open`
classmethod) plus one line in `BACKENDS`; nothing outside a backend knows its cache
layout or its loading options, and every face (API, CLI, server, planner) lists,
checks and explains backends from this table.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

from .base import CausalLM, eos_token_ids

__all__ = ["BACKENDS", "BackendKind", "CausalLM", "backend_class", "check_backend", "check_options",
           "default_backend", "eos_token_ids", "installed"]


@dataclass(frozen=True)
class BackendKind:
    """A registered backend.

    Attributes:
        path: "module:Class" of its `CausalLM` (imported on first use: a backend's
            package may be an optional extra).
        help: a few words for `--backend`'s help.
        package: the module its class needs (`importlib.util.find_spec` tells whether
            it is installed).
        label: how people call it ("llama.cpp"), in messages.
        options: the loading options its class's `open` takes (`verispec.api.load_model`'s
            device, num_hidden_layers, batch_invariant, n_threads, flash_attn).
        extra: the pip extra that installs it ("" when verispec's own requirements do).
        preferred_on: devices ("cpu", "cuda") where it is the default when installed.
    """

    path: str
    help: str
    package: str
    label: str
    options: tuple[str, ...] = ()
    extra: str = ""
    preferred_on: tuple[str, ...] = ()


BACKENDS: dict[str, BackendKind] = {
    "transformers": BackendKind("verispec.models.hf:HFModel", "Hugging Face transformers (CPU, CUDA)",
                                "transformers", "transformers", ("device", "num_hidden_layers"),
                                preferred_on=("cuda",)),
    "llamacpp": BackendKind("verispec.models.llamacpp:LlamaCppModel", "llama.cpp on a GGUF file (CPU)",
                            "llama_cpp", "llama.cpp", ("batch_invariant", "n_threads", "flash_attn"), extra="llamacpp",
                            preferred_on=("cpu",)),
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
    kind = BACKENDS[check_backend(name)]
    module, cls = kind.path.split(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError as e:
        hint = f"pip install 'verispec[{kind.extra}]'" if kind.extra else "pip install verispec"
        raise ImportError(f"backend {name!r} needs packages that are missing ({e}); {hint}") from e


def check_options(name: str, options: dict) -> None:
    """Raise ValueError naming the first of `options` backend `name` does not take (and
    the backend that does)."""
    kind = BACKENDS[check_backend(name)]
    for option in options:
        if option not in kind.options:
            owners = [n for n, k in BACKENDS.items() if option in k.options]
            where = (f"a {BACKENDS[owners[0]].label} option (backend={owners[0]!r})" if owners
                     else "not a loading option")
            raise ValueError(f"{option} is {where}; the {name} backend takes "
                             f"{', '.join(kind.options) or 'no options'}")


def installed(name: str) -> bool:
    """Whether backend `name`'s package can be imported."""
    return importlib.util.find_spec(BACKENDS[check_backend(name)].package) is not None


def default_backend(device: str | None = None) -> str:
    """The first installed backend preferred on `device` (None: "cuda" when torch sees
    a GPU, else "cpu"), else the first installed one, else the first in `BACKENDS`."""
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    ready = [name for name in BACKENDS if installed(name)]
    preferred = [name for name in ready if device in BACKENDS[name].preferred_on]
    return (preferred or ready or list(BACKENDS))[0]
