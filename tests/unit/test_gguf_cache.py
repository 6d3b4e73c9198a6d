"""Parsed GGUF headers kept in the cache (zinc.model.gguf_cache): a large header is read back from
its entry, exactly as parsed; an edited file, a damaged entry and a cache that takes no writes all
fall back to the parse, never to a stale or broken header."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import pytest

from zinc.model import gguf_cache
from zinc.model.gguf_cache import KEY_BYTES, MIN_CACHED_BYTES, header_and_identity
from zinc.model.gguf_file import open_gguf
from zinc.model.gguf_header import Header, read_header


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ZINC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "headers"


@pytest.fixture
def big_header(smollm2: Path, tmp_path: Path) -> Path:
    """SmolLM2's header alone (1.8 MB: its 49k tokens and merges); a header-only file parses."""
    data_offset = read_header(smollm2).data_offset
    assert data_offset > max(MIN_CACHED_BYTES, KEY_BYTES)
    out = tmp_path / "header.gguf"
    with smollm2.open("rb") as f:
        out.write_bytes(f.read(data_offset))
    return out


def _parse_counted(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    calls: list[Path] = []

    def counted(path: Path) -> Header:
        calls.append(path)
        return read_header(path)

    monkeypatch.setattr(gguf_cache, "read_header", counted)
    return calls


def _identity(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha256(str(len(data)).encode() + data[: read_header(path).data_offset]).hexdigest()


def test_a_large_header_is_read_back_from_its_entry(
    big_header: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parses = _parse_counted(monkeypatch)
    size = big_header.stat().st_size
    first = header_and_identity(big_header, size)
    (entry,) = cache.glob("*.marshal")
    assert len(parses) == 1 and entry.stat().st_mode & 0o777 == 0o644  # readable where the cache is shared
    second = header_and_identity(big_header, size)
    assert len(parses) == 1  # no second parse
    assert second == first and second[0] == read_header(big_header)
    assert second[1] == _identity(big_header)
    assert isinstance(second[0].tensors, list) and isinstance(second[0].metadata["tokenizer.ggml.tokens"], list)


def test_open_gguf_identity_is_the_same_from_the_cache(
    smollm2: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The identity (which keys compiled artifacts) and the model view are what a parse gives."""
    parsed = open_gguf(smollm2)  # the per-process copy, however it was read
    size = smollm2.stat().st_size
    header, identity = header_and_identity(smollm2, size)  # parsed here, stored
    parses = _parse_counted(monkeypatch)
    assert header_and_identity(smollm2, size) == (header, identity) and not parses
    assert identity == parsed.identity
    assert [(t.name, t.ne, t.offset) for t in header.tensors] == [
        (t.name, t.ne, t.offset) for t in parsed.tensors.values()
    ]


def test_an_edited_file_is_parsed_again(big_header: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A byte changed past the first MiB keeps the entry's key and fails its identity check."""
    size = big_header.stat().st_size
    before = header_and_identity(big_header, size)
    data = bytearray(big_header.read_bytes())
    last = before[0].metadata["tokenizer.ggml.merges"][-1].encode()
    at = data.rindex(struct.pack("<Q", len(last)) + last) + 8  # the last merge's text
    assert at > KEY_BYTES
    data[at] = ord("Z") if data[at] != ord("Z") else ord("Y")
    big_header.write_bytes(bytes(data))
    parses = _parse_counted(monkeypatch)
    after = header_and_identity(big_header, size)
    assert len(parses) == 1
    assert after[1] != before[1] and after[1] == _identity(big_header)
    assert after[0].metadata != before[0].metadata and after[0] == read_header(big_header)
    assert header_and_identity(big_header, size) == after and len(parses) == 1  # the entry now holds the edit


def test_a_damaged_entry_is_parsed_and_rewritten(
    big_header: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    size = big_header.stat().st_size
    good = header_and_identity(big_header, size)
    (entry,) = cache.glob("*.marshal")
    for damage in (b"", b"\x00not marshal", entry.read_bytes()[:1000]):
        entry.write_bytes(damage)
        parses = _parse_counted(monkeypatch)
        assert header_and_identity(big_header, size) == good and len(parses) == 1
        assert header_and_identity(big_header, size) == good and len(parses) == 1  # rewritten whole


def test_small_headers_and_caches_that_take_no_writes_only_parse(
    big_header: Path, tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("ZINC_CACHE", str(blocked / "cache"))  # mkdir fails, even as root
    size = big_header.stat().st_size
    assert header_and_identity(big_header, size)[0] == read_header(big_header)
    monkeypatch.setenv("ZINC_CACHE", str(tmp_path / "cache"))
    for path in tiny_models.values():
        assert header_and_identity(path, path.stat().st_size)[0] == read_header(path)
    assert not (tmp_path / "cache").exists()


def test_only_the_newest_entries_are_kept(big_header: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gguf_cache, "MAX_ENTRIES", 2)
    data = big_header.read_bytes()
    at = data.index(b"<|im_start|>")  # a token inside the first MiB: each copy has its own key
    copies = []
    for i, tag in enumerate((b"<|im_stArt|>", b"<|im_stBrt|>", b"<|im_stCrt|>")):
        copy = big_header.with_name(f"copy{i}.gguf")
        copy.write_bytes(data[:at] + tag + data[at + len(tag) :])
        header_and_identity(copy, copy.stat().st_size)
        copies.append(copy)
    assert len(list(cache.glob("*.marshal"))) == 2
    parses = _parse_counted(monkeypatch)
    for copy in copies[1:]:
        header_and_identity(copy, copy.stat().st_size)
    assert not parses
    header_and_identity(copies[0], copies[0].stat().st_size)
    assert len(parses) == 1
