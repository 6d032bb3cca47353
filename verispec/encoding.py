"""Prompts to token ids, once for every face: chat template, raw text, checked ids.

`SpeculativeDecoder.encode` and the server (`verispec.serve.tokens`) both build the
prompt's ids here, so a chat request with one user message gets exactly the ids
``generate(text)`` gets (the chat template with the assistant's generation prompt,
as Hugging Face's `apply_chat_template(..., add_generation_prompt=True)` builds
them), and raw text gets ``tokenizer.encode(text)`` with the tokenizer's special
tokens (BOS where the model uses one).

Every error is a `PromptError` (a `ValueError`) whose `param` names the part of the
input at fault ("prompt", "prompt[3]", "messages"), so the API can raise it as is and
the server can turn it into a 400 naming the field.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence


class PromptError(ValueError):
    """A prompt that cannot become token ids.

    Attributes:
        param: the argument or request field at fault, e.g. "prompt", "prompt[3]", "messages".
    """

    def __init__(self, message: str, param: str = "prompt") -> None:
        super().__init__(message)
        self.param = param


def has_chat_template(tokenizer) -> bool:
    """Whether `tokenizer` (a Hugging Face tokenizer, or None) carries a chat template."""
    return tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))


def chat_ids(tokenizer, messages: Sequence[dict], *, param: str = "messages",
             add_generation_prompt: bool = True) -> list[int]:
    """Token ids of chat `messages` ({"role", "content"} dicts) under the chat template,
    with the assistant's generation prompt appended (unless `add_generation_prompt` is False).

    Raises:
        PromptError: naming `param` when there is no tokenizer or chat template, or the
            template refuses the conversation (e.g. roles out of order).
    """
    if tokenizer is None:
        raise PromptError("this model has no tokenizer: give the prompt as token ids", param)
    if not has_chat_template(tokenizer):
        raise PromptError("this model has no chat template: give a raw text prompt "
                          "(use_chat_template=False, --no-chat-template, /v1/completions)", param)
    try:
        ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=add_generation_prompt,
                                            tokenize=True)
    except Exception as e:  # noqa: BLE001 - jinja's TemplateError and friends: the template refused
        raise PromptError(f"the chat template refused these messages: {e}", param) from None
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids   # newer transformers return a BatchEncoding
    return [int(i) for i in ids]


def text_ids(tokenizer, text: str, *, add_special_tokens: bool = True, param: str = "prompt") -> list[int]:
    """Token ids of raw `text` (no chat template), with the tokenizer's special tokens.

    Raises:
        PromptError: naming `param` when there is no tokenizer.
    """
    if tokenizer is None:
        raise PromptError("this model has no tokenizer: give the prompt as token ids", param)
    return [int(i) for i in tokenizer.encode(text, add_special_tokens=add_special_tokens)]


def checked_ids(ids, vocab_size: int, *, param: str = "prompt") -> list[int]:
    """`ids` as a list of ints, each in 0..V-1 (integer-like objects, e.g. torch or numpy
    integers, are accepted; bools and floats are not).

    Raises:
        PromptError: naming `param` when `ids` is not a sequence, or `param[j]` for the
            first bad id.
    """
    if isinstance(ids, (str, bytes, int)) or not hasattr(ids, "__iter__"):
        raise PromptError(f"{param} must be text or a list of token ids, got {type(ids).__name__}", param)
    out = []
    for j, i in enumerate(ids):
        try:
            if isinstance(i, bool):
                raise TypeError
            i = operator.index(i)
        except TypeError:
            raise PromptError(f"{param}[{j}]: token ids must be integers, got {i!r}", f"{param}[{j}]") from None
        if not 0 <= i < vocab_size:
            raise PromptError(f"{param} holds token id {i} (at [{j}]), outside the vocabulary "
                              f"0..{vocab_size - 1}; encode the text with this model's tokenizer",
                              f"{param}[{j}]")
        out.append(i)
    return out


def encode(tokenizer, prompt: str | Sequence[int], vocab_size: int, *,
           use_chat_template: bool | None = None) -> list[int]:
    """Prompt text (or ids) -> token ids, applying the chat template by default.

    Args:
        tokenizer: the target's tokenizer, or None (ids only).
        prompt: text, or token ids.
        vocab_size: V (ids must lie in 0..V-1).
        use_chat_template: None = apply it when the tokenizer has one.

    Raises:
        PromptError: naming "prompt" (or "prompt[j]") if the prompt is empty, encodes to
            no tokens, is neither text nor token ids, or holds an id outside 0..V-1; or
            when a chat template is asked for and there is none.
    """
    if isinstance(prompt, str):
        if not prompt.strip():
            raise PromptError("prompt is empty: give some text to continue or answer")
        if use_chat_template is None:
            use_chat_template = has_chat_template(tokenizer)
        if use_chat_template:
            ids = chat_ids(tokenizer, [{"role": "user", "content": prompt}], param="prompt")
        else:
            ids = text_ids(tokenizer, prompt)
    else:
        ids = checked_ids(prompt, vocab_size)
    if not ids:
        raise PromptError("prompt is empty: it encodes to no tokens")
    return ids
