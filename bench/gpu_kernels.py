"""Which of an artifact's kernels the Vulkan driver refuses to build, one by one.

Usage: python bench/gpu_kernels.py VMFB [VMFB ...] [--out FILE]

IREE builds every kernel of a module when it loads it and stops at the first the driver refuses
(`vkCreateComputePipelines` failed, with no name), so one bad kernel hides the rest. This reads
the SPIR-V modules out of the vmfb (each a word-count-prefixed run of words that starts with
SPIR-V's magic number), reflects each one's entry point, storage-buffer bindings and push-constant
size from its words, and asks the first Vulkan device to build a compute pipeline for it, with
every feature the device has enabled. It found that an H200's driver refuses IREE 3.13's
cooperative-matrix f16 GEMMs and builds every other kernel (zinc.compiler.targets.prefill_gemm).
Talks to the Vulkan loader (`libvulkan.so.1`) with ctypes, as zinc.runtime.vulkan_probe does (its
instance structures and extension query): no Vulkan SDK is needed, so it runs
on the GPU machine from the bundle (scripts/gpu-bench), and here on lavapipe.
"""

from __future__ import annotations

import argparse
import ctypes as ct
import json
import struct
import sys
import time
from pathlib import Path
from typing import Any

from zinc.runtime import vulkan_probe

MAGIC = 0x07230203
P, U32, U64 = ct.c_void_p, ct.c_uint32, ct.c_uint64
COMPUTE, STORAGE_BUFFER = 0x20, 7
COOP_EXTENSION = b"VK_KHR_cooperative_matrix"
# sTypes (vulkan_core.h): features2, Vulkan 1.1/1.2/1.3 features, VK_KHR_cooperative_matrix's
FEATURES2, V11, V12, V13, COOP = 1000059000, 49, 51, 53, 1000506000


def spirv_modules(vmfb: bytes) -> list[list[int]]:
    """The SPIR-V modules in a vmfb, as words: each follows its flatbuffer vector's word count."""
    found, pos = [], 0
    magic = struct.pack("<I", MAGIC)
    while (i := vmfb.find(magic, pos)) >= 0:
        pos = i + 4
        if i % 4 or i < 4:
            continue
        (words,) = struct.unpack_from("<I", vmfb, i - 4)
        if words > 5 and i + 4 * words <= len(vmfb):
            found.append(list(struct.unpack_from(f"<{words}I", vmfb, i)))
    return found


def reflect(w: list[int]) -> tuple[str, list[tuple[int, int]], int]:
    """(entry point, sorted (set, binding) pairs, push-constant bytes) of a compute module."""
    types: dict[int, tuple[Any, ...]] = {}
    consts: dict[int, int] = {}
    pointers: dict[int, int] = {}
    sets: dict[int, int] = {}
    bindings: dict[int, int] = {}
    entry, push_type, i = "", None, 5
    while i < len(w):
        n, op, a = w[i] >> 16, w[i] & 0xFFFF, w[i + 1 : i + (w[i] >> 16)]
        if op == 15:  # OpEntryPoint: model, id, name
            entry = struct.pack(f"<{len(a) - 2}I", *a[2:]).split(b"\0")[0].decode()
        elif op == 71 and a[1] in (33, 34):  # OpDecorate Binding / DescriptorSet
            (bindings if a[1] == 33 else sets)[a[0]] = a[2]
        elif op in (21, 22, 23, 28, 30):  # int, float, vector, array, struct
            types[a[0]] = (op, *a[1:])
        elif op == 32:  # OpTypePointer
            pointers[a[0]] = a[2]
        elif op == 43 and len(a) >= 3:  # OpConstant
            consts[a[1]] = a[2]
        elif op == 59 and a[2] == 9:  # OpVariable in PushConstant storage
            push_type = pointers[a[0]]
        i += max(n, 1)

    def size(t: int) -> int:
        op, *rest = types[t]
        if op in (21, 22):
            return int(rest[0]) // 8
        if op == 23:
            return size(rest[0]) * int(rest[1])
        if op == 28:
            return size(rest[0]) * consts[rest[1]]
        return sum(size(m) for m in rest)

    pairs = sorted({(sets[v], b) for v, b in bindings.items() if v in sets})
    return entry, pairs, size(push_type) if push_type is not None else 0


def _struct(name: str, fields: list[tuple[str, Any]]) -> Any:
    return type(name, (ct.Structure,), {"_fields_": fields})


QueueInfo = _struct("QueueInfo", [("sType", U32), ("pNext", P), ("flags", U32), ("family", U32), ("count", U32),
                                  ("prio", P)])  # fmt: skip
DeviceInfo = _struct("DeviceInfo", [("sType", U32), ("pNext", P), ("flags", U32), ("nq", U32), ("queues", P),
                                    ("nl", U32), ("layers", P), ("ne", U32), ("exts", P), ("features", P)])  # fmt: skip
ShaderInfo = _struct("ShaderInfo", [("sType", U32), ("pNext", P), ("flags", U32), ("size", ct.c_size_t), ("code", P)])
Binding = _struct("Binding", [("binding", U32), ("type", U32), ("count", U32), ("stages", U32), ("samplers", P)])
SetInfo = _struct("SetInfo", [("sType", U32), ("pNext", P), ("flags", U32), ("n", U32), ("bindings", P)])
PushRange = _struct("PushRange", [("stages", U32), ("offset", U32), ("size", U32)])
LayoutInfo = _struct("LayoutInfo", [("sType", U32), ("pNext", P), ("flags", U32), ("nsets", U32), ("sets", P),
                                    ("npush", U32), ("push", P)])  # fmt: skip
StageInfo = _struct("StageInfo", [("sType", U32), ("pNext", P), ("flags", U32), ("stage", U32), ("module", U64),
                                  ("name", ct.c_char_p), ("spec", P)])  # fmt: skip
PipelineInfo = _struct("PipelineInfo", [("sType", U32), ("pNext", P), ("flags", U32), ("stage", StageInfo),
                                        ("layout", U64), ("base", U64), ("base_index", ct.c_int32)])  # fmt: skip


class Device:
    """The first Vulkan device, every feature it reports (and cooperative matrices) enabled."""

    def __init__(self) -> None:
        vk = self.vk = ct.CDLL("libvulkan.so.1")
        app = vulkan_probe._AppInfo(0, None, b"zinc-gpu-kernels", 1, None, 0, (1 << 22) | (3 << 12))
        info = vulkan_probe._InstanceInfo(1, None, 0, ct.pointer(app), 0, None, 0, None)
        self.instance = P()
        self._ok(vk.vkCreateInstance(ct.byref(info), None, ct.byref(self.instance)), "vkCreateInstance")
        count = U32(1)
        physical = P()
        vk.vkEnumeratePhysicalDevices(self.instance, ct.byref(count), ct.byref(physical))
        if not count.value:
            raise RuntimeError("no Vulkan device")
        props = (ct.c_char * 1024)()
        vk.vkGetPhysicalDeviceProperties(physical, props)
        api, self.name = struct.unpack_from("<I", props)[0], bytes(props[20:276]).split(b"\0")[0].decode()
        coop = COOP_EXTENSION.decode() in vulkan_probe._extensions(vk, physical.value)
        chain = [s for s, need in ((V11, True), (V12, api >= (1 << 22 | 2 << 12)), (V13, api >= (1 << 22 | 3 << 12)),
                                   (COOP, coop)) if need]  # fmt: skip
        self._features = [self._header(FEATURES2)] + [self._header(s) for s in chain]
        for this, after in zip(self._features, self._features[1:], strict=False):
            struct.pack_into("<Q", this, 8, ct.addressof(after))
        vk.vkGetPhysicalDeviceFeatures2(physical, self._features[0])
        prio = ct.c_float(1.0)
        exts = (ct.c_char_p * 1)(COOP_EXTENSION)
        queue = QueueInfo(2, None, 0, 0, 1, ct.addressof(prio))
        info = DeviceInfo(3, ct.addressof(self._features[0]), 0, 1, ct.addressof(queue), 0, None, int(coop),
                          ct.addressof(exts), None)  # fmt: skip
        self.device = P()
        self._ok(vk.vkCreateDevice(physical, ct.byref(info), None, ct.byref(self.device)), "vkCreateDevice")
        for fn in ("vkCreateShaderModule", "vkCreateDescriptorSetLayout", "vkCreatePipelineLayout",
                   "vkCreateComputePipelines"):  # fmt: skip
            getattr(vk, fn).restype = ct.c_int32

    @staticmethod
    def _header(stype: int) -> Any:
        buf = (ct.c_char * 512)()  # larger than any of these feature structs
        struct.pack_into("<I", buf, 0, stype)
        return buf

    @staticmethod
    def _ok(result: int, what: str) -> None:
        if result:
            raise RuntimeError(f"{what}: VkResult {result}")

    def build(self, words: list[int]) -> int:
        """VkResult of building `words`' compute pipeline (0: built), everything freed again."""
        vk, dev = self.vk, self.device
        entry, pairs, push = reflect(words)
        code = (U32 * len(words))(*words)
        module = U64()
        result = vk.vkCreateShaderModule(dev, ct.byref(ShaderInfo(16, None, 0, 4 * len(words), ct.addressof(code))),
                                         None, ct.byref(module))  # fmt: skip
        if result:
            return int(result)
        nsets = max((s for s, _ in pairs), default=-1) + 1
        layouts = (U64 * max(nsets, 1))()
        for s in range(nsets):
            mine = [Binding(b, STORAGE_BUFFER, 1, COMPUTE, None) for t, b in pairs if t == s]
            arr = (Binding * max(len(mine), 1))(*mine)
            info = SetInfo(32, None, 0, len(mine), ct.addressof(arr))
            vk.vkCreateDescriptorSetLayout(dev, ct.byref(info), None, ct.byref(layouts, 8 * s))
        push_range = PushRange(COMPUTE, 0, push)
        layout = U64()
        vk.vkCreatePipelineLayout(dev, ct.byref(LayoutInfo(30, None, 0, nsets, ct.addressof(layouts), int(push > 0),
                                                          ct.addressof(push_range))), None, ct.byref(layout))  # fmt: skip
        stage = StageInfo(18, None, 0, COMPUTE, module.value, entry.encode(), None)
        pipeline = U64()
        result = vk.vkCreateComputePipelines(dev, U64(0), 1, ct.byref(PipelineInfo(29, None, 0, stage, layout.value, 0, -1)),
                                             None, ct.byref(pipeline))  # fmt: skip
        if not result:
            vk.vkDestroyPipeline(dev, pipeline, None)
        vk.vkDestroyPipelineLayout(dev, layout, None)
        for s in range(nsets):
            vk.vkDestroyDescriptorSetLayout(dev, U64(layouts[s]), None)
        vk.vkDestroyShaderModule(dev, module, None)
        return int(result)


def check(device: Device, vmfb: Path) -> dict[str, Any]:
    modules = spirv_modules(vmfb.read_bytes())
    t0 = time.perf_counter()
    refused = []
    for words in modules:
        result = device.build(words)
        if result:
            refused.append({"entry": reflect(words)[0], "result": result})
    return {"modules": len(modules), "refused": refused, "seconds": round(time.perf_counter() - t0, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("vmfb", nargs="+", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    device = Device()
    results = {"device": device.name, "artifacts": {str(v): check(device, v) for v in args.vmfb}}
    for path, r in results["artifacts"].items():
        names = ", ".join(f"{x['entry']} ({x['result']})" for x in r["refused"][:8])
        print(f"{device.name}: {path}: {r['modules']} kernels, {len(r['refused'])} refused{': ' + names if names else ''}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
