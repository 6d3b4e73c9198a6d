"""Tier 2: calling entry points on a module's timeline (zinc.runtime.invoke).

Artifacts are compiled with IREE's async-external model: each call waits for the one before it
on the device and the host blocks on an eventfd the timeline exports (or polls it). Calls enqueued with `submit` (the KV write-back)
must be done before a later call reads their effect; a call that fails to start must not leave
the timeline waiting for a value nobody signals; a function compiled the synchronous way (an
artifact built before) must still run.
"""

from __future__ import annotations

import os
import resource
import threading

import numpy as np
import pytest
from iree.compiler import compile_str

from tests.compile_pool import compile_kernel
from tests.conftest import DEVICES, device_params
from tests.kernels.test_paged_kernels import L, filled_slab, paged_module, stored
from zinc.compiler.targets import ASYNC, target_flags
from zinc.runtime.device import open_device, to_host
from zinc.runtime.invoke import Timeline
from zinc.runtime.module import LoadedModule
from zinc.runtime.session import layer_major

SLOTS = 64


def _fill(mod: LoadedModule, vulkan: bool) -> tuple[object, np.ndarray]:
    """The slab after 8 submitted writes of 8 rows each (a prefill's chunks), and its f16 rows."""
    cache, expect = filled_slab(mod, vulkan, np.random.default_rng(3), SLOTS)
    write = mod.fn("kv_write")
    for at in range(0, SLOTS, 8):
        where = np.arange(at, at + 8, dtype=np.int32)
        write.submit(cache, mod.to_device(layer_major(stored(expect[at : at + 8], vulkan))), mod.to_device(where))
    return cache, expect


@pytest.mark.parametrize("poll", [False, True], ids=["eventfd", "poll"])
@pytest.mark.parametrize("device", device_params("cpu-task", "vulkan"))
def test_submitted_calls_are_done_before_the_next_call_reads(device: str, poll: bool) -> None:
    spec = DEVICES[device]()
    vulkan = spec.target == "vulkan"
    mod = LoadedModule(compile_kernel(paged_module(vulkan, tiled=not vulkan), spec.target), spec.uri)
    assert mod.fn("one").fenced and mod.fn("kv_write").fenced
    mod.timeline.exports = not poll
    cache, expect = _fill(mod, vulkan)
    assert mod.timeline.submitted == SLOTS // 8
    ctx = np.random.default_rng(4).permutation(SLOTS).astype(np.int32)
    one = to_host(mod.fn("one")(cache, mod.to_device(ctx)), mod.device)  # waits for its own call only
    assert mod.timeline.semaphore.query() == mod.timeline.submitted == SLOTS // 8 + 1
    assert np.array_equal(one, expect[ctx, L - 1, 1].astype(np.float32))
    assert mod.timeline.exports is not poll  # the eventfd wait worked (it turns itself off on failure)


@pytest.mark.parametrize("poll", [False, True], ids=["eventfd", "poll"])
def test_a_wait_blocks_until_the_value_and_ends_when_the_device_fails(poll: bool) -> None:
    device = open_device("local-task")
    fds = len(os.listdir("/proc/self/fd"))
    timeline = Timeline(device)
    timeline.exports = not poll
    threading.Timer(0.05, timeline.semaphore.signal, [1]).start()
    timeline.wait(1)
    # it waited for the timer: had it returned before, the value would still be 0 (no time is
    # measured: the value read after the wait shows the order)
    assert timeline.semaphore.query() == 1
    assert timeline.exports is not poll
    threading.Timer(0.05, timeline.semaphore.fail, ["a dispatch failed"]).start()
    with pytest.raises(RuntimeError, match="a dispatch failed"):  # not a hang
        timeline.wait(2)
    del timeline
    assert len(os.listdir("/proc/self/fd")) == fds  # the eventfds were closed


def test_a_wait_works_with_descriptors_past_1024() -> None:
    """A server with many connections: the eventfd's number is past select()'s limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the open-file limit ({hard}) cannot reach past 1024")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    read, write = os.pipe()
    held = [os.dup(read) for _ in range(1100 - len(os.listdir("/proc/self/fd")))]
    try:
        timeline = Timeline(open_device("local-task"))
        threading.Timer(0.05, timeline.semaphore.signal, [1]).start()
        timeline.wait(1)
        assert timeline.exports and timeline.semaphore.query() == 1
    finally:
        for fd in [*held, read, write]:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_call_that_cannot_start_leaves_the_timeline_usable() -> None:
    spec = DEVICES["cpu-task"]()
    mod = LoadedModule(compile_kernel(paged_module(False, tiled=True), spec.target), spec.uri)
    cache, expect = _fill(mod, vulkan=False)  # 8 writes enqueued, none waited for
    with pytest.raises(ValueError, match="expected 4 arguments but passed 3"):  # the ctx is missing
        mod.fn("one")(cache)
    with pytest.raises(TypeError, match="not booleans"):
        mod.fn("kv_write").submit(cache, True)
    assert mod.timeline.submitted == 0  # reset: a new semaphore, after the enqueued writes ended
    ctx = np.arange(SLOTS, dtype=np.int32)
    one = to_host(mod.fn("one")(cache, mod.to_device(ctx)), mod.device)
    assert np.array_equal(one, expect[:, L - 1, 1].astype(np.float32))


def test_a_failed_device_call_does_not_fail_the_calls_after_it() -> None:
    spec = DEVICES["cpu-task"]()
    mod = LoadedModule(compile_kernel(paged_module(False, tiled=True), spec.target), spec.uri)
    cache, expect = _fill(mod, vulkan=False)
    mod.timeline.wait(mod.timeline.submitted)
    mod.timeline.semaphore.fail("a dispatch failed")  # as the device does when a call fails
    one, ctx = mod.fn("one"), np.arange(SLOTS, dtype=np.int32)
    with pytest.raises(RuntimeError, match="a dispatch failed"):
        one(cache, mod.to_device(ctx))
    got = to_host(one(cache, mod.to_device(ctx)), mod.device)
    assert np.array_equal(got, expect[:, L - 1, 1].astype(np.float32))


def test_functions_compiled_synchronously_still_run() -> None:
    spec = DEVICES["cpu-task"]()
    flags = [f for f in target_flags("cpu") if f != ASYNC]
    vmfb = compile_str(paged_module(False, tiled=True), extra_args=flags)
    assert isinstance(vmfb, bytes)
    mod = LoadedModule(vmfb, spec.uri)
    assert not mod.fn("one").fenced
    cache, expect = _fill(mod, vulkan=False)  # `submit` runs a synchronous function to its end
    assert mod.timeline.submitted == 0
    ctx = np.arange(SLOTS, dtype=np.int32)[::-1].copy()
    one = to_host(mod.fn("one")(cache, mod.to_device(ctx)), mod.device)
    assert np.array_equal(one, expect[ctx, L - 1, 1].astype(np.float32))


# A matmul the device takes a tenth of a second or so for: long enough that the host's uploads
# and calls after it (well under a millisecond) cannot outlast it, even on 2 busy cores.
N_SLOW = {"cpu-task": 1536, "vulkan": 768}


def slow_module(n: int) -> str:
    return f"""
module @uploads {{
  func.func @slow(%x: tensor<{n}x{n}xf32>) -> tensor<{n}x{n}xf32> {{
    %z = arith.constant 0.0 : f32
    %e = tensor.empty() : tensor<{n}x{n}xf32>
    %a = linalg.fill ins(%z : f32) outs(%e : tensor<{n}x{n}xf32>) -> tensor<{n}x{n}xf32>
    %y = linalg.matmul ins(%x, %x : tensor<{n}x{n}xf32>, tensor<{n}x{n}xf32>)
        outs(%a : tensor<{n}x{n}xf32>) -> tensor<{n}x{n}xf32>
    return %y : tensor<{n}x{n}xf32>
  }}
  func.func @inc(%x: tensor<16xi32>) -> tensor<16xi32> {{
    %e = tensor.empty() : tensor<16xi32>
    %y = linalg.generic {{indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>],
        iterator_types = ["parallel"]}} ins(%x : tensor<16xi32>) outs(%e : tensor<16xi32>) {{
      ^bb0(%a: i32, %o: i32):
        %c1 = arith.constant 1 : i32
        %s = arith.addi %a, %c1 : i32
        linalg.yield %s : i32
    }} -> tensor<16xi32>
    return %y : tensor<16xi32>
  }}
}}
"""


@pytest.mark.parametrize("device", device_params("cpu-task", "vulkan"))
def test_an_upload_does_not_wait_for_the_calls_in_flight(device: str) -> None:
    """A decode step's inputs go up while the step before it runs, with its KV write enqueued
    behind it: IREE's default upload (a transfer on the device's queue) waited for both on
    Vulkan, so the host never got a step ahead of the device."""
    spec, n = DEVICES[device](), N_SLOW[device]
    mod = LoadedModule(compile_kernel(slow_module(n), spec.target), spec.uri)
    x = mod.to_device(np.full((n, n), 1.0 / n, np.float32))
    mod.fn("slow")(x)  # compiles the device's pipelines before anything is timed
    _, wait = mod.fn("slow").start(x)
    mod.fn("inc").submit(mod.to_device(np.zeros(16, np.int32)))  # enqueued behind it, as a KV write
    ids = np.arange(16, dtype=np.int32)
    up = mod.to_device(ids)
    assert mod.timeline.semaphore.query() < mod.timeline.submitted - 1  # the slow call still runs
    wait()
    assert np.array_equal(to_host(mod.fn("inc")(up), mod.device), ids + 1)


def test_an_upload_falls_back_to_the_next_kind_of_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device that cannot allocate one kind of upload memory gets the next one, and keeps to it."""
    import zinc.runtime.module as module_mod

    spec = DEVICES["cpu-task"]()
    mod = LoadedModule(compile_kernel(slow_module(8), spec.target), spec.uri)
    real, kinds = module_mod.rt.asdevicearray, []

    def allocate(device: object, host: np.ndarray, **kw: object) -> object:
        kinds.append(kw.get("memory_type"))
        if kw.get("memory_type") == module_mod.UPLOAD_MEMORY[0]:
            raise RuntimeError("could not allocate buffer: RESOURCE_EXHAUSTED")
        return real(device, host, **kw)

    monkeypatch.setattr(module_mod.rt, "asdevicearray", allocate)
    ids = np.arange(16, dtype=np.int32)
    for _ in range(2):
        assert np.array_equal(to_host(mod.fn("inc")(mod.to_device(ids)), mod.device), ids + 1)
    assert kinds == [module_mod.UPLOAD_MEMORY[0], module_mod.UPLOAD_MEMORY[1], module_mod.UPLOAD_MEMORY[1]]
