"""`zinc model pull` killed with SIGKILL mid-download, its part damaged, or out of disk space: the next
pull resumes (HTTP Range) or starts over, a file that fails its checksum is never installed, and
the model is installed only complete. Each pull is `python -m zinc model pull` in a subprocess,
against tests/file_server.py."""

from __future__ import annotations

import hashlib
import json
import os
import random
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.file_server import FileServer
from zinc.catalog.entries import CatalogEntry
from zinc.catalog.store import write_atomic

pytestmark = pytest.mark.e2e
BLOB = random.Random(38).randbytes(2 << 20)
GUARD_S = 120  # a pull that neither grows its part nor ends by then is stuck: the test fails


@pytest.fixture
def server() -> Iterator[FileServer]:
    files = FileServer({"blob.gguf": BLOB})
    yield files
    files.close()


def make_home(home: Path, files: FileServer) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    entry = CatalogEntry(
        id="blob", display_name="Blob", source=files.url("blob.gguf"), sha256=hashlib.sha256(BLOB).hexdigest(),
        size_bytes=len(BLOB), architecture="llama", quantization="Q8_0",
    )  # fmt: skip
    (home / "catalog.json").write_text(json.dumps({"models": [entry.to_json()]}))
    return home


def pull(home: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "zinc", "model", "pull", "blob"], cwd=ROOT, env={**os.environ, "ZINC_HOME": str(home)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    _, err = proc.communicate(timeout=GUARD_S)
    return proc.returncode, err


def kill_midway(home: Path, files: FileServer) -> int:
    """Pull slowly, SIGKILL the pull once its part holds 512 KiB; the part's size."""
    files.chunk, files.chunk_delay = 16 << 10, 0.02
    part = home / "models" / "blob" / "blob.gguf.part"
    proc = pull(home)
    deadline = time.monotonic() + GUARD_S
    while not (part.exists() and part.stat().st_size >= 512 << 10):
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "the pull never got 512 KiB"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    files.chunk_delay = 0.0
    size = part.stat().st_size
    assert 0 < size < len(BLOB) and part.read_bytes() == BLOB[:size]
    assert not (home / "models" / "blob" / "blob.gguf").exists()
    return size


def test_killed_pull_resumes_with_a_range_request(tmp_path: Path, server: FileServer) -> None:
    home = make_home(tmp_path / "home", server)
    size = kill_midway(home, server)
    code, err = finish(pull(home))
    assert code == 0, err
    assert (home / "models" / "blob" / "blob.gguf").read_bytes() == BLOB
    assert server.requests[-1] == ("blob.gguf", f"bytes={size}-")
    assert not (home / "models" / "blob" / "blob.gguf.part").exists()


def test_damaged_part_fails_its_checksum_and_is_never_installed(tmp_path: Path, server: FileServer) -> None:
    home = make_home(tmp_path / "home", server)
    size = kill_midway(home, server)
    part = home / "models" / "blob" / "blob.gguf.part"
    with part.open("r+b") as f:  # one flipped byte in what was already downloaded
        f.seek(size // 2)
        byte = f.read(1)
        f.seek(size // 2)
        f.write(bytes([byte[0] ^ 0x40]))
    code, err = finish(pull(home))
    assert code == 1 and "sha256 mismatch" in err and "Traceback" not in err, err
    assert not (home / "models" / "blob").exists()  # neither the model nor the part
    code, err = finish(pull(home))  # starts over
    assert code == 0, err
    assert (home / "models" / "blob" / "blob.gguf").read_bytes() == BLOB


def test_pull_into_a_full_disk_fails_cleanly_then_resumes(tmp_path: Path, server: FileServer) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        home = make_home(disk, server)
        code, err = finish(pull(home))
        assert code == 1 and "No space left on device" in err and "Traceback" not in err, err
        assert err.count("error:") == 1
        part = home / "models" / "blob" / "blob.gguf.part"
        kept = part.stat().st_size
        assert 0 < kept < len(BLOB) and not (home / "models" / "blob" / "blob.gguf").exists()
        subprocess.run(["mount", "-o", "remount,size=8m", "tmpfs", str(disk)], check=True)
        code, err = finish(pull(home))
        assert code == 0, err
        assert (home / "models" / "blob" / "blob.gguf").read_bytes() == BLOB
        assert server.requests[-1] == ("blob.gguf", f"bytes={kept}-")
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_store_file_that_cannot_be_written_leaves_nothing(tmp_path: Path) -> None:
    """write_atomic (model manifests, config.json) under RLIMIT_FSIZE: the error, and no temporary file."""
    (tmp_path / "config.json").write_text("{}")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, hard))
    try:
        with pytest.raises(OSError, match="File too large"):
            write_atomic(tmp_path / "config.json", bytes(4096))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]
    assert (tmp_path / "config.json").read_text() == "{}"
