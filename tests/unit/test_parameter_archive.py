"""zinc's parameter archive writer (runtime/archive.py) read back by IREE's own parser.

Entries arrive in interleaved chunks, as the compile's repacking yields them; IREE's
`ParameterIndex` must find every entry, with its size, at an aligned offset holding its bytes, in
a file whose size is a whole number of pages. A chunk that overruns its entry, or an entry left
short, is an error, not a corrupt archive.
"""

from __future__ import annotations

from pathlib import Path

import iree.runtime as rt
import numpy as np
import pytest

from zinc.runtime import archive
from zinc.runtime.archive import PAGE, entry_align, write_parameter_archive


def test_interleaved_chunks_read_back_by_iree(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    whole = {
        "blk.0.ffn_up.weight.qs": rng.integers(-128, 127, (4, 100), dtype=np.int8),
        "blk.0.ffn_up.weight.d": rng.standard_normal((4, 7)).astype(np.float32),
        "output.weight.sc": rng.integers(0, 255, (4, 3), dtype=np.uint8),
    }
    chunks = [(name, arr[i], arr.nbytes) for i in range(4) for name, arr in whole.items()]
    path = tmp_path / "weights.irpa"
    write_parameter_archive(path, chunks)
    assert path.stat().st_size % PAGE == 0
    index = rt.ParameterIndex()
    index.load(str(path))
    items = dict(index.items())
    assert sorted(items) == sorted(whole)
    data = path.read_bytes()
    for name, arr in whole.items():
        entry = items[name]
        assert entry.length == arr.nbytes and entry.is_file
        _, offset = entry.file_storage
        assert offset % entry_align(arr.nbytes) == 0
        assert data[offset : offset + arr.nbytes] == arr.tobytes()


def test_an_entry_given_too_many_or_too_few_bytes_is_an_error(tmp_path: Path) -> None:
    a = np.zeros(8, np.uint8)
    with pytest.raises(ValueError, match="more than its 8 bytes"):
        write_parameter_archive(tmp_path / "over.irpa", [("w", a, 8), ("w", a, 8)])
    with pytest.raises(ValueError, match="fewer bytes than their size: w"):
        write_parameter_archive(tmp_path / "short.irpa", [("w", a, 16)])


def test_whole_page_chunks_are_written_direct_and_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of whole pages go through the O_DIRECT writer (where the file system has it), the
    others through the page cache; IREE reads both back, each at its place."""
    taken: list[int] = []
    write = archive.DirectWriter.write

    def counted(self: archive.DirectWriter, data: memoryview, offset: int) -> bool:
        done = write(self, data, offset)
        taken.extend([data.nbytes] if done else [])
        return done

    monkeypatch.setattr(archive.DirectWriter, "write", counted)
    rng = np.random.default_rng(5)
    pages = rng.integers(0, 255, (3, 2 * PAGE), dtype=np.uint8)  # three chunks of two pages
    odd = rng.integers(0, 255, (3, 1000), dtype=np.uint8)
    big = rng.integers(0, 255, archive.DIRECT_BUFFER + PAGE, dtype=np.uint8)  # more than one staging buffer
    chunks = [("pages", pages[i], pages.nbytes) for i in range(3)] + [("odd", odd[i], odd.nbytes) for i in range(3)]
    path = tmp_path / "weights.irpa"
    write_parameter_archive(path, [*chunks, ("big", big, big.nbytes)])
    probe = archive.DirectWriter.open(path)
    if probe is not None:  # tmpfs has no O_DIRECT: there every chunk goes through the page cache
        probe.close()
        assert taken == [2 * PAGE] * 3 + [big.nbytes]
    index = rt.ParameterIndex()
    index.load(str(path))
    data = path.read_bytes()
    for name, arr in (("pages", pages), ("odd", odd), ("big", big)):
        _, offset = dict(index.items())[name].file_storage
        assert data[offset : offset + arr.nbytes] == arr.tobytes()
