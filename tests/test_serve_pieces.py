"""Token bytes are the tokens' real bytes: concatenated over a text's ids they give the
text's UTF-8 exactly, even where a character is split across byte-level (Qwen, SmolLM2)
or byte-fallback (Gemma) tokens — where decoding a token alone gives U+FFFD."""

import os
from pathlib import Path

import pytest

from verispec.serve.pieces import Pieces

TEXT = "naïve 𝄞 clef, 🦜 parrot, 𓀀 and ꙮ, 漢字 and \u200b zero-width"
CACHE = Path(os.environ.get("VERISPEC_CACHE", Path.home() / ".cache" / "verispec"))
TOKENIZERS = [CACHE / "tokenizers" / "qwen2.5-coder-1.5b", CACHE / "tokenizers" / "gemma3-270m",
              CACHE / "hf" / "smollm2-135m"]


@pytest.mark.parametrize("path", TOKENIZERS, ids=lambda p: p.name)
def test_token_bytes_concatenate_to_the_text(path):
    if not path.is_dir():
        pytest.skip(f"no tokenizer at {path}")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    pieces = Pieces(tokenizer)
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    assert b"".join(bytes(pieces(i)[1]) for i in ids) == TEXT.encode()
    split = [i for i in ids if "\ufffd" in pieces(i)[0]]
    assert split, "the text should hold a character split across tokens"
    for i in split:                                  # what the old bytes field reported instead
        assert bytes(pieces(i)[1]) != "\ufffd".encode()
    special = tokenizer.eos_token_id
    assert bytes(pieces(special)[1]).decode() == tokenizer.decode([special], skip_special_tokens=False)


def test_without_a_tokenizer_a_token_is_its_id():
    assert Pieces(None)(42) == ("42", list(b"42"))
