"""Resolution: turn what a user typed as a model into something ``from_pretrained`` loads.

A model spec is, in the order tried: a registered name (fetched and converted on first use),
an existing Hugging Face model directory, an existing ``.gguf`` file (converted once into the
cache), or a hub id ``org/name`` (passed through).  :func:`resolve` returns a
:class:`ResolvedModel` saying which it was, or raises an error that names the spec and says
what to do instead.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .cache import cache_dir, read_convert_marker
from .catalogue import REGISTRY, UnknownModelError, gguf_path, hf_dir, is_converted, is_fetched, unknown_model_message
from .conversion import check_gguf_file, convert, convert_gguf_file, local_dir
from .fetching import fetch
from .tokenizers import ensure_tokenizer, registered_tokenizer_dir


class ModelNotFetchedError(RuntimeError):
    """A registered model is not in the cache and fetching was not allowed."""


@dataclass
class ResolvedModel:
    """What :func:`resolve` found.

    ``kind`` is one of ``"registered"``, ``"hf_dir"``, ``"gguf_file"``, ``"hub_id"``;
    ``hf_path`` is a local directory or a hub id usable with ``from_pretrained``;
    ``gguf_path`` is the source GGUF when there is one; ``chat`` says whether the tokenizer
    has a chat template (``None`` when unknown, e.g. for hub ids).
    """

    kind: str
    name: str
    hf_path: str
    gguf_path: Path | None = None
    chat: bool | None = None
    info: dict[str, Any] = field(default_factory=dict, repr=False)


def resolve(spec: str, fetch_missing: bool = True, progress: bool = True,
            weights: bool = True) -> ResolvedModel:
    """Turn a user model spec into something ``from_pretrained`` can load.

    ``weights=False`` is for a backend that reads the GGUF itself (llama.cpp): a registered
    name or ``.gguf`` file is then never converted to float32; ``hf_path`` is a tokenizer-only
    directory built from the GGUF's metadata (:mod:`.tokenizers`; a full conversion already
    in the cache is used as it is).

    Rules, in order:

    * a registered name (see :data:`REGISTRY`) -> ``kind="registered"``; fetched and converted
      if missing (minutes, network).  With ``fetch_missing=False`` a missing model raises
      :class:`ModelNotFetchedError` telling to run ``verispec models fetch NAME``;
    * an existing directory -> ``"hf_dir"``; it must contain ``config.json`` (else
      ``ValueError`` naming the path and what is missing);
    * an existing ``*.gguf`` file -> ``"gguf_file"``; converted once into the cache (see
      :func:`convert_gguf_file`; this is local work and happens regardless of
      ``fetch_missing``);
    * a path-looking string (contains a path separator, starts with ``.`` or ``~``, or ends in
      ``.gguf``) that does not exist -> ``FileNotFoundError`` naming it, except that a string
      of the form ``org/name`` is taken as
    * a hub id -> ``"hub_id"``, passed through unchanged;
    * anything else -> :class:`UnknownModelError` listing the registered names.

    A path that exists but cannot be read raises ``PermissionError`` with the path.
    ``progress`` shows download/conversion progress on stderr when work is needed."""
    if not isinstance(spec, str) or not spec.strip():
        raise UnknownModelError(unknown_model_message(str(spec)))
    spec = spec.strip()

    if spec in REGISTRY:
        m = REGISTRY[spec]
        if not weights and not is_converted(m.name):
            if not is_fetched(m.name) and not fetch_missing:
                raise ModelNotFetchedError(
                    f"model {m.name!r} is registered but not downloaded yet (cache: {cache_dir()}); "
                    f"run `verispec models fetch {m.name}` first")
            g = fetch(m.name, progress=progress)
            d = ensure_tokenizer(g, registered_tokenizer_dir(m.name), spec=m, label=m.name, progress=progress)
            return ResolvedModel(kind="registered", name=m.name, hf_path=str(d), gguf_path=g,
                                 chat=m.chat, info=read_convert_marker(d) or {})
        if not is_converted(m.name):
            if not fetch_missing:
                state = "downloaded but not converted" if is_fetched(m.name) else "not downloaded"
                raise ModelNotFetchedError(
                    f"model {m.name!r} is registered but {state} yet (cache: {cache_dir()}); "
                    f"run `verispec models fetch --convert {m.name}` first"
                )
            convert(m.name, progress=progress)
        d = hf_dir(m.name)
        g = gguf_path(m.name)
        return ResolvedModel(
            kind="registered", name=m.name, hf_path=str(d),
            gguf_path=g if g.exists() else None, chat=m.chat, info=read_convert_marker(d) or {},
        )

    p = Path(spec).expanduser()
    try:
        exists = p.exists()
    except PermissionError as exc:
        raise PermissionError(f"cannot access {p}: permission denied") from exc
    except OSError as exc:
        raise ValueError(f"cannot access {p}: {exc}") from exc

    if exists:
        if p.is_dir():
            if not os.access(p, os.R_OK | os.X_OK):
                raise PermissionError(f"cannot read model directory {p}: permission denied")
            if not (p / "config.json").is_file():
                ggufs = sorted(x.name for x in p.glob("*.gguf"))
                hint = f"; it has GGUF file(s) {', '.join(ggufs)}: pass one of them instead" if ggufs else ""
                raise ValueError(
                    f"{p} is not a Hugging Face model directory: config.json is missing{hint}"
                )
            if not os.access(p / "config.json", os.R_OK):
                raise PermissionError(f"cannot read {p / 'config.json'}: permission denied")
            return ResolvedModel(kind="hf_dir", name=p.resolve().name, hf_path=str(p), chat=_dir_chat(p))
        if p.is_file() and p.suffix.lower() == ".gguf":
            if weights:
                d = convert_gguf_file(p, progress=progress)
            else:
                check_gguf_file(p)
                d = ensure_tokenizer(p, local_dir(p, suffix="-tok"), spec=None, label=p.name, progress=progress)
            info = read_convert_marker(d) or {}
            return ResolvedModel(
                kind="gguf_file", name=p.stem, hf_path=str(d), gguf_path=p,
                chat=info.get("chat_template"), info=info,
            )
        raise ValueError(
            f"{p} exists but is neither a model directory (with config.json) nor a .gguf file"
        )

    if _is_hub_id(spec):
        return ResolvedModel(kind="hub_id", name=spec, hf_path=spec)
    if _looks_like_path(spec):
        raise FileNotFoundError(f"model path does not exist: {p}")
    raise UnknownModelError(unknown_model_message(spec))


_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


def _looks_like_path(spec: str) -> bool:
    """True if ``spec`` reads as a file path: it has a path separator, starts with ``.`` or
    ``~``, or ends in ``.gguf``."""
    seps = {os.sep, "/"} | ({os.altsep} if os.altsep else set())
    return (
        any(s in spec for s in seps)
        or spec.startswith((".", "~"))
        or spec.lower().endswith(".gguf")
    )


def _is_hub_id(spec: str) -> bool:
    """True if ``spec`` has the form ``org/name`` of a hub id (and is no ``..`` or ``.gguf`` path)."""
    return bool(_HUB_ID.fullmatch(spec)) and ".." not in spec and not spec.lower().endswith(".gguf")


def _dir_chat(directory: Path) -> bool | None:
    """Whether the tokenizer saved in ``directory`` has a chat template (``None``: no readable
    ``tokenizer_config.json`` to tell)."""
    if (directory / "chat_template.jinja").is_file() or (directory / "chat_template.json").is_file():
        return True
    try:
        cfg = json.loads((directory / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    return bool(cfg.get("chat_template"))
