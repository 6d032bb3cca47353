"""Request bodies -> a validated `GenerationRequest`, or a 400 naming the field.

Field names are OpenAI's (`/v1/chat/completions`, `/v1/completions`), plus vLLM's
sampling extensions (`top_k`, `min_p`, `repetition_penalty`, `min_tokens`,
`return_token_ids`) and verispec's own `k` and `drafter`. Types are checked by pydantic
(strict: `true` is not 1, "1" is not 1, NaN and infinities are refused); the sampling
settings' ranges, the drafter and the prompt's encoding by the API's own code
(`SpeculativeDecoder.sampling_config`, `.drafter_names`, `verispec.encoding`); what
needs the model (prompt length, token ids, the context) is checked here.

Fields the server does not implement are refused by name, never silently ignored;
each is accepted only with its neutral value (e.g. ``"echo": false``, ``"n": 1``,
``"tools": []``), so clients that always send the defaults keep working. Unknown
fields are refused too (as OpenAI's API does).

Defaults: ``temperature`` 1 and ``top_p`` 1 (OpenAI's); a missing ``max_tokens`` means
the rest of the context (context length − prompt tokens), as vLLM does; ``k`` and
``drafter`` default to the server's ``--k`` and ``--drafter``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..sampling import SamplingConfig, SettingError
from .errors import ApiError, bad_request
from .tokens import ROLES, Prompter

MAX_STOP = 16        # stop strings per request
MAX_LOGPROBS = 20    # alternatives per token (vLLM's default limit; OpenAI's is 20 for chat)
MAX_K = 64           # drafts per round a request may ask for

#: Fields OpenAI or vLLM define that verispec does not implement -> the values that mean
#: "not used" (accepted and dropped). Anything else is a 400 naming the field.
UNSUPPORTED: dict[str, tuple] = {
    "tools": (None, []), "tool_choice": (None, "none"), "parallel_tool_calls": (None,),
    "functions": (None, []), "function_call": (None, "none"),
    "response_format": (None, {"type": "text"}), "echo": (None, False), "suffix": (None, ""),
    "best_of": (None, 1), "audio": (None,), "modalities": (None, ["text"]), "prediction": (None,),
    "reasoning_effort": (None,), "service_tier": (None, "auto", "default"), "store": (None, False),
    "metadata": (None, {}), "web_search_options": (None,), "ignore_eos": (None, False),
    "include_stop_str_in_output": (None, False), "skip_special_tokens": (None, True),
    "spaces_between_special_tokens": (None, True), "use_beam_search": (None, False),
    "length_penalty": (None, 1.0, 1), "stop_token_ids": (None, []), "bad_words": (None, []),
    "allowed_token_ids": (None,), "prompt_logprobs": (None,), "guided_json": (None,),
    "guided_regex": (None,), "guided_choice": (None,), "guided_grammar": (None,),
    "structured_outputs": (None,), "chat_template": (None,), "chat_template_kwargs": (None, {}),
    "add_generation_prompt": (None, True), "continue_final_message": (None, False),
    "add_special_tokens": (None,), "truncate_prompt_tokens": (None,), "priority": (None, 0),
    "cache_salt": (None,), "documents": (None,), "mm_processor_kwargs": (None,),
    "return_tokens_as_token_ids": (None, False), "prompt_cache_key": (None,),
    "safety_identifier": (None,), "verbosity": (None,),
}


class StreamOptions(BaseModel):
    """OpenAI's `stream_options`: `include_usage` adds a last chunk with usage and metrics."""

    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool | None = None


class _Common(BaseModel):
    """Fields both endpoints share (types and ranges; None = the default)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    model: str | None = None
    max_tokens: int | None = Field(None, ge=0)
    # the sampling settings' ranges are checked once, by the API (`SamplingConfig`)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    min_tokens: int | None = None
    seed: int | None = None
    stop: Any = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n: int | None = None
    user: str | None = None
    k: Any = None
    drafter: str | None = None
    return_token_ids: bool | None = None


class ChatRequest(_Common):
    """`POST /v1/chat/completions`: `messages` go through the chat template."""

    messages: Any = None
    max_completion_tokens: int | None = Field(None, ge=0)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)


class CompletionRequest(_Common):
    """`POST /v1/completions`: `prompt` is a text or a list of token ids."""

    prompt: Any = None
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)


@dataclass
class ServerDefaults:
    """What the server fills in and checks requests against.

    Attributes:
        model_names: names `model` may take (the first is reported).
        k: the server's draft length ("auto" or an integer >= 0).
        drafter: the server's drafter choice.
        drafter_names: choice -> the drafters it uses, or ValueError naming `drafter`
            (`SpeculativeDecoder.drafter_names`: the same rule that builds them).
        sampling: the API's validation of the sampling settings
            (`SpeculativeDecoder.sampling_config`; raises `SettingError`).
    """

    model_names: tuple[str, ...]
    drafter_names: Callable[[str], tuple[str, ...]]
    sampling: Callable[..., SamplingConfig]
    k: int | str = "auto"
    drafter: str = "auto"


@dataclass
class GenerationRequest:
    """A validated request, ready for the decode worker.

    Attributes:
        endpoint: "chat" or "completion".
        model: the served model name to report.
        prompt_ids: the prompt's token ids (chat template applied for chat).
        max_tokens: the exact token budget (the rest of the context when not given).
        sampling: the warps and controls, validated by the API.
        k, drafter, seed, stop_strings: as `SpeculativeDecoder.generate` takes them.
        stream, include_usage: SSE streaming; a final usage chunk.
        logprobs: alternatives per token when log-probabilities were asked for (0 = the
            chosen token only), else None.
        return_token_ids: add `token_ids` / `prompt_token_ids` to the response.
    """

    endpoint: str
    model: str
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingConfig
    k: int | str = "auto"
    drafter: str = "auto"
    seed: int | None = None
    stop_strings: list[str] | None = None
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None
    return_token_ids: bool = False


#: `SamplingConfig`'s argument names -> the request's field names, where they differ.
_FIELD_OF = {"min_new_tokens": "min_tokens"}


def _param(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _validate(cls: type[BaseModel], body: Any) -> BaseModel:
    if not isinstance(body, dict):
        raise bad_request(None, f"the request body must be a JSON object, got {type(body).__name__}")
    for name, value in list(body.items()):
        if name in UNSUPPORTED:
            neutral = UNSUPPORTED[name]
            if value is not None and not any(type(value) is type(n) and value == n for n in neutral):
                accepted = " or ".join(json.dumps(n) for n in neutral)
                raise bad_request(name, f"{name} is not supported by verispec serve (it accepts only "
                                        f"{accepted}, meaning not used)", code="unsupported_parameter")
            body = {k: v for k, v in body.items() if k != name}
        elif name not in cls.model_fields:
            raise bad_request(name, f"unrecognized request field {name!r}", code="unknown_parameter")
    try:
        return cls.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        param = _param(err["loc"])
        raise bad_request(param, f"{param}: {err['msg']} (got {err.get('input')!r})") from None


def _messages(value: Any) -> list[dict]:
    if value is None:
        raise bad_request("messages", "messages is required: a list of {role, content} objects")
    if not isinstance(value, list):
        raise bad_request("messages", f"messages must be a list of {{role, content}} objects, "
                                      f"got {type(value).__name__}")
    if not value:
        raise bad_request("messages", "messages is empty: give at least one message")
    out = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_request(where, f"{where} must be an object with role and content")
        extra = set(m) - {"role", "content", "name"}
        if extra:
            name = min(extra)
            raise bad_request(f"{where}.{name}", f"{where}.{name} is not supported (tool calls and "
                                                 "audio are not implemented)", code="unsupported_parameter")
        role = m.get("role")
        if role not in ROLES:
            raise bad_request(f"{where}.role", f"{where}.role must be one of {', '.join(ROLES)}, "
                                               f"got {role!r}")
        content = m.get("content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" \
                        or not isinstance(part.get("text"), str):
                    raise bad_request(f"{where}.content[{j}]", f"{where}.content[{j}] must be "
                                      '{"type": "text", "text": ...}; only text is supported')
                texts.append(part["text"])
            content = "\n".join(texts)
        if not isinstance(content, str):
            raise bad_request(f"{where}.content", f"{where}.content must be a string (or a list of "
                                                  f"text parts), got {content!r}")
        msg = {"role": "system" if role == "developer" else role, "content": content}
        if "name" in m:
            if not isinstance(m["name"], str):
                raise bad_request(f"{where}.name", f"{where}.name must be a string")
            msg["name"] = m["name"]
        out.append(msg)
    return out


def _prompt(value: Any, prompter: Prompter) -> list[int]:
    if value is None:
        raise bad_request("prompt", "prompt is required: text or a list of token ids")
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]           # a batch of one prompt
    if isinstance(value, str):
        if not value:
            raise bad_request("prompt", "prompt is empty: give some text to continue")
        ids = prompter.text(value)
        if not ids:
            raise bad_request("prompt", "prompt encodes to no tokens")
        return ids
    if isinstance(value, list):
        if not value:
            raise bad_request("prompt", "prompt is empty: give some text or token ids")
        if all(isinstance(v, (str, list)) for v in value):
            raise bad_request("prompt", f"a batch of {len(value)} prompts is not supported: send "
                                        "one prompt per request", code="unsupported_parameter")
        return prompter.check_ids(value)
    raise bad_request("prompt", f"prompt must be text or a list of token ids, got {type(value).__name__}")


def _stop(value: Any) -> list[str] | None:
    if value is None:
        return None
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list):
        raise bad_request("stop", f"stop must be a string or a list of strings, got {type(value).__name__}")
    if len(stops) > MAX_STOP:
        raise bad_request("stop", f"stop holds {len(stops)} strings; at most {MAX_STOP} are allowed")
    for j, s in enumerate(stops):
        if not isinstance(s, str) or not s:
            raise bad_request(f"stop[{j}]" if isinstance(value, list) else "stop",
                              f"stop strings must be non-empty strings, got {s!r}")
    return stops or None


def _logit_bias(value: dict[str, float] | None, vocab: int) -> dict[int, float] | None:
    if not value:
        return None
    out = {}
    for key, bias in value.items():
        try:
            tok = int(key)
        except ValueError:
            tok = -1
        if not 0 <= tok < vocab or str(tok) != key.strip():
            raise bad_request(f"logit_bias.{key}", f"logit_bias keys must be token ids in "
                                                   f"0..{vocab - 1}, got {key!r}")
        if not -100 <= bias <= 100:
            raise bad_request(f"logit_bias.{key}", f"logit_bias values must be in [-100, 100], got {bias}")
        out[tok] = float(bias)
    return out


def _k_and_drafter(req: _Common, server: ServerDefaults) -> tuple[int | str, str]:
    k = server.k if req.k is None else req.k
    if not (k == "auto" or (isinstance(k, int) and not isinstance(k, bool) and 0 <= k <= MAX_K)):
        raise bad_request("k", f'k must be "auto" or an integer in 0..{MAX_K} (0 = plain decoding), '
                               f"got {req.k!r}")
    drafter = server.drafter if req.drafter is None else req.drafter
    try:
        usable = server.drafter_names(drafter)
    except ValueError as e:
        raise bad_request("drafter", f"{e} (this server's default: {server.drafter})") from None
    if isinstance(k, int) and k > 0 and not usable:
        raise bad_request("k", f"k={k} needs a drafter, and drafter {drafter!r} drafts nothing; "
                               "use k=0 or another drafter")
    return k, drafter


def parse(endpoint: str, body: Any, prompter: Prompter, server: ServerDefaults) -> GenerationRequest:
    """Validate a chat ("chat") or completion ("completion") request body.

    Args:
        endpoint: "chat" or "completion".
        body: the decoded JSON body.
        prompter: tokenizes the prompt.
        server: the server's defaults and limits.

    Returns:
        A `GenerationRequest`.

    Raises:
        ApiError: 400 naming the first bad field.
    """
    req = _validate(ChatRequest if endpoint == "chat" else CompletionRequest, body)
    # fields first (cheap, and the error names the first bad field), then the prompt
    if req.model is not None and req.model not in server.model_names:
        raise ApiError(400, f"model {req.model!r} is not served here; /v1/models lists "
                            f"{', '.join(server.model_names)}", param="model", code="model_not_found")
    if req.n not in (None, 1):
        raise bad_request("n", f"n must be 1 (one choice per request), got {req.n}",
                          code="unsupported_parameter")
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options", "stream_options is only allowed with stream: true")
    if endpoint == "chat":
        messages = _messages(req.messages)
        if req.max_tokens is not None and req.max_completion_tokens is not None \
                and req.max_tokens != req.max_completion_tokens:
            raise bad_request("max_completion_tokens", "max_tokens and max_completion_tokens differ; "
                                                       "give one of them")
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        max_param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        if req.top_logprobs is not None and not req.logprobs:
            raise bad_request("top_logprobs", "top_logprobs needs logprobs: true")
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
    else:
        max_param, max_tokens, logprobs = "max_tokens", req.max_tokens, req.logprobs
    min_tokens = req.min_tokens or 0
    if max_tokens is not None and min_tokens > max_tokens:
        raise bad_request("min_tokens", f"min_tokens ({min_tokens}) exceeds {max_param} ({max_tokens})")
    k, drafter = _k_and_drafter(req, server)
    top_k = req.top_k or 0
    try:
        sampling = server.sampling(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=0 if top_k == -1 else top_k,      # vLLM's -1 = off
            min_p=req.min_p or 0.0,
            repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            logit_bias=_logit_bias(req.logit_bias, prompter.vocab_size), min_new_tokens=min_tokens)
    except SettingError as e:
        raise bad_request(_FIELD_OF.get(e.name, e.name), str(e)) from None
    stop_strings = _stop(req.stop)
    if stop_strings and prompter.tokenizer is None:
        raise bad_request("stop", "stop strings need a tokenizer, and this model has none")

    if endpoint == "chat":
        prompt_ids, prompt_param = prompter.chat(messages), "messages"
    else:
        prompt_ids, prompt_param = _prompt(req.prompt, prompter), "prompt"
    context = prompter.context_length
    if len(prompt_ids) >= context:
        raise ApiError(400, f"the prompt has {len(prompt_ids)} tokens but the context holds {context}; "
                            "shorten it", param=prompt_param, code="context_length_exceeded")
    room = context - len(prompt_ids)
    if max_tokens is None:
        max_tokens = room        # the rest of the context
    elif max_tokens > room:
        raise ApiError(400, f"{max_param}={max_tokens} does not fit: the prompt has {len(prompt_ids)} "
                            f"tokens and the context {context}, so at most {room} can be generated",
                       param=max_param, code="context_length_exceeded")
    if min_tokens > max_tokens:
        raise bad_request("min_tokens", f"min_tokens ({min_tokens}) exceeds the token budget ({max_tokens})")
    return GenerationRequest(
        endpoint=endpoint, model=req.model or server.model_names[0], prompt_ids=prompt_ids,
        max_tokens=max_tokens, sampling=sampling, k=k, drafter=drafter, seed=req.seed,
        stop_strings=stop_strings, stream=bool(req.stream),
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        logprobs=logprobs, return_token_ids=bool(req.return_token_ids))
