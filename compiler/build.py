"""`zinc compile`: GGUF -> model description -> MLIR -> vmfb + manifest, with a compile cache.

Owns: `compile_model` (build one artifact into a directory), `ensure_artifact` (compile on first
use into `$ZINC_CACHE`, keyed by the GGUF identity, target, flags, versions and the generated
MLIR; a broken or partly written cache entry is rebuilt, never trusted; one process compiles an
entry while others wait for it, zinc.artifact.artifact_lock; a read-only cache, shared by
machines that compile nothing, is only read: a missing entry there is a clear error, as it is
with ZINC_NO_COMPILE=1). The cache's location is zinc.model.gguf_cache.cache_root.
Imports: zinc.compiler.*, zinc.model, zinc.artifact, zinc.errors, zinc.runtime.archive. The MLIR
generator (zinc.compiler.llama, graph, emitter, embed) only inside the functions that compile:
finding a cached artifact, every start's path, needs the cache key's modules only.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from zinc import __version__
from zinc.artifact import (
    COPY_PLANE,
    DEFAULT_BATCH_SIZES,
    FORMAT_VERSION,
    MANIFEST,
    KVCacheGeometry,
    Manifest,
    artifact_lock,
    load_manifest,
    pause_point,
    sha256_bytes,
    write_artifact,
)
from zinc.compiler import dot8, dot8_layout, dp4
from zinc.compiler.kernels import QuantType
from zinc.compiler.targets import (
    GENERIC,
    check_target,
    compile_mlir,
    compiler_version,
    detected_vulkan_target,
    index_inputs,
    prefill_gemm,
    shared_layers,
    target_cpu_flags,
    target_flags,
    vulkan_target_flags,
)
from zinc.errors import ArtifactError
from zinc.model.gguf_cache import cache_root
from zinc.model.gguf_file import GGUFModel, open_gguf
from zinc.model.hparams import ROPE_FREQS, describe, with_pooling
from zinc.runtime.archive import advise_willneed, read_tensor_bytes, write_parameter_archive

Progress = Callable[[str], None]
REPACKED_ARCHIVE = "weights.irpa"


def zinc_version() -> str:
    return __version__


@dataclass(frozen=True)
class Plan:
    """Everything an artifact is built from."""

    gguf: GGUFModel
    target: str
    mlir: str
    flags: tuple[str, ...]
    repacked: dict[str, tuple[tuple[str, ...], QuantType, int, int, str]]  # see ModuleEmitter.repacked
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES  # decode buckets (decode_b{B} entry points)
    kv_dtype: str = "f16"  # the KV slab's type (ModuleEmitter.kv_dtype, zinc.artifact.KV_DTYPES)
    vulkan_target: str = GENERIC  # IREE's Vulkan GPU target (zinc.compiler.targets.VULKAN_TARGETS)
    pooling: str | None = None  # the operator's pooling (`zinc serve --embeddings`); None: the GGUF's
    cpu_features: frozenset[str] = frozenset()  # on the CPU: the ISA features the code may use
    copied: tuple[str, ...] = ()  # GGUF tensors bound from an aligned copy in the .irpa (`misaligned`)

    @property
    def archive(self) -> bool:
        """Whether the artifact carries `weights.irpa` (repacked weights or aligned copies)."""
        return bool(self.repacked or self.copied)


def _source_digest() -> str:
    """A hash of everything the generated MLIR is derived from: the compiler, its templates, the
    model descriptions and the artifact contract's constants (zinc/artifact.py: PREFILL_ROWS,
    CTX_ALIGN). The cache key uses it, so finding a cached artifact never has to regenerate the
    MLIR (that took a third of a second of every start)."""
    h = hashlib.sha256()
    for package in ("zinc.compiler", "zinc.mlir", "zinc.model"):
        root = resources.files(package)
        for entry in sorted(root.iterdir(), key=lambda e: e.name):
            if entry.name.endswith((".py", ".mlir")):
                h.update(entry.name.encode() + b"\0" + entry.read_bytes())
    h.update(b"artifact.py\0" + resources.files("zinc").joinpath("artifact.py").read_bytes())
    return h.hexdigest()


def batch_buckets(batch_sizes: tuple[int, ...] | None) -> tuple[int, ...]:
    """The decode buckets to compile: 1 (single-sequence decode) plus the requested sizes."""
    sizes = DEFAULT_BATCH_SIZES if batch_sizes is None else batch_sizes
    if any(not 1 <= b <= 64 for b in sizes):
        raise ArtifactError(f"batch sizes must be between 1 and 64, not {list(sizes)}")
    return tuple(sorted({1, *sizes}))


def artifact_key(
    gguf: GGUFModel, target: str, batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES, vulkan_target: str = GENERIC,
    pooling: str | None = None,
) -> str:
    """The cache key of an artifact: GGUF identity, target, flags (the Vulkan GPU target's too),
    batch buckets, versions, the sources, the tensor values baked into the MLIR and the
    operator's pooling, if any; on the CPU, whose artifacts hold repacked weights, a sample of the
    weights too (`GGUFModel.weights_sample`), so two files with one header and name but other
    weights each have an artifact of their own."""
    h = hashlib.sha256()
    for part in (
        str(FORMAT_VERSION), zinc_version(), compiler_version(), target, *_flags(target, vulkan_target),
        gguf.identity, str(gguf.file_size), _source_digest(), ",".join(map(str, batch_buckets(batch_sizes))),
        f"dot8={_use_dot8(target)}", f"vnni={_use_dot8(target) and dot8_layout.vnni()}",
        f"wide={_use_dot8(target) and dot8_layout.wide_enabled()}", f"prefetch={dot8.prefetch_blocks()}",
        _baked_values(gguf), *([f"pooling={pooling}"] if pooling is not None else []),
        *([f"gemm={prefill_gemm(vulkan_target)}", f"dp4={dp4.subgroup_size(vulkan_target)}"]
          if check_target(target) == "vulkan" else []),
        *(["cpu=" + ",".join(sorted(target_cpu_flags())), f"weights={gguf.weights_sample}"] if target == "cpu" else []),
    ):  # fmt: skip
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:24]


def _baked_values(gguf: GGUFModel) -> str:
    """The tensor values that the generated MLIR holds as constants, for the cache key (the GGUF
    identity covers the header only): Llama 3's `rope_freqs.weight` (emitter.rope_freqs)."""
    info = gguf.tensors.get(ROPE_FREQS)
    if info is None or info.type_name != "F32":  # absent, or describe rejects it
        return ""
    return f"rope_freqs={gguf.read_f32(ROPE_FREQS)!r}"


def _flags(target: str, vulkan_target: str) -> tuple[str, ...]:
    """iree-compile's flags for `target`, with the Vulkan GPU target's (none for GENERIC)."""
    return target_flags(target) + (vulkan_target_flags(vulkan_target) if check_target(target) == "vulkan" else ())


def _use_dot8(target: str) -> bool:
    """The integer dot-product kernels: CPU target on a host with AVX2 (ZINC_CPU_INT8=0 turns them off)."""
    return check_target(target) == "cpu" and dot8_layout.enabled()


# IREE's local-task driver (zinc's CPU device) maps a parameter in place only where its bytes start at
# a multiple of 64 in the file; otherwise it reads it into memory of its own while loading. GGUF
# aligns tensors to 32 bytes.
PARAM_ALIGN = 64
COPY_MIN_BYTES = 1 << 20  # a smaller misaligned tensor (a norm's weights) is left to IREE's copy


def misaligned(gguf: GGUFModel) -> frozenset[str]:
    """The GGUF tensors of at least COPY_MIN_BYTES that IREE could not map in place. A CPU artifact
    binds those it reads as they are (not repacked) from a copy in its .irpa instead: Llama 3.2
    1B's token embeddings (205 MiB, a few rows read a step) otherwise cost their whole size twice
    in resident memory, IREE's copy and the file pages it was read from."""
    return frozenset(
        name for name, t in gguf.tensors.items() if t.offset % PARAM_ALIGN and t.n_bytes >= COPY_MIN_BYTES
    )


def plan(
    gguf_path: str | os.PathLike[str], target: str, batch_sizes: tuple[int, ...] | None = None,
    vulkan_target: str = GENERIC, pooling: str | None = None,
) -> Plan:
    """What to build; `pooling` overrides the GGUF's `{arch}.pooling_type` (an `embed` entry for
    a model that declares none)."""
    from zinc.compiler import llama  # here: the MLIR generator, which finding a cached artifact never needs

    gguf = open_gguf(gguf_path)
    desc = with_pooling(describe(gguf), pooling)
    buckets = batch_buckets(batch_sizes)
    kind = check_target(target)
    mod = llama.emit_module(
        desc,
        tiled=kind == "cpu",
        dot8=_use_dot8(kind),
        batch_sizes=buckets,
        kv_write_parallel=kind == "vulkan",
        index_inputs=kind == "vulkan" and index_inputs(vulkan_target),
        gemm=prefill_gemm(vulkan_target) if kind == "vulkan" else None,
        dp4_subgroup=dp4.subgroup_size(vulkan_target) if kind == "vulkan" else 0,
        shared_layers=kind == "vulkan" and shared_layers(vulkan_target),
        copies=misaligned(gguf) if kind == "cpu" else frozenset(),  # Vulkan uploads every weight anyway
    )
    pause_point("emit")  # tests/faults: killed while the MLIR is generated
    return Plan(gguf=gguf, target=target, mlir=mod.text("zinc_model"), flags=_flags(target, vulkan_target),
                repacked=dict(mod.repacked), batch_sizes=buckets, kv_dtype=mod.kv_dtype,
                vulkan_target=vulkan_target if kind == "vulkan" else GENERIC, pooling=pooling,
                cpu_features=target_cpu_flags() if kind == "cpu" else frozenset(),
                copied=tuple(sorted(mod.copied)))  # fmt: skip


def _write_repacked(p: Plan, directory: Path) -> None:
    """Repack the tiled weights into `weights.irpa` in `directory` (a byte shuffle, no requantizing),
    one weight at a time, then copy the misaligned tensors' bytes."""
    if p.archive:
        planes = itertools.chain(_repacked_planes(p), _copies(p))
        write_parameter_archive(directory / REPACKED_ARCHIVE, planes)


COPY_CHUNK = 64 << 20


def _copies(p: Plan) -> Iterator[tuple[str, np.ndarray[Any, Any], int]]:
    """The bytes of each tensor in `p.copied`, unchanged, in chunks of COPY_CHUNK bytes."""
    for name in p.copied:
        info = p.gguf.tensors[name]
        raw = read_tensor_bytes(p.gguf.path, info)
        for at in range(0, info.n_bytes, COPY_CHUNK):
            yield f"{name}.{COPY_PLANE}", raw[at : at + COPY_CHUNK], info.n_bytes


REPACK_ROWS = 2048  # at most this many rows of a weight repacked at a time


def _repacked_planes(p: Plan) -> Iterator[tuple[str, np.ndarray[Any, Any], int]]:
    """Each repacked weight's planes, in chunks of `REPACK_ROWS` rows, with each plane's whole
    size: every layout keeps its groups of rows apart (a plane is row-group major), so the chunks
    of a plane follow each other, and as the chunks are equal, a plane is n / step of them."""
    from zinc.compiler.emitter import LAYOUTS

    weights = list(p.repacked.items())
    for i, (name, (sources, q, n, k, layout)) in enumerate(weights):
        if i + 1 < len(weights):  # the next weight's bytes read from disk while this one is repacked
            advise_willneed(p.gguf.path, [p.gguf.tensors[s] for s in weights[i + 1][1][0]])
        rows = [read_tensor_bytes(p.gguf.path, p.gguf.tensors[s]) for s in sources]
        raw = rows[0] if len(rows) == 1 else np.concatenate(rows)  # stacked row-wise: [sum n, k]
        raw = raw.reshape(n, -1)
        # whole 32-row tiles and pairs of 8-row groups in each chunk
        step = next((s for s in range(REPACK_ROWS, 0, -32) if n % s == 0), n)
        for r0 in range(0, n, step):
            for plane, arr in LAYOUTS[layout].repack(q, raw[r0 : r0 + step].reshape(-1), step, k).items():
                yield f"{name}.{plane}", arr, arr.nbytes * (n // step)


def compile_model(p: Plan, out_dir: Path, progress: Progress | None = None, keep_ir: bool = False) -> Path:
    """Compile `p` into `out_dir`. iree-compile (a subprocess) runs on a thread of its own while
    this one repacks the weights: each keeps one core busy, and neither needs the other's output."""
    from zinc.compiler.embed import pools
    from zinc.compiler.graph import entry_points

    say = progress or (lambda _msg: None)
    desc = with_pooling(describe(p.gguf), p.pooling)
    gpu = f" ({p.vulkan_target})" if p.target == "vulkan" else ""
    say(f"iree-compile for {p.target}{gpu} ({desc.hparams.block_count} layers)")
    t0 = time.perf_counter()

    def compiled() -> bytes:
        vmfb = compile_mlir(p.mlir, p.target, p.flags[len(target_flags(p.target)) :])
        say(f"compiled in {time.perf_counter() - t0:.1f} s ({len(vmfb) / 1e6:.2f} MB)")
        return vmfb

    def module(vmfb: bytes) -> tuple[Manifest, bytes]:
        manifest = Manifest(
            zinc_version=zinc_version(),
            iree_compiler_version=compiler_version(),
            target=p.target,
            flags=list(p.flags),
            gguf_identity=p.gguf.identity,
            gguf_file_size=p.gguf.file_size,
            architecture=desc.hparams.architecture,
            hparams=desc.hparams,
            entry_points=entry_points(p.batch_sizes, check_target(p.target) == "cpu", pools(desc.hparams)),
            batch_sizes=list(p.batch_sizes),
            vmfb=f"model.{p.target}.vmfb",
            vmfb_sha256=sha256_bytes(vmfb),
            mlir_sha256=sha256_bytes(p.mlir.encode()),
            parameter_archives=[REPACKED_ARCHIVE] if p.archive else [],
            kv_cache=KVCacheGeometry(dtype=p.kv_dtype),
            cpu_features=sorted(p.cpu_features),
            weights_sample=p.gguf.weights_sample if p.archive else "",
        )
        return manifest, vmfb

    def repack(tmp: Path) -> None:
        if p.archive:
            say(f"repacking {len(p.repacked)} weights into {REPACKED_ARCHIVE}"
                + (f", with {len(p.copied)} copied" if p.copied else ""))  # fmt: skip
            _write_repacked(p, tmp)

    extra = {"model.mlir": p.mlir} if keep_ir else None
    with ThreadPoolExecutor(1, thread_name_prefix="iree-compile") as pool:
        compiling = pool.submit(compiled)
        return write_artifact(out_dir, lambda: module(compiling.result()), extra, payload=repack)


def ensure_artifact(
    gguf_path: str | os.PathLike[str],
    target: str,
    progress: Progress | None = None,
    cache_dir: Path | None = None,
    batch_sizes: tuple[int, ...] | None = None,
    vulkan_target: str | None = None,
    pooling: str | None = None,
) -> Path:
    """The cached artifact for this GGUF, target and batch buckets, compiling it if absent or broken.
    On Vulkan, `vulkan_target` names IREE's GPU target; None: the one of this machine's GPU
    (`detected_vulkan_target`). `pooling` (mean, cls or last) overrides the GGUF's pooling type."""
    say = progress or (lambda _msg: None)
    gguf = open_gguf(gguf_path)
    kind = check_target(target)
    gpu = (vulkan_target or detected_vulkan_target()) if kind == "vulkan" else GENERIC
    key = artifact_key(gguf, target, batch_buckets(batch_sizes), gpu, pooling)
    directory = (cache_dir or cache_root()) / f"{gguf.path.stem}-{kind}-{key}"
    if _cached(directory, gguf, say):
        return directory
    if os.environ.get("ZINC_NO_COMPILE") == "1" or not _writable(directory.parent):
        raise ArtifactError(
            f"no artifact of {gguf.path.name} for this {kind} target in the cache {directory.parent} "
            f"(wanted {directory.name}), which is read-only here (or ZINC_NO_COMPILE=1): compile it with "
            "`zinc compile` where the cache is writable, with this zinc and this machine's CPU or GPU "
            "target, or serve a compiled one with `zinc serve --artifact DIR`"
        )
    with artifact_lock(directory, say):  # one compile per entry; a process that waited finds it built
        if _cached(directory, gguf, say):
            return directory
        return compile_model(plan(gguf_path, target, batch_sizes, gpu, pooling), directory, progress)


def _writable(folder: Path) -> bool:
    """Whether `folder` (or, while it does not exist, the nearest folder above it) takes writes."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return os.access(folder, os.W_OK)


def _cached(directory: Path, gguf: GGUFModel, say: Progress) -> bool:
    """Whether `directory` holds a sound artifact of `gguf` (a partial or broken one is rebuilt)."""
    if not (directory / MANIFEST).exists():
        return False
    try:
        load_manifest(directory, gguf)
    except ArtifactError as exc:
        say(f"rebuilding broken cache entry: {exc.message}")
        return False
    say(f"using cached artifact {directory}")
    return True
