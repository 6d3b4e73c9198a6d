"""Loading a compiled vmfb into an IREE context with its weights bound as parameters.

Owns: `LoadedModule` — a VM context holding the HAL module, an `io_parameters` module backed by
a `ParameterIndex` over the GGUF file (and any `.irpa` of repacked weights), and the compiled
module, with the timeline its calls run on; `fn(name)` returns an entry point (zinc.runtime.invoke);
`to_device` uploads a call's inputs (`UPLOAD_MEMORY`: without waiting for the calls in flight);
`empty` allocates device arrays (the KV slab), on the CPU over transparent huge pages; a module
the device cannot build is an ArtifactError naming the cause (`load_failure`).
Imports: ctypes (madvise), re, iree.runtime, numpy, zinc.runtime.device, zinc.runtime.invoke, zinc.errors.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import iree.runtime as rt
import numpy as np

from zinc.errors import ArtifactError
from zinc.runtime.device import open_device
from zinc.runtime.invoke import Entry, Timeline

PARAMETER_SCOPE = "model"
# the element types `empty` allocates (the KV slab's, by the manifest's name): numpy's and IREE's
ELEMENT_TYPES: dict[str, tuple[np.dtype[Any], rt.HalElementType]] = {
    "f16": (np.dtype(np.float16), rt.HalElementType.FLOAT_16),
    "i32": (np.dtype(np.int32), rt.HalElementType.SINT_32),  # Vulkan's "f16x2" slab (zinc.artifact.kv_storage)
}


# Where a call's inputs (token ids, positions, a step's slots: bytes to kilobytes) go, in order of
# preference: memory the host writes and the device reads, so that an upload is a copy by the host.
# IREE's default, device-local memory the host cannot map, is filled by a transfer on the device's
# queue that waits for the calls already enqueued there: on Vulkan a decode step's inputs waited
# for the step before, so the host never got a step ahead of the device. Device-local host-visible
# memory (a GPU's BAR) first, so kernels read their inputs from the GPU's own memory, then host
# memory the device reads; a device with neither gets the transfer. On the CPU all memory is both.
UPLOAD_MEMORY = (
    rt.MemoryType.DEVICE_LOCAL | rt.MemoryType.HOST_VISIBLE,
    rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE,
)
UPLOAD_USAGE = rt.BufferUsage.DEFAULT | rt.BufferUsage.MAPPING

HUGE_PAGE = 1 << 21
MADV_HUGEPAGE = 14


def advise_huge_pages(host: np.ndarray[Any, Any]) -> None:
    """Ask the kernel for transparent huge pages over the whole 2 MiB pages of `host` (where THP
    is `madvise`, Linux's default, an allocation gets them only when asked). Decode attention
    reads each cached position's K/V rows from a slot of their own, a page apart at 1B sizes, so
    with 4 KiB pages nearly every row is a TLB miss: Llama 3.2 1B decoding with 4,096 positions
    cached, alternating runs, 15.0-19.2 tok/s without, 18.2-22.4 with. Best effort: nothing
    happens where madvise is unavailable."""
    start = -(-host.ctypes.data // HUGE_PAGE) * HUGE_PAGE
    length = (host.ctypes.data + host.nbytes - start) // HUGE_PAGE * HUGE_PAGE
    if length <= 0:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), MADV_HUGEPAGE)
    except (OSError, AttributeError):
        pass


def load_failure(detail: str, device_uri: str) -> str:
    """The message for a module the device would not load: a kernel its driver refused to build
    (Vulkan: the first line of vkCreateComputePipelines' failure) says which target to change."""
    cause = re.search(r"\.c:\d+: (.*?)(?:; while|$)", detail, re.M)
    lines = (ln.strip() for ln in detail.splitlines() if ln.strip())
    first = cause.group(1) if cause else next(lines, "unknown error")
    if "vkCreateComputePipelines" in detail or "hal.executable.create" in detail:
        return (
            f"the {device_uri} device's driver could not build the artifact's kernels ({first[:200]}): "
            "compile it for another GPU target (zinc compile --target vulkan --vulkan-target NAME) "
            "or serve it with --device cpu"
        )
    return f"cannot load compiled module on {device_uri}: {first[:300]}"


class LoadedModule:
    def __init__(
        self,
        vmfb: bytes | Path,
        device_uri: str,
        parameter_files: Sequence[Path] = (),
        parameter_arrays: Mapping[str, np.ndarray[Any, Any]] | None = None,
        threads: int | None = None,
    ) -> None:
        self.device = open_device(device_uri, threads)
        config = rt.Config(device=self.device)
        index = rt.ParameterIndex()
        for path in parameter_files:
            index.load(str(path))
        for name, arr in (parameter_arrays or {}).items():
            index.add_buffer(name, np.ascontiguousarray(arr))
        params = rt.create_io_parameters_module(
            config.vm_instance, index.create_provider(scope=PARAMETER_SCOPE)
        )
        try:
            if isinstance(vmfb, Path):
                vm_module = rt.VmModule.mmap(config.vm_instance, str(vmfb))
            else:
                vm_module = rt.VmModule.copy_buffer(config.vm_instance, vmfb)
        except Exception as exc:
            raise ArtifactError(f"cannot load compiled module: {exc}") from exc
        self._index = index  # keeps mmaps and buffers alive
        self._upload: tuple[Any, ...] = UPLOAD_MEMORY  # the kinds of memory `to_device` may still try
        try:
            self.context = rt.SystemContext(vm_modules=[params, vm_module], config=config)
        except RuntimeError as exc:  # the device refused to build a kernel, or lacks a feature
            raise ArtifactError(load_failure(str(exc), device_uri)) from exc
        self._module = self.context.modules[vm_module.name]
        self.timeline = Timeline(self.device)

    def fn(self, name: str) -> Entry:
        try:
            invoker = self._module[name]
        except KeyError as exc:
            raise ArtifactError(f"compiled module has no entry point {name!r}") from exc
        return Entry(invoker, self.timeline, self.to_device)

    def to_device(self, array: np.ndarray[Any, Any]) -> Any:
        """A device array holding `array`, written by the host (`UPLOAD_MEMORY`): it does not wait
        for the calls in flight, so a step's inputs can go up while the step before it runs."""
        host = np.ascontiguousarray(array)
        while self._upload:
            try:
                return rt.asdevicearray(self.device, host, memory_type=self._upload[0], allowed_usage=UPLOAD_USAGE)
            except RuntimeError:  # the device cannot allocate such memory: the next kind
                self._upload = self._upload[1:]
        return rt.asdevicearray(self.device, host)

    def empty(self, shape: tuple[int, ...], dtype: str) -> Any:
        """An uninitialized device array of `dtype` (f16, or i32 words): its pages are only touched
        (and resident) once written.

        The KV slab uses it: a step reads only the rows earlier steps wrote, so a 2048-position
        cache costs memory in proportion to the positions in use, not to its size.
        """
        np_type, hal_type = ELEMENT_TYPES[dtype]
        size = int(np.prod(shape)) * np_type.itemsize
        buffer = self.device.allocator.allocate_buffer(
            memory_type=int(rt.MemoryType.DEVICE_LOCAL), allowed_usage=int(rt.BufferUsage.DEFAULT), allocation_size=size
        )
        view = rt.HalBufferView(buffer, list(shape), hal_type)
        array = rt.DeviceArray(self.device, view, override_dtype=np_type)
        if array._is_mappable():  # host memory (the CPU): back it with huge pages where it can be
            advise_huge_pages(array.to_host())
        return array
