"""The artifact contract: a directory holding `model.<target>.vmfb` and `manifest.json`.

Owns: `Manifest` (format version, versions, target and flags, the GGUF identity, hyperparameters,
entry points and decode batch buckets, KV-cache geometry, the vmfb's sha256, the `.irpa` archives
of repacked weights and of aligned copies (`COPY_PLANE`), and the size (and, but for an archive,
the sha256) of every file it vouches for), `kv_storage` (how the slab of each KV type is stored:
compiler and runtime agree through it), `write_artifact` (crash-safe: below), `load_manifest`,
which refuses what it does not understand, what is missing or partly written, and what does not
match the GGUF it is used with, `artifact_lock`, and `prefill_rows` (tokens per prefill call on
each target).

Crash safety: an artifact is written into a temporary sibling directory (`.NAME.tmp-*`), each file
fsynced, the manifest last (it names the size of every other file), then the directory
is renamed into place and its parent fsynced. So a process killed at any point, or a full disk,
leaves either no artifact at NAME or a complete one (a replaced one is first renamed aside to
`.NAME.old-*`); the next write into that folder removes the leftovers. Writers of one NAME take
`artifact_lock` (an flock on `.NAME.lock`, released by the kernel when a process dies), so two
processes never write it at once and leftovers are never those of a live writer.
`pause_point(name)` is a test hook: with `ZINC_PAUSE_AT=name` the process stops itself there
(SIGSTOP), so tests/faults can kill it at a known point.
Imports: zinc.errors, zinc.model (leaf-level helpers only). Anyone may import this module.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from zinc.errors import ArtifactError
from zinc.model.gguf_file import GGUFModel
from zinc.model.hparams import HParams

# 2: slot-major paged KV slab, decode_b{B} batch buckets; 3: kv_write takes layer-major rows;
# 4: `files`, every file's size and sha256 (none for a parameter archive); 5: Vulkan's kv_write
# takes any number of rows, so a Vulkan prefill call takes PREFILL_ROWS tokens as the CPU's;
# 6: Vulkan's KV slab holds f16 values two to an i32 word (kv_cache.dtype "f16x2"); 7: a step's ctx
# width is a multiple of CTX_ALIGN (16, was 8)
FORMAT_VERSION = 7
MANIFEST = "manifest.json"
HASH_BLOCK_BYTES = 8 << 20
DEFAULT_BATCH_SIZES = (1, 4, 8)  # the decode buckets (decode_b{B} entry points) an artifact has unless asked
PREFILL_ROWS = 128  # prompt tokens per prefill call (a Vulkan GPU target's prefill pads its chunk to it)
# an .irpa entry `<tensor>.gguf` holds a GGUF tensor's bytes unchanged, at an offset IREE maps in place
COPY_PLANE = "gguf"
CTX_ALIGN = 16  # a step's ctx width (so its S) is a multiple of this: the CPU's prefill attention reads keys in blocks of 16


def prefill_rows(target: str, hp: HParams) -> int:
    """Prompt tokens per prefill call of a model on `target`: PREFILL_ROWS on every target."""
    return PREFILL_ROWS


# The KV slab's types (the manifest's kv_cache.dtype), with the bytes each value takes.
KV_DTYPES = {"f16": 2, "f16x2": 2}


def kv_storage(dtype: str, head_dim: int) -> tuple[str, int]:
    """How a KV slab of `kv_cache.dtype` `dtype` is stored: (its element type, f16 or i32, and
    the last dimension of its rows). "f16x2" (Vulkan) holds f16 values two to an i32 word, [...,
    head_dim / 2]: value d of a row in word d // 2, its low 16 bits for an even d, the high 16
    for an odd one (numpy's f16 row viewed as int32, little-endian). IREE 3.13's generic Vulkan
    target gets f16 tensors wrong, so the compiler packs and unpacks the halves with integer ops."""
    return ("i32", head_dim // 2) if dtype == "f16x2" else (dtype, head_dim)


@dataclass(frozen=True)
class KVCacheGeometry:
    layout: str = "[slots, block_count, 2 (K|V), head_count_kv, key_length]"  # a slot: one position's K/V
    dtype: str = "f16"  # "f16" on the CPU, "f16x2" on Vulkan (f16 in i32 words: `kv_storage`)
    writer: str = "kv_write"  # the step functions return new rows [L, 2, T, Hkv, hd]; this entry point stores them


@dataclass(frozen=True)
class ArtifactFile:
    size: int
    sha256: str | None  # None for a parameter archive (`_seal`)


@dataclass(frozen=True)
class Manifest:
    zinc_version: str
    iree_compiler_version: str
    target: str  # "cpu" or "vulkan"
    flags: list[str]
    gguf_identity: str
    gguf_file_size: int
    architecture: str
    hparams: HParams
    entry_points: list[str]
    vmfb: str  # file name inside the artifact directory
    vmfb_sha256: str
    mlir_sha256: str
    parameter_archives: list[str] = field(default_factory=list)  # `.irpa` files: repacked weights, copies
    batch_sizes: list[int] = field(default_factory=lambda: [1])  # decode buckets: entry decode_b{B}
    kv_cache: KVCacheGeometry = field(default_factory=KVCacheGeometry)
    sampling: str = "greedy token computed on the device (argmax); other samplers on the host from logits"
    files: dict[str, ArtifactFile] = field(default_factory=dict)  # every other file (set by write_artifact)
    cpu_features: list[str] = field(default_factory=list)  # CPU target: ISA features the code uses
    weights_sample: str = ""  # with parameter archives: the GGUF's `weights_sample` they were made from
    format_version: int = FORMAT_VERSION

    def flag(self, prefix: str, default: str) -> str:
        """The value of the iree-compile flag `prefix`VALUE among `flags`, or `default`."""
        return next((f.removeprefix(prefix) for f in self.flags if f.startswith(prefix)), default)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["hparams"] = self.hparams.to_json()
        return d

    @staticmethod
    def from_json(d: dict[str, Any]) -> Manifest:
        version = d.get("format_version")
        if version != FORMAT_VERSION:
            raise ArtifactError(
                f"artifact format version {version!r} is not supported (expected {FORMAT_VERSION}): "
                "compile it again with `zinc compile`"
            )
        try:
            manifest = Manifest(
                **{k: v for k, v in d.items() if k not in ("hparams", "kv_cache", "files")},
                hparams=HParams.from_json(d["hparams"]),
                kv_cache=KVCacheGeometry(**d.get("kv_cache", {})),
                files={name: _file_entry(f) for name, f in d["files"].items()},
            )
        except (TypeError, KeyError, ValueError, AttributeError) as exc:
            raise ArtifactError(f"artifact manifest is malformed: {type(exc).__name__}: {exc}") from exc
        for name in (manifest.vmfb, *manifest.parameter_archives, *manifest.files):
            if not isinstance(name, str) or Path(name).name != name or name.startswith(".") or name == MANIFEST:
                raise ArtifactError(f"artifact manifest is malformed: {name!r} is not a file name")
        unlisted = {manifest.vmfb, *manifest.parameter_archives} - set(manifest.files)
        if unlisted:
            raise ArtifactError(f"artifact manifest is malformed: no size and sha256 for {sorted(unlisted)}")
        return manifest


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pause_point(name: str) -> None:
    """Test hook: with `ZINC_PAUSE_AT=name`, say so on stderr and stop this process here."""
    if os.environ.get("ZINC_PAUSE_AT") == name:
        sys.stderr.write(f"zinc: paused at {name}\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGSTOP)


_locks_guard = threading.Lock()
_locks: dict[Path, tuple[threading.RLock, list[int]]] = {}  # per directory: its lock, [depth, fd]


@contextlib.contextmanager
def artifact_lock(directory: Path, waiting: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the write lock of the artifact `directory`: an flock on `.NAME.lock` beside it, taken
    once per process (re-entrant: `ensure_artifact` holds it around `write_artifact`'s own)."""
    directory = directory.absolute()
    with _locks_guard:
        rlock, state = _locks.setdefault(directory, (threading.RLock(), [0, -1]))
    with rlock:
        if state[0] == 0:
            directory.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(directory.parent / f".{directory.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if waiting is not None:
                    waiting(f"waiting for another zinc process writing {directory}")
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:  # a filesystem without flock: go on unlocked
                pass
            state[1] = fd
        state[0] += 1
        try:
            yield
        finally:
            state[0] -= 1
            if state[0] == 0:
                os.close(state[1])  # releases the flock


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes) -> None:
    with path.open("xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _seal(path: Path) -> ArtifactFile:
    """Flush a written file to disk and measure it for the manifest. A parameter archive gets its
    size only: hashing it would read an 8B model's 4.4 GB back from disk (it is written past the
    page cache) at the end of every compile, for a digest no load reads."""
    with path.open("rb") as f:
        os.fsync(f.fileno())
        if path.suffix == ".irpa":
            return ArtifactFile(os.fstat(f.fileno()).st_size, None)
        digest = hashlib.sha256()
        size = 0
        while block := f.read(HASH_BLOCK_BYTES):
            digest.update(block)
            size += len(block)
    return ArtifactFile(size, digest.hexdigest())


def _file_entry(d: dict[str, Any]) -> ArtifactFile:
    sha = d["sha256"]
    if sha is not None and not isinstance(sha, str):
        raise TypeError(f"a file's sha256 is {sha!r}")
    return ArtifactFile(int(d["size"]), sha)


def _ours(directory: Path) -> bool:
    """Whether `directory` may be replaced: absent, empty, or holding only an artifact's files."""
    try:
        names = [p.name for p in directory.iterdir()]
    except FileNotFoundError:
        return True
    except NotADirectoryError:
        return False
    return all(n == MANIFEST or n.endswith((".vmfb", ".irpa", ".mlir")) for n in names)


_LEFTOVER = re.compile(r"\.(.+)\.(tmp|old)-[0-9a-f]{8}")  # .NAME.tmp-XXXXXXXX, .NAME.old-XXXXXXXX


def _remove_leftovers(directory: Path) -> None:
    """Remove what killed writes left beside `directory` (called under its lock): its own
    temporary and replaced directories, and those of other names whose lock is free (a live
    writer holds its lock, so those belong to processes that died)."""
    for leftover in directory.parent.glob(".*-????????"):
        match = _LEFTOVER.fullmatch(leftover.name)
        if match is None:
            continue
        if match[1] == directory.name:
            shutil.rmtree(leftover, ignore_errors=True)
            continue
        try:
            fd = os.open(directory.parent / f".{match[1]}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(leftover, ignore_errors=True)
        except OSError:  # held: a writer is alive
            pass
        finally:
            os.close(fd)


def write_artifact(
    directory: Path,
    module: Callable[[], tuple[Manifest, bytes]],
    extra: dict[str, str] | None = None,
    payload: Callable[[Path], object] | None = None,
) -> Path:
    """Write the artifact crash-safely (the module docstring says how) into `directory`.

    `payload(tmp_dir)` writes any further files (the repacked-weight archives) first; `module()`
    then gives the manifest and the vmfb, so the vmfb may still be compiling while they are written.
    A write that fails (a full disk) leaves nothing behind and is one `ArtifactError`.
    """
    if not _ours(directory):
        raise ArtifactError(f"{directory} exists and is not a zinc artifact: choose another output directory")
    with artifact_lock(directory):
        _remove_leftovers(directory)
        tmp = directory.parent / f".{directory.name}.tmp-{uuid.uuid4().hex[:8]}"
        old = directory.parent / f".{directory.name}.old-{uuid.uuid4().hex[:8]}"
        try:
            tmp.mkdir()
            for name, text in (extra or {}).items():
                _write_file(tmp / name, text.encode())
            if payload is not None:
                payload(tmp)
            manifest, vmfb = module()
            _write_file(tmp / manifest.vmfb, vmfb)
            files = {p.name: _seal(p) for p in sorted(tmp.iterdir())}
            manifest = replace(manifest, files=files)
            text = json.dumps(manifest.to_json(), indent=2) + "\n"
            pause_point("manifest")
            _write_file(tmp / MANIFEST, text.encode())
            _fsync(tmp)
            pause_point("rename")
            if directory.exists():
                os.replace(directory, old)
                pause_point("swap")
            os.replace(tmp, directory)
            _fsync(directory.parent)
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if old.exists() and not directory.exists():  # put back what was being replaced
                with contextlib.suppress(OSError):
                    os.replace(old, directory)
            if isinstance(exc, OSError):
                raise _write_error(directory, exc) from exc
            raise
        shutil.rmtree(old, ignore_errors=True)
    return directory


def _write_error(directory: Path, exc: OSError) -> ArtifactError:
    why = os.strerror(exc.errno) if exc.errno else str(exc)
    where = f" ({exc.filename})" if exc.filename else ""
    hint = "; free some space and run it again" if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else ""
    return ArtifactError(f"writing the artifact {directory} failed: {why}{where}{hint}")


def load_manifest(directory: Path, gguf: GGUFModel | None = None, verify_vmfb: bool = True) -> Manifest:
    """Read and check an artifact: every file the manifest names is there with its size (and the
    vmfb with its sha256, unless `verify_vmfb` is false); with `gguf`, also check that it was
    compiled from that file (its header, and a sample of its weights where the artifact holds
    weights of its own)."""
    path = directory / MANIFEST
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ArtifactError(f"{directory}: not a zinc artifact (no {MANIFEST})") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path}: corrupted manifest ({exc})") from exc
    if not isinstance(data, dict):
        raise ArtifactError(f"{path}: corrupted manifest (not a JSON object)")
    manifest = Manifest.from_json(data)
    for name, expected in manifest.files.items():
        try:
            size = (directory / name).stat().st_size
        except FileNotFoundError:
            raise ArtifactError(f"{directory}: {name} is missing") from None
        if size != expected.size:
            raise ArtifactError(
                f"{directory}: {name} is {size} bytes, the manifest says {expected.size} (a partial or damaged write)"
            )
    vmfb = directory / manifest.vmfb
    if verify_vmfb and sha256_bytes(vmfb.read_bytes()) != manifest.vmfb_sha256:
        raise ArtifactError(f"{vmfb}: corrupted module (checksum does not match the manifest)")
    if gguf is not None and (
        gguf.identity != manifest.gguf_identity or gguf.file_size != manifest.gguf_file_size
    ):
        raise ArtifactError(
            f"{directory} was compiled from a different GGUF than {gguf.path}; recompile with `zinc compile`"
        )
    if gguf is not None and manifest.weights_sample and manifest.weights_sample != gguf.weights_sample:
        raise ArtifactError(
            f"{directory} holds weights of a GGUF with the same header as {gguf.path} but other tensor "
            "data (requantized or replaced since); recompile with `zinc compile`"
        )
    return manifest
