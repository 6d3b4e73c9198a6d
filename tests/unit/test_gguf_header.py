"""zinc's fast GGUF header reader gives exactly what gguf's GGUFReader gives, and fails cleanly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gguf import GGUFReader, GGUFValueType

from zinc.errors import GGUFError
from zinc.model.gguf_header import read_header

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
