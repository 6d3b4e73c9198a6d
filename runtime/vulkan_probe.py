"""What the Vulkan devices of this machine are: vendor, name, type, subgroup size and the features
that choose IREE's GPU target (integer dot products, cooperative matrices, 16-bit storage).

Owns: `probe()` (the devices as `VulkanInfo`), read straight from the Vulkan loader
(`libvulkan.so.1`) with ctypes, in a child process (`python -m zinc.runtime.vulkan_probe` prints
JSON): a driver that crashes or hangs while it is asked costs that process, never the server, and
a timeout bounds it. Why not `vulkaninfo`: it is a separate package (vulkan-tools) that a machine
with a working driver often lacks (CI installs mesa-vulkan-drivers and libvulkan1 only), and its
JSON output changes between versions; IREE's runtime reports only names. The loader is there
wherever IREE's Vulkan driver works, since IREE loads the same library.
Imports: ctypes, json, subprocess, sys (stdlib only).
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Any

PROBE_TIMEOUT_S = 20.0
# Vulkan structure types and enums used here (vulkan_core.h)
_APP_INFO, _INSTANCE_INFO = 0, 1
_PROPS2, _FEATURES2 = 1000059001, 1000059000
_SUBGROUP_PROPS, _STORAGE16_FEATURES = 1000094000, 1000083000
_DEVICE_TYPES = {0: "other", 1: "integrated", 2: "discrete", 3: "virtual", 4: "cpu"}
_API_1_1 = (1 << 22) | (1 << 12)


@dataclass(frozen=True)
class VulkanInfo:
    name: str
    vendor_id: int
    device_id: int
    device_type: str  # discrete, integrated, virtual, cpu, other
    api_version: str
    subgroup_size: int
    integer_dot_product: bool  # VK_KHR_shader_integer_dot_product
    cooperative_matrix: bool  # VK_KHR_cooperative_matrix or VK_NV_cooperative_matrix
    storage_16bit: bool  # storageBuffer16BitAccess


class _Chain(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int32), ("pNext", ctypes.c_void_p)]


class _SubgroupProps(ctypes.Structure):
    _fields_ = [*_Chain._fields_, ("subgroupSize", ctypes.c_uint32), ("stages", ctypes.c_uint32),
                ("operations", ctypes.c_uint32), ("quad", ctypes.c_uint32)]  # fmt: skip


class _Props2(ctypes.Structure):  # VkPhysicalDeviceProperties is read from `raw` by offset
    _fields_ = [*_Chain._fields_, ("raw", ctypes.c_uint8 * 2048)]


class _Storage16(ctypes.Structure):
    _fields_ = [*_Chain._fields_, ("storageBuffer16BitAccess", ctypes.c_uint32), ("other", ctypes.c_uint32 * 3)]


class _Features2(ctypes.Structure):
    _fields_ = [*_Chain._fields_, ("raw", ctypes.c_uint32 * 64)]


class _AppInfo(ctypes.Structure):
    _fields_ = [*_Chain._fields_, ("pApplicationName", ctypes.c_char_p), ("appVersion", ctypes.c_uint32),
                ("pEngineName", ctypes.c_char_p), ("engineVersion", ctypes.c_uint32), ("apiVersion", ctypes.c_uint32)]  # fmt: skip


class _InstanceInfo(ctypes.Structure):
    _fields_ = [*_Chain._fields_, ("flags", ctypes.c_uint32), ("pApplicationInfo", ctypes.POINTER(_AppInfo)),
                ("layers", ctypes.c_uint32), ("ppLayers", ctypes.c_void_p),
                ("extensions", ctypes.c_uint32), ("ppExtensions", ctypes.c_void_p)]  # fmt: skip


def _query() -> list[VulkanInfo]:
    """Ask the loader in this process (the child's side of `probe`)."""
    vk = ctypes.CDLL("libvulkan.so.1")
    app = _AppInfo(_APP_INFO, None, b"zinc", 0, b"zinc", 0, _API_1_1)
    info = _InstanceInfo(_INSTANCE_INFO, None, 0, ctypes.pointer(app), 0, None, 0, None)
    instance = ctypes.c_void_p()
    if vk.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(instance)) != 0:
        return []
    try:
        count = ctypes.c_uint32()
        vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), None)
        devices = (ctypes.c_void_p * count.value)()
        vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), devices)
        return [_describe(vk, d) for d in devices[: count.value] if d is not None]
    finally:
        vk.vkDestroyInstance(instance, None)


def _describe(vk: Any, device: int) -> VulkanInfo:
    sub = _SubgroupProps(_SUBGROUP_PROPS, None)
    props = _Props2(_PROPS2, ctypes.cast(ctypes.pointer(sub), ctypes.c_void_p))
    vk.vkGetPhysicalDeviceProperties2(ctypes.c_void_p(device), ctypes.byref(props))
    raw = bytes(props.raw)
    # VkPhysicalDeviceProperties: apiVersion, driverVersion, vendorID, deviceID, deviceType, deviceName[256]
    api, _driver, vendor, device_id, kind = (int.from_bytes(raw[i : i + 4], "little") for i in range(0, 20, 4))
    name = raw[20:276].split(b"\0", 1)[0].decode("utf-8", "replace")
    s16 = _Storage16(_STORAGE16_FEATURES, None)
    feats = _Features2(_FEATURES2, ctypes.cast(ctypes.pointer(s16), ctypes.c_void_p))
    vk.vkGetPhysicalDeviceFeatures2(ctypes.c_void_p(device), ctypes.byref(feats))
    exts = _extensions(vk, device)
    return VulkanInfo(
        name=name, vendor_id=vendor, device_id=device_id, device_type=_DEVICE_TYPES.get(kind, "other"),
        api_version=f"{api >> 22}.{(api >> 12) & 0x3FF}.{api & 0xFFF}", subgroup_size=int(sub.subgroupSize),
        integer_dot_product="VK_KHR_shader_integer_dot_product" in exts,
        cooperative_matrix=bool({"VK_KHR_cooperative_matrix", "VK_NV_cooperative_matrix"} & exts),
        storage_16bit=bool(s16.storageBuffer16BitAccess),
    )  # fmt: skip


def _extensions(vk: Any, device: int) -> set[str]:
    class Ext(ctypes.Structure):
        _fields_ = [("name", ctypes.c_char * 256), ("spec", ctypes.c_uint32)]

    count = ctypes.c_uint32()
    vk.vkEnumerateDeviceExtensionProperties(ctypes.c_void_p(device), None, ctypes.byref(count), None)
    found = (Ext * count.value)()
    vk.vkEnumerateDeviceExtensionProperties(ctypes.c_void_p(device), None, ctypes.byref(count), found)
    return {e.name.decode("ascii", "replace") for e in found[: count.value]}


def probe(timeout: float = PROBE_TIMEOUT_S) -> list[VulkanInfo]:
    """The Vulkan devices, asked in a child process; empty when there is no loader or driver, or
    when the child fails or times out."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "zinc.runtime.vulkan_probe"], capture_output=True, text=True, timeout=timeout
        )
        rows = json.loads(done.stdout) if done.returncode == 0 else []
        return [VulkanInfo(**row) for row in rows]
    except (OSError, subprocess.SubprocessError, ValueError, TypeError):
        return []


def main() -> None:
    try:
        found = _query()
    except OSError:  # no libvulkan.so.1
        found = []
    print(json.dumps([asdict(d) for d in found]))


if __name__ == "__main__":
    main()
