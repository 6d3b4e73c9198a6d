"""The one place where a failure becomes an HTTP status and an OpenAI error envelope.

Owns: the HTTP-level failures the server raises itself (404, 405, 408, 413, 431, 503, 505, 500,
and a malformed request's 400) as `ZincError` subclasses, and `describe()`, which maps any exception to
`(status, envelope)`. Every `ZincError` carries its status, OpenAI `type` and `code` as class
attributes (see zinc.errors); together with the classes below they form the status table:

    400 invalid_request_error   InvalidRequestError (param named), BadHttpRequestError
    400 invalid_request_error   ContextLengthExceededError, code context_length_exceeded
    401 authentication_error    AuthenticationError
    404 invalid_request_error   ModelNotFoundError (code model_not_found), NotFoundError (not_found)
    405 invalid_request_error   MethodNotAllowedError
    408 invalid_request_error   RequestTimeoutError
    413 invalid_request_error   PayloadTooLargeError
    429 rate_limit_error        QueueFullError
    431 invalid_request_error   HeadersTooLargeError
    503 server_error            ServiceUnavailableError, DeviceError
    505 invalid_request_error   HttpVersionNotSupportedError
    500 server_error            any other exception: a generic message, never a traceback

Imports: zinc.errors, orjson, the stdlib.
"""

from __future__ import annotations

from typing import Any

import orjson

from zinc.errors import ZincError

GENERIC_500_MESSAGE = "The server had an internal error while processing the request."


class BadHttpRequestError(ZincError):
    """The bytes received are not a valid HTTP/1.1 request."""

    status = 400
    error_type = "invalid_request_error"
    code = "bad_request"


class NotFoundError(ZincError):
    status = 404
    error_type = "invalid_request_error"
    code = "not_found"


class MethodNotAllowedError(ZincError):
    status = 405
    error_type = "invalid_request_error"
    code = "method_not_allowed"

    def __init__(self, message: str, allowed: tuple[str, ...]) -> None:
        super().__init__(message)
        self.allowed = allowed


class RequestTimeoutError(ZincError):
    status = 408
    error_type = "invalid_request_error"
    code = "request_timeout"


class PayloadTooLargeError(ZincError):
    status = 413
    error_type = "invalid_request_error"
    code = "request_too_large"


class HeadersTooLargeError(ZincError):
    status = 431
    error_type = "invalid_request_error"
    code = "headers_too_large"


class ServiceUnavailableError(ZincError):
    status = 503
    error_type = "server_error"
    code = "service_unavailable"


class HttpVersionNotSupportedError(ZincError):
    """A request line of another HTTP version than 1.x (an HTTP/2 preface, HTTP/0.9)."""

    status = 505
    error_type = "invalid_request_error"
    code = "http_version_not_supported"


def envelope(message: str, error_type: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    """The OpenAI error object: `{"error": {"message", "type", "param", "code"}}`."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def describe(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """Status and envelope for any exception; unknown ones become a generic 500."""
    if isinstance(exc, ZincError):
        param = getattr(exc, "param", None)
        return exc.status, envelope(
            exc.message, exc.error_type, exc.code, param if isinstance(param, str) else None
        )
    return 500, envelope(GENERIC_500_MESSAGE, "server_error", "internal_error")


def error_json(exc: BaseException) -> tuple[int, bytes]:
    """`describe()` serialized: the status and the JSON body to send."""
    status, body = describe(exc)
    return status, orjson.dumps(body)
