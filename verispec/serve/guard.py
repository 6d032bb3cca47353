"""What stands between the socket and the routes, so that no client can hurt another.

`Limits` are the server's bounds (each a `verispec serve` option; the defaults are what
a 2-core machine serves without one request stalling the rest):

| limit | option | default | refused with |
|---|---|---|---|
| request body size | `--max-request-bytes` | 1 MiB | 413, `code: "request_too_large"` |
| time for the body to arrive | `--read-timeout` | 30 s | 408, `code: "read_timeout"` |
| prompt length | `--max-prompt-tokens` | 2048 | 400 naming `prompt` / `messages` |
| time per request (queue + decode) | `--request-timeout` | 300 s | 408, `code: "request_timeout"` |
| JSON nesting depth | (fixed) | 64 | 400 |
| integers | (fixed) | 64-bit | 400 naming the field |

`Guard` is an ASGI middleware in front of the app: it reads a POST body within the size
and time limits before any route sees it, requires ``Content-Type: application/json``
(415 otherwise: a web page cannot make a browser send a JSON "simple request", so no
page can start generations cross-site), and turns an unhandled exception into a 500 in
OpenAI's error shape *without* re-raising it, so the keep-alive connection stays usable
(Starlette's own handler re-raises, and uvicorn then drops the connection).

`parse_json` decodes a body: nesting deeper than the limit, an integer with more digits
than Python converts, or a lone surrogate (``"\\ud800"``: valid JSON, but not text any
tokenizer or encoder accepts) is a 400 naming where it is.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

from .errors import ApiError, bad_request

log = logging.getLogger("verispec.serve")

MAX_DEPTH = 64            # JSON nesting (OpenAI bodies need < 10)
INT_LIMIT = 2 ** 63       # integers must fit in a signed 64-bit word, as vLLM's seed does


@dataclass(frozen=True)
class Limits:
    """The server's bounds (see the module docstring).

    Attributes:
        max_request_bytes: largest request body, bytes.
        read_timeout: seconds a client has to send the whole body.
        max_prompt_tokens: longest prompt, tokens (chat template included).
        request_timeout: seconds from arrival to the last token; a request still queued
            or decoding then is stopped (after the round in flight) with a 408.

    Raises:
        ValueError: naming the limit when it is not positive.
    """

    max_request_bytes: int = 1 << 20
    read_timeout: float = 30.0
    max_prompt_tokens: int = 2048
    request_timeout: float = 300.0

    def __post_init__(self) -> None:
        for name in ("max_request_bytes", "max_prompt_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("read_timeout", "request_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")


def check_api_key(api_key: str | None) -> None:
    """Refuse at start-up a key no client could send.

    Raises:
        ValueError: naming `api_key` when it is empty, has surrounding whitespace, or
            holds characters other than printable ASCII (HTTP headers carry no others).
    """
    if api_key is None:
        return
    if not isinstance(api_key, str) or not api_key:
        raise ValueError("api_key is empty: give a non-empty key or none")
    if api_key != api_key.strip():
        raise ValueError("api_key has surrounding whitespace, which no client sends in "
                         "'Authorization: Bearer KEY'; remove it")
    if not all("!" <= c <= "~" for c in api_key):
        raise ValueError("api_key must be printable ASCII without spaces (it travels in an HTTP header)")


def parse_json(raw: bytes) -> Any:
    """Decode a request body, refusing what would fail later (see the module docstring).

    Raises:
        ApiError: 400 (`param` naming the place when there is one).
    """
    try:
        body = json.loads(raw)
    except RecursionError:
        raise bad_request(None, f"the request body is nested too deeply (at most {MAX_DEPTH} levels)",
                          code="invalid_json") from None
    except UnicodeDecodeError as e:
        raise bad_request(None, f"the request body is not UTF-8: {e.reason} at byte {e.start}",
                          code="invalid_json") from None
    except json.JSONDecodeError as e:
        raise bad_request(None, f"the request body is not valid JSON: {e.msg} (line {e.lineno}, "
                                f"column {e.colno})", code="invalid_json") from None
    except ValueError as e:      # int() refusing a number with thousands of digits
        raise bad_request(None, f"the request body holds a number Python will not convert: "
                                f"{str(e)[:120]}", code="invalid_json") from None
    _check(body)
    return body


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _check(body: Any) -> None:
    """Walk `body` (iteratively: no recursion to exhaust) for depth, integers, surrogates."""
    stack: list[tuple[Any, str, int]] = [(body, "", 0)]
    while stack:
        value, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise bad_request(where or None, f"the request body is nested more than {MAX_DEPTH} levels deep",
                              code="invalid_json")
        if isinstance(value, str):
            if _has_surrogate(value):
                raise bad_request(where or None, f"{where or 'the body'} holds a lone UTF-16 surrogate "
                                                 "(e.g. \\ud800), which is not text; send valid Unicode")
        elif isinstance(value, bool) or value is None or isinstance(value, float):
            continue
        elif isinstance(value, int):
            if not -INT_LIMIT <= value < INT_LIMIT:
                raise bad_request(where or None, f"{where or 'the body'} is an integer outside the "
                                                 "64-bit range")
        elif isinstance(value, dict):
            for key, item in value.items():
                if _has_surrogate(key):
                    name = key.encode("utf-8", "backslashreplace").decode()
                    raise bad_request(f"{where}.{name}" if where else name,
                                      f"the field name {name!r} holds a lone UTF-16 surrogate; "
                                      "send valid Unicode")
                stack.append((item, f"{where}.{key}" if where else key, depth + 1))
        elif isinstance(value, list):
            for j, item in enumerate(value):
                stack.append((item, f"{where}[{j}]", depth + 1))


def _json_media_type(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class Guard:
    """ASGI middleware: body size and read-time limits, JSON content type, and 500s that
    keep the connection (see the module docstring).

    Args:
        app: the ASGI app behind it.
        limits: the server's `Limits`.
    """

    def __init__(self, app, limits: Limits) -> None:
        self.app, self.limits = app, limits

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked_send(message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            if scope["method"] in ("POST", "PUT", "PATCH"):
                receive = await self._buffered(scope, receive)
                if receive is None:            # the client left before sending its body
                    return
            await self.app(scope, receive, tracked_send)
        except ApiError as e:
            if started:
                raise
            unread = {"connection": "close"} if e.status in (408, 413) else {}   # body left unread
            await _send_json(send, e.status, e.body(), {**e.headers, **unread})
        except asyncio.CancelledError:
            raise
        except Exception as e:       # a real fault: answer it, keep the connection
            log.exception("unhandled error on %s", scope.get("path"))
            if started:        # the response is under way: all that can be done is to end it
                return
            error = ApiError(500, f"internal error: {type(e).__name__}", type="server_error")
            await _send_json(send, 500, error.body(), {})

    async def _drain(self, receive, declared: int, deadline: float) -> None:
        """Read and discard the rest of a body that gets a 413, so that closing the connection
        after the answer does not reset it (a socket closed with unread input sends an RST, and
        the client may lose the 413 it was sent). Bounded: at most 4 × the limit, before the
        read deadline, and not at all for a declared size beyond that (abusive; then the reset
        may happen, which is all such a client can expect)."""
        cap = 4 * self.limits.max_request_bytes
        if declared > cap:
            return
        loop, seen = asyncio.get_running_loop(), 0
        try:
            while seen <= cap:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
                if message["type"] != "http.request":
                    return
                seen += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return
        except asyncio.TimeoutError:
            return

    async def _buffered(self, scope, receive):
        """Read the whole body within the limits; return a `receive` that replays it."""
        limit = self.limits.max_request_bytes
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        declared = headers.get("content-length")
        too_large = ApiError(413, f"the request body exceeds the server's limit of {limit} bytes "
                                  "(--max-request-bytes)", code="request_too_large")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.read_timeout
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._drain(receive, int(declared), deadline)
            raise too_large
        chunks, size = [], 0
        try:
            while True:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
                if message["type"] != "http.request":      # the client went away
                    return None
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    if message.get("more_body", False):
                        await self._drain(receive, 0, deadline)
                    raise too_large
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
        except asyncio.TimeoutError:
            raise ApiError(408, f"the request body did not arrive within {self.limits.read_timeout:g} s "
                                "(--read-timeout)", code="read_timeout") from None
        if not _json_media_type(headers.get("content-type", "")):
            raise ApiError(415, "send the body as JSON with 'Content-Type: application/json' "
                                f"(got {headers.get('content-type', 'none')[:60]!r})",
                           code="unsupported_media_type")
        body = b"".join(chunks)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay


async def _send_json(send, status: int, body: dict, headers: dict[str, str]) -> None:
    data = json.dumps(body, ensure_ascii=False).encode("utf-8")
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    raw += [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data})
