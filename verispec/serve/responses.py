"""OpenAI response bodies and stream chunks for a finished (or streaming) job.

Non-streaming responses (`chat.completion`, `text_completion`)::

    {"id", "object", "created", "model",
     "choices": [{"index": 0, "message": {"role": "assistant", "content"} | "text",
                  "logprobs", "finish_reason": "stop" | "length",
                  "token_ids" (return_token_ids), "prompt_token_ids" (completions, return_token_ids)}],
     "prompt_token_ids" (chat, return_token_ids),
     "usage": {"prompt_tokens", "completion_tokens", "total_tokens",
               "prompt_tokens_details": {"cached_tokens"}},
     "metrics": {"time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms",
                 "tokens_per_second", "e2e_time_ms", "speculative_decoding": {...}}}

Streaming (Server-Sent Events, ``data: {json}`` lines): for chat, a first chunk with the
assistant role; one `chat.completion.chunk` / `text_completion` chunk per committed block
(its text delta, and its `token_ids` and `logprobs` when asked for); a last chunk with
empty text and the finish reason; when ``stream_options.include_usage`` is set, a chunk
with empty `choices` carrying `usage` and `metrics` (as vLLM does); then ``data: [DONE]``.
"""

from __future__ import annotations

import json

from .engine import Job, Outcome
from .progress import Chunk, TokenLogprob

DONE = "data: [DONE]\n\n"


def sse(body: dict) -> str:
    """One Server-Sent Event carrying `body` (JSON never holds NaN or infinities here)."""
    return f"data: {json.dumps(body, ensure_ascii=False, allow_nan=False)}\n\n"


def _bytes(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def _chat_logprobs(lps: list[TokenLogprob]) -> dict:
    return {"content": [{"token": t.token, "logprob": t.logprob, "bytes": _bytes(t.token),
                         "top_logprobs": [{"token": s, "logprob": v, "bytes": _bytes(s)}
                                          for _, s, v in t.top]} for t in lps],
            "refusal": None}


def _completion_logprobs(lps: list[TokenLogprob], n_top: int, offset: int) -> dict:
    offsets = []
    for t in lps:                      # offsets of each token's own text (approximate where a
        offsets.append(offset)         # token ends inside a character)
        offset += len(t.token)
    return {"tokens": [t.token for t in lps], "token_logprobs": [t.logprob for t in lps],
            "top_logprobs": [{s: v for _, s, v in t.top} for t in lps] if n_top else None,
            "text_offset": offsets}


class Renderer:
    """Builds the response bodies of one job (chat or completion).

    Args:
        job: the job (its id, creation time, request).
    """

    def __init__(self, job: Job) -> None:
        self.job, self.req = job, job.request
        self.chat = self.req.endpoint == "chat"
        self.offset = 0     # characters streamed so far (completion logprobs' text_offset)

    def _head(self, obj: str) -> dict:
        return {"id": self.job.id, "object": obj, "created": self.job.created, "model": self.req.model}

    def _logprobs(self, lps: list[TokenLogprob], offset: int = 0) -> dict | None:
        if self.req.logprobs is None:
            return None
        return _chat_logprobs(lps) if self.chat else _completion_logprobs(lps, self.req.logprobs, offset)

    def usage(self, outcome: Outcome) -> dict:
        n_prompt, n_out = len(self.req.prompt_ids), len(outcome.token_ids)
        return {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out,
                "prompt_tokens_details": {"cached_tokens": outcome.cached_tokens}}

    def response(self, outcome: Outcome) -> dict:
        """The non-streaming response body."""
        choice: dict = {"index": 0}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": outcome.text}
        else:
            choice["text"] = outcome.text
        choice["logprobs"] = self._logprobs(outcome.logprobs)
        choice["finish_reason"] = outcome.finish_reason
        body = self._head("chat.completion" if self.chat else "text_completion")
        if self.req.return_token_ids:
            choice["token_ids"] = outcome.token_ids
            if self.chat:
                body["prompt_token_ids"] = self.req.prompt_ids
            else:
                choice["prompt_token_ids"] = self.req.prompt_ids
        body.update(choices=[choice], usage=self.usage(outcome), metrics=outcome.metrics)
        return body

    # -- streaming ----------------------------------------------------------------------------
    def _chunk(self, text: str | None, *, role: bool = False, finish: str | None = None,
               token_ids: list[int] | None = None, lps: list[TokenLogprob] | None = None) -> dict:
        choice: dict = {"index": 0}
        if self.chat:
            delta: dict = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        choice["logprobs"] = self._logprobs(lps, self.offset) if lps else None
        choice["finish_reason"] = finish
        if self.req.return_token_ids and token_ids is not None:
            choice["token_ids"] = token_ids
        return {**self._head("chat.completion.chunk" if self.chat else "text_completion"),
                "choices": [choice]}

    def first(self) -> list[str]:
        """Events before any text: the chat role chunk (with prompt ids when asked for)."""
        if not self.chat and not self.req.return_token_ids:
            return []
        body = self._chunk("", role=self.chat, token_ids=[])
        if self.req.return_token_ids:
            body["prompt_token_ids"] = self.req.prompt_ids
        return [sse(body)]

    def chunk(self, chunk: Chunk) -> str:
        """The event of one committed block."""
        body = self._chunk(chunk.text, token_ids=chunk.token_ids, lps=chunk.logprobs)
        self.offset += len(chunk.text)
        return sse(body)

    def last(self, outcome: Outcome) -> list[str]:
        """The closing events: finish reason, usage + metrics when asked for, [DONE]."""
        events = [sse(self._chunk("", finish=outcome.finish_reason, token_ids=[]))]
        if self.req.include_usage:
            body = {**self._head("chat.completion.chunk" if self.chat else "text_completion"),
                    "choices": [], "usage": self.usage(outcome), "metrics": outcome.metrics}
            events.append(sse(body))
        return events + [DONE]
