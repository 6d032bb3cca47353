"""Committed token ids -> text: the one incremental detokeniser behind streaming, stop strings
and returned text.

Everything that turns generated tokens into text goes through `TextStream`: `generate`'s
`on_text` streaming and `GenerationResult.text` (so `--json` and `bench`), the `stop` callback
given to `verispec.decoding.decode`, and a server's streamed chunks. The streamed chunks
concatenate exactly to the returned text.

Incremental decoding
--------------------
Decoding all tokens again after every token costs O(n²) over a generation. Instead (the
prefix/read-offset technique of Hugging Face's `TextStreamer` and vLLM's
`detokenize_incrementally`) each new token is decoded inside a short window of ids::

    ids:   ... | prefix ....... read | new ids ... |
                 \\_ prefix_text _/   \\_ new text = decode(prefix..) - prefix_text _/

The window starts a few tokens back (at `prefix`) so that whatever a decoder does at the start
of a string — SentencePiece decoders that drop the space of a leading "▁", for example —
happens to the already-emitted `prefix_text` and not to the new text. (When the window's
text does not extend `prefix_text` — byte fallback decodes a run of <0xNN> tokens as one, so
while a character continuing the run is incomplete the whole run comes out as U+FFFD — the new
ids are decoded on their own.) Once the new text ends on
a whole character the window slides forward: `prefix` <- `read`, `read` <- the end. The cost per
token is bounded by the window (a few tokens), so a generation is linear in its length; the
window only stretches over a run of tokens none of whose boundaries falls between two
characters (e.g. byte tokens of a run of emoji whose bytes straddle token boundaries).

A character can take several tokens (byte-level BPE: a rare CJK character is 2-3 byte tokens,
🧑‍💻 is 4; SentencePiece byte fallback: one <0xNN> token per byte), and a token can end inside
one: the decoder then gives U+FFFD for the incomplete bytes. Text up to a trailing run of U+FFFD
is *settled* (it cannot change when more bytes arrive); the run itself is held back until the
character completes — or, if generation ends first, kept as U+FFFD (what the model really
produced). So a chunk contains U+FFFD only where the model produced invalid UTF-8 (or the
character U+FFFD itself) before the end.

Stop strings (the OpenAI / vLLM convention)
-------------------------------------------
- They are matched on the decoded text (special tokens skipped, so a special token never
  matches; end on those with EOS ids), after every committed token, for any tokenizer and any
  string length, wherever the match falls (mid-token, mid-block, across blocks). Only settled
  text is searched, and only where a new match can be: the new text plus the
  len(longest stop) - 1 characters before it.
- Generation ends with the token that completed the first match: it is the last of the token
  ids (`stop_index` = the number of tokens up to and including it), and `Stats.finish_reason`
  is "stop_string" (OpenAI's finish reason "stop").
- The text is cut right before the match: neither the stop string nor anything after it (even
  text later in the same token) is returned. When several stop strings match, the one that
  starts first wins (at the same start, the one listed first).
- Streamed chunks never contain text that is cut later: while streaming, the last
  len(longest stop) - 1 characters are held back; `finish()` flushes them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

REPLACEMENT = "\ufffd"   # what decoders put where bytes are not (yet) a whole UTF-8 character


def check_stop_strings(stop_strings: Sequence[str] | None) -> tuple[str, ...]:
    """Validate stop strings; return them as a tuple (empty for None).

    Raises:
        ValueError: naming `stop_strings` when it is a bare string (pass a list) or holds
            anything but non-empty strings.
    """
    if stop_strings is None:
        return ()
    if isinstance(stop_strings, str):
        raise ValueError(f"stop_strings must be a list of strings, got the string {stop_strings!r}; "
                         f"pass [{stop_strings!r}]")
    try:
        stops = tuple(stop_strings)
    except TypeError:
        raise ValueError(f"stop_strings must be a list of non-empty strings, got "
                         f"{type(stop_strings).__name__}") from None
    for s in stops:
        if not isinstance(s, str) or not s:
            raise ValueError(f"stop_strings must be a list of non-empty strings; got {s!r} in it")
    return stops


class TextStream:
    """Incremental detokenisation of committed tokens, with stop strings and safe chunks.

    Args:
        tokenizer: a Hugging Face tokenizer (anything with `decode(ids, skip_special_tokens=...,
            clean_up_tokenization_spaces=...)`).
        stop_strings: strings that end generation (see the module docstring for the exact
            semantics); None or empty: none.
        skip_special_tokens: leave special tokens (EOS, chat markers) out of the text.
        min_tokens: stop strings completed by one of the first `min_tokens` - 1 tokens are
            not matched (as vLLM's `min_tokens`: no stop before that many tokens).

    Raises:
        ValueError: if `tokenizer` is None or `stop_strings` is malformed (see
            `check_stop_strings`).

    Use: `push(new_ids)` after each committed token (True: a stop string completed), then
    `pop_chunk()` for text safe to show, and `finish()` once at the end for the rest; `text`,
    `token_ids`, `stop_index` and `stop_string` describe the result. Pushing ids one at a time
    or in blocks gives the same result.

    Attributes:
        token_ids: the ids consumed (list[int]); after a stop, the ids up to and including the
            token that completed it (ids pushed after it are ignored).
        stop_index: len(token_ids) when a stop string completed, else None.
        stop_string: the stop string that matched, else None.
        finished: True once `finish()` was called.
    """

    def __init__(self, tokenizer, stop_strings: Sequence[str] | None = None, *,
                 skip_special_tokens: bool = True, min_tokens: int = 0) -> None:
        if tokenizer is None:
            raise ValueError("TextStream needs a tokenizer to turn token ids into text")
        self.tokenizer = tokenizer
        self.stop_strings = check_stop_strings(stop_strings)
        self.skip_special_tokens = skip_special_tokens
        self.min_tokens = min_tokens
        self.holdback = max((len(s) for s in self.stop_strings), default=1) - 1   # characters
        self.token_ids: list[int] = []
        self.stop_index: int | None = None
        self.stop_string: str | None = None
        self.finished = False
        # detokeniser window: ids[_prefix:_read] decode to _prefix_text; the text of ids[_read:]
        # is _settled (already passed on) + _unsettled (a trailing run of U+FFFD, held back)
        self._prefix = self._read = 0
        self._prefix_text = self._settled = self._unsettled = ""
        self._whole = False   # fallback: decode from the first token (see _fall_back)
        # the text: chunks already popped, then settled text not popped yet
        self._popped: list[str] = []
        self._pending: list[str] = []
        self._pending_len = 0
        self._tail = ""       # the last `holdback` characters of the settled text

    # -- public ----------------------------------------------------------------------------
    @property
    def stopped(self) -> bool:
        """True once a stop string completed."""
        return self.stop_index is not None

    @property
    def text(self) -> str:
        """The text so far: settled text (cut before a stop string); after `finish()`, the
        final text, equal to the concatenation of all chunks popped."""
        return "".join(self._popped) + "".join(self._pending)

    def push(self, token_ids: Iterable[int]) -> bool:
        """Consume newly committed token ids, one at a time.

        Args:
            token_ids: ids committed since the last push (any number, in order).

        Returns:
            True if a stop string has completed (now or before); ids after the one that
            completed it are not consumed.

        Raises:
            RuntimeError: if called after `finish()`.
        """
        if self.finished:
            raise RuntimeError("TextStream.push after finish(): start a new TextStream")
        for token in token_ids:
            if self.stopped:
                break
            self.token_ids.append(int(token))
            piece = self._decode_step()
            if piece and self._settle(piece):
                self.stop_index = len(self.token_ids)
        return self.stopped

    def pop_chunk(self) -> str:
        """Text that is safe to show and was not returned before ("" if none).

        Until `finish()` or a stop, the last len(longest stop string) - 1 characters are held
        back (a stop string may still start there); incomplete characters always are.
        """
        hold = 0 if self.finished or self.stopped else self.holdback
        n = self._pending_len - hold
        if n <= 0:
            return ""
        pending = "".join(self._pending)
        chunk, rest = pending[:n], pending[n:]
        self._pending, self._pending_len = ([rest] if rest else []), len(rest)
        self._popped.append(chunk)
        return chunk

    def finish(self) -> str:
        """End of generation: return the last chunk (everything not popped yet).

        Bytes of an incomplete character at the very end stay in the text as U+FFFD, as a
        one-shot decode gives them. Calling it again returns "".
        """
        if not self.finished:
            self.finished = True
            if self._whole and not self.stopped:
                text, full = self.text, self._decode(self.token_ids)
                self._unsettled = full[len(os.path.commonprefix([text, full])):]
            if self._unsettled and not self.stopped:
                self._append(self._unsettled)
                self._unsettled = ""
        return self.pop_chunk()

    # -- detokeniser -----------------------------------------------------------------------
    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens,
                                     clean_up_tokenization_spaces=False)

    def _decode_step(self) -> str:
        """Decode the window after the last id was appended; return newly settled text."""
        if self._whole:
            new = self._decode(self.token_ids)
        else:
            window = self._decode(self.token_ids[self._prefix:])
            if window.startswith(self._prefix_text):
                new = window[len(self._prefix_text):]
            else:
                # Byte fallback decodes a run of <0xNN> tokens as one: while the new bytes
                # continuing it are incomplete (or if they are invalid) the whole run, the
                # prefix's character too, comes out as U+FFFD. Decode the new ids alone.
                new = self._decode(self.token_ids[self._read:])
        settled = new.rstrip(REPLACEMENT)
        if not settled.startswith(self._settled):
            if not self._whole:   # a decoder that rewrites text it gave (no registered one)
                self._fall_back()
                return self._decode_step()
            return ""   # wait until the decoded text extends what was passed on again
        piece = settled[len(self._settled):]
        self._settled, self._unsettled = settled, new[len(settled):]
        if new and not self._unsettled and not self._whole:
            # the window ends between two characters: slide it
            self._prefix, self._read = self._read, len(self.token_ids)
            self._prefix_text = self._decode(self.token_ids[self._prefix:self._read])
            self._settled = ""
        return piece

    def _fall_back(self) -> None:
        """Decode from the first token from now on (quadratic, but consistent)."""
        self._whole = True
        self._settled = self.text

    # -- text and stop strings -------------------------------------------------------------
    def _append(self, piece: str) -> None:
        self._pending.append(piece)
        self._pending_len += len(piece)
        if self.holdback:
            self._tail = (self._tail + piece)[-self.holdback:]

    def _settle(self, piece: str) -> bool:
        """Add settled text; True (and the text cut before it) if a stop string completed."""
        region = self._tail + piece    # only here can a match end in `piece`
        self._append(piece)
        if len(self.token_ids) < self.min_tokens:
            return False
        best: tuple[int, str] | None = None
        for s in self.stop_strings:
            i = region.find(s)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is None:
            return False
        cut = len(region) - best[0]    # characters to drop from the end (<= pending: see pop_chunk)
        pending = "".join(self._pending)[:self._pending_len - cut]
        self._pending, self._pending_len = ([pending] if pending else []), len(pending)
        self._unsettled = ""
        self.stop_string = best[1]
        return True


def decode_text(tokenizer, token_ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
    """The text of generated ids exactly as `TextStream` gives it (one-shot, e.g. for a
    baseline's output in `bench`): equal to the concatenated streamed chunks.

    Raises:
        ValueError: if `tokenizer` is None.
    """
    stream = TextStream(tokenizer, skip_special_tokens=skip_special_tokens)
    stream.push(token_ids)
    stream.finish()
    return stream.text
