"""Parameter archives (`.irpa`): the repacked weights a CPU artifact carries beside its vmfb.

Owns: `write_parameter_archive` (named arrays -> one `.irpa`, written through IREE's own writer
so the runtime's `ParameterIndex` reads it back by mmap; the arrays come in chunks, one at a
time, and go to scratch files first, so writing an 8B model's archive holds a chunk in memory,
not the archive) and `read_tensor_bytes` (one GGUF tensor's raw bytes, mapped, never copied
whole into memory).
Imports: iree.runtime, numpy, zinc.model.gguf_file (TensorInfo).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import iree.runtime as rt
import numpy as np

from zinc.model.gguf_file import TensorInfo


def write_parameter_archive(path: Path, chunks: Iterable[tuple[str, np.ndarray[Any, Any]]]) -> None:
    """Write the archive at `path` from `chunks` (name, array), taken one at a time: the arrays of
    one name, in order, are that entry's bytes. Each entry goes to a scratch file of its own
    beside `path` first, and IREE's writer copies them from there."""
    scratch = path.with_name(path.name + ".scratch")
    scratch.mkdir(exist_ok=True)
    files: dict[str, tuple[Path, int]] = {}  # entry -> (scratch file, bytes)
    try:
        for name, arr in chunks:
            data = np.ascontiguousarray(arr)
            file, size = files.get(name, (scratch / str(len(files)), 0))
            with open(file, "ab") as f:
                data.tofile(f)
            files[name] = (file, size + data.nbytes)
            del data
        index = rt.ParameterIndex()
        fds = [os.open(file, os.O_RDONLY) for file, _ in files.values()]
        try:
            for (name, (_, size)), fd in zip(files.items(), fds, strict=True):
                index.add_from_file_handle(name, rt.FileHandle.wrap_fd(fd), size)
            index.create_archive_file(str(path))
            del index
        finally:
            for fd in fds:
                os.close(fd)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def read_tensor_bytes(gguf_path: Path, info: TensorInfo) -> np.ndarray[Any, np.dtype[np.uint8]]:
    return np.memmap(gguf_path, dtype=np.uint8, mode="r", offset=info.offset, shape=(info.n_bytes,))
