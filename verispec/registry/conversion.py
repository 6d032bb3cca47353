"""Conversion: turn a GGUF file, once, into a Hugging Face directory that loads in seconds.

transformers can read a GGUF directly (``from_pretrained(..., gguf_file=...)``), but it
dequantizes every weight on each load (about a minute per GB on 2 CPU cores).  This room does
that once and saves the result: ``model.safetensors`` (float32), ``config.json``,
``generation_config.json``, tokenizer files with the chat template, and ``verispec.json`` (the
marker: format version, source sha256 or key, dtype, end-of-generation ids, vocabulary sizes).

* :func:`convert` converts a registered model (fetching it first) into ``<cache>/hf/<name>/``;
* :func:`convert_gguf_file` converts a user's ``.gguf`` file into ``<cache>/local/<stem>-<key>/``,
  keyed by its real path, size and mtime so that an edited file is converted again.

Both write into a temporary directory and ``os.replace`` it into place under a lock (see
:mod:`.cache`), so an interrupted conversion is never used, and both return at once when a
complete conversion of the same source already exists.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .cache import CONVERT_FORMAT, MARKER_NAME, cache_dir, hf_dir_complete, locked, remove_quietly
from .catalogue import ModelSpec, get_spec, hf_dir
from .fetching import fetch
from .tokenizers import finish_tokenizer, gguf_metadata


def convert(name: str, progress: bool = True) -> Path:
    """Convert registered model ``name`` to a Hugging Face directory; return its path.

    Fetches the GGUF first if needed (see :func:`fetch`).  The result, ``<cache>/hf/<name>/``,
    holds ``model.safetensors`` (float32, dequantized from the GGUF), ``config.json``,
    ``generation_config.json`` (``eos_token_id`` lists every end-of-generation id, the chat EOS
    first), tokenizer files with the chat template (copied from the GGUF metadata if
    transformers dropped it) and ``verispec.json`` (source sha256, dtype, eos ids, vocab sizes).
    It is written to a temporary directory and moved into place with ``os.replace``, so an
    interrupted conversion is never used.  Takes about a minute per GB of GGUF on 2 CPU cores.
    Returns at once if already converted.  Raises what :func:`fetch` raises, plus
    ``ValueError`` if an instruct model ends up without a chat template."""
    spec = get_spec(name)
    dest = hf_dir(spec.name)
    if hf_dir_complete(dest, source_sha256=spec.sha256):
        return dest
    src = fetch(spec.name, progress=progress)
    with locked(f"convert-{spec.name}", progress, f"converting {spec.name}"):
        if hf_dir_complete(dest, source_sha256=spec.sha256):
            return dest
        _convert_to_dir(src, dest, spec=spec, source_sha256=spec.sha256, source_key=None, progress=progress)
    return dest


def convert_gguf_file(path: str | os.PathLike[str], progress: bool = True) -> Path:
    """Convert a user-supplied ``.gguf`` file once into ``<cache>/local/<stem>-<key>/``
    (``key`` hashes its real path, size and mtime, so an edited file is converted again);
    return the directory.  Raises ``FileNotFoundError``, ``PermissionError`` or ``ValueError``
    (not a GGUF file) with the path in the message."""
    p = Path(path).expanduser()
    check_gguf_file(p)
    dest = local_dir(p)
    key = dest.name
    if hf_dir_complete(dest, source_key=key):
        return dest
    with locked(f"local-{key}", progress, f"converting {p.name}"):
        if not hf_dir_complete(dest, source_key=key):
            _convert_to_dir(p.resolve(), dest, spec=None, source_sha256=None, source_key=key, progress=progress)
    return dest


def _local_key(path: Path) -> str:
    """16 hex digits of sha256 over ``path``'s real path, size and mtime (ns)."""
    st = path.stat()
    raw = f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def local_dir(path: Path, suffix: str = "") -> Path:
    """``<cache>/local/<stem>-<key><suffix>``: where user file ``path`` is converted to (its
    tokenizer-only directory: ``suffix="-tok"``)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", path.stem)[:80] or "model"
    return cache_dir() / "local" / f"{stem}-{_local_key(path)}{suffix}"


def check_gguf_file(p: Path) -> None:
    """Raise ``FileNotFoundError``, ``PermissionError`` or ``ValueError`` (naming ``p``) unless
    ``p`` is a readable regular file that starts with the GGUF magic bytes."""
    if not p.exists():
        raise FileNotFoundError(f"GGUF file not found: {p}")
    if not p.is_file():
        raise ValueError(f"not a regular file: {p}")
    try:
        with open(p, "rb") as fh:
            magic = fh.read(4)
    except PermissionError as exc:
        raise PermissionError(f"cannot read GGUF file {p}: permission denied") from exc
    if magic != b"GGUF":
        raise ValueError(f"{p} is not a GGUF file (no GGUF magic at its start)")


def _convert_to_dir(
    gguf: Path, dest: Path, *, spec: ModelSpec | None, source_sha256: str | None,
    source_key: str | None, progress: bool,
) -> dict[str, Any]:
    """Convert ``gguf`` into a temporary directory beside ``dest`` and ``os.replace`` it into
    place.  Caller holds the lock.  Returns the info written to ``verispec.json``."""
    import importlib.util

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    if importlib.util.find_spec("accelerate") is None:
        # transformers refuses to load any GGUF without it; fail before the slow tokenizer step.
        raise ImportError(
            "converting a GGUF needs the `accelerate` package (transformers requires it for "
            "from_pretrained(..., gguf_file=...)): pip install accelerate"
        )

    label = spec.name if spec else gguf.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    for stale in dest.parent.glob(f".{dest.name}.tmp-*"):
        remove_quietly(stale)
    for stale in dest.parent.glob(f".{dest.name}.old-*"):
        remove_quietly(stale)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.tmp-"))

    hf_logging = transformers.utils.logging
    bars_were_enabled = hf_logging.is_progress_bar_enabled()
    if not progress:
        hf_logging.disable_progress_bar()
    t0 = time.perf_counter()
    try:
        def say(msg: str) -> None:
            if progress:
                print(f"verispec: {label}: {msg} [{time.perf_counter() - t0:.0f}s]", file=sys.stderr, flush=True)

        meta = gguf_metadata(gguf)
        say("loading tokenizer from GGUF")
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        ids = finish_tokenizer(tok, meta, spec, label)
        eos_ids, bos_id, pad_id = ids["eos_token_ids"], ids["bos_token_id"], ids["pad_token_id"]
        has_template = ids["chat_template"]

        say("loading + dequantizing GGUF weights to float32 (slow: about a minute per GB)")
        model = _load_dense_from_gguf(AutoModelForCausalLM, gguf, torch.float32)
        dtype = str(next(model.parameters()).dtype).replace("torch.", "")

        cfg = model.config
        if eos_ids:
            # config.json: the primary (chat) EOS as an int, like the upstream instruct configs;
            # generation_config.json: every end id, which is what generate() stops on.
            cfg.eos_token_id = eos_ids[0]
        if pad_id is not None:
            cfg.pad_token_id = int(pad_id)
        if bos_id is not None:
            cfg.bos_token_id = int(bos_id)
        gen = GenerationConfig(
            bos_token_id=int(bos_id) if bos_id is not None else None,
            eos_token_id=list(eos_ids) if len(eos_ids) > 1 else (eos_ids[0] if eos_ids else None),
            pad_token_id=int(pad_id) if pad_id is not None else None,
            do_sample=False,
        )
        model.generation_config = gen

        max_pos = getattr(cfg, "max_position_embeddings", None)
        if isinstance(max_pos, int) and max_pos > 0:
            tok.model_max_length = max_pos  # GGUF tokenizers come back with "unlimited" (1e30)

        say(f"saving {dtype} safetensors")
        model.save_pretrained(str(tmp), safe_serialization=True)
        tok.save_pretrained(str(tmp))
        gen.save_pretrained(str(tmp))
        vocab = int(getattr(cfg, "vocab_size", 0) or getattr(cfg.get_text_config(), "vocab_size", 0) or 0)
        n_params = sum(p.numel() for p in model.parameters())
        del model

        info: dict[str, Any] = {
            "format": CONVERT_FORMAT,
            "name": label,
            "registered": spec is not None,
            "source_gguf": str(gguf),
            "source_sha256": source_sha256,
            "source_key": source_key,
            "architecture": meta.get("general.architecture"),
            "dtype": dtype,
            "n_params": n_params,
            "vocab_size": vocab,
            "tokenizer_len": len(tok),
            "eos_token_ids": eos_ids,
            "bos_token_id": bos_id,
            "pad_token_id": pad_id,
            "chat_template": has_template,
            "chat": bool(spec.chat) if spec is not None else has_template,
            "transformers_version": transformers.__version__,
            "converted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "convert_seconds": round(time.perf_counter() - t0, 1),
        }
        (tmp / MARKER_NAME).write_text(json.dumps(info, indent=2) + "\n")
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700, safetensors writes 0600
        for f in tmp.iterdir():
            os.chmod(f, 0o644)

        # Move into place: an existing (outdated/incomplete) dest is first renamed away.
        if dest.exists():
            old = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.old-"))
            os.replace(dest, old / "x")
            os.replace(tmp, dest)
            remove_quietly(old)
        else:
            os.replace(tmp, dest)
        say(f"done -> {dest}")
        return info
    finally:
        if tmp.exists():
            remove_quietly(tmp)
        if bars_were_enabled and not progress:
            hf_logging.enable_progress_bar()


def _load_dense_from_gguf(auto_cls: Any, gguf: Path, dtype: Any) -> Any:
    """``auto_cls.from_pretrained(dir, gguf_file=...)`` fully dequantized to plain tensors.

    transformers >= 5.2x loads GGUFs through a ``GgufHfQuantizer`` that may keep weights packed
    (when the ``kernels`` package is present) and marks the model as quantized, which makes
    ``save_pretrained`` refuse it.  Asking for ``GgufConfig(dequantize=True)`` gives a plain
    dense model; anything left marked as quantized is checked and unmarked."""
    kwargs: dict[str, Any] = {"gguf_file": gguf.name, "dtype": dtype}
    try:
        from transformers import GgufConfig
    except ImportError:  # older transformers: always dequantizes
        GgufConfig = None
    if GgufConfig is not None:
        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    model = auto_cls.from_pretrained(str(gguf.parent), **kwargs)
    model.eval()
    packed = sorted({type(m).__name__ for m in model.modules() if "gguf" in type(m).__name__.lower()})
    if packed:
        raise RuntimeError(f"{gguf.name}: weights stayed packed in {packed}; cannot save a dense copy")
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    bad = {str(p.dtype) for p in model.parameters() if p.dtype != dtype}
    if bad:
        raise RuntimeError(f"{gguf.name}: expected all weights in {dtype}, found {sorted(bad)}")
    return model
