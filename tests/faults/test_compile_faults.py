"""`zinc compile` killed with SIGKILL at chosen points, or out of disk space: nothing half-written is
ever taken for an artifact, and the next run rebuilds it and removes what the killed one left.

Each run is `python -m zinc compile` on a tiny fixture in a subprocess. The kill points are
zinc.artifact.pause_point's (`ZINC_PAUSE_AT`: the process stops itself there, and the test kills
it while stopped): `emit` (the MLIR being generated), `archive` (weights.irpa half written),
`manifest` (every other file written, the manifest not yet), `rename` (all written and fsynced,
the folder not yet renamed into place), `swap` (a broken entry renamed aside,
the new one not yet in place); and while iree-compile runs (the test finds that child process).
The disk fills on a small tmpfs (root only) or under RLIMIT_FSIZE.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT
from zinc.artifact import MANIFEST, load_manifest
from zinc.errors import ArtifactError
from zinc.model.gguf_file import open_gguf

pytestmark = pytest.mark.e2e
GUARD_S = 600  # a run that neither stops nor ends by then is stuck: the test fails, it does not hang


def compile_run(
    model: Path, cache: Path, pause: str = "", preexec: Callable[[], None] | None = None, output: Path | None = None
) -> subprocess.Popen[str]:
    """`zinc compile` into the cache `cache`, or into `output` (-o)."""
    env = {**os.environ, "ZINC_CACHE": str(cache), "ZINC_PAUSE_AT": pause}
    to = ["-o", str(output)] if output is not None else []
    return subprocess.Popen(
        [sys.executable, "-m", "zinc", "compile", str(model), "--batch", "1", *to],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=preexec,
    )  # fmt: skip


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=GUARD_S)
    return proc.returncode, out, err


def state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]  # after "pid (comm) "


def wait_for(proc: subprocess.Popen[str], ready: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + GUARD_S
    while not ready():
        if proc.poll() is not None:
            _, err = proc.communicate()
            pytest.fail(f"zinc compile exited ({proc.returncode}) before {what}: {err[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"zinc compile never reached {what}")
        time.sleep(0.02)


def kill_at(model: Path, cache: Path, point: str, output: Path | None = None) -> str:
    """Run until the process stops itself at `point`, SIGKILL it there; its stderr."""
    proc = compile_run(model, cache, pause=point, output=output)
    wait_for(proc, lambda: state(proc.pid) == "T", f"the pause point {point}")
    proc.send_signal(signal.SIGKILL)
    code, _, err = finish(proc)
    assert code == -signal.SIGKILL and f"zinc: paused at {point}" in err, err
    return err


def iree_compile_child(pid: int) -> int | None:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text()
            ppid = int(fields[fields.rindex(")") + 2 :].split()[1])
            if ppid == pid and b"iree-compile" in (stat.parent / "cmdline").read_bytes():
                return int(stat.parent.name)
        except (OSError, ValueError):  # a process that ended meanwhile
            continue
    return None


def kill_during_iree_compile(model: Path, cache: Path) -> None:
    proc = compile_run(model, cache)
    found: list[int] = []

    def running() -> bool:
        child = iree_compile_child(proc.pid)
        if child is not None:
            found.append(child)
        return bool(found)

    wait_for(proc, running, "iree-compile")
    proc.send_signal(signal.SIGKILL)
    finish(proc)
    os.kill(found[0], signal.SIGKILL)  # the orphan would otherwise compile on to no one


def entries(cache: Path) -> list[str]:
    """What the cache holds, the lock files left out: artifacts and `.NAME.tmp-*`/`.old-*` leftovers."""
    return sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) if cache.exists() else []


def artifacts(cache: Path) -> list[Path]:
    return [cache / name for name in entries(cache) if not name.startswith(".")]


def rebuild(model: Path, cache: Path, output: Path | None = None) -> Path:
    """A run to the end: it builds a sound artifact and leaves nothing else behind."""
    code, out, err = finish(compile_run(model, cache, output=output))
    assert code == 0, err
    art = Path(out.strip())
    load_manifest(art, open_gguf(model))
    assert entries(art.parent) == [art.name]
    return art


@pytest.fixture
def model(tiny_models: dict[str, Path]) -> Path:
    return tiny_models["tiny-q8-q41"]


def test_killed_while_compiling_then_rebuilt(model: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    kill_at(model, cache, "emit")
    assert entries(cache) == []  # nothing is written before the MLIR exists
    kill_during_iree_compile(model, cache)
    assert artifacts(cache) == []
    kill_at(model, cache, "archive")
    [tmp] = entries(cache)
    assert tmp.startswith(".") and ".tmp-" in tmp
    assert [p.name for p in (cache / tmp).iterdir()] == [".weights.irpa.partial"]  # half an archive
    kill_at(model, cache, "manifest")
    assert artifacts(cache) == []
    written = {p.name for tmp in cache.glob(".*.tmp-*") for p in tmp.iterdir()}
    assert written == {"model.cpu.vmfb", "weights.irpa"}  # all but the manifest, in a temp dir
    kill_at(model, cache, "rename")
    assert artifacts(cache) == []
    [tmp] = entries(cache)  # complete, but under its temporary name: never loaded, removed next time
    load_manifest(cache / tmp, open_gguf(model))
    rebuild(model, cache)  # and the three temp dirs are gone


def test_replacing_an_artifact_killed_midway(model: Path, tmp_path: Path) -> None:
    """`zinc compile -o DIR` over an artifact: killed between moving the old one aside and
    renaming the new one in, DIR is absent (never a mix of the two); the next run completes."""
    out = tmp_path / "out" / "tiny"
    assert rebuild(model, tmp_path / "cache", out) == out
    kill_at(model, tmp_path / "cache", "swap", out)
    old, tmp = entries(out.parent)  # the old one aside, the new one complete in its temp dir
    assert ".old-" in old and ".tmp-" in tmp
    assert (out.parent / old / MANIFEST).is_file() and (out.parent / tmp / MANIFEST).is_file()
    with pytest.raises(ArtifactError, match="not a zinc artifact"):
        load_manifest(out)
    assert rebuild(model, tmp_path / "cache", out) == out


def test_output_directory_that_is_not_an_artifact_is_left_alone(model: Path, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    code, _, err = finish(compile_run(model, tmp_path / "cache", output=tmp_path))
    assert code == 1 and "exists and is not a zinc artifact" in err and "Traceback" not in err, err
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs: too small for the tiny model's artifact (about 190 KB)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root); the RLIMIT_FSIZE test covers a full disk")
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_disk_full_fails_cleanly_then_rebuilds(model: Path, small_disk: Path) -> None:
    code, _, err = finish(compile_run(model, small_disk))
    assert code == 1 and "No space left on device" in err and "Traceback" not in err, err
    assert err.count("error:") == 1
    assert entries(small_disk) == []  # the partial files are gone: the space is free again
    subprocess.run(["mount", "-o", "remount,size=8m", "tmpfs", str(small_disk)], check=True)
    rebuild(model, small_disk)


def test_file_size_limit_fails_cleanly(model: Path, tmp_path: Path) -> None:
    """RLIMIT_FSIZE (any user): the archive's first write past 4 KiB fails with EFBIG."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    cache = tmp_path / "cache"
    code, _, err = finish(compile_run(model, cache, preexec=limit))
    assert code == 1 and "File too large" in err and "Traceback" not in err, err
    assert entries(cache) == []
    shutil.rmtree(cache)


def test_two_compiles_of_one_entry_build_it_once(model: Path, tmp_path: Path) -> None:
    """The second process waits on the entry's lock while the first compiles, then uses its artifact."""
    cache = tmp_path / "cache"
    first = compile_run(model, cache, pause="emit")  # holds the entry's lock, stopped
    wait_for(first, lambda: state(first.pid) == "T", "the pause point emit")
    second = compile_run(model, cache)
    assert second.stderr is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(second.stderr.readline, "")), daemon=True)
    reader.start()
    wait_for(second, lambda: any("waiting for another zinc process" in line for line in lines), "the lock")
    first.send_signal(signal.SIGCONT)
    code1, out1, err1 = finish(first)
    assert second.wait(timeout=GUARD_S) == 0 and code1 == 0, err1
    reader.join(timeout=GUARD_S)
    out2, err2 = second.stdout.read() if second.stdout else "", "".join(lines)
    assert out1 == out2 and "iree-compile for" in err1
    assert "using cached artifact" in err2 and "iree-compile for" not in err2, err2
    assert entries(cache) == [Path(out1.strip()).name]
