"""Prompts to token ids (chat template, raw text, ids) and back, on the HTTP side.

The server tokenizes while the decode worker detokenizes, each in its own thread, so
this side works on its own copy of the tokenizer (a Hugging Face fast tokenizer is one
Rust object that must not be used from two threads at once) and holds a lock around it.

The ids are built exactly as `SpeculativeDecoder.encode` builds them, so a chat request
with one user message gets the ids ``generate(text)`` gets (chat template with the
generation prompt), and a completion with a text prompt gets ``tok.encode(text)`` with
the tokenizer's special tokens (BOS where the model uses one).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence

from .errors import bad_request, short

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
        return bool(getattr(self.tokenizer, "chat_template", None))

    def chat(self, messages: list[dict], param: str = "messages") -> list[int]:
        """Token ids of `messages` (already validated: role + text content) under the
        chat template, with the assistant's generation prompt appended.

        Raises:
            ApiError: 400 naming `param` when the model has no tokenizer or chat template,
                or the template refuses the conversation (e.g. roles out of order).
        """
        if self.tokenizer is None:
            raise bad_request(param, "this model has no tokenizer: use /v1/completions with a "
                                     "prompt of token ids")
        if not self.has_chat_template:
            raise bad_request(param, "this model has no chat template: use /v1/completions "
                                     "with a text prompt")
        with self._lock:
            try:
                ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                         tokenize=True)
            except Exception as e:  # noqa: BLE001 - jinja's TemplateError and friends: the template refused
                raise bad_request(param, f"the chat template refused these messages: {e}") from None
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        return [int(i) for i in ids]

    def text(self, prompt: str, param: str = "prompt", add_special_tokens: bool = True) -> list[int]:
        """Token ids of raw text (no chat template)."""
        if self.tokenizer is None:
            raise bad_request(param, "this model has no tokenizer: send the prompt as a list "
                                     "of token ids")
        with self._lock:
            return [int(i) for i in self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)]

    def check_ids(self, ids: Sequence, param: str = "prompt") -> list[int]:
        """Validate a list of token ids (integers in 0..V-1)."""
        out = []
        for j, i in enumerate(ids):
            if isinstance(i, bool) or not isinstance(i, int):
                raise bad_request(f"{param}[{j}]", f"token ids must be integers, got {short(i)}")
            if not 0 <= i < self.vocab_size:
                raise bad_request(f"{param}[{j}]", f"token id {i} is outside the vocabulary "
                                                   f"0..{self.vocab_size - 1}")
            out.append(i)
        return out

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
