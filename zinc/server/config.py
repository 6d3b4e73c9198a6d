"""Server settings: where to listen, who may call, and every limit the HTTP layer enforces.

Owns: `ServerConfig`, a frozen dataclass the CLI fills in. Each limit is a named field so that no
number in the protocol code is magic; the HTTP status a limit produces is noted beside it.
Imports: the stdlib only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True)
class ServerConfig:
    """How the HTTP server listens and what it tolerates.

    Admission: at most `parallel` requests generate at once (the engine decodes them together),
    at most `max_queued_requests` more wait for a slot; anything past that is refused at once
    with 429 (never left hanging).
    """

    host: str = "127.0.0.1"
    port: int = 8080  # 0 picks a free port (tests)
    api_key: str | None = None  # None: no authentication; `/health` is always public
    parallel: int = 8  # requests admitted to the engine at once (`zinc serve --parallel`)
    max_queued_requests: int = 16  # requests waiting for a slot before 429

    max_header_bytes: int = 16 * KIB  # request line + headers larger than this: 431
    max_body_bytes: int = 16 * MIB  # declared or received body larger than this: 413
    request_timeout_s: float = 30.0  # a request not received in full by then: 408
    keep_alive_timeout_s: float = 15.0  # an idle keep-alive connection is closed after this
    write_timeout_s: float = 30.0  # a client that reads nothing of a response for this long is dropped
    max_connections: int = 1024  # open connections; past them a new one gets 503 and is closed
    graceful_shutdown_timeout_s: float = 10.0  # streams still running after this are cancelled
    drain_delay_s: float = 0.0  # after SIGTERM: /health 503 "draining" this long, still serving, then close
    body_high_water_bytes: int = 64 * KIB  # unread request body past this pauses reading

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be within 0..65535, got {self.port}")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must be None (no authentication) or a non-empty string")
        limits = ("parallel", "max_header_bytes", "max_body_bytes", "body_high_water_bytes", "max_connections")
        for name in limits:
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        if not (self.drain_delay_s >= 0 and math.isfinite(self.drain_delay_s)):
            raise ValueError(f"drain_delay_s must be a number of seconds >= 0, got {self.drain_delay_s}")
        if self.max_queued_requests < 0:
            raise ValueError(f"max_queued_requests must be >= 0, got {self.max_queued_requests}")
        timeouts = ("request_timeout_s", "keep_alive_timeout_s", "write_timeout_s", "graceful_shutdown_timeout_s")
        for name in timeouts:
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number of seconds, got {value}")
