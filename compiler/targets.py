"""Compile targets and the one call into iree-compile.

Owns: the table of iree-compile flags per target (`cpu` = llvm-cpu for the host, `vulkan` =
SPIR-V) and `compile_mlir`, which turns MLIR text into vmfb bytes with a clear error.
Imports: iree.compiler, zinc.errors.
"""

from __future__ import annotations

from iree.compiler import CompilerToolError, compile_str
from iree.compiler import version as iree_compiler_version

from zinc.errors import CompileError, ZincError

TARGET_FLAGS: dict[str, tuple[str, ...]] = {
    "cpu": (
        "--iree-hal-target-device=local",
        "--iree-hal-local-target-device-backends=llvm-cpu",
        "--iree-llvmcpu-target-cpu=host",
    ),
    "vulkan": ("--iree-hal-target-device=vulkan",),
}
TARGETS = tuple(TARGET_FLAGS)


def check_target(target: str) -> str:
    if target not in TARGET_FLAGS:
        raise ZincError(f"unknown target {target!r}: choose one of {', '.join(TARGETS)}")
    return target


def compiler_version() -> str:
    return str(getattr(iree_compiler_version, "VERSION", "unknown"))


def compile_mlir(text: str, target: str, extra_flags: tuple[str, ...] = ()) -> bytes:
    """Compile MLIR text for `target`; a compiler failure becomes a `CompileError`."""
    flags = [*TARGET_FLAGS[check_target(target)], *extra_flags]
    try:
        out = compile_str(text, extra_args=flags)
    except CompilerToolError as exc:
        lines = [ln for ln in str(exc).splitlines() if "error:" in ln][:3]
        detail = " | ".join(ln.strip() for ln in lines) or str(exc).splitlines()[0]
        raise CompileError(f"iree-compile failed for target {target}: {detail}") from exc
    if not isinstance(out, bytes):
        raise CompileError("iree-compile returned no module")
    return out
