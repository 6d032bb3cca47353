"""Tokenizer-only directories: what the llama.cpp backend needs from a GGUF, without its weights.

llama.cpp reads the quantized GGUF itself; verispec needs only a Hugging Face tokenizer beside it
(chat template, incremental detokenisation, stop strings, end-of-generation ids). Converting the
whole model to float32 safetensors for that (what :func:`.conversion.convert` does for the
transformers backend) cost 289 s of CPU and 9.1 GB of disk for the default pair on a 2-core
machine. A GGUF starts with its key-value metadata — the whole tokenizer (tokens, merges or
scores, token types, special ids, chat template) — before any tensor, so this room:

* reads that metadata prefix (a few MB; :func:`metadata_end` finds where it stops),
* writes it as a GGUF with zero tensors and lets transformers build the tokenizer from it
  exactly as it does from the full file (``AutoTokenizer.from_pretrained(dir, gguf_file=...)``),
* applies the same fixes as the conversion (:func:`finish_tokenizer`: chat template from the
  metadata, EOS/pad/bos ids) and saves the tokenizer with ``verispec.json`` (kind
  ``"tokenizer"``, the sha256 of the metadata bytes it came from).

Layout: ``<cache>/tokenizers/<name>/`` for a registered model, ``<cache>/local/<stem>-<key>-tok/``
for a user's ``.gguf`` file. Both are written into a temporary directory and moved into place
under a lock, like conversions; a directory whose recorded metadata digest differs from the
GGUF's is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from pathlib import Path
from typing import Any

from .cache import cache_dir, locked, read_convert_marker, remove_quietly
from .catalogue import ModelSpec, get_spec

TOKENIZER_FORMAT = 1
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}   # GGUF scalar types


def metadata_end(buf: bytes) -> int:
    """Offset (bytes) where a GGUF's key-value metadata ends.

    GGUF v2/v3 layout (ggml's `docs/gguf.md`): magic ``GGUF``, version u32, n_tensors u64,
    n_kv u64, then n_kv entries (key: u64 length + bytes, type u32, value).

    Raises:
        ValueError: ``buf`` does not start with the GGUF magic or holds an unknown value type.
        struct.error: ``buf`` ends before the metadata does (read more bytes and call again).
    """
    if buf[:4] != b"GGUF":
        raise ValueError("not a GGUF file (no GGUF magic at its start)")
    (n_kv,) = struct.unpack_from("<Q", buf, 16)
    off = 24

    def skip(kind: int, off: int) -> int:
        if kind in _FIXED:
            return off + _FIXED[kind]
        if kind == 8:                                    # string: u64 length + bytes
            return off + 8 + struct.unpack_from("<Q", buf, off)[0]
        if kind == 9:                                    # array: item type u32, count u64, items
            item, n = struct.unpack_from("<IQ", buf, off)
            off += 12
            if item in _FIXED:
                return off + _FIXED[item] * n
            for _ in range(n):
                off = skip(item, off)
            return off
        raise ValueError(f"unknown GGUF value type {kind}")

    for _ in range(n_kv):
        off += 8 + struct.unpack_from("<Q", buf, off)[0]   # key
        (kind,) = struct.unpack_from("<I", buf, off)
        off = skip(kind, off + 4)
    if off > len(buf):
        raise struct.error(f"GGUF metadata runs past the {len(buf)} bytes read")
    return off


def read_header(path: Path, first: int = 1 << 23) -> bytes:
    """The metadata bytes of the GGUF file at ``path`` (reads ``first`` bytes, more if needed).

    Raises:
        ValueError: not a GGUF file, or its metadata is longer than the file.
    """
    size = first
    with open(path, "rb") as fh:
        while True:
            fh.seek(0)
            buf = fh.read(size)
            try:
                return buf[:metadata_end(buf)]
            except struct.error:
                if len(buf) < size:
                    raise ValueError(f"{path}: GGUF metadata is truncated") from None
                size *= 4


def finish_tokenizer(tok: Any, meta: dict[str, Any], spec: ModelSpec | None, label: str) -> dict[str, Any]:
    """Make a tokenizer built from GGUF metadata complete, in place; return its ids.

    The GGUF metadata is authoritative where transformers drops something: the chat template
    (``tokenizer.chat_template``), the end-of-generation ids (the registered end tokens first —
    the first is the chat EOS — then ``eos``/``eot``/``eom`` ids), the padding and bos ids.

    Returns:
        ``{"eos_token_ids": [int], "bos_token_id": int | None, "pad_token_id": int | None,
        "chat_template": bool}``.

    Raises:
        ValueError: an instruct model (``spec.chat``) ends up without a chat template.
    """
    gguf_template = meta.get("tokenizer.chat_template")
    if not getattr(tok, "chat_template", None) and gguf_template:
        tok.chat_template = gguf_template
    has_template = bool(getattr(tok, "chat_template", None))
    if spec is not None and spec.chat and not has_template:
        raise ValueError(f"{label}: instruct model but neither transformers nor the GGUF metadata has a chat template")

    eos_ids: list[int] = []
    for t in (spec.eos_tokens if spec else ()):
        tid = _token_id(tok, t)
        if tid is not None and tid not in eos_ids:
            eos_ids.append(tid)
    if spec is None and gguf_template and "<|im_end|>" in gguf_template:
        tid = _token_id(tok, "<|im_end|>")
        if tid is not None:
            eos_ids.append(tid)
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        v = meta.get(key)
        if isinstance(v, int) and v not in eos_ids:
            eos_ids.append(int(v))
    if not eos_ids and tok.eos_token_id is not None:
        eos_ids.append(int(tok.eos_token_id))
    if eos_ids and tok.eos_token_id != eos_ids[0]:
        tok.eos_token = tok.convert_ids_to_tokens(eos_ids[0])
    pad_id = meta.get("tokenizer.ggml.padding_token_id")
    if not isinstance(pad_id, int):
        pad_id = tok.pad_token_id
    if pad_id is None and eos_ids:
        pad_id = eos_ids[-1]
    if pad_id is not None and tok.pad_token_id is None:
        tok.pad_token = tok.convert_ids_to_tokens(int(pad_id))
    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    if not isinstance(bos_id, int):
        bos_id = tok.bos_token_id
    return {"eos_token_ids": eos_ids, "bos_token_id": bos_id, "pad_token_id": pad_id,
            "chat_template": has_template}


def gguf_metadata(path: Path) -> dict[str, Any]:
    """A few scalar/str metadata fields of a GGUF file (architecture, tokenizer ids, chat template)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    wanted = (
        "general.architecture", "general.name", "tokenizer.chat_template",
        "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id", "tokenizer.ggml.padding_token_id",
        "tokenizer.ggml.add_bos_token",
    )
    out = {key: reader.fields[key].contents() for key in wanted if key in reader.fields}
    del reader
    return out


def build_from_header(header: bytes, dest: Path, *, spec: ModelSpec | None, label: str,
                      source: dict[str, Any] | None = None) -> Path:
    """Build the tokenizer from GGUF metadata bytes into ``dest`` (replacing it); return ``dest``.

    ``header`` is a GGUF's prefix up to the end of its key-value metadata (:func:`read_header`);
    ``source`` adds fields to the marker (e.g. the file it came from). The caller holds the lock.

    Raises:
        ValueError: ``header`` is not complete GGUF metadata, or see :func:`finish_tokenizer`.
    """
    from transformers import AutoTokenizer

    if metadata_end(header) != len(header):
        raise ValueError(f"{label}: the bytes given are not exactly a GGUF's metadata")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.tmp-"))
    try:
        version, _, n_kv = struct.unpack_from("<IQQ", header, 4)
        stub = tmp / "metadata.gguf"
        body = header[:4] + struct.pack("<IQQ", version, 0, n_kv) + header[24:]   # zero tensors
        stub.write_bytes(body + b"\0" * (-len(body) % 32))
        tok = AutoTokenizer.from_pretrained(str(tmp), gguf_file=stub.name)
        ids = finish_tokenizer(tok, gguf_metadata(stub), spec, label)
        stub.unlink()
        tok.save_pretrained(str(tmp))
        info = {"format": TOKENIZER_FORMAT, "kind": "tokenizer", "name": label,
                "registered": spec is not None, "header_sha256": hashlib.sha256(header).hexdigest(),
                "tokenizer_len": len(tok), "chat": bool(spec.chat) if spec else ids["chat_template"],
                **ids, **(source or {})}
        (tmp / "verispec.json").write_text(json.dumps(info, indent=2) + "\n")
        os.chmod(tmp, 0o755)   # mkdtemp makes 0700; a cache is fine to share read-only
        if dest.exists():
            remove_quietly(dest)
        os.replace(tmp, dest)
    finally:
        remove_quietly(tmp)
    return dest


def tokenizer_complete(directory: Path, header_sha256: str) -> bool:
    """True if ``directory`` holds a tokenizer built from metadata with digest ``header_sha256``."""
    info = read_convert_marker(directory)
    return (info is not None and info.get("kind") == "tokenizer"
            and info.get("format") == TOKENIZER_FORMAT and info.get("header_sha256") == header_sha256)


def ensure_tokenizer(gguf: Path, dest: Path, *, spec: ModelSpec | None, label: str,
                     progress: bool = False) -> Path:
    """A tokenizer-only directory for the GGUF file ``gguf`` at ``dest``, built once.

    Takes seconds to half a minute (transformers builds a BPE tokenizer from the metadata in
    Python); later calls read a few MB of ``gguf`` to check the digest and return.

    Raises:
        FileNotFoundError, ValueError: ``gguf`` is missing or not a GGUF file.
    """
    digest = hashlib.sha256(read_header(gguf)).hexdigest()
    if tokenizer_complete(dest, digest):
        return dest
    with locked(f"tokenizer-{dest.name}", progress, f"building the tokenizer of {label}"):
        header = read_header(gguf)
        if not tokenizer_complete(dest, hashlib.sha256(header).hexdigest()):
            build_from_header(header, dest, spec=spec, label=label, source={"source_gguf": str(gguf)})
    return dest


def registered_tokenizer_dir(name: str) -> Path:
    """``<cache>/tokenizers/<name>/``: where registered model ``name``'s tokenizer is built."""
    return cache_dir() / "tokenizers" / get_spec(name).name


def _token_id(tok: Any, token: str) -> int | None:
    tid = tok.convert_tokens_to_ids(token)
    unk = getattr(tok, "unk_token_id", None)
    if tid is None or (unk is not None and tid == unk and token != getattr(tok, "unk_token", None)):
        return None
    return int(tid)
