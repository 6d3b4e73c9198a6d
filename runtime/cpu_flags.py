"""The x86 instruction-set features of this CPU, and of the portable x86-64 levels.

Owns: `host_cpu_flags` (the `flags` line of /proc/cpuinfo), `ISA_FLAGS` (the features compiled
code may use, as /proc/cpuinfo spells them), `CPU_LEVELS` (x86-64-v2, v3, v4: the levels LLVM
compiles for by those names) and `check_cpu_features`, which refuses an artifact that needs a
feature this CPU lacks: its code would die of an illegal instruction (SIGILL) at the first call.
Where /proc/cpuinfo has no x86 flags (another architecture, no procfs), nothing is checked.
Imports: zinc.errors, the stdlib (the compiler reads these too).
"""

from __future__ import annotations

from collections.abc import Collection
from functools import cache
from pathlib import Path

from zinc.errors import ArtifactError

_V2 = frozenset({"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"})
_V3 = _V2 | {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
CPU_LEVELS: dict[str, frozenset[str]] = {"x86-64-v2": _V2, "x86-64-v3": _V3, "x86-64-v4": _V4}
ISA_FLAGS = _V4 | {
    "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512vbmi", "avx512_vbmi2", "avx512_bitalg",
    "avx512_vpopcntdq", "avx512ifma", "avx512_fp16", "gfni", "vaes", "vpclmulqdq", "aes", "pclmulqdq",
    "sha_ni", "adx", "amx_tile", "amx_int8", "amx_bf16",
}  # fmt: skip


@cache
def host_cpu_flags() -> frozenset[str]:
    """This CPU's feature flags from /proc/cpuinfo (none where it cannot be read)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def check_cpu_features(required: Collection[str], where: str, cpu_target: str) -> None:
    """Refuse code compiled for `required` features when this CPU lacks some of them."""
    host = host_cpu_flags()
    missing = sorted(set(required) - host) if host else []
    if missing:
        raise ArtifactError(
            f"{where} was compiled for a CPU ({cpu_target}) with {', '.join(missing)}, which this CPU lacks "
            "(its code would stop with an illegal instruction): compile it on this machine, or build a "
            "portable one with `zinc compile --cpu-target x86-64-v3` (or v2, v4)"
        )
