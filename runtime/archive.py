"""Parameter archives (`.irpa`): the repacked weights a CPU artifact carries beside its vmfb.

Owns: `write_parameter_archive` (named arrays -> one `.irpa` in IREE's parameter archive format,
version 0 as iree/schemas/parameter_archive.h defines it, which the runtime's `ParameterIndex`
reads back by mmap; the arrays come in chunks, one at a time, each written once at its place in
the file, so writing an 8B model's archive holds one chunk in memory and writes its 4 GB once;
into a temporary name beside it, fsynced and renamed into place, so `path` is never a partial
archive, whatever stops the write)
`read_tensor_bytes` (one GGUF tensor's raw bytes, mapped, never copied whole into memory) and
`advise_willneed` (the next tensors read ahead from disk while one is repacked).
Imports: numpy, zinc.model.gguf_file (TensorInfo), zinc.artifact (pause_point, a test hook).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from zinc.artifact import pause_point
from zinc.model.gguf_file import TensorInfo

# The archive's layout (all little-endian, packed): the header at offset 0; the entries' data from
# DATA_START on, each at a multiple of its alignment (`entry_align`); then the entry table and the names.
MAGIC = 0x41505249  # "IRPA"
HEADER = struct.Struct("<IHHQQQ" "Q" "QQ" "QQ" "QQ")  # prefix; entry count; entry, name, data segments
ENTRY = struct.Struct("<QIQ" "QQ" "QQ" "Q" "QQ")  # size, type, flags; name; metadata; alignment; data
ENTRY_DATA = 2  # an entry whose bytes are in the archive's data segment
ENTRY_ALIGN = 16
PAGE = 4096  # the data segment starts, and the file ends, at a page boundary: the runtime maps it
DATA_ALIGN = 64  # an entry's alignment, or PAGE for one of at least PAGE_ENTRY bytes (`entry_align`)
PAGE_ENTRY = 16 * PAGE
DATA_START = PAGE
DIRECT_BUFFER = 8 << 20  # DirectWriter's staging buffer


def write_parameter_archive(path: Path, chunks: Iterable[tuple[str, np.ndarray[Any, Any], int]]) -> None:
    """Write the archive at `path` from `chunks` (name, array, the entry's size in bytes), taken one
    at a time: the arrays of one name, in order, are that entry's bytes, and its first chunk
    reserves its whole size, so entries may be written interleaved."""
    entries: dict[str, list[int]] = {}  # name -> [offset in the data segment, size, bytes written]
    end = 0  # the data segment's length so far
    partial = path.with_name(f".{path.name}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    direct = DirectWriter.open(partial)
    try:
        for name, arr, size in chunks:
            entry = entries.get(name)
            if entry is None:
                entry = entries[name] = [_align(end, entry_align(size)), size, 0]
                end = entry[0] + size
            data = memoryview(np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data)
            if entry[2] + data.nbytes > entry[1]:
                raise ValueError(f"parameter {name}: more than its {entry[1]} bytes")
            if direct is None or not direct.write(data, DATA_START + entry[0] + entry[2]):
                _write_at(fd, data, DATA_START + entry[0] + entry[2])
            entry[2] += data.nbytes
            pause_point("archive")  # tests/faults: killed with the archive half written
        short = [name for name, (_, size, done) in entries.items() if done != size]
        if short:
            raise ValueError(f"parameters given fewer bytes than their size: {', '.join(short[:3])}")
        names = [key.encode() for key in entries]
        table = bytearray()
        at = 0  # each name's offset in the name segment
        for encoded, (offset, size, _) in zip(names, entries.values(), strict=True):
            table += ENTRY.pack(ENTRY.size, ENTRY_DATA, 0, at, len(encoded), 0, 0, entry_align(size), offset, size)
            table += bytes(_align(len(table), ENTRY_ALIGN) - len(table))
            at += len(encoded)
        table_at = _align(DATA_START + end, ENTRY_ALIGN)
        names_at = table_at + len(table)
        _write_at(fd, memoryview(bytes(table) + b"".join(names)), table_at)
        os.ftruncate(fd, _align(names_at + at, PAGE))
        header = HEADER.pack(MAGIC, 0, 0, HEADER.size, 0, 0, len(entries), table_at, len(table), names_at, at,
                             DATA_START, end)  # fmt: skip
        _write_at(fd, memoryview(header), 0)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        partial.unlink(missing_ok=True)
        raise
    finally:
        if direct is not None:
            direct.close()
    os.close(fd)
    os.replace(partial, path)


class DirectWriter:
    """Writes of whole pages at page offsets that bypass the page cache (O_DIRECT). Buffered, an 8B
    model's 4.4 GB of dirty pages pass the kernel's dirty-page limits, and the writer is held to
    the page cache's writeback speed: 140-250 MB/s on this project's hosts, against 600-1,500 MB/s
    written direct. A chunk that is not whole pages at a page offset goes through the page cache."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = mmap.mmap(-1, DIRECT_BUFFER)  # page-aligned, as O_DIRECT requires of memory

    @classmethod
    def open(cls, path: Path) -> DirectWriter | None:
        """A direct writer on `path`, or None where the file system refuses O_DIRECT (tmpfs)."""
        flag = getattr(os, "O_DIRECT", 0)
        if not flag:
            return None
        try:
            return cls(os.open(path, os.O_WRONLY | flag))
        except OSError:
            return None

    def write(self, data: memoryview, offset: int) -> bool:
        """Write `data` at `offset` if both are whole pages; False leaves it to the caller."""
        if offset % PAGE or data.nbytes % PAGE:
            return False
        view = memoryview(self.buffer)
        try:
            for start in range(0, data.nbytes, DIRECT_BUFFER):
                piece = data[start : start + DIRECT_BUFFER]
                view[: piece.nbytes] = piece
                _write_at(self.fd, view[: piece.nbytes], offset + start)
        finally:
            view.release()
        return True

    def close(self) -> None:
        os.close(self.fd)
        with contextlib.suppress(BufferError):  # a failed write's traceback still holds a view of it
            self.buffer.close()


def entry_align(size: int) -> int:
    """An entry's alignment: whole pages for a large one, so that DirectWriter takes its chunks of
    the usual shapes (whole pages too); 64 bytes for a small one, which pages would mostly pad."""
    return PAGE if size >= PAGE_ENTRY else DATA_ALIGN


def _align(n: int, to: int) -> int:
    return -(-n // to) * to


def _write_at(fd: int, data: memoryview, offset: int) -> None:
    while data.nbytes:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


def advise_willneed(gguf_path: Path, infos: Iterable[TensorInfo]) -> None:
    """Ask the kernel to start reading these tensors' bytes now (a hint; ignored where unsupported)."""
    if not hasattr(os, "posix_fadvise"):
        return
    fd = os.open(gguf_path, os.O_RDONLY)
    try:
        for info in infos:
            os.posix_fadvise(fd, info.offset, info.n_bytes, os.POSIX_FADV_WILLNEED)
    finally:
        os.close(fd)


def read_tensor_bytes(gguf_path: Path, info: TensorInfo) -> np.ndarray[Any, np.dtype[np.uint8]]:
    return np.memmap(gguf_path, dtype=np.uint8, mode="r", offset=info.offset, shape=(info.n_bytes,))
