"""zinc's fast GGUF header reader gives exactly what gguf's GGUFReader gives, and fails cleanly: on
truncation and on each kind of hostile header (huge counts, lengths past the end, unknown types,
bad dimensions, offsets and alignments), with one `GGUFError` and little memory."""

from __future__ import annotations

import os
import re
import struct
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType

from zinc.errors import GGUFError
from zinc.model.gguf_file import open_gguf
from zinc.model.gguf_header import GGML_TYPES, MAX_HEADER_BYTES, MAX_STRING_BYTES, MAX_VALUES, read_header

READER_ONLY_KEYS = {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}  # GGUFReader's own fields


def reader_value(field: Any) -> Any:
    types = list(field.types)
    if types and types[0] == GGUFValueType.ARRAY:
        if len(types) > 1 and types[1] == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    value = field.contents()
    return value.item() if hasattr(value, "item") else value


def assert_same_as_reader(path: Path) -> None:
    header, reader = read_header(path), GGUFReader(path, "r")
    expected = {k: reader_value(f) for k, f in reader.fields.items() if k not in READER_ONLY_KEYS}
    assert header.metadata == expected
    assert header.data_offset == int(reader.data_offset)
    got = [(t.name, t.ggml_type, t.ne, t.n_bytes, t.offset) for t in header.tensors]
    want = [(t.name, int(t.tensor_type), tuple(int(x) for x in t.shape), int(t.n_bytes), int(t.data_offset))
            for t in reader.tensors]  # fmt: skip
    assert got == want


def test_tiny_fixtures_match_gguf_reader(tiny_models: dict[str, Path]) -> None:
    for path in tiny_models.values():
        assert_same_as_reader(path)


def test_ggml_type_table_is_gguf_py_s() -> None:
    """The header reader's own table of tensor types (it does not import gguf-py) names and sizes
    each type as gguf-py does, and holds every type of gguf-py 0.19 (a newer gguf-py may add some:
    the reader then calls a file with one of those an unknown type, as it would a bad one)."""
    theirs = {t.value: (t.name, *GGML_QUANT_SIZES[t]) for t in GGMLQuantizationType if t in GGML_QUANT_SIZES}
    assert {k: theirs.get(k) for k in GGML_TYPES} == GGML_TYPES
    assert len(GGML_TYPES) == 34 and GGML_TYPES.keys() >= {0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 30}


def test_smollm2_matches_gguf_reader(smollm2: Path) -> None:
    assert_same_as_reader(smollm2)  # 49k-token vocabulary, merges, scores


@pytest.mark.parametrize("keep", [0.01, 0.2, 0.5, 0.9, 0.999])
def test_truncated_header_is_a_gguf_error(tmp_path: Path, tiny_models: dict[str, Path], keep: float) -> None:
    path = next(iter(tiny_models.values()))
    data = path.read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[: max(5, int(read_header(path).data_offset * keep) - 32)])
    with pytest.raises(GGUFError):
        read_header(bad)


# ---- hostile headers, built byte by byte: each is one GGUFError, quickly and in little memory

U32, U64 = struct.Struct("<I"), struct.Struct("<Q")
STRING, ARRAY, U8, F32_TYPE = 8, 9, 0, 0  # GGUF value types; GGML type 0 is F32


def gguf_string(text: str | bytes, length: int | None = None) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return U64.pack(len(raw) if length is None else length) + raw


def kv_u32(key: str, value: int) -> bytes:
    return gguf_string(key) + U32.pack(4) + U32.pack(value)


def tensor_info(name: str, dims: tuple[int, ...], ggml_type: int = F32_TYPE, offset: int = 0) -> bytes:
    return gguf_string(name) + U32.pack(len(dims)) + b"".join(U64.pack(d) for d in dims) + U32.pack(ggml_type) + U64.pack(offset)


def gguf_bytes(kvs: list[bytes], tensors: list[bytes], n_kv: int | None = None, n_tensors: int | None = None,
               version: int = 3, tail: bytes = bytes(256)) -> bytes:  # fmt: skip
    head = b"GGUF" + U32.pack(version)
    head += U64.pack(len(tensors) if n_tensors is None else n_tensors)
    head += U64.pack(len(kvs) if n_kv is None else n_kv)
    return head + b"".join(kvs) + b"".join(tensors) + tail


GOOD_KVS = [gguf_string("general.architecture") + U32.pack(STRING) + gguf_string("llama"), kv_u32("llama.block_count", 1)]
GOOD_TENSOR = tensor_info("token_embd.weight", (4, 2))


def nested_arrays(depth: int) -> bytes:
    value = U32.pack(U8) + U64.pack(0)
    for _ in range(depth):
        value = U32.pack(ARRAY) + U64.pack(1) + value
    return gguf_string("deep") + U32.pack(ARRAY) + value


HOSTILE: dict[str, tuple[bytes, str]] = {
    "bad magic": (b"GGUX" + bytes(60), "not a GGUF file"),
    "too short": (b"GGUF" + U32.pack(3), "shorter than a GGUF header"),
    "version 1": (gguf_bytes(GOOD_KVS, [GOOD_TENSOR], version=1), "version 1 is not supported"),
    "version 2^32-1": (gguf_bytes(GOOD_KVS, [GOOD_TENSOR], version=2**32 - 1), "is not supported"),
    "huge key/value count": (gguf_bytes(GOOD_KVS, [GOOD_TENSOR], n_kv=2**63), "key/values"),
    "huge tensor count": (gguf_bytes(GOOD_KVS, [GOOD_TENSOR], n_tensors=2**64 - 1), "tensor entries"),
    "key length past the end": (gguf_bytes([gguf_string("k", 2**62)], []), r"key 0 of \d+ bytes"),
    "string value past the end": (
        gguf_bytes([gguf_string("k") + U32.pack(STRING) + gguf_string("v", 1 << 40)], []), "k of 1099511627776 bytes"
    ),
    "numeric array past the end": (
        gguf_bytes([gguf_string("a") + U32.pack(ARRAY) + U32.pack(12) + U64.pack(2**60)], []), "a of 1152921504606846976 elements"
    ),
    "string array past the end": (
        gguf_bytes([gguf_string("a") + U32.pack(ARRAY) + U32.pack(STRING) + U64.pack(2**40)], []), "a of 1099511627776 elements"
    ),
    "string in an array past the end": (
        gguf_bytes([gguf_string("a") + U32.pack(ARRAY) + U32.pack(STRING) + U64.pack(2) + gguf_string("x", 2**33)], []),
        "a's string of 8589934592 bytes",
    ),
    "array of arrays past the end": (
        gguf_bytes([gguf_string("a") + U32.pack(ARRAY) + U32.pack(ARRAY) + U64.pack(2**50)], []), "elements"
    ),
    "arrays nested 10,000 deep": (gguf_bytes([nested_arrays(10_000)], []), "nested more than 4 deep"),
    "unknown value type": (gguf_bytes([gguf_string("k") + U32.pack(13) + U32.pack(0)], []), "unknown value type 13"),
    "unknown value type 2^32-1": (gguf_bytes([gguf_string("k") + U32.pack(2**32 - 1)], []), "unknown value type"),
    "unknown array type": (
        gguf_bytes([gguf_string("a") + U32.pack(ARRAY) + U32.pack(99) + U64.pack(1)], []), "array of unknown value type 99"
    ),
    "duplicate key": (gguf_bytes([kv_u32("k", 1), kv_u32("k", 2)], []), "'k' appears twice"),
    "duplicate tensor": (gguf_bytes(GOOD_KVS, [GOOD_TENSOR, GOOD_TENSOR]), "token_embd.weight appears twice"),
    "five dimensions": (gguf_bytes(GOOD_KVS, [tensor_info("t", (1, 1, 1, 1, 1))]), "5 dimensions"),
    "2^32-1 dimensions": (gguf_bytes(GOOD_KVS, [gguf_string("t") + U32.pack(2**32 - 1)]), "dimensions"),
    "dimensions whose product overflows": (
        gguf_bytes(GOOD_KVS, [tensor_info("t", (2**32, 2**32, 2**32))]), r"more than 2\^63 elements"
    ),
    "a dimension of 2^64-1": (gguf_bytes(GOOD_KVS, [tensor_info("t", (2**64 - 1,))]), r"more than 2\^63 elements"),
    "unknown tensor type": (gguf_bytes(GOOD_KVS, [tensor_info("t", (4,), ggml_type=200)]), "unknown type 200"),
    "partial quant block": (gguf_bytes(GOOD_KVS, [tensor_info("t", (33,), ggml_type=8)]), "whole number of Q8_0 blocks"),
    "unaligned tensor offset": (gguf_bytes(GOOD_KVS, [tensor_info("t", (4,), offset=7)]), "not a multiple of the alignment 32"),
    "alignment 0": (gguf_bytes([kv_u32("general.alignment", 0)], [GOOD_TENSOR]), "power of two, not 0"),
    "alignment 48": (gguf_bytes([kv_u32("general.alignment", 48)], [GOOD_TENSOR]), "power of two, not 48"),
    "alignment as a string": (
        gguf_bytes([gguf_string("general.alignment") + U32.pack(STRING) + gguf_string("32")], [GOOD_TENSOR]),
        "power of two, not '32'",
    ),
    "truncated tensor entry": (gguf_bytes(GOOD_KVS, [GOOD_TENSOR[:-3]], tail=b""), "offset needs 8 bytes"),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_header_is_one_gguf_error_in_little_memory(tmp_path: Path, case: str) -> None:
    data, message = HOSTILE[case]
    path = tmp_path / "hostile.gguf"
    path.write_bytes(data)
    tracemalloc.start()
    try:
        with pytest.raises(GGUFError, match=message):
            read_header(path)
        with pytest.raises(GGUFError, match=rf"^{re.escape(str(path))}: "):  # the same, naming the file
            open_gguf(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"{case}: {peak} bytes allocated"


def test_the_hand_built_header_is_valid(tmp_path: Path) -> None:
    """The hostile cases above are one defect each away from a header that parses."""
    path = tmp_path / "good.gguf"
    path.write_bytes(gguf_bytes(GOOD_KVS, [GOOD_TENSOR]))
    header = read_header(path)
    assert header.metadata == {"general.architecture": "llama", "llama.block_count": 1}
    assert [(t.name, t.ne, t.n_bytes, t.offset) for t in header.tensors] == [("token_embd.weight", (4, 2), 32, 160)]


def test_tensor_data_past_the_end_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "short.gguf"
    path.write_bytes(gguf_bytes(GOOD_KVS, [tensor_info("t", (1 << 20,), offset=1 << 30)], tail=bytes(64)))
    assert read_header(path).tensors[0].offset == (1 << 30) + 160  # the header itself is sound
    with pytest.raises(GGUFError, match=r"truncated GGUF: tensor data ends at byte 1077936288 but the file has 199"):
        open_gguf(path)


def test_the_value_limit_holds_over_all_arrays(tmp_path: Path) -> None:
    """Arrays that each fit in the file but together hold more than MAX_VALUES elements."""
    half = MAX_VALUES // 2 + 1
    kvs = [gguf_string(f"a{i}") + U32.pack(ARRAY) + U32.pack(U8) + U64.pack(half) + bytes(half) for i in range(2)]
    path = tmp_path / "many.gguf"
    path.write_bytes(gguf_bytes(kvs, []))
    with pytest.raises(GGUFError, match=rf"a1: {half} elements, past the limit of {MAX_VALUES}"):
        read_header(path)


def test_a_header_past_the_size_limit(tmp_path: Path) -> None:
    """Two strings that the file holds (a sparse file), each within the string limit, that make
    the header larger than its limit."""
    kvs = [gguf_string(f"k{i}") + U32.pack(STRING) + gguf_string(b"", MAX_STRING_BYTES) for i in range(2)]
    path = tmp_path / "big.gguf"
    path.write_bytes(gguf_bytes(kvs[:1], [], n_kv=2, tail=b""))
    os.truncate(path, MAX_HEADER_BYTES + (1 << 20))
    with path.open("r+b") as f:  # the second key/value, where the first one's string ends
        f.seek(24 + len(kvs[0]) + MAX_STRING_BYTES)
        f.write(kvs[1])
    with pytest.raises(GGUFError, match=r"header larger than 64 MiB \(k1 of 33554432 bytes\)"):
        read_header(path)


def test_a_string_past_the_size_limit(tmp_path: Path) -> None:
    n = MAX_STRING_BYTES + 1
    path = tmp_path / "long.gguf"
    path.write_bytes(gguf_bytes([gguf_string("k") + U32.pack(STRING) + gguf_string("v", n)], []))
    os.truncate(path, 2 * n)
    with pytest.raises(GGUFError, match=r"k of 33554433 bytes, past the limit of 32 MiB for a string"):
        read_header(path)
    path.write_bytes(gguf_bytes([gguf_string("a") + U32.pack(ARRAY) + U32.pack(STRING) + U64.pack(1) + gguf_string("v", n)], []))
    os.truncate(path, 2 * n)
    with pytest.raises(GGUFError, match=r"a's string of 33554433 bytes, past the limit"):
        read_header(path)
