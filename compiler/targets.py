"""Compile targets and the one call into iree-compile.

Owns: the table of iree-compile flags per target (`cpu` = llvm-cpu, `vulkan` = SPIR-V), the CPU
the llvm-cpu code is for (`cpu_target`: this host, or a portable x86-64 level, and the features
it may use), the Vulkan GPU targets (IREE's `--iree-vulkan-target` names, and `vulkan_target_for`,
which maps a device's vendor, name and features to one) and `compile_mlir`, which turns MLIR text
into vmfb bytes with a clear error (a launch that fails for a passing reason is tried again).
Imports: iree.compiler (only inside `compile_mlir`: importing it maps about 60 MB of compiler
library, which serving a cached artifact never needs), zinc.artifact (PREFILL_ROWS), zinc.errors,
zinc.runtime.{cpu_flags, vulkan_probe} (stdlib only: the CPU's features, the GPU's properties).
"""

from __future__ import annotations

import ast
import errno
import importlib.util
import os
import re
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from zinc.artifact import PREFILL_ROWS
from zinc.errors import CompileError, ZincError
from zinc.runtime.cpu_flags import CPU_LEVELS, ISA_FLAGS, host_cpu_flags
from zinc.runtime.vulkan_probe import VulkanInfo, probe

# Every entry point takes a wait and a signal fence (IREE's async-external model): the runtime
# orders calls on one timeline and waits on an eventfd it exports, not with IREE's own wait (see
# zinc.runtime.invoke for why).
ASYNC = "--iree-execution-model=async-external"
# On the CPU, command buffers bind their buffers when they run, not when recorded: a decode step
# enqueued behind the one before it reads that step's greedy tokens, a transient buffer that
# exists only once the step runs (recorded directly, IREE 3.13's local HAL refuses it: "transient
# buffer has not been committed"). On Vulkan the chained step runs as it is (lavapipe; tests/model).
INDIRECT = "--iree-hal-force-indirect-command-buffers"
TARGET_FLAGS: dict[str, tuple[str, ...]] = {
    "cpu": (
        "--iree-hal-target-device=local",
        "--iree-hal-local-target-device-backends=llvm-cpu",
        ASYNC,
        INDIRECT,
    ),
    "vulkan": ("--iree-hal-target-device=vulkan", ASYNC),
}
TARGETS = tuple(TARGET_FLAGS)
VULKAN_TARGET_FLAG = "--iree-vulkan-target="
CPU_TARGETS = ("host", *CPU_LEVELS)


def cpu_target() -> str:
    """The CPU the llvm-cpu target compiles for: `ZINC_CPU_TARGET` (`zinc compile --cpu-target`),
    "host" (this CPU, all its features) by default, or a portable x86-64 level."""
    name = os.environ.get("ZINC_CPU_TARGET") or "host"
    if name not in CPU_TARGETS:
        raise ZincError(f"unknown CPU target {name!r}: choose one of {', '.join(CPU_TARGETS)}")
    return name


def target_cpu_flags() -> frozenset[str]:
    """The features the CPU target's code may use: this host's, or the level's. The kernels
    choose their instructions from these (zinc.compiler.dot8); the manifest records them."""
    name = cpu_target()
    return host_cpu_flags() & ISA_FLAGS if name == "host" else CPU_LEVELS[name]


def target_flags(target: str) -> tuple[str, ...]:
    """iree-compile's flags for `target` (on the CPU, with the CPU target's name)."""
    flags = TARGET_FLAGS[check_target(target)]
    return (*flags, f"--iree-llvmcpu-target-cpu={cpu_target()}") if target == "cpu" else flags


def check_target(target: str) -> str:
    if target not in TARGET_FLAGS:
        raise ZincError(f"unknown target {target!r}: choose one of {', '.join(TARGETS)}")
    return target


@cache
def compiler_version() -> str:
    """iree.compiler's VERSION, read from its version.py without loading the compiler library."""
    spec = importlib.util.find_spec("iree")
    for root in (spec.submodule_search_locations or []) if spec else []:
        source = Path(root, "compiler", "version.py")
        if source.is_file():
            for node in ast.parse(source.read_text()).body:
                if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "VERSION" for t in node.targets
                ):
                    return str(ast.literal_eval(node.value))
    return "unknown"


# A launch that fails for want of memory or processes, or on a binary briefly held open for
# writing by a process forked meanwhile, is tried again: a short pause lets the pressure pass.
LAUNCH_TRANSIENT = frozenset({errno.EAGAIN, errno.ENOMEM, errno.ETXTBSY, errno.EINTR})
LAUNCH_TRIES = 3
LAUNCH_PAUSE_S = 0.5


def compile_mlir(text: str, target: str, extra_flags: tuple[str, ...] = ()) -> bytes:
    """Compile MLIR text for `target`; a compiler failure becomes a `CompileError`."""
    from iree.compiler import CompilerToolError, compile_str  # here, not at the top: see the docstring

    flags = [*target_flags(target), *extra_flags]
    for attempt in range(1, LAUNCH_TRIES + 1):
        try:
            out = compile_str(text, extra_args=flags)
            break
        except CompilerToolError as exc:
            lines = [ln for ln in str(exc).splitlines() if "error:" in ln][:3]
            detail = " | ".join(ln.strip() for ln in lines) or str(exc).splitlines()[0]
            raise CompileError(f"iree-compile failed for target {target}: {detail}") from exc
        except OSError as exc:  # the process did not start: its fork or exec failed
            if exc.errno not in LAUNCH_TRANSIENT or attempt == LAUNCH_TRIES:
                raise CompileError(f"iree-compile could not start: {exc.strerror or exc}") from exc
            time.sleep(LAUNCH_PAUSE_S * attempt)
    if not isinstance(out, bytes):
        raise CompileError("iree-compile returned no module")
    return out


# --- Vulkan GPU targets ---------------------------------------------------------------------------
# IREE's named Vulkan targets (`--iree-vulkan-target=NAME`, IREE 3.13) that zinc maps GPUs to, and
# GENERIC: no flag, IREE's baseline SPIR-V (no subgroup operations, integer dot products or
# cooperative matrices assumed), which every Vulkan device runs, lavapipe included.
GENERIC = "generic"
VULKAN_TARGETS = (
    GENERIC,
    "ampere", "ada", "turing", "volta", "pascal",  # NVIDIA
    "rdna1", "rdna2", "rdna3", "rdna4", "cdna1", "cdna2", "cdna3",  # AMD
    "valhall", "valhall1", "valhall2", "valhall3", "valhall4",  # ARM Mali
    "adreno",  # Qualcomm
)  # fmt: skip
NVIDIA_TARGETS = frozenset(("ampere", "ada", "turing", "volta", "pascal"))
NVIDIA, AMD, INTEL, ARM, QUALCOMM = 0x10DE, 0x1002, 0x8086, 0x13B5, 0x5143


@dataclass(frozen=True)
class GpuProperties:
    """What picks a Vulkan target (zinc.runtime.vulkan_probe.VulkanInfo has these fields)."""

    name: str
    vendor_id: int
    device_type: str = "discrete"  # discrete, integrated, virtual, cpu, other
    subgroup_size: int = 0
    integer_dot_product: bool = False
    cooperative_matrix: bool = False
    storage_16bit: bool = False


# (vendor, name patterns, IREE target): first match wins; patterns are regexes on the upper-cased
# device name as the driver reports it (the marketing name, and on Mesa's RADV the chip: NAVI31).
_BY_NAME: tuple[tuple[int, str, str], ...] = (
    # Hopper (H100/H200/GH200) has no IREE Vulkan target: Ampere's is the nearest (same
    # subgroup size, integer dot products and f16 cooperative matrices)
    (NVIDIA, r"\bG?H[12]00\b|\bH800\b|HOPPER", "ampere"),
    (NVIDIA, r"RTX [0-9]*\s*ADA|RTX 40[0-9]{2}|\bL4\b|\bL40S?\b|\bL20\b", "ada"),
    (NVIDIA, r"RTX 30[0-9]{2}|\bA(100|800|40|30|16|10G?|2)\b|RTX A[0-9]{4}", "ampere"),
    (NVIDIA, r"RTX 20[0-9]{2}|GTX 16[0-9]{2}|\bT4\b|QUADRO RTX|TITAN RTX", "turing"),
    (NVIDIA, r"V100|TITAN V\b", "volta"),
    (NVIDIA, r"GTX 10[0-9]{2}|\bP(100|40|4)\b|TITAN X", "pascal"),
    (AMD, r"RX 9[0-9]{3}|GFX12|NAVI4", "rdna4"),
    (AMD, r"RX 7[0-9]{3}|GFX11|NAVI3|RADEON 7[0-9]0M|RADEON 8[0-9]0M|PHOENIX|STRIX", "rdna3"),
    (AMD, r"RX 6[0-9]{3}|GFX103|NAVI2|RADEON 6[0-9]0M|REMBRANDT|VAN GOGH", "rdna2"),
    (AMD, r"RX 5[0-9]{3}|GFX101|NAVI1", "rdna1"),
    (AMD, r"MI3[0-9]{2}|GFX94", "cdna3"),
    (AMD, r"MI2[0-9]{2}|GFX90A", "cdna2"),
    (AMD, r"MI100|GFX908", "cdna1"),
    (ARM, r"MALI-G(57|68|77|78|[3-9][0-9]{2})|IMMORTALIS", "valhall"),
    (QUALCOMM, r"ADRENO", "adreno"),
)


def vulkan_target_for(gpu: GpuProperties) -> str:
    """IREE's Vulkan target for a device: by vendor and name, else by what the device reports
    (a newer NVIDIA or AMD GPU with cooperative matrices takes the newest target zinc knows of its
    vendor); GENERIC for a CPU implementation (lavapipe, SwiftShader), Intel (IREE 3.13 has no
    Intel Vulkan target), and anything not recognised: a named target assumes features, and a
    module that assumes one the device lacks does not load."""
    if gpu.device_type == "cpu":
        return GENERIC
    upper = gpu.name.upper()
    for vendor, pattern, target in _BY_NAME:
        if gpu.vendor_id == vendor and re.search(pattern, upper):
            return target
    if gpu.cooperative_matrix and gpu.integer_dot_product:
        return {NVIDIA: "ampere", AMD: "rdna3"}.get(gpu.vendor_id, GENERIC)
    return GENERIC


def check_vulkan_target(name: str) -> str:
    if name not in VULKAN_TARGETS:
        raise ZincError(f"unknown Vulkan target {name!r}: choose one of {', '.join(VULKAN_TARGETS)}")
    return name


def vulkan_target_flags(name: str) -> tuple[str, ...]:
    """The iree-compile flags of a Vulkan target (none for GENERIC)."""
    return () if check_vulkan_target(name) == GENERIC else (f"{VULKAN_TARGET_FLAG}{name}",)


def index_inputs(name: str) -> bool:
    """Whether the Vulkan target's kernels take their forms for IREE's subgroup pipelines: every
    named GPU target, not GENERIC. Those pipelines (SubgroupReduce) keep a reduction's vectorized
    `linalg.index` values in workgroup memory as `index`, a type SPIR-V cannot store ("failed to
    legalize operation 'memref.alloc' ... memref<576xindex, #spirv.storage_class<Workgroup>>"),
    so the argmax and the batch attention read their loop indices from i32 iota constants (the
    quantized matmuls' forms, which every Vulkan target takes, need none but Q5's bit number:
    zinc.compiler.subgroup_matmul). The generic target keeps linalg.index: there an iota form of
    a one-token matmul crashed IREE's SPIR-V vector unrolling (a segfault in getDimPosition)."""
    return check_vulkan_target(name) != GENERIC


def shared_layers(name: str) -> bool:
    """Whether a Vulkan target's layers share their KV slab kernels, the layer's number a push
    constant (zinc.compiler.emitter.Body.opaque_index): NVIDIA's and AMD's targets, and GENERIC.
    A dynamic slab offset is 64-bit arithmetic: the subgroup pipelines vectorize it, which a
    target without 64-bit integers (adreno, valhall) cannot lower ("failed to legalize
    vector.broadcast (i64) -> vector<4xi64>"); GENERIC keeps it scalar, which IREE emulates in
    32-bit words. Elsewhere (and on the CPU) the layer's number stays a constant."""
    kind = check_vulkan_target(name)
    return kind == GENERIC or kind in NVIDIA_TARGETS or name.startswith(("rdna", "cdna"))


GEMM_ROWS = PREFILL_ROWS  # the rows a Vulkan prefill chunk is padded to for its GEMMs: a whole call's


def prefill_gemm(name: str) -> tuple[int, str] | None:
    """The prefill matmuls' form on a Vulkan target (zinc.compiler.gemm): (rows, operand type), or
    None for the fused quantized matmul. Named GPU targets: f16 GEMMs (cooperative matrices where
    IREE's target has them), except NVIDIA's: its driver (580, an H200) refuses to build IREE
    3.13's cooperative-matrix GEMM pipelines ("NVVM compilation failed", every other kernel
    builds), so they take the f32 GEMM, which uses none. GENERIC keeps the fused form: its f16
    tensors compute wrong values on lavapipe, and an f32 GEMM over a chunk padded to 128 rows is
    mostly padding for the short prompts lavapipe runs. `$ZINC_VULKAN_GEMM` (off, f16 or f32)
    overrides it (the tests run the f32 GEMM on lavapipe)."""
    forced = os.environ.get("ZINC_VULKAN_GEMM")
    if forced:
        if forced not in ("off", "f16", "f32"):
            raise ZincError(f"ZINC_VULKAN_GEMM={forced!r}: choose off, f16 or f32")
        return None if forced == "off" else (GEMM_ROWS, forced)
    if check_vulkan_target(name) == GENERIC:
        return None
    return (GEMM_ROWS, "f32" if name in NVIDIA_TARGETS else "f16")


def gpu_properties(info: VulkanInfo) -> GpuProperties:
    return GpuProperties(
        name=info.name, vendor_id=info.vendor_id, device_type=info.device_type, subgroup_size=info.subgroup_size,
        integer_dot_product=info.integer_dot_product, cooperative_matrix=info.cooperative_matrix,
        storage_16bit=info.storage_16bit,
    )  # fmt: skip


def pick_device(devices: list[VulkanInfo]) -> VulkanInfo | None:
    """The device zinc runs on, as zinc.runtime.device picks it: the first that is not a CPU
    implementation, else the first."""
    gpus = [d for d in devices if d.device_type != "cpu"]
    return next(iter(gpus or devices), None)


@cache
def detected_vulkan_target() -> str:
    """The Vulkan target of this machine's GPU: `$ZINC_VULKAN_TARGET` when set, else the device's
    properties (zinc.runtime.vulkan_probe) through `vulkan_target_for`; GENERIC with no device."""
    forced = os.environ.get("ZINC_VULKAN_TARGET")
    if forced:
        return check_vulkan_target(forced)
    device = pick_device(probe())
    return GENERIC if device is None else vulkan_target_for(gpu_properties(device))
