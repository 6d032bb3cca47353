"""Tokenizer-only directories (verispec.registry.tokenizers): what the llama.cpp backend loads
instead of a float32 conversion. On the real SmolLM2 GGUF (fetched by `make test`)."""

from __future__ import annotations

import struct

import pytest

from verispec import registry
from verispec.registry import tokenizers

SMOL_HEADER_BYTES = 1_769_507   # tests/tokenizer_cache.py pins the same size and its sha256


@pytest.fixture(scope="module")
def smol_gguf():
    path = registry.gguf_path("smollm2-135m")
    if not registry.is_fetched("smollm2-135m"):
        pytest.skip("SmolLM2 GGUF not fetched: run `verispec models fetch smollm2-135m`")
    return path


def test_metadata_end_and_read_header_grow(smol_gguf):
    header = tokenizers.read_header(smol_gguf, first=1024)       # grows from 1 KiB
    assert len(header) == SMOL_HEADER_BYTES
    assert tokenizers.metadata_end(header) == SMOL_HEADER_BYTES
    with pytest.raises(struct.error):
        tokenizers.metadata_end(header[: SMOL_HEADER_BYTES // 2])
    with pytest.raises(ValueError, match="GGUF magic"):
        tokenizers.metadata_end(b"PK\x03\x04" + header[4:])


def test_gguf_file_for_llamacpp_is_never_converted(smol_gguf, model_cache, monkeypatch):
    """resolve(weights=False): a tokenizer-only directory, no safetensors, the same tokens and
    chat template as the full conversion; built once, then reused."""
    from transformers import AutoTokenizer

    def no_conversion(*args, **kwargs):
        raise AssertionError("weights=False must never convert the GGUF to float32")

    monkeypatch.setattr(registry.conversion, "_convert_to_dir", no_conversion)
    resolved = registry.resolve(str(smol_gguf), weights=False, progress=False)
    d = resolved.gguf_path, resolved.hf_path
    assert d[0] == smol_gguf and resolved.kind == "gguf_file" and resolved.chat is True
    assert not list((model_cache / "local").rglob("*.safetensors"))
    assert resolved.info["kind"] == "tokenizer" and resolved.info["eos_token_ids"]

    tok = AutoTokenizer.from_pretrained(resolved.hf_path)
    text = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # ünïcode ✓"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert "hi" in chat and chat.rstrip().endswith("assistant")

    monkeypatch.setattr(tokenizers, "build_from_header", no_conversion)   # second time: reused
    again = registry.resolve(str(smol_gguf), weights=False, progress=False)
    assert again.hf_path == resolved.hf_path


def test_registered_model_for_llamacpp_builds_tokenizer_only(smol_gguf, model_cache, monkeypatch):
    """A registered name with weights=False needs the GGUF (fetched, verified) but not a
    conversion; its tokenizer lands in <cache>/tokenizers/<name>/."""
    monkeypatch.setattr(registry.resolution, "fetch", lambda name, progress=True: smol_gguf)
    monkeypatch.setattr(registry.conversion, "_convert_to_dir",
                        lambda *a, **k: pytest.fail("converted for llama.cpp"))
    resolved = registry.resolve("smollm2-135m", weights=False, progress=False)
    assert resolved.kind == "registered" and resolved.gguf_path == smol_gguf
    assert resolved.hf_path == str(model_cache / "tokenizers" / "smollm2-135m")
    assert resolved.info["eos_token_ids"][0] == 2    # <|im_end|>, the registered chat EOS first
