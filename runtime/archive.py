"""Parameter archives (`.irpa`): the repacked weights a CPU artifact carries beside its vmfb.

Owns: `write_parameter_archive` (named arrays -> one `.irpa`, written through IREE's own writer
so the runtime's `ParameterIndex` reads it back by mmap) and `read_tensor_bytes` (one GGUF
tensor's raw bytes, mapped, never copied whole into memory).
Imports: iree.runtime, numpy, zinc.model.gguf_file (TensorInfo).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import iree.runtime as rt
import numpy as np

from zinc.model.gguf_file import TensorInfo


def write_parameter_archive(path: Path, entries: Mapping[str, np.ndarray[Any, Any]]) -> None:
    rt.save_archive_file({name: np.ascontiguousarray(a) for name, a in entries.items()}, path)


def read_tensor_bytes(gguf_path: Path, info: TensorInfo) -> np.ndarray[Any, np.dtype[np.uint8]]:
    return np.memmap(gguf_path, dtype=np.uint8, mode="r", offset=info.offset, shape=(info.n_bytes,))
