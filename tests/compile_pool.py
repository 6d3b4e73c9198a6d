"""The kernel tests' iree-compile runs: each module text compiled once per test run, and the
modules of a test file's selected tests compiled ahead, two at a time, while its first tests run.

One iree-compile keeps about 1.3 of this machine's 2 cores busy (most of its passes run on one
thread), so two at once finish a file's modules in about two thirds of the time. A test module
opts in by defining `compile_jobs(test, params)`: the `KernelJob`s that the test named `test`
(its function's name) with these parameters compiles, in the order it compiles them. The jobs
only warm the cache: a test compiles whatever text it builds, through `compile_kernel`, and waits
only when that text is one the pool has not finished.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from zinc.compiler.targets import compile_mlir, target_flags

KernelJob = tuple[str, str, tuple[str, ...]]  # module text, target ("cpu" or "vulkan"), extra flags
JobsOf = Callable[[str, Mapping[str, Any]], Iterable[KernelJob]]

_POOL = ThreadPoolExecutor(2, thread_name_prefix="iree-compile")
_COMPILED: dict[tuple[str, tuple[str, ...]], Future[bytes]] = {}


def _key(text: str, target: str, extra_flags: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    return text, (*target_flags(target), *extra_flags)


def compile_kernel(text: str, target: str, extra_flags: tuple[str, ...] = ()) -> bytes:
    """`compile_mlir`, once per module text and iree-compile flags in a test run (the kernel tests
    run one module on both CPU drivers, local-sync and local-task, whose vmfb is the same bytes).
    A text not compiled ahead compiles here, on this thread, not behind the pool's queue."""
    key = _key(text, target, extra_flags)
    if key not in _COMPILED:
        done: Future[bytes] = Future()
        try:
            done.set_result(compile_mlir(text, target, extra_flags))
        except Exception as exc:  # kept, as the pool keeps it: the next request raises it too
            done.set_exception(exc)
        _COMPILED[key] = done
    return _COMPILED[key].result()


def compile_ahead(jobs: Iterable[KernelJob]) -> list[Future[bytes]]:
    """Queue the jobs not yet compiled or queued; their futures, for `cancel_pending`."""
    queued = []
    for text, target, extra_flags in jobs:
        key = _key(text, target, extra_flags)
        if key not in _COMPILED:
            _COMPILED[key] = _POOL.submit(compile_mlir, text, target, extra_flags)
            queued.append(_COMPILED[key])
    return queued


def cancel_pending(queued: Iterable[Future[bytes]]) -> None:
    """Drop the queued jobs that have not started (a test file's end: its tests did not ask for
    them), so that a later request compiles them afresh; a running one finishes into the cache."""
    dropped = {id(f) for f in queued if f.cancel()}
    for key in [k for k, f in _COMPILED.items() if id(f) in dropped]:
        del _COMPILED[key]

