"""Tests for verispec.registry.resolution (and the conversion cache it goes through): conversion
is replaced by a fake, so no network, no real models, no torch import."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from verispec import registry
from verispec.registry import conversion, resolution
from verispec.registry import ModelNotFetchedError, UnknownModelError

from conftest import fake_converted


# --------------------------------------------------------------------------- resolve


def test_resolve_unknown_name_lists_registered_names(model_cache):
    with pytest.raises(UnknownModelError) as info:
        registry.resolve("llama-70b")
    assert isinstance(info.value, ValueError)
    for name in registry.REGISTRY:  # test_registry_catalogue pins which names these are
        assert name in str(info.value)
    with pytest.raises(UnknownModelError, match="Did you mean 'qwen2.5-coder-1.5b'"):
        registry.resolve("qwen2.5-coder-1.5")
    with pytest.raises(UnknownModelError):
        registry.resolve("")


@pytest.mark.parametrize("spec", ["./nope", "/definitely/not/here", "~/no-such-verispec-model", "nope.gguf", "a/b/c"])
def test_resolve_missing_path(model_cache, spec):
    with pytest.raises(FileNotFoundError) as info:
        registry.resolve(spec)
    assert Path(spec).name in str(info.value)


def test_resolve_dir_without_config(model_cache, tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "weights.gguf").write_bytes(b"GGUF")
    with pytest.raises(ValueError) as info:
        registry.resolve(str(d))
    assert str(d) in str(info.value) and "config.json" in str(info.value)
    assert "weights.gguf" in str(info.value)  # hints at the GGUF inside


def test_resolve_hf_dir(model_cache, tmp_path):
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
def test_resolve_unreadable_dir(model_cache, tmp_path):
    d = tmp_path / "locked"
    d.mkdir()
    (d / "config.json").write_text("{}")
    d.chmod(0)
    try:
        with pytest.raises(PermissionError, match="locked"):
            registry.resolve(str(d))
    finally:
        d.chmod(0o755)


def test_resolve_hub_id_passthrough(model_cache):
    r = registry.resolve("Qwen/Qwen2.5-Coder-1.5B-Instruct")
    assert (r.kind, r.hf_path, r.gguf_path, r.chat) == ("hub_id", "Qwen/Qwen2.5-Coder-1.5B-Instruct", None, None)


def test_resolve_registered_not_fetched_without_fetching(model_cache):
    with pytest.raises(ModelNotFetchedError, match=r"verispec models fetch --convert smollm2-135m"):
        registry.resolve("smollm2-135m", fetch_missing=False)


def test_resolve_registered_converted_and_missing(model_cache, monkeypatch):
    spec = registry.REGISTRY["qwen2.5-coder-0.5b"]
    calls = []

    def fake_convert(name, progress=True):
        calls.append(name)
        fake_converted(registry.hf_dir(name), source_sha256=registry.REGISTRY[name].sha256)
        return registry.hf_dir(name)

    monkeypatch.setattr(resolution, "convert", fake_convert)
    r = registry.resolve(spec.name)  # missing -> fetch + convert
    assert calls == [spec.name]
    assert (r.kind, r.name, r.hf_path, r.chat) == ("registered", spec.name, str(model_cache / "hf" / spec.name), True)
    assert registry.resolve(spec.name, fetch_missing=False).hf_path == r.hf_path  # no more work
    assert calls == [spec.name]


# --------------------------------------------------------------------------- .gguf files: converted once


def test_resolve_gguf_file_converted_once(model_cache, tmp_path, monkeypatch):
    g = tmp_path / "weights" / "tiny.gguf"
    g.parent.mkdir()
    g.write_bytes(b"GGUF" + b"\0" * 64)
    calls = []

    def fake_convert_to_dir(src, dest, *, spec, source_sha256, source_key, progress):
        calls.append((src, dest))
        fake_converted(dest, source_key=source_key, chat_template=True)
        return {}

    monkeypatch.setattr(conversion, "_convert_to_dir", fake_convert_to_dir)
    r = registry.resolve(str(g))
    assert r.kind == "gguf_file" and r.name == "tiny" and r.gguf_path == g and r.chat is True
    assert Path(r.hf_path).parent == model_cache / "local"
    assert registry.resolve(str(g)).hf_path == r.hf_path
    assert len(calls) == 1
    # Editing the file (new size/mtime) converts it again, into a new directory.
    g.write_bytes(b"GGUF" + b"\1" * 65)
    assert registry.resolve(str(g)).hf_path != r.hf_path
    assert len(calls) == 2


def test_resolve_non_gguf_files(model_cache, tmp_path):
    fake_gguf = tmp_path / "notreally.gguf"
    fake_gguf.write_bytes(b"PK\3\4 this is a zip")
    with pytest.raises(ValueError, match="not a GGUF"):
        registry.resolve(str(fake_gguf))
    other = tmp_path / "model.bin"
    other.write_bytes(b"x")
    with pytest.raises(ValueError, match="neither"):
        registry.resolve(str(other))
