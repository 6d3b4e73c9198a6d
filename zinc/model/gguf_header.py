"""A fast reader of a GGUF file's header: metadata key/values and the tensor index.

Owns: `read_header(path)`, which parses GGUF v2/v3 headers straight from a memory map (numeric
arrays through numpy, strings with one slice each). gguf's `GGUFReader` builds a numpy view per
field part, which takes about 3 s for SmolLM2's 49k-token vocabulary; this takes ~0.1 s, which
is most of zinc's cold start. Values come out as plain Python (str, int, float, bool, lists of
them), the same values `GGUFReader` gives.

The bytes are untrusted: every count and length is checked against the bytes left before it is
used, and the header as a whole is held to fixed limits (`MAX_HEADER_BYTES`, `MAX_STRING_BYTES`,
`MAX_VALUES`, `MAX_NESTING`), so a hostile or damaged file is one `GGUFError` in time and memory proportional
to those limits, never a hang, a deep recursion or a huge allocation. The checks follow
llama.cpp's loader: a power-of-two alignment, at most 4 dimensions, element counts that fit in
int64, aligned tensor offsets, no duplicate keys or tensor names.
Imports: numpy, zinc.errors.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zinc.errors import GGUFError

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
# Limits on what a header may hold. Real ones are far smaller: Gemma 3's (a 262k-token vocabulary)
# is 6 MB and 0.8M values; Llama 3's is 1.1M values (with 280k merges).
MAX_HEADER_BYTES = 64 << 20  # metadata plus tensor index
MAX_STRING_BYTES = 32 << 20  # one string (a chat template is tens of kB); decoded, up to 4x this in memory
MAX_VALUES = 1 << 22  # array elements, all arrays together
MAX_NESTING = 4  # arrays of arrays
INT64_MAX = (1 << 63) - 1
# ggml's tensor types: id -> (name, values per block, bytes per block), as the GGUF spec and
# gguf-py's GGML_QUANT_SIZES give them (tests/unit/test_gguf_header.py holds them to gguf-py's).
# Kept here so that reading a header does not import gguf-py (numpy, yaml and its writers: about
# a tenth of a second of every start).
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
}
# GGUF value types: id -> (struct format, numpy dtype) for the fixed-size ones
_SCALARS: dict[int, tuple[str, str]] = {
    0: ("<B", "<u1"), 1: ("<b", "<i1"), 2: ("<H", "<u2"), 3: ("<h", "<i2"), 4: ("<I", "<u4"),
    5: ("<i", "<i4"), 6: ("<f", "<f4"), 7: ("<?", "<u1"), 10: ("<Q", "<u8"), 11: ("<q", "<i8"),
    12: ("<d", "<f8"),
}  # fmt: skip
_STRING, _ARRAY, _BOOL = 8, 9, 7
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
_MIN_BYTES = {_STRING: 8, _ARRAY: 12}  # the fewest bytes an element of these types takes


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
    """Reads values at `pos`, never past `end` (the file, or `MAX_HEADER_BYTES` of it)."""

    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.pos = buf, 0
        self.end = min(len(buf), MAX_HEADER_BYTES)
        self.values = 0  # array elements read so far (MAX_VALUES)

    def need(self, n: int, what: str) -> None:
        if self.pos + n > self.end:
            if self.end < len(self.buf):
                raise GGUFError(f"header larger than {MAX_HEADER_BYTES >> 20} MiB ({what})")
            raise GGUFError(f"truncated: {what} needs {n} bytes at offset {self.pos}, past the end of the file")

    def u32(self, what: str) -> int:
        self.need(4, what)
        (value,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return int(value)

    def u64(self, what: str) -> int:
        self.need(8, what)
        (value,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return int(value)

    def take(self, fmt: str, what: str) -> Any:
        size = struct.calcsize(fmt)
        self.need(size, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self, what: str) -> str:
        n = self.u64(f"{what}'s length")
        self.need(n, f"{what} of {n} bytes")
        _check_string(n, what)
        end = self.pos + n
        text = self.buf[self.pos : end].decode("utf-8", errors="replace")
        self.pos = end
        return text

    def count(self, n: int, min_bytes: int, what: str) -> None:
        """Check a claimed element count before anything is allocated for it."""
        self.need(n * min_bytes, f"{what} of {n} elements")
        self.values += n
        if self.values > MAX_VALUES:
            raise GGUFError(f"{what}: {n} elements, past the limit of {MAX_VALUES} array values in a header")

    def value(self, vtype: int, what: str, depth: int = 0) -> Any:
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            return self.array(what, depth + 1)
        fmt = _SCALARS.get(vtype)
        if fmt is None:
            raise GGUFError(f"{what} has unknown value type {vtype}")
        return self.take(fmt[0], what)

    def array(self, what: str, depth: int) -> list[Any]:
        if depth > MAX_NESTING:
            raise GGUFError(f"{what}: arrays nested more than {MAX_NESTING} deep")
        etype, count = self.u32(f"{what}'s element type"), self.u64(f"{what}'s length")
        if etype == _STRING:
            self.count(count, 8, what)
            return self._strings(count, what)
        if etype == _ARRAY:
            self.count(count, 12, what)
            return [self.array(what, depth + 1) for _ in range(count)]
        fmt = _SCALARS.get(etype)
        if fmt is None:
            raise GGUFError(f"{what} is an array of unknown value type {etype}")
        dtype = np.dtype(fmt[1])
        self.count(count, dtype.itemsize, what)
        values = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos)
        self.pos += count * dtype.itemsize
        out: list[Any] = values.astype(bool).tolist() if etype == _BOOL else values.tolist()
        return out

    def _strings(self, count: int, what: str) -> list[str]:
        """`count` strings, in a loop kept tight: a vocabulary is most of a header."""
        buf, pos, end, unpack = self.buf, self.pos, self.end, _U64.unpack_from
        out = []
        for _ in range(count):
            if pos + 8 > end:
                self.pos = pos
                self.need(8, f"{what}'s string length")
            (n,) = unpack(buf, pos)
            pos += 8
            if pos + n > end:
                self.pos = pos
                self.need(n, f"{what}'s string of {n} bytes")
            if n > MAX_STRING_BYTES:
                _check_string(n, f"{what}'s string")
            out.append(buf[pos : pos + n].decode("utf-8", errors="replace"))
            pos += n
        self.pos = pos
        return out


def _check_string(n: int, what: str) -> None:
    if n > MAX_STRING_BYTES:
        raise GGUFError(f"{what} of {n} bytes, past the limit of {MAX_STRING_BYTES >> 20} MiB for a string")


def _tensor_bytes(name: str, ggml_type: int, ne: tuple[int, ...]) -> tuple[str, int]:
    known = GGML_TYPES.get(ggml_type)
    if known is None:
        raise GGUFError(f"tensor {name} has unknown type {ggml_type}")
    type_name, block, size = known
    count = 1
    for n in ne:  # Python integers: a product that overflows int64 is caught, not wrapped
        count *= n
        if count > INT64_MAX:
            raise GGUFError(f"tensor {name}: dimensions {list(ne)} have more than 2^63 elements")
    if ne and ne[0] % block:
        raise GGUFError(f"tensor {name}: a row of {ne[0]} values is not a whole number of {type_name} blocks")
    return type_name, count // block * size


def _alignment(metadata: dict[str, Any]) -> int:
    align = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if type(align) is not int or align <= 0 or align & (align - 1):
        raise GGUFError(f"general.alignment must be a power of two, not {align!r}")
    return align


def read_header(path: Path) -> Header:
    """Parse the header of the GGUF at `path`; any inconsistency is a `GGUFError`."""
    with path.open("rb") as f:
        if f.read(4) != MAGIC:
            raise GGUFError("not a GGUF file")
        if f.seek(0, 2) < 24:
            raise GGUFError("truncated: shorter than a GGUF header")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(_Cursor(buf))


def _parse(c: _Cursor) -> Header:
    if c.take("4s", "magic") != MAGIC:
        raise GGUFError("not a GGUF file")
    version = c.u32("version")
    if version not in (2, 3):
        raise GGUFError(f"GGUF version {version} is not supported (2 or 3)")
    n_tensors, n_kv = c.u64("tensor count"), c.u64("key/value count")
    c.need(n_kv * 12, f"{n_kv} key/values")  # a key's length and a value type, at least
    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        key = c.string(f"key {i}")
        if key in metadata:
            raise GGUFError(f"key {key!r} appears twice")
        metadata[key] = c.value(c.u32(f"{key}'s type"), key)
    c.need(n_tensors * 24, f"{n_tensors} tensor entries")  # name length, dims, type, offset
    infos: list[tuple[str, tuple[int, ...], int, int]] = []
    names: set[str] = set()
    for i in range(n_tensors):
        name = c.string(f"tensor {i}'s name")
        if name in names:
            raise GGUFError(f"tensor {name} appears twice")
        names.add(name)
        n_dims = c.u32(f"tensor {name}'s dimension count")
        if n_dims > MAX_DIMS:
            raise GGUFError(f"tensor {name} has {n_dims} dimensions (at most {MAX_DIMS})")
        ne = tuple(c.u64(f"tensor {name}'s dimensions") for _ in range(n_dims))
        infos.append((name, ne, c.u32(f"tensor {name}'s type"), c.u64(f"tensor {name}'s offset")))
    align = _alignment(metadata)
    data_offset = (c.pos + align - 1) // align * align
    tensors = []
    for name, ne, ggml_type, rel in infos:
        type_name, n_bytes = _tensor_bytes(name, ggml_type, ne)
        if rel % align:
            raise GGUFError(f"tensor {name}: offset {rel} is not a multiple of the alignment {align}")
        tensors.append(RawTensor(name, ggml_type, type_name, ne, n_bytes, data_offset + rel))
    return Header(version, metadata, tensors, data_offset)
