"""The artifact contract: a directory holding `model.<target>.vmfb` and `manifest.json`.

Owns: `Manifest` (format version, versions, target and flags, the GGUF identity, hyperparameters,
entry points and decode batch buckets, KV-cache geometry, the vmfb's sha256, the `.irpa` archives of repacked weights), writing it atomically, and `load_manifest`,
which refuses what it does not understand or what does not match the GGUF it is used with.
Imports: zinc.errors, zinc.model (leaf-level helpers only). Anyone may import this module.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from zinc.errors import ArtifactError
from zinc.model.gguf_file import GGUFModel
from zinc.model.hparams import HParams

FORMAT_VERSION = 3  # 2: slot-major paged KV slab, decode_b{B} batch buckets; 3: kv_write takes layer-major rows
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class KVCacheGeometry:
    layout: str = "[slots, block_count, 2 (K|V), head_count_kv, key_length]"  # a slot: one position's K/V
    dtype: str = "f32"  # "f16" on the CPU, "f32" on Vulkan
    writer: str = "kv_write"  # the step functions return new rows [L, 2, T, Hkv, hd]; this entry point stores them


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
    parameter_archives: list[str] = field(default_factory=list)  # `.irpa` files of repacked weights
    batch_sizes: list[int] = field(default_factory=lambda: [1])  # decode buckets: entry decode_b{B}
    kv_cache: KVCacheGeometry = field(default_factory=KVCacheGeometry)
    sampling: str = "greedy token computed on the device (argmax); other samplers on the host from logits"
    format_version: int = FORMAT_VERSION

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
            return Manifest(
                **{k: v for k, v in d.items() if k not in ("hparams", "kv_cache")},
                hparams=HParams.from_json(d["hparams"]),
                kv_cache=KVCacheGeometry(**d.get("kv_cache", {})),
            )
        except (TypeError, KeyError) as exc:
            raise ArtifactError(f"artifact manifest is malformed: {exc}") from exc


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_artifact(
    directory: Path,
    module: Callable[[], tuple[Manifest, bytes]],
    extra: dict[str, str] | None = None,
    payload: Callable[[Path], object] | None = None,
) -> Path:
    """Write the artifact atomically: into a sibling temp directory, then rename over `directory`.

    `payload(tmp_dir)` writes any further files (the repacked-weight archives) first; `module()`
    then gives the manifest and the vmfb, so the vmfb may still be compiling while they are written.
    """
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        for name, text in (extra or {}).items():
            (tmp / name).write_text(text)
        if payload is not None:
            payload(tmp)
        manifest, vmfb = module()
        (tmp / manifest.vmfb).write_bytes(vmfb)
        (tmp / MANIFEST).write_text(json.dumps(manifest.to_json(), indent=2) + "\n")
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def load_manifest(directory: Path, gguf: GGUFModel | None = None, verify_vmfb: bool = True) -> Manifest:
    """Read and check an artifact; with `gguf`, also check that it was compiled from that file."""
    path = directory / MANIFEST
    try:
        manifest = Manifest.from_json(json.loads(path.read_text()))
    except FileNotFoundError as exc:
        raise ArtifactError(f"{directory}: not a zinc artifact (no {MANIFEST})") from exc
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as exc:
        raise ArtifactError(f"{path}: corrupted manifest ({exc})") from exc
    vmfb = directory / manifest.vmfb
    if not vmfb.is_file():
        raise ArtifactError(f"{directory}: the module {manifest.vmfb} is missing")
    for name in manifest.parameter_archives:
        if not (directory / name).is_file():
            raise ArtifactError(f"{directory}: the parameter archive {name} is missing")
    if verify_vmfb and sha256_bytes(vmfb.read_bytes()) != manifest.vmfb_sha256:
        raise ArtifactError(f"{vmfb}: corrupted module (checksum does not match the manifest)")
    if gguf is not None and (
        gguf.identity != manifest.gguf_identity or gguf.file_size != manifest.gguf_file_size
    ):
        raise ArtifactError(
            f"{directory} was compiled from a different GGUF than {gguf.path}; recompile with `zinc compile`"
        )
    return manifest
