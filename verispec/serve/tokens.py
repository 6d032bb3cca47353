"""Prompts to token ids (chat template, raw text, ids) and back, on the HTTP side.

The server tokenizes while the decode worker detokenizes, each in its own thread, so
this side works on its own copy of the tokenizer (a Hugging Face fast tokenizer is one
Rust object that must not be used from two threads at once) and holds a lock around it.

The ids are built by the API's own code (`verispec.encoding`, which
`SpeculativeDecoder.encode` calls), so a chat request with one user message gets the
ids ``generate(text)`` gets, and a completion with a text prompt gets
``tok.encode(text)`` with the tokenizer's special tokens (BOS where the model uses one).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from contextlib import contextmanager

from .. import encoding
from ..encoding import PromptError
from .errors import bad_request

#: Roles a chat message may have; "developer" (OpenAI's newer name) is sent to the
#: chat template as "system".
ROLES = ("system", "developer", "user", "assistant")


class Prompter:
    """Tokenize and detokenize for the HTTP side of the server.

    Args:
        tokenizer: the target's Hugging Face tokenizer, or None (token-id prompts only).
        vocab_size: the target's number of logits V (ids must be in 0..V-1).
        context_length: the target's context, in tokens.
    """

    def __init__(self, tokenizer, vocab_size: int, context_length: int) -> None:
        self.tokenizer = copy.deepcopy(tokenizer) if tokenizer is not None else None
        self.vocab_size, self.context_length = vocab_size, context_length
        self._lock = threading.Lock()

    @property
    def has_chat_template(self) -> bool:
        return encoding.has_chat_template(self.tokenizer)

    def chat(self, messages: list[dict], param: str = "messages", add_generation_prompt: bool = True) -> list[int]:
        """Token ids of `messages` (already validated: role + text content) under the
        chat template, with the assistant's generation prompt appended (unless
        `add_generation_prompt` is False: /tokenize's vLLM field).

        Raises:
            ApiError: 400 naming `param` when the model has no tokenizer or chat template,
                or the template refuses the conversation (e.g. roles out of order).
        """
        with self._lock, _as_400():
            return encoding.chat_ids(self.tokenizer, messages, param=param,
                                     add_generation_prompt=add_generation_prompt)

    def text(self, prompt: str, param: str = "prompt", add_special_tokens: bool = True) -> list[int]:
        """Token ids of raw text (no chat template)."""
        with self._lock, _as_400():
            return encoding.text_ids(self.tokenizer, prompt, add_special_tokens=add_special_tokens,
                                     param=param)

    def check_ids(self, ids: Sequence, param: str = "prompt") -> list[int]:
        """Validate a list of token ids (integers in 0..V-1)."""
        with _as_400():
            return encoding.checked_ids(ids, self.vocab_size, param=param)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of token ids (for /detokenize)."""
        if self.tokenizer is None:
            raise bad_request("tokens", "this model has no tokenizer to detokenize with")
        with self._lock:
            return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """Each id's own text (special tokens included), for /tokenize's `token_strs`."""
        if self.tokenizer is None:
            return [str(i) for i in ids]
        with self._lock:
            return [self.tokenizer.decode([i], skip_special_tokens=False) for i in ids]


@contextmanager
def _as_400():
    """Turn the API's `PromptError` into a 400 naming the same field."""
    try:
        yield
    except PromptError as e:
        raise bad_request(e.param, str(e)) from None
