"""A fast reader of a GGUF file's header: metadata key/values and the tensor index.

Owns: `read_header(path)`, which parses GGUF v2/v3 headers straight from a memory map (numeric
arrays through numpy, strings with one struct call each). gguf's `GGUFReader` builds a numpy view
per field part, which takes about 3 s for SmolLM2's 49k-token vocabulary; this takes ~0.1 s,
which is most of zinc's cold start. Values come out as plain Python (str, int, float, bool,
lists of them), the same values `GGUFReader` gives.
Imports: numpy, gguf.constants (type tables only), zinc.errors.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from zinc.errors import GGUFError

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# GGUF value types: id -> (struct format, numpy dtype) for the fixed-size ones
_SCALARS: dict[int, tuple[str, str]] = {
    0: ("<B", "<u1"), 1: ("<b", "<i1"), 2: ("<H", "<u2"), 3: ("<h", "<i2"), 4: ("<I", "<u4"),
    5: ("<i", "<i4"), 6: ("<f", "<f4"), 7: ("<?", "<u1"), 10: ("<Q", "<u8"), 11: ("<q", "<i8"),
    12: ("<d", "<f8"),
}  # fmt: skip
_STRING, _ARRAY, _BOOL = 8, 9, 7


@dataclass(frozen=True)
class RawTensor:
    name: str
    ggml_type: int
    type_name: str
    ne: tuple[int, ...]
    n_bytes: int
    offset: int  # absolute byte offset in the file


@dataclass(frozen=True)
class Header:
    version: int
    metadata: dict[str, Any]
    tensors: list[RawTensor]
    data_offset: int  # where tensor data starts (the header's bytes are [0, data_offset))


class _Cursor:
    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.pos = buf, 0

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise GGUFError("truncated")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.take("<Q")
        end = self.pos + n
        if end > len(self.buf):
            raise GGUFError("truncated")
        text = bytes(self.buf[self.pos : end]).decode("utf-8", errors="replace")
        self.pos = end
        return text

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            return self.array()
        fmt = _SCALARS.get(vtype)
        if fmt is None:
            raise GGUFError(f"unknown metadata value type {vtype}")
        return self.take(fmt[0])

    def array(self) -> list[Any]:
        etype, count = self.take("<I"), self.take("<Q")
        if etype == _STRING:
            return [self.string() for _ in range(count)]
        if etype == _ARRAY:
            return [self.array() for _ in range(count)]
        fmt = _SCALARS.get(etype)
        if fmt is None:
            raise GGUFError(f"unknown metadata array type {etype}")
        dtype = np.dtype(fmt[1])
        end = self.pos + count * dtype.itemsize
        if end > len(self.buf):
            raise GGUFError("truncated")
        values = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos)
        self.pos = end
        out: list[Any] = values.astype(bool).tolist() if etype == _BOOL else values.tolist()
        return out


def _tensor_bytes(ggml_type: int, ne: tuple[int, ...]) -> tuple[str, int]:
    try:
        qtype = GGMLQuantizationType(ggml_type)
        block, size = GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError) as exc:
        raise GGUFError(f"unknown tensor type {ggml_type}") from exc
    count = int(np.prod(ne, dtype=np.int64)) if ne else 1
    if ne and ne[0] % block:
        raise GGUFError(f"tensor row of {ne[0]} values is not a whole number of {qtype.name} blocks")
    return qtype.name, count // block * size


def read_header(path: Path) -> Header:
    """Parse the header of the GGUF at `path`; any inconsistency is a `GGUFError`."""
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        c = _Cursor(buf)
        if c.take("4s") != MAGIC:
            raise GGUFError("not a GGUF file")
        version = c.take("<I")
        if version not in (2, 3):
            raise GGUFError(f"GGUF version {version} is not supported (2 or 3)")
        n_tensors, n_kv = c.take("<Q"), c.take("<Q")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = c.string()
            metadata[key] = c.value(c.take("<I"))
        infos = []
        for _ in range(n_tensors):
            name = c.string()
            n_dims = c.take("<I")
            if n_dims > 8:
                raise GGUFError(f"tensor {name} has {n_dims} dimensions")
            ne = tuple(int(c.take("<Q")) for _ in range(n_dims))
            infos.append((name, ne, c.take("<I"), c.take("<Q")))
        align = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        data_offset = (c.pos + align - 1) // align * align
    tensors = []
    for name, ne, ggml_type, rel in infos:
        type_name, n_bytes = _tensor_bytes(ggml_type, ne)
        tensors.append(RawTensor(name, ggml_type, type_name, ne, n_bytes, data_offset + rel))
    return Header(version, metadata, tensors, data_offset)
