"""Compile targets and the one call into iree-compile.

Owns: the table of iree-compile flags per target (`cpu` = llvm-cpu for the host, `vulkan` =
SPIR-V) and `compile_mlir`, which turns MLIR text into vmfb bytes with a clear error.
Imports: iree.compiler (only inside `compile_mlir`: importing it maps about 60 MB of compiler
library, which serving a cached artifact never needs), zinc.errors.
"""

from __future__ import annotations

import ast
import importlib.util
from functools import cache
from pathlib import Path

from zinc.errors import CompileError, ZincError

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
        "--iree-llvmcpu-target-cpu=host",
        ASYNC,
        INDIRECT,
    ),
    "vulkan": ("--iree-hal-target-device=vulkan", ASYNC),
}
TARGETS = tuple(TARGET_FLAGS)


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


def compile_mlir(text: str, target: str, extra_flags: tuple[str, ...] = ()) -> bytes:
    """Compile MLIR text for `target`; a compiler failure becomes a `CompileError`."""
    from iree.compiler import CompilerToolError, compile_str  # here, not at the top: see the docstring

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
