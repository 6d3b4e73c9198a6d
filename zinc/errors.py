"""Error types shared by every layer of zinc.

Owns: the exception hierarchy. Each error carries a one-line, user-facing message; the CLI prints
it as-is and the server maps the type to an HTTP status and an OpenAI error `type` in one table.
Imports: nothing from zinc (this module is a leaf that anyone may import).
"""

from __future__ import annotations


class ZincError(Exception):
    """Base class: a failure with a clear one-line message, never shown as a traceback."""

    status = 500
    error_type = "server_error"
    code: str | None = None

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class GGUFError(ZincError):
    """The file is missing, not GGUF, truncated, or inconsistent."""

    status = 400
    error_type = "invalid_request_error"
    code = "invalid_model_file"


class UnsupportedModelError(ZincError):
    """The GGUF is valid but uses an architecture or quant type zinc cannot compile."""

    status = 400
    error_type = "invalid_request_error"
    code = "unsupported_model"


class CompileError(ZincError):
    """iree-compile rejected the generated program (a zinc bug, reported with context), or could
    not be started (its fork or exec refused, after the retries of a passing refusal)."""


class ArtifactError(ZincError):
    """An artifact directory is missing, corrupted, or does not match its GGUF."""

    code = "artifact_mismatch"


class DeviceError(ZincError):
    """The requested device (e.g. Vulkan) is not available."""

    status = 503
    error_type = "server_error"
    code = "device_unavailable"


class InsufficientMemoryError(ZincError):
    """A model's weights, KV cache and working buffers need more memory than the machine has
    available (checked before anything is loaded)."""

    status = 400
    error_type = "invalid_request_error"
    code = "model_does_not_fit"


class InvalidRequestError(ZincError):
    """A request is malformed or has a parameter of the wrong type or range."""

    status = 400
    error_type = "invalid_request_error"

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        if code is not None:
            self.code = code


class ContextLengthExceededError(InvalidRequestError):
    """The prompt plus requested tokens do not fit in the context window."""

    code = "context_length_exceeded"

    def __init__(self, prompt_tokens: int, context_length: int) -> None:
        super().__init__(
            f"This model's maximum context length is {context_length} tokens, "
            f"but the prompt has {prompt_tokens} tokens.",
            param="messages",
            code="context_length_exceeded",
        )
        self.prompt_tokens = prompt_tokens
        self.context_length = context_length


class ModelNotFoundError(ZincError):
    """The requested model id is not the one being served or installed."""

    status = 404
    error_type = "invalid_request_error"
    code = "model_not_found"


class QueueFullError(ZincError):
    """Admission control: too many requests running and queued."""

    status = 429
    error_type = "rate_limit_error"
    code = "queue_full"


class EngineClosedError(ZincError):
    """The engine shut down (server exit, model swap) before the request could finish."""

    status = 503
    error_type = "server_error"
    code = "engine_closed"


class AuthenticationError(ZincError):
    """A missing or wrong API key."""

    status = 401
    error_type = "authentication_error"
    code = "invalid_api_key"
