"""Each token's own text and its *real* bytes, for `logprobs` (`token`, `bytes`).

A byte-level BPE token (GPT-2, Llama 3, Qwen, SmolLM2) or a byte-fallback piece
(`<0xE2>` in SentencePiece vocabularies: Llama 2, Gemma) can hold part of a UTF-8
character: decoded alone it is U+FFFD, and ``"\\ufffd".encode()`` is not what the model
produced. OpenAI's `bytes` field exists for exactly this: the client concatenates the
bytes of consecutive tokens to rebuild characters split across tokens. So the bytes
are read from the vocabulary entry itself:

* byte-level vocabularies write byte b as the character `_byte_decoder` maps back
  (Radford et al. 2019, GPT-2's ``bytes_to_unicode``: printable bytes stand for
  themselves, the others are shifted past U+0100);
* a ``<0xHH>`` piece is the byte 0xHH; "▁" in a SentencePiece piece is a space;
* special and added tokens (``<|im_end|>``) are their text, as vLLM reports them
  (decoded with special tokens kept, then UTF-8).

Without a tokenizer (token-id models) a token's text is its id.
"""

from __future__ import annotations

import re
import threading

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's byte -> printable character table."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: b for b in printable}
    for b in range(256):
        if b not in table:
            table[b] = 256 + len(table) - len(printable)
    return {chr(c): b for b, c in table.items()}


BYTE_DECODER = _byte_decoder()


class Pieces:
    """Token id -> (text, bytes) for one tokenizer, cached (see the module docstring).

    Args:
        tokenizer: a Hugging Face tokenizer, or None.

    Thread safety: one instance per thread that uses the tokenizer (the cache is locked,
    the tokenizer is not shared by this class).
    """

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}
        self._lock = threading.Lock()
        self.byte_level = False
        self.special: set[int] = set()
        if tokenizer is not None:
            decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
            self.byte_level = type(decoder).__name__ == "ByteLevel"
            self.special = set(getattr(tokenizer, "all_special_ids", []) or [])
            self.special |= set(getattr(tokenizer, "added_tokens_decoder", {}) or {})

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        """(the token's own text, special tokens kept; its bytes as a list of ints)."""
        with self._lock:
            hit = self._cache.get(token_id)
        if hit is not None:
            return hit
        out = self._compute(int(token_id))
        with self._lock:
            self._cache[token_id] = out
        return out

    def text(self, token_id: int) -> str:
        return self(token_id)[0]

    def _compute(self, token_id: int) -> tuple[str, list[int]]:
        tok = self.tokenizer
        if tok is None:
            text = str(token_id)
            return text, list(text.encode())
        text = tok.decode([token_id], skip_special_tokens=False)
        if token_id in self.special:
            return text, list(text.encode("utf-8", "replace"))
        piece = tok.convert_ids_to_tokens(token_id)
        raw: bytes | None = None
        if isinstance(piece, str):
            match = _BYTE_PIECE.fullmatch(piece)
            if match:
                raw = bytes([int(match.group(1), 16)])
            elif self.byte_level and all(c in BYTE_DECODER for c in piece):
                raw = bytes(BYTE_DECODER[c] for c in piece)
            elif "\ufffd" not in text:
                raw = text.encode("utf-8")
            else:
                raw = piece.replace("▁", " ").encode("utf-8")
        if raw is None:
            raw = text.encode("utf-8", "replace")
        return text, list(raw)
