"""A model that does not fit in memory is refused with one line before anything loads: prompt mode
and `zinc serve` on a tiny fixture with `ZINC_MEMORY_LIMIT` set below what it needs exit non-zero
with the error naming both figures, and nothing was compiled into the cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_cli import assert_one_line_error, zinc


def limited(tmp_path: Path) -> dict[str, str]:
    return {"ZINC_MEMORY_LIMIT": "0.1GiB", "ZINC_CACHE": str(tmp_path / "cache"), "ZINC_HOME": str(tmp_path / "home")}


@pytest.mark.e2e
def test_prompt_mode_refuses_a_model_that_does_not_fit(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    model = tiny_models["tiny-q8-q41"]
    proc = zinc("-m", str(model), "--prompt-ids", "1,2,3", "-n", "2", "--device", "cpu", env=limited(tmp_path))
    assert_one_line_error(proc, f"{model.stem} does not fit in memory: it needs ")
    assert "and 0.10 GiB is available (ZINC_MEMORY_LIMIT)" in proc.stderr
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())  # nothing compiled


@pytest.mark.e2e
def test_serve_stops_with_the_error_when_the_model_does_not_fit(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    model = tiny_models["tiny-q8-q41"]
    proc = zinc("serve", "-m", str(model), "--port", "0", "--device", "cpu", env=limited(tmp_path), timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    last = [line for line in proc.stderr.splitlines() if line.strip()][-1]
    assert last.startswith("zinc: error:") and f"{model.stem} does not fit in memory" in last, proc.stderr
    assert "GiB is available (ZINC_MEMORY_LIMIT)" in last
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
