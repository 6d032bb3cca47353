"""Errors in OpenAI's wire format: ``{"error": {"message", "type", "param", "code"}}``.

Every refusal the server makes is an `ApiError`: bad input is a 400 naming the field
(`param`), a wrong key a 401, a full queue a 429 with ``Retry-After``, a server still
loading its models a 503. Nothing a client sends may reach a 500.
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


_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 429: "rate_limit_error", 503: "service_unavailable"}


def bad_request(param: str | None, message: str, code: str = "invalid_value") -> ApiError:
    """A 400 naming `param`."""
    return ApiError(400, message, param=param, code=code)
