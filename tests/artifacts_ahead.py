"""The model artifacts a whole test run opens, compiled ahead by one background process.

With `ZINC_ARTIFACTS_AHEAD=1` (.ci/run sets it), tests/conftest.py starts `python -m
tests.artifacts_ahead` once the tests are collected, at the lowest CPU priority, and stops it when
the run ends. It compiles `AHEAD` in order into the run's cache (`$ZINC_CACHE`), one artifact at
a time, on the core the tests leave idle: most tests keep one of this machine's two cores busy,
and a compile otherwise stalls the test that first opens it. A test that needs an artifact waits
on its lock while this process compiles it, or compiles it itself if this process has not got
there yet (this process then finds it built). The list only saves time: an entry no test opens
costs a compile, and an artifact missing from it is compiled where it is opened, as without it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# (model: a bundled model's name or a fixtures/make_fixtures.py fixture's), target, decode buckets
# (None: the default), pooling; in the order a run first opens them (unit, e2e, golden, model), except
# that the bundled models come first: a minute or two each, where the tiny fixtures the first tests
# also open take 15-20 s
AHEAD: tuple[tuple[str, str, tuple[int, ...] | None, str | None], ...] = (
    ("smollm2", "cpu", None, None),
    ("smollm2", "vulkan", None, None),
    ("gemma3-270m", "cpu", None, None),
    ("tiny-q8-q41", "cpu", None, None),
    ("tiny-q40-f16", "cpu", None, None),
    ("tiny-qwen3-embed", "cpu", None, None),
    ("tiny-qwen3", "cpu", (1,), "mean"),
    ("tiny-fim", "cpu", None, None),
    ("tiny-q8-q41", "vulkan", None, None),
    ("gemma3-270m", "vulkan", (1,), None),
    ("tiny-qwen2", "cpu", (1,), None),
    ("tiny-qwen3-embed", "vulkan", None, None),
    ("tiny-qwen3", "cpu", (1,), None),
    ("tiny-q40-f16", "vulkan", (1,), None),
    ("tiny-f32-q8", "cpu", (1,), None),
    ("tiny-f32-q8", "vulkan", (1,), None),
    ("tiny-qwen2", "vulkan", (1,), None),
    ("tiny-qwen3", "vulkan", (1,), None),
    ("tiny-gemma3", "cpu", None, None),
    ("tiny-gemma3", "vulkan", None, None),
    ("tiny-gemma3-scaled", "cpu", (1,), None),
    ("tiny-gemma3-scaled", "vulkan", (1,), None),
    ("tiny-llama3-ropefreqs", "cpu", None, None),
    ("tiny-llama3-ropefreqs", "vulkan", None, None),
)


def start(log: Path) -> subprocess.Popen[bytes]:
    """This module as a process of its own, niced, in a session of its own (`stop` ends its
    iree-compile children with it); its output goes to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        return subprocess.Popen(
            ["nice", "-n", "19", sys.executable, "-m", "tests.artifacts_ahead"], stdout=out, stderr=subprocess.STDOUT,
            cwd=Path(__file__).resolve().parent.parent, start_new_session=True,
        )  # fmt: skip


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End the process and its children (a compile cut short leaves its lock free and its
    temporary directory to the next writer, as a killed `zinc compile` does)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def model_path(name: str, folder: Path) -> Path:
    from fixtures.make_fixtures import FIXTURES, write_fixture
    from zinc.model.gguf_file import BUNDLED_MODELS

    if name in BUNDLED_MODELS:
        return BUNDLED_MODELS[name]()
    return write_fixture(FIXTURES[name], folder / f"{name}.gguf")


def main() -> None:
    from zinc.compiler.build import ensure_artifact
    from zinc.errors import ZincError

    with tempfile.TemporaryDirectory(prefix="zinc-artifacts-ahead-") as tmp:
        for name, target, buckets, pooling in AHEAD:
            t0 = time.perf_counter()
            try:
                path = model_path(name, Path(tmp))
                ensure_artifact(path, target, batch_sizes=buckets, pooling=pooling)
            except ZincError as exc:  # the test that opens it reports it
                print(f"{name} {target}: {exc.message}", flush=True)
                continue
            print(f"{name} {target} {buckets} {pooling}: {time.perf_counter() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
