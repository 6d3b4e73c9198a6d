"""Calling a compiled entry point: in order on the device, the host blocked on an eventfd.

Owns: `Timeline` (one HAL semaphore per loaded module whose value counts the calls finished, and
the host's wait for a value) and `Entry` (one entry point). Functions compiled with IREE's
async-external model (`iree.abi.model` = coarse-fences, see zinc.compiler.targets) take a wait
and a signal fence: call k waits for value k and signals k + 1, so the device runs calls in the
order they are made, and `Entry.submit` can enqueue a call whose results the host never reads
(the KV write-back) without waiting for it. `Entry.__call__` waits for its own call, then returns
its results; `Entry.start` returns them with the wait, so the host can enqueue the next call
before this one ends. A call that fails (to start, or on the device, which fails the semaphore) resets the
timeline: a new semaphore once the calls already enqueued have ended, so one failed step does not
fail every later one.

The wait: the semaphore exports an eventfd that IREE signals at the value, and the host blocks in
`poll` on it (polling the semaphore where it cannot export one). Not IREE's own wait (a
synchronous function, or `HalFence.wait`): once woken it spins until the thread that signalled it
has finished its callback, and when that thread has just lost its core to the waiter, the spin
holds the core it needs. Decode steps through ModelSession on 2 cores: SmolLM2 4.7 -> 3.8 ms,
Gemma 3 8.0 -> 7.0 ms. Polling the semaphore (30 us sleeps) did as well for short calls but cost
Gemma 3's 128-token prefill 12 ms of 47, each look waking a thread on a busy core.
Functions compiled with the synchronous model (artifacts built before) are called as they are.
Imports: iree.runtime, numpy, the stdlib.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections.abc import Callable
from typing import Any

import iree.runtime as rt
import numpy as np

DRAIN_NS = 30_000_000_000  # a reset waits at most this long for the calls already enqueued
POLL_S = 30e-6  # between looks at the semaphore: the kernel's timer slack makes it about 80 us
CHECK_S = 0.1  # a blocked wait still asks the semaphore this often whether the device failed
MAX_RESULTS = 16


class Timeline:
    def __init__(self, device: Any) -> None:
        self.device = device
        self.semaphore = device.create_semaphore(0)
        self.submitted = 0  # the value the last call made will signal
        self.lock = threading.Lock()
        self.epoch = 0  # counts resets: a wait for a call made before the last one cannot be answered
        self.exports = True  # whether `_eventfd` may be tried (it turns off where it fails)
        self._checked = False  # whether an exported descriptor was seen to be an eventfd (once is enough)

    def wait(self, value: int) -> None:
        """Until `value` is signalled: blocked on an eventfd IREE signals at that value, or
        polling where the semaphore cannot export one. A failed device call raises here (query
        reports it)."""
        query = self.semaphore.query
        if query() >= value:
            return
        fd = self._eventfd(value)
        if fd is not None:
            try:  # poll, not select: a server with many connections has descriptors past 1024
                ready = select.poll()
                ready.register(fd, select.POLLIN)
                while not ready.poll(CHECK_S * 1000):
                    query()  # raises if the device failed
            finally:
                os.close(fd)
            query()
            return
        while query() < value:
            time.sleep(POLL_S)

    def reset(self) -> None:
        """After a call that failed (to start, or on the device): a new semaphore from 0, once the
        calls already enqueued have ended, so that later calls neither wait for a value nobody
        will signal nor inherit the old semaphore's failure."""
        with self.lock:
            with contextlib.suppress(Exception):  # failed: the calls queued behind the failure never run
                self.semaphore.wait(self.submitted, timeout=DRAIN_NS)
            self.semaphore = self.device.create_semaphore(0)
            self.submitted = 0
            self.epoch += 1

    def _eventfd(self, value: int) -> int | None:
        """A new eventfd that IREE signals when the timeline reaches `value` (the caller closes
        it), or None where the semaphore cannot export one."""
        if not self.exports:
            return None
        point = rt.HalExternalTimepoint()
        try:
            self.semaphore.export_timepoint(value, rt.ExternalTimepointType.ASYNC_PRIMITIVE, 0, point)
        except Exception:  # a driver that cannot export one: poll instead
            self.exports = False
            return None
        # The binding shows the handle union only as a CUDA event (64 bits): an async primitive
        # is its type byte (1: a file descriptor), then the descriptor at byte 4.
        raw = int(point.cuda_event)
        fd = (raw >> 32) & 0xFFFFFFFF
        layout = point.type == rt.ExternalTimepointType.ASYNC_PRIMITIVE and raw & 0xFF == 1
        if not layout or not (self._checked or _is_eventfd(fd)):
            self.exports = False
            return None
        self._checked = True  # the layout is the binding's: one look at /proc covers every later step
        return fd


def _is_eventfd(fd: int) -> bool:
    """Whether `fd` is an eventfd of this process (checked on the first export, before zinc waits
    on or closes one)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[eventfd]"
    except OSError:
        return False


class Entry:
    """One entry point: `entry(*args)` runs it and returns its results (device arrays);
    `entry.submit(*args)` only enqueues it (async-external functions) and returns nothing;
    `entry.start(*args)` enqueues it and returns its results and their wait."""

    def __init__(self, invoker: Any, timeline: Timeline, to_device: Callable[[np.ndarray[Any, Any]], Any]):
        self._invoker = invoker
        self._function = invoker.vm_function
        self._context = invoker._vm_context
        self._timeline = timeline
        self._to_device = to_device
        self.fenced = self._function.reflection.get("iree.abi.model") == "coarse-fences"

    def __call__(self, *args: Any) -> Any:
        results, wait = self.start(*args)
        wait()
        return results

    def submit(self, *args: Any) -> None:
        """Enqueue the call without its results (nothing is waited for or read back)."""
        if not self.fenced:
            self._invoker(*args)
            return
        try:
            self._enqueue(args, read=False)
        except Exception:
            self._timeline.reset()
            raise

    def start(self, *args: Any) -> tuple[Any, Callable[[], None]]:
        """Enqueue the call and return its results with a function that waits for them (the host
        goes on meanwhile: it may enqueue the next call, which the device runs after this one).
        The wait raises if this call, or one before it, failed."""
        if not self.fenced:
            return self._invoker(*args), _done
        timeline = self._timeline
        try:
            results, done, epoch = self._enqueue(args)
        except Exception:
            timeline.reset()
            raise

        def wait() -> None:
            if timeline.epoch != epoch:
                raise RuntimeError("an earlier call on the device failed; this one did not run")
            try:
                timeline.wait(done)
            except Exception:
                timeline.reset()
                raise

        return results, wait

    def _enqueue(self, args: tuple[Any, ...], read: bool = True) -> tuple[Any, int, int]:
        inputs = rt.VmVariantList(len(args) + 2)
        for arg in args:
            if isinstance(arg, (bool, np.bool_)):
                raise TypeError("an entry point takes tensors and integers, not booleans")
            if isinstance(arg, (int, np.integer)):
                inputs.push_int(int(arg))
            else:
                array = self._to_device(arg) if isinstance(arg, np.ndarray) else arg
                inputs.push_ref(array._buffer_view)
        outputs = rt.VmVariantList(MAX_RESULTS)
        timeline = self._timeline
        with timeline.lock:
            start = timeline.submitted
            inputs.push_ref(rt.HalFence.create_at(timeline.semaphore, start))
            inputs.push_ref(rt.HalFence.create_at(timeline.semaphore, start + 1))
            self._context.invoke(self._function, inputs, outputs)
            timeline.submitted = start + 1
            epoch = timeline.epoch
        if not read:  # a call whose results the host never reads (the KV write-back)
            return None, start + 1, epoch
        views = [outputs.get_as_object(i, rt.HalBufferView) for i in range(len(outputs))]
        arrays = [rt.DeviceArray(timeline.device, view) for view in views]
        results = None if not arrays else arrays[0] if len(arrays) == 1 else tuple(arrays)
        return results, start + 1, epoch


def _done() -> None:
    """The wait of a synchronous call: it has already finished."""
