"""Handing the scheduler thread's events to an asyncio event loop, one wake-up for many.

Owns: `EventRelay` — events posted from any thread are queued under a lock, and the loop is woken
(`call_soon_threadsafe`) only by the first event of a batch; the callback it runs hands over every
event posted until then, in posting order. A batched decode step posts one token event per
sequence: the loop wakes once per step and serves every stream in that one turn, instead of once
per token. Posting to a closed loop raises (as `call_soon_threadsafe` does), and the events of
that batch are dropped, so that a later batch wakes the loop again; a hand-over that raises on
the loop is logged and the rest of its batch still delivered. `EventChannel` — one request's
events on its loop, in order, to one reader (what `asyncio.Queue` did for it, in a fraction of
the calls per event).
Imports: the stdlib (asyncio, collections, logging, threading).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

log = logging.getLogger("zinc.engine")
T = TypeVar("T")


class EventRelay:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._pending: list[tuple[Callable[[Any], None], Any]] = []

    def post(self, deliver: Callable[[Any], None], event: Any) -> None:
        """Call `deliver(event)` on the loop (any thread), after the events posted before it."""
        with self._lock:
            first = not self._pending
            self._pending.append((deliver, event))
        if first:
            try:
                self.loop.call_soon_threadsafe(self._flush)
            except RuntimeError:  # the loop is closed: nothing will run this batch
                with self._lock:
                    self._pending.clear()
                raise

    def _flush(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
        for deliver, event in batch:
            try:
                deliver(event)
            except Exception:  # one failed hand-over must not lose the rest of the batch
                log.exception("delivering a token event failed")


class EventChannel(Generic[T]):
    """Events for one reader on the loop: `put` (on the loop) never blocks; `get` waits for the
    next one. A cancelled `get` loses nothing: the events stay queued."""

    def __init__(self) -> None:
        self._items: deque[T] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: T) -> None:
        self._items.append(item)
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> T:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return self._items.popleft()
