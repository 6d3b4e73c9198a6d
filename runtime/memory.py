"""Whether a model fits in memory, checked before anything of it is loaded.

Owns: `MemoryNeed` and the pieces of the estimate: `weights_bytes` (the GGUF tensors an artifact
binds as they are, plus its `.irpa` archives of repacked ones: all mapped from their files, and
all counted as resident, since a served model reads every weight every step), the KV slab
(`kv_slot_bytes` a position, every slot counted: under load every page fills), and
`working_bytes` (the step buffers of a prefill chunk and a decode batch, with slack for the
allocator, plus the process itself: Python, the IREE runtime, the tokenizer); `available_memory`
(MemAvailable from /proc/meminfo, capped by the headroom under any cgroup memory limit of this
process, v2 `memory.max` or v1 `memory.limit_in_bytes`; `ZINC_MEMORY_LIMIT` overrides both); and
`check_memory`, which raises `InsufficientMemoryError`, one line with both figures in GiB, when
the need exceeds what is available. zinc.runtime.session puts the pieces together for a model.
Imports: iree.runtime (an archive's index, mapped, never read whole), zinc.artifact, zinc.model,
zinc.errors, the stdlib.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import iree.runtime as rt

from zinc.artifact import COPY_PLANE, KV_DTYPES
from zinc.errors import InsufficientMemoryError, ZincError
from zinc.model.gguf_file import GGUFModel
from zinc.model.hparams import HParams

GIB = 1 << 30
MIB = 1 << 20
LIMIT_ENV = "ZINC_MEMORY_LIMIT"
# The KV slab's type per target, as the compiler picks it (the manifest says it once compiled):
# f16 values on both, on Vulkan two to an i32 word (zinc.artifact.kv_storage).
KV_DTYPE = {"cpu": "f16", "vulkan": "f16x2"}
# The process besides a model's weights, KV pages and step buffers: the interpreter, numpy, the IREE
# runtime, the HTTP server and the tokenizer (`zinc serve` with SmolLM2 held 343 MiB after a
# 1,459-token prompt, about 190 MiB of it besides its 0.12 GiB of weights and 34 MiB of KV pages).
PROCESS_BYTES = 256 * MIB
# Step buffers are allocated per call and kept by IREE's allocator once used: room for two sets.
STEP_SLACK = 2
# GGUF tensors an artifact binds as they are even when it also repacks them: the embedding rows are
# gathered from the GGUF bytes (a tied output head is repacked from the same tensor).
ALWAYS_BOUND = ("token_embd.weight",)
_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kib": 1 << 10, "kb": 10**3,
    "m": 1 << 20, "mib": 1 << 20, "mb": 10**6,
    "g": 1 << 30, "gib": 1 << 30, "gb": 10**9,
    "t": 1 << 40, "tib": 1 << 40, "tb": 10**12,
}  # fmt: skip
_NO_LIMIT = 1 << 60  # cgroup v1 writes "no limit" as the largest page-aligned 63-bit number


@dataclass(frozen=True)
class MemoryNeed:
    weights: int
    kv_cache: int
    working: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.working


@dataclass(frozen=True)
class Available:
    bytes: int
    source: str  # where the figure comes from, for the error message


def gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def parse_size(text: str) -> int:
    """`ZINC_MEMORY_LIMIT`'s value: bytes, or a number with a unit (K/KiB, M/MiB, G/GiB, T/TiB are
    powers of 1024, KB/MB/GB/TB of 1000), e.g. `8GiB`, `512 MiB`, `1.5G`."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*", text)
    unit = _UNITS.get(m.group(2).lower()) if m else None
    if m is None or unit is None:
        raise ZincError(f"{LIMIT_ENV} must be a size in bytes, or with a unit (8GiB, 512MiB), got {text!r}")
    return int(float(m.group(1)) * unit)


def weights_bytes(gguf: GGUFModel, archives: Sequence[Path] = ()) -> int:
    """The bytes of weights a module binds: its `.irpa` archives whole, and the GGUF tensors that
    none of their entries repacks (an entry is `<tensor>[+<tensor>...].<plane>`), plus those
    bound as they are anyway (`ALWAYS_BOUND`) unless an archive holds their copy (plane
    COPY_PLANE). Without archives (not compiled yet), every GGUF tensor: the archives are a byte
    shuffle of the tensors they replace, or larger (Q4_K by a third, Q6_K by 1%)."""
    replaced: set[str] = set()
    copied: set[str] = set()  # bound from their copy in an archive, never from the GGUF
    total = 0
    for path in archives:
        index = rt.ParameterIndex()
        index.load(str(path))  # mapped: only the index is read
        for key, _ in index.items():
            tensors, plane = key.rsplit(".", 1)
            (copied if plane == COPY_PLANE else replaced).update(tensors.split("+"))
        total += path.stat().st_size
    replaced.difference_update(ALWAYS_BOUND)
    replaced.update(copied)
    return total + sum(t.n_bytes for name, t in gguf.tensors.items() if name not in replaced)


def kv_slot_bytes(hp: HParams, dtype: str) -> int:
    """One slot of the KV slab of KV type `dtype` (zinc.artifact.KV_DTYPES; one it does not know
    counts 4 bytes a value, and the session refuses it): a position's keys and values in every layer."""
    return hp.block_count * 2 * hp.head_count_kv * hp.key_length * KV_DTYPES.get(dtype, 4)


def working_bytes(hp: HParams, context: int, tokens: int, rows: int) -> int:
    """The step buffers of a prefill call of `tokens` tokens at the end of a `context`-long
    sequence (per token: the residual stream and its normed copies, q/k/v, the gated FFN, one
    row of attention scores per head, its K/V rows) or a decode step of `rows` sequences (their
    logits), in f32, with `STEP_SLACK`, plus the process itself (`PROCESS_BYTES`)."""
    qkv = (hp.head_count + 2 * hp.head_count_kv) * hp.key_length
    per_token = 4 * hp.embedding_length + qkv + 2 * hp.feed_forward_length + hp.head_count * context
    per_token += hp.block_count * 2 * hp.head_count_kv * hp.key_length
    step = 4 * (max(tokens, rows) * per_token + max(rows, 1) * hp.vocab_size)
    return PROCESS_BYTES + STEP_SLACK * step


def available_memory(
    environ: Mapping[str, str] | None = None,
    meminfo: Path = Path("/proc/meminfo"),
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    own_cgroup: Path = Path("/proc/self/cgroup"),
) -> Available | None:
    """The memory a model may take now: `ZINC_MEMORY_LIMIT` when set, else the least of
    MemAvailable and the headroom under each cgroup memory limit above this process (the limit,
    less what the group uses besides its inactive page cache, which the kernel reclaims first).
    None when none of them can be read (nothing is checked then)."""
    env = os.environ if environ is None else environ
    if text := env.get(LIMIT_ENV, "").strip():
        return Available(parse_size(text), LIMIT_ENV)
    found: list[Available] = []
    if (free := _meminfo(meminfo, "MemAvailable")) is not None:
        found.append(Available(free, "MemAvailable"))
    if (room := _cgroup_headroom(cgroup_root, own_cgroup)) is not None:
        found.append(Available(room, "under the cgroup memory limit"))
    return min(found, key=lambda a: a.bytes) if found else None


def check_memory(need: MemoryNeed, what: str, available: Available | None = None, options: str = "") -> None:
    """Raise `InsufficientMemoryError` when `need` exceeds what is available (`available_memory()`
    unless given), its hint naming the command's `options` that shrink the KV cache; a machine
    whose memory cannot be read is not checked."""
    have = available if available is not None else available_memory()
    if have is None or need.total <= have.bytes:
        return
    raise InsufficientMemoryError(
        f"{what} does not fit in memory: it needs {gib(need.total)} (weights {gib(need.weights)}, "
        f"KV cache {gib(need.kv_cache)}, working buffers {gib(need.working)}) and {gib(have.bytes)} "
        f"is available ({have.source}); use a smaller KV cache{f' ({options})' if options else ''} "
        "or a smaller model"
    )


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _meminfo(path: Path, key: str) -> int | None:
    """A /proc/meminfo-style figure ("Key:  123 kB") in bytes."""
    text = _read(path) or ""
    m = re.search(rf"^{key}:\s*([0-9]+)\s*kB", text, re.MULTILINE)
    return int(m.group(1)) * 1024 if m else None


def _stat(path: Path, key: str) -> int:
    text = _read(path) or ""
    m = re.search(rf"^{key}\s+([0-9]+)$", text, re.MULTILINE)
    return int(m.group(1)) if m else 0


def _cgroup_headroom(root: Path, own: Path) -> int | None:
    """The least headroom under the memory limits of this process's cgroup and its ancestors (v2:
    `memory.max`, `memory.current`; v1: `memory.limit_in_bytes`, `memory.usage_in_bytes`), each
    less the group's inactive page cache. The path from /proc/self/cgroup is looked up under the
    mount; in a container it is often not there (the mount is the container's own group), and
    then the mount's root is that group."""
    paths = {"v2": "/", "v1": "/"}
    for line in (_read(own) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[0] == "0" and parts[1] == "":
            paths["v2"] = parts[2]
        elif len(parts) == 3 and "memory" in parts[1].split(","):
            paths["v1"] = parts[2]
    rooms: list[int] = []
    for version, base, limit_file, usage_file, inactive in (
        ("v2", root, "memory.max", "memory.current", "inactive_file"),
        ("v1", root / "memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
    ):
        directory = base / paths[version].strip("/")
        while True:  # the group, then each ancestor up to the mount's root
            limit = (_read(directory / limit_file) or "").strip()
            if limit.isdigit() and int(limit) < _NO_LIMIT:
                usage = (_read(directory / usage_file) or "").strip()
                used = int(usage) if usage.isdigit() else 0
                used -= min(used, _stat(directory / "memory.stat", inactive))
                rooms.append(max(0, int(limit) - used))
            if directory == base or base not in directory.parents:
                break
            directory = directory.parent
    return min(rooms) if rooms else None
