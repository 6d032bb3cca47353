"""Errors in OpenAI's wire format: ``{"error": {"message", "type", "param", "code"}}``.

Every refusal the server makes is an `ApiError`: bad input is a 400 naming the field
(`param`), a wrong key a 401, a full queue a 429 with ``Retry-After``, a server still
loading its models a 503. Nothing a client sends may reach a 500.

An error body never carries more than a short prefix of what the client sent
(`short`; messages are capped at `MAX_MESSAGE` characters), and never a character
that cannot be encoded (a lone surrogate is written as its escape), so building the
refusal itself can never fail.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse


class ApiError(Exception):
    """A refusal with its HTTP status and OpenAI error object.

    Args:
        status: HTTP status code (400, 401, 404, 429, 503, ...).
        message: what was wrong and how to fix it.
        param: the request field at fault (e.g. "temperature", "messages[2].role"), or None.
        code: OpenAI's machine-readable code ("invalid_value", "unsupported_parameter",
            "model_not_found", "context_length_exceeded", ...), or None.
        type: OpenAI's error type; default from the status.
        headers: extra response headers (``Retry-After`` for a 429).
    """

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, type: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        message, param = _safe(message, MAX_MESSAGE), (_safe(param, 200) if param is not None else None)
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or _TYPES.get(status, "server_error")
        self.headers = headers or {}

    def body(self) -> dict:
        """The JSON body: ``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


MAX_MESSAGE = 1000   # characters of an error message


def _safe(text: str, limit: int) -> str:
    text = str(text).encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[:limit] + "..."


def short(value, limit: int = 60) -> str:
    """repr(value) cut to `limit` characters (with the full length said), for messages
    that quote what the client sent: a 20 MB string is never echoed back."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 408: "invalid_request_error", 413: "invalid_request_error",
          415: "invalid_request_error", 429: "rate_limit_error", 503: "service_unavailable"}


def bad_request(param: str | None, message: str, code: str = "invalid_value") -> ApiError:
    """A 400 naming `param`."""
    return ApiError(400, message, param=param, code=code)
