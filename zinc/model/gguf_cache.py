"""zinc's cache folder, and the parsed GGUF headers kept in it so that a start reads a large
vocabulary back in one `marshal.loads` instead of parsing it string by string.

Owns: `cache_root()` ($ZINC_CACHE, default ~/.cache/zinc: compiled artifacts, real-shape models,
these headers) and `header_and_identity(path, size)`. Llama 3's header (128k tokens, 280k merges)
parses in 0.3 s on a 2-core host and loads from its entry in 0.06 s; a header under
`MIN_CACHED_BYTES` (1 MiB: up to some tens of thousands of tokens, a few tens of ms to parse) is
parsed every time.
An entry is `headers/<key>.marshal`, found by the file's size and first MiB, holding the parsed
header and the sha256 of the file's size and header bytes (the GGUF identity). It is used only
when the file's header bytes hash to that identity, so an edited or replaced file is parsed again,
never served a stale header. Writes go to a temporary file renamed into place; a read-only or full
cache only costs the parse. The newest `MAX_ENTRIES` entries are kept.
Imports: zinc.model.gguf_header.
"""

from __future__ import annotations

import dataclasses
import hashlib
import marshal
import os
import tempfile
from pathlib import Path
from typing import BinaryIO

from zinc.model.gguf_header import Header, RawTensor, read_header

FORMAT = "zinc-gguf-header-1"
KEY_BYTES = 1 << 20  # the file's first MiB picks the entry; the identity check decides
MIN_CACHED_BYTES = 1 << 20
MAX_ENTRIES = 32  # a few MiB each (Llama 3: 6 MiB)


def cache_root() -> Path:
    return Path(os.environ.get("ZINC_CACHE") or Path.home() / ".cache" / "zinc")


def header_and_identity(path: Path, size: int) -> tuple[Header, str]:
    """The header of the GGUF at `path` (`size` bytes) and its identity: from the cache when an
    entry's identity matches the file's header bytes, else parsed (and stored when it is large)."""
    with path.open("rb") as f:
        head = f.read(KEY_BYTES)
        entry = _entry(hashlib.sha256(b"%d:" % size + head).hexdigest()[:40])
        cached = _load(entry)
        if cached is not None and _identity(size, head, f, cached[0].data_offset) == cached[1]:
            return cached
        header = read_header(path)
        identity = _identity(size, head, f, header.data_offset)
    if header.data_offset >= MIN_CACHED_BYTES:
        _store(entry, header, identity)
    return header, identity


def _identity(size: int, head: bytes, f: BinaryIO, data_offset: int) -> str:
    """The sha256 of the file's size and its first `data_offset` bytes: `head` (the file's first
    bytes, already read) and what follows it from `f`."""
    digest = hashlib.sha256(str(size).encode())
    digest.update(head[:data_offset])
    if data_offset > len(head):
        f.seek(len(head))
        digest.update(f.read(data_offset - len(head)))
    return digest.hexdigest()


def _entry(key: str) -> Path:
    return cache_root() / "headers" / f"{key}.marshal"


def _load(entry: Path) -> tuple[Header, str] | None:
    """The entry's header and identity; None when it is absent, unreadable or not one of ours."""
    try:
        fmt, identity, version, metadata, tensors, data_offset = marshal.loads(entry.read_bytes())
        if fmt != FORMAT:
            return None
        raw = [RawTensor(name, ggml_type, type_name, tuple(ne), n_bytes, offset)
               for name, ggml_type, type_name, ne, n_bytes, offset in tensors]  # fmt: skip
        return Header(version, metadata, raw, data_offset), identity
    except (OSError, EOFError, ValueError, TypeError):
        return None


def _store(entry: Path, header: Header, identity: str) -> None:
    """Write `entry` atomically; a cache that cannot take it is left as it is."""
    tensors = [dataclasses.astuple(t) for t in header.tensors]
    try:
        data = marshal.dumps((FORMAT, identity, header.version, header.metadata, tensors, header.data_offset))
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=entry.parent, prefix=".", suffix=".tmp")
        try:
            os.fchmod(fd, 0o644)  # readable by whoever shares the cache, as the artifacts are (mkstemp: 0600)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(tmp, entry)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _prune(entry.parent)
    except (OSError, ValueError):
        pass


def _prune(folder: Path) -> None:
    """Delete all but the `MAX_ENTRIES` newest entries."""
    entries = sorted(folder.glob("*.marshal"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for old in entries[MAX_ENTRIES:]:
        old.unlink(missing_ok=True)
