"""A byte-flip fuzz of a real model's GGUF header and tensor table (the bundled SmolLM2): every
seeded case (tests/faults/gguf_fuzz.py says which) gives a valid model or one `ZincError`, never
another exception, a hang or a large allocation (the cases run in a child process under a data
limit, whose peak RSS is held to `PEAK_RSS_BYTES`).

The default tier runs `QUICK_CASES`; the long test (the opt-in fuzz tier: `pytest --fuzz -m fuzz`,
`just test-fuzz`) runs `SLOW_CASES` more (`ZINC_FUZZ_CASES` overrides that number). The outcomes
are printed (`pytest -s`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.faults.gguf_fuzz import KINDS, load
from zinc.model.gguf_header import read_header

QUICK_CASES = 50
SLOW_CASES = int(os.environ.get("ZINC_FUZZ_CASES", "2000"))
PEAK_RSS_BYTES = 400 << 20  # the interpreter, numpy and a valid SmolLM2 header come to about 120 MB


def fuzz(model: Path, first: int, count: int, directory: Path) -> dict[str, int]:
    child = subprocess.run(
        [sys.executable, "-m", "tests.faults.gguf_fuzz", str(model), str(first), str(count), str(directory)],
        capture_output=True, text=True, cwd=ROOT, timeout=3600,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr[-2000:]
    report: dict[str, Any] = json.loads(child.stdout)
    outcomes: dict[str, int] = report["outcomes"]
    print(f"\n{count} cases, peak RSS {report['peak_rss_bytes'] >> 20} MiB:")
    for label, n in sorted(outcomes.items(), key=lambda item: -item[1]):
        print(f"  {n:5d}  {label}")
    assert report["crashes"] == []
    assert sum(outcomes.values()) == count
    assert report["peak_rss_bytes"] < PEAK_RSS_BYTES
    return outcomes


def test_structural_fields_cover_the_tensor_table(smollm2: Path) -> None:
    model, tensors = load(smollm2), read_header(smollm2).tensors
    # the two counts, each key's length and type, and per tensor: name length, dimension count,
    # its dimensions, type and offset; the last field ends where the tensor table does
    dims = sum(len(t.ne) for t in tensors)
    assert len(model.fields) >= 2 + 4 * len(tensors) + dims
    assert len(model.header) - 32 < model.fields[-1][0] + 8 <= len(model.header)


def test_quick_fuzz_of_the_smollm2_header(smollm2: Path, tmp_path: Path) -> None:
    outcomes = fuzz(smollm2, 0, QUICK_CASES, tmp_path)
    assert {label.split(":")[0] for label in outcomes} == set(KINDS)


@pytest.mark.slow
@pytest.mark.fuzz
def test_long_fuzz_of_the_smollm2_header(smollm2: Path, tmp_path: Path) -> None:
    outcomes = fuzz(smollm2, QUICK_CASES, SLOW_CASES, tmp_path)
    valid = sum(n for label, n in outcomes.items() if label.endswith(": valid"))
    assert 0 < valid < SLOW_CASES  # both outcomes occur: the flips reach past what is ignored
