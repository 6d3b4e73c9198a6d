"""Choosing and opening an IREE HAL device: `cpu` (local-sync / local-task), `vulkan`, or `auto`.

Owns: device resolution (auto takes a real Vulkan GPU when one exists, else the CPU; lavapipe
and other CPU emulations never count as a GPU), the worker threads of the CPU task driver, one
cached `HalDevice` per URI (its threads that poll while it is idle, as IREE's Vulkan completion
threads do on lavapipe, moved to idle cores), and reading a device array back to the host (our own
path: `DeviceArray.to_host()` fails on lavapipe).
Imports: iree.runtime, numpy, zinc.errors, the stdlib.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import iree.runtime as rt
import numpy as np

from zinc.errors import DeviceError, ZincError

DEVICE_CHOICES = ("auto", "cpu", "vulkan")
CPU_DRIVERS = ("local-sync", "local-task")
_SOFTWARE_GPUS = ("llvmpipe", "lavapipe", "swiftshader", "software")
log = logging.getLogger("zinc.runtime")


@dataclass(frozen=True)
class DeviceSpec:
    target: str  # artifact target: "cpu" or "vulkan"
    uri: str  # IREE device URI: "local-sync", "local-task" or "vulkan"
    name: str  # human-readable, e.g. "llvmpipe (LLVM 15.0.6, 256 bits)"
    threads: int | None = None  # local-task worker threads (None: `default_threads()`)


@functools.cache
def vulkan_devices() -> tuple[str, ...]:
    """Names of the Vulkan devices the loader sees; empty when there is no driver or loader."""
    try:
        driver = rt.get_driver("vulkan")
        infos: list[dict[str, Any]] = driver.query_available_devices()
    except Exception:
        return ()
    return tuple(str(info.get("name", "vulkan")) for info in infos)


def is_real_gpu(name: str) -> bool:
    low = name.lower()
    return not any(s in low for s in _SOFTWARE_GPUS)


def default_threads() -> int:
    """The physical cores among the CPUs this process may run on: two hyperthreads of one core
    share its memory bandwidth, which bounds decoding."""
    cores = set()
    for cpu in os.sched_getaffinity(0):
        topology = f"/sys/devices/system/cpu/cpu{cpu}/topology"
        try:
            with open(f"{topology}/physical_package_id") as package, open(f"{topology}/core_id") as core:
                cores.add((package.read().strip(), core.read().strip()))
        except OSError:  # no sysfs topology (a container may hide it): count the CPU itself
            cores.add((f"cpu{cpu}", ""))
    return max(1, len(cores))


def resolve_device(choice: str, cpu_driver: str = "local-task", threads: int | None = None) -> DeviceSpec:
    """Turn a user's `--device` into a concrete device, or a clear `DeviceError`."""
    if threads is not None and not 1 <= threads <= 1024:
        raise ZincError(f"--threads must be between 1 and 1024, got {threads}")
    if choice not in DEVICE_CHOICES:
        raise ZincError(f"unknown device {choice!r}: choose one of {', '.join(DEVICE_CHOICES)}")
    if cpu_driver not in CPU_DRIVERS:
        raise ZincError(f"unknown CPU driver {cpu_driver!r}: choose one of {', '.join(CPU_DRIVERS)}")
    if choice in ("vulkan", "auto"):
        names = vulkan_devices()
        if choice == "vulkan":
            if not names:
                raise DeviceError(
                    "no Vulkan device found: install a Vulkan driver (on Debian: "
                    "apt-get install mesa-vulkan-drivers libvulkan1) or use --device cpu"
                )
            return DeviceSpec("vulkan", "vulkan", names[0])
        gpus = [n for n in names if is_real_gpu(n)]
        if gpus:
            return DeviceSpec("vulkan", "vulkan", gpus[0])
    if cpu_driver == "local-sync":  # runs every dispatch on the calling thread
        return DeviceSpec("cpu", cpu_driver, f"CPU ({cpu_driver})")
    n = threads or default_threads()
    return DeviceSpec("cpu", cpu_driver, f"CPU ({cpu_driver}, {n} thread{'s' * (n > 1)})", n)


_task_threads: list[int] = []  # the worker count the process's local-task driver was created with


def _set_task_threads(threads: int) -> None:
    """Give the local-task driver `threads` workers, free to run on any of the process's CPUs.

    IREE's default is one worker per physical core, each pinned to its core: on a machine whose
    cores also run the server's Python threads, a pinned worker waits for its core while another
    is idle (SmolLM2 decode on 2 cores: 5.5 ms a token pinned, 4.3 ms unpinned). An explicit
    topology group count leaves the workers unpinned. The flag is process-wide and read when the
    driver is created, so the first local-task device of the process fixes it.
    """
    if not _task_threads:
        rt.flags.parse_flags(f"--task_topology_group_count={threads}")
        _task_threads.append(threads)
    elif _task_threads[0] != threads:
        log.warning("the CPU task driver already runs %d threads; %d requested", _task_threads[0], threads)


_opened: set[str] = set()  # the Vulkan URIs whose device this process has opened


def open_device(uri: str, threads: int | None = None) -> Any:
    """One HAL device per URI for the whole process (iree.runtime caches it); `threads` sets
    the local-task driver's worker threads when it is first created."""
    if uri == "local-task":
        _set_task_threads(threads or default_threads())
    first = uri.startswith("vulkan") and uri not in _opened  # the CPU drivers' threads sleep
    before = _thread_ids() if first else set()
    try:
        device = rt.get_device(uri)
    except Exception as exc:
        raise DeviceError(f"cannot open IREE device {uri!r}: {exc}") from exc
    if first:
        _opened.add(uri)
        _yield_spinning_threads(_thread_ids() - before)
    return device


SPIN_SAMPLES, SPIN_SAMPLE_S = 10, 0.02  # looks at a new device's threads while it is idle


def _yield_spinning_threads(new: set[int]) -> None:
    """Give the threads a device brought that keep a core busy while it is idle the lowest CPU
    priority. IREE's Vulkan queues each wait for completions on a thread of their own, in
    vkWaitSemaphores over two timeline semaphores (any of them); Mesa's lavapipe (22.3) answers
    such a wait by polling, so each thread keeps a core busy for the device's whole life: two
    threads, this machine's two cores, taken from the CPU's and lavapipe's own work. Scheduled as
    SCHED_IDLE they still see a completion at once on an idle core and take nearly nothing from a
    busy one, a niced process's included. They are found by their state, not their CPU time: a
    polling thread is runnable whenever it is looked at, however busy the machine, where its share
    of a core falls with the load; an idle device's other threads, and every thread of a GPU's
    driver or of the CPU's, sleep."""
    runnable = dict.fromkeys(new, 0)
    for _ in range(SPIN_SAMPLES):
        for tid in runnable:
            runnable[tid] += _state(tid) == "R"
        time.sleep(SPIN_SAMPLE_S)
    for tid, seen in runnable.items():
        if seen >= SPIN_SAMPLES * 0.8:
            with contextlib.suppress(OSError):
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
                log.info("thread %d of the new device polls while idle: it runs on idle cores only", tid)


def _thread_ids() -> set[int]:
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:  # no procfs: nothing to watch
        return set()


def _state(tid: int) -> str | None:
    """The scheduler state of thread `tid` of this process (R: running or runnable), None if gone."""
    try:
        with open(f"/proc/self/task/{tid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def to_host(array: Any, device: Any) -> np.ndarray[Any, Any]:
    """Copy a device array to a numpy array.

    Host-mappable buffers are read directly; others (Vulkan) go through a staging buffer that is
    host-local and device-visible, because iree.runtime's own `to_host` imports an unaligned host
    pointer that lavapipe rejects.
    """
    if array._is_mappable():  # a view of the device buffer: copy it, the buffer is reused or freed
        return np.array(array.to_host(), copy=True)
    view = array._buffer_view
    src = view.get_buffer()
    staging = device.allocator.allocate_buffer(
        memory_type=int(rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE),
        allowed_usage=int(rt.BufferUsage.TRANSFER_TARGET | rt.BufferUsage.MAPPING_SCOPED),
        allocation_size=src.byte_length(),
    )
    sem = device.create_semaphore(0)
    device.queue_copy(
        src,
        staging,
        wait_semaphores=rt.HalFence.create_at(sem, 0),
        signal_semaphores=rt.HalFence.create_at(sem, 1),
    )
    rt.HalFence.create_at(sem, 1).wait()
    dtype = rt.HalElementType.map_to_dtype(view.element_type)
    return np.array(staging.map().asarray(view.shape, dtype))
