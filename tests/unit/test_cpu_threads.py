"""The CPU task driver's worker threads: how many (`--threads`, default the physical cores) and
that they are not pinned to one core each, as IREE's default topology pins them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from zinc.errors import ZincError
from zinc.runtime.device import default_threads, resolve_device

WORKERS = """
import os, sys, time
from zinc.runtime.device import open_device
open_device("local-task", int(sys.argv[1]))
me = os.getpid()
def workers():
    found = []
    for tid in sorted(os.listdir(f"/proc/{me}/task")):
        with open(f"/proc/{me}/task/{tid}/comm") as f:
            if f.read().startswith("iree-worker"):
                found.append(sorted(os.sched_getaffinity(int(tid))))
    return found
deadline = time.monotonic() + 10  # each worker names itself once it runs
while len(workers()) < int(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(0.2)  # and sets its affinity, if it pins itself
print("\\n".join(map(str, workers())))
"""


def test_default_threads_are_the_usable_physical_cores() -> None:
    assert 1 <= default_threads() <= len(os.sched_getaffinity(0))


def test_resolve_device_names_its_threads() -> None:
    spec = resolve_device("cpu", "local-task", threads=3)
    assert (spec.threads, spec.name) == (3, "CPU (local-task, 3 threads)")
    assert resolve_device("cpu", "local-task").threads == default_threads()
    assert resolve_device("cpu", "local-sync").threads is None  # one thread: the caller's
    with pytest.raises(ZincError, match="--threads must be between 1 and 1024, got 0"):
        resolve_device("cpu", threads=0)


@pytest.mark.parametrize("threads", [1, 3])
def test_task_workers_run_unpinned_on_every_usable_cpu(threads: int) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", WORKERS, str(threads)], capture_output=True, text=True, timeout=60, check=True
    )
    usable = str(sorted(os.sched_getaffinity(0)))
    assert proc.stdout.splitlines() == [usable] * threads, proc.stderr
