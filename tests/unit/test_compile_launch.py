"""`compile_mlir` when iree-compile cannot start: a passing refusal of the fork or exec is tried
again, and a lasting one is a `CompileError` that says why, not an OSError's traceback."""

from __future__ import annotations

import errno
import subprocess
from typing import Any

import pytest

from zinc.compiler import targets
from zinc.compiler.targets import compile_mlir
from zinc.errors import CompileError

MODULE = "func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }"


def launcher(failures: list[int]) -> tuple[list[list[str]], Any]:
    """A `subprocess.run` that fails with the errnos in `failures`, one a call, then succeeds."""
    calls: list[list[str]] = []

    def run(command_line: list[str], **_: Any) -> subprocess.CompletedProcess[bytes]:
        calls.append(command_line)
        if failures:
            code = failures.pop(0)
            raise OSError(code, f"{errno.errorcode[code]} from the test")
        return subprocess.CompletedProcess(command_line, 0, stdout=b"vmfb bytes", stderr=b"")

    return calls, run


@pytest.fixture(autouse=True)
def no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(targets, "LAUNCH_PAUSE_S", 0.0)


def test_a_passing_refusal_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    calls, run = launcher([errno.ETXTBSY, errno.ENOMEM])
    monkeypatch.setattr(subprocess, "run", run)
    assert compile_mlir(MODULE, "cpu") == b"vmfb bytes"
    assert len(calls) == 3 and "iree-compile" in calls[0][0]


def test_a_lasting_refusal_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    calls, run = launcher([errno.EAGAIN] * targets.LAUNCH_TRIES)
    monkeypatch.setattr(subprocess, "run", run)
    with pytest.raises(CompileError, match="iree-compile could not start: EAGAIN from the test"):
        compile_mlir(MODULE, "cpu")
    assert len(calls) == targets.LAUNCH_TRIES


def test_a_missing_binary_is_not_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    calls, run = launcher([errno.ENOENT])
    monkeypatch.setattr(subprocess, "run", run)
    with pytest.raises(CompileError, match="could not start: ENOENT"):
        compile_mlir(MODULE, "vulkan")
    assert len(calls) == 1
