"""A device's threads that keep a core busy while it is idle run on idle cores only
(`zinc.runtime.device._yield_spinning_threads`): IREE's Vulkan completion threads on lavapipe poll
in vkWaitSemaphores, a core each, for the device's whole life."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time

import pytest

from zinc.runtime.device import _yield_spinning_threads

# A process that opens a device as zinc does, idles, then prints the CPU ticks its threads of
# ordinary priority used over a second: the work it takes from the rest of the machine while idle.
IDLE = """
import os, sys, time
from zinc.runtime.device import open_device
open_device(sys.argv[1])
def ticks():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        if os.sched_getscheduler(int(tid)) == os.SCHED_IDLE:
            continue
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out[tid] = int(fields[11]) + int(fields[12])
    return out
before = ticks()
time.sleep(1.0)
after = ticks()
print(sum(after[t] - before.get(t, 0) for t in after) / os.sysconf("SC_CLK_TCK"))
"""


@pytest.mark.parametrize("hogs", [0, 2])
def test_a_spinning_thread_is_moved_to_idle_cores_and_a_sleeping_one_is_not(hogs: int) -> None:
    """Also with the cores taken by `hogs` busy processes of ordinary priority: the spinning
    thread then gets a fraction of a core, but it is runnable whenever it is looked at."""
    stop = threading.Event()
    ids: dict[str, int] = {}
    block = bytes(1 << 20)

    def spin() -> None:  # hashing a large block runs without the GIL, as a native thread would
        ids["spin"] = threading.get_native_id()
        while not stop.is_set():
            hashlib.sha256(block).digest()

    def sleep() -> None:
        ids["sleep"] = threading.get_native_id()
        stop.wait()

    threads = [threading.Thread(target=spin), threading.Thread(target=sleep)]
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs)]
    for t in threads:
        t.start()
    try:
        while len(ids) < 2:
            time.sleep(0.01)
        _yield_spinning_threads(set(ids.values()))
        assert os.sched_getscheduler(ids["spin"]) == os.SCHED_IDLE
        assert os.sched_getscheduler(ids["sleep"]) == os.SCHED_OTHER
    finally:
        stop.set()
        for t in threads:
            t.join()
        for p in busy:
            p.kill()
            p.wait()


@pytest.mark.parametrize(
    ("uri", "hogs"),
    [pytest.param("vulkan", 0, marks=pytest.mark.vulkan), pytest.param("vulkan", 2, marks=pytest.mark.vulkan),
     ("local-task", 0)],
)  # fmt: skip
def test_an_idle_device_takes_no_core_from_other_work(uri: str, hogs: int) -> None:
    """Without the lowering, an idle lavapipe device's threads used 2.0 s of CPU in this second
    (opened beside `hogs` busy processes: they are found however busy the machine is)."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs)]
    try:
        proc = subprocess.run([sys.executable, "-c", IDLE, uri], capture_output=True, text=True, timeout=120)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout) < 0.2, proc.stdout
