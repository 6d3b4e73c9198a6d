"""tests/artifacts_ahead.py: its list names models that exist, once each, and `stop` ends the
background process with every child it started (an iree-compile left running would compile on to
no one, on a core the tests need)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests import artifacts_ahead


def test_every_entry_names_a_model_once(tmp_path: Path) -> None:
    assert len(set(artifacts_ahead.AHEAD)) == len(artifacts_ahead.AHEAD)
    for name in {name for name, *_ in artifacts_ahead.AHEAD}:
        assert artifacts_ahead.model_path(name, tmp_path).is_file(), name


def test_stop_ends_the_process_and_its_children(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZINC_CACHE", str(tmp_path / "cache"))
    proc = artifacts_ahead.start(tmp_path / "ahead.log")
    time.sleep(1.0)  # under way: writing its fixtures or compiling the first model
    assert proc.poll() is None, (tmp_path / "ahead.log").read_text()
    artifacts_ahead.stop(proc)
    assert proc.returncode is not None
    deadline = time.monotonic() + 10  # its killed children are reaped by init, not at once
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return  # nothing is left in its process group
        time.sleep(0.05)
    pytest.fail("a process of the compile-ahead group outlived stop()")
