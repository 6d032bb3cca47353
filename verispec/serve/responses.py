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
With ``stream_options.continuous_usage_stats`` (vLLM's; guidellm sends it) every chunk
also carries `usage` so far.

Logprobs: chat's ``{"token", "logprob", "bytes", "top_logprobs"}`` with each token's
real bytes (`verispec.serve.pieces`); completions' legacy ``{"tokens", "token_logprobs",
"top_logprobs", "text_offset"}``, where `top_logprobs` holds the n most likely tokens
and the chosen one (OpenAI's legacy definition) and `text_offset` is each token's
character offset in the returned text. With ``echo`` (completions) the text starts
with the prompt and the logprobs with the prompt's tokens: the first has no logprob
(null), each other one its log-probability after the tokens before it (lm-eval's
loglikelihood reads these); the generated tokens' offsets then start at the prompt's
length.

With ``n > 1`` each choice is rendered by its own `Renderer` (its `index`) under one id.
"""

from __future__ import annotations

import json

from .engine import Job, Outcome
from .progress import Chunk, TokenLogprob

DONE = "data: [DONE]\n\n"


def sse(body: dict) -> str:
    """One Server-Sent Event carrying `body` (JSON never holds NaN or infinities here)."""
    return f"data: {json.dumps(body, ensure_ascii=False, allow_nan=False)}\n\n"


def _chat_logprobs(lps: list[TokenLogprob]) -> dict:
    return {"content": [{"token": t.token, "logprob": t.logprob, "bytes": t.bytes,
                         "top_logprobs": [{"token": s, "logprob": v, "bytes": b} for _, s, v, b in t.top]}
                        for t in lps],
            "refusal": None}


def _completion_logprobs(lps: list[TokenLogprob], offset: int) -> dict:
    offsets = []
    for t in lps:                      # offsets of each token's own text (approximate where a
        offsets.append(offset)         # token ends inside a character)
        offset += len(t.token)
    # the n most likely and the chosen one: with logprobs 0, the chosen one alone (OpenAI's
    # "up to logprobs + 1 elements"; it was null)
    tops = [None if t.logprob is None else {**{s: v for _, s, v, _ in t.top}, t.token: t.logprob}
            for t in lps]
    return {"tokens": [t.token for t in lps], "token_logprobs": [t.logprob for t in lps],
            "top_logprobs": tops, "text_offset": offsets}


def _join(a: dict | None, b: dict | None) -> dict | None:
    if a is None or b is None:
        return b if a is None else a
    return {key: (a[key] + b[key]) if isinstance(a[key], list) else a[key] for key in a}


class Renderer:
    """Builds the response bodies of one job (chat or completion).

    Args:
        job: the job (its creation time, request).
        index: the choice's index (n > 1).
        id: the response id (default: the job's).
    """

    def __init__(self, job: Job, index: int = 0, id: str | None = None) -> None:
        self.job, self.req, self.index = job, job.request, index
        self.id = id or job.id
        self.chat = self.req.endpoint == "chat"
        self.echo = (self.req.prompt_text or "") if self.req.echo and not self.chat else ""
        self.offset = 0     # characters streamed so far (completion logprobs' text_offset)
        self.n_out = 0      # tokens streamed so far (continuous usage)

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.job.created, "model": self.req.model}

    def _logprobs(self, lps: list[TokenLogprob], offset: int = 0) -> dict | None:
        if self.req.logprobs is None:
            return None
        return _chat_logprobs(lps) if self.chat else _completion_logprobs(lps, offset)

    def usage(self, outcome: Outcome | None) -> dict:
        n_prompt = len(self.req.prompt_ids)
        n_out = len(outcome.token_ids) if outcome is not None else self.n_out
        return {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out,
                "prompt_tokens_details": {"cached_tokens": outcome.cached_tokens if outcome else 0}}

    def choice(self, outcome: Outcome) -> dict:
        """The non-streaming choice of this job."""
        choice: dict = {"index": self.index}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": outcome.text}
        else:
            choice["text"] = self.echo + outcome.text
        logprobs = self._logprobs(outcome.logprobs, len(self.echo))
        if self.echo and self.req.logprobs is not None:
            logprobs = _join(self._logprobs(outcome.prompt_logprobs), logprobs)
        choice["logprobs"] = logprobs
        choice["finish_reason"] = outcome.finish_reason
        if self.req.return_token_ids:
            choice["token_ids"] = outcome.token_ids
            if not self.chat:
                choice["prompt_token_ids"] = self.req.prompt_ids
        return choice

    def response(self, outcome: Outcome) -> dict:
        """The non-streaming response body (n = 1)."""
        body = self._head("chat.completion" if self.chat else "text_completion")
        if self.req.return_token_ids and self.chat:
            body["prompt_token_ids"] = self.req.prompt_ids
        body.update(choices=[self.choice(outcome)], usage=self.usage(outcome), metrics=outcome.metrics)
        return body

    # -- streaming ----------------------------------------------------------------------------
    def _chunk(self, text: str | None, *, role: bool = False, finish: str | None = None,
               token_ids: list[int] | None = None, lps: list[TokenLogprob] | None = None) -> dict:
        choice: dict = {"index": self.index}
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
        body = {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [choice]}
        if self.req.continuous_usage:
            body["usage"] = self.usage(None)
        return body

    def first(self) -> list[str]:
        """Events before any text: the chat role chunk (with prompt ids when asked for)."""
        if not self.chat and not self.req.return_token_ids:
            return []
        body = self._chunk("", role=self.chat, token_ids=[])
        if self.req.return_token_ids:
            body["prompt_token_ids"] = self.req.prompt_ids
        return [sse(body)]

    def chunk(self, chunk: Chunk) -> str:
        """The event of one committed block (or, with echo, of the prompt)."""
        self.n_out += len(chunk.token_ids)
        body = self._chunk(chunk.text, token_ids=chunk.token_ids, lps=chunk.logprobs)
        self.offset += len(chunk.text)
        return sse(body)

    def last(self, outcome: Outcome, done: bool = True) -> list[str]:
        """The closing events: finish reason, usage + metrics when asked for, [DONE]."""
        self.n_out = len(outcome.token_ids)
        events = [sse(self._chunk("", finish=outcome.finish_reason, token_ids=[]))]
        if self.req.include_usage and done:
            body = {**self._head("chat.completion.chunk" if self.chat else "text_completion"),
                    "choices": [], "usage": self.usage(outcome), "metrics": outcome.metrics}
            events.append(sse(body))
        return events + [DONE] if done else events
