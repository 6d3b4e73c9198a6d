"""A short soak (bench/bench_soak.py, the fake engine): a few hundred requests of every kind
(keep-alive and new connections, streamed and not, clients that reset mid-stream, bad bodies)
leave the server's open file descriptors exactly where they were after the warm-up, and its RSS
within a generous bound. The 10,000-request soak and its figures: docs/RELIABILITY.md."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
REQUESTS = 300  # 50 rounds of the six kinds
RSS_BOUND_KIB = 32 * 1024  # growth allowed: allocator noise, never a leak per request


def test_short_soak_leaves_fds_and_rss_flat(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    proc = subprocess.run(
        [sys.executable, "bench/bench_soak.py", "--fake", "--requests", str(REQUESTS), "--sample-every", "50",
         "--json", str(out), "--quiet"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = orjson.loads(out.read_bytes())
    kinds = 6
    assert result["statuses"] == {"200": REQUESTS * 5 // kinds, "400": REQUESTS // kinds}
    baseline, final = result["baseline"], result["final"]
    assert final["fds"] == baseline["fds"], result["samples"]
    assert final["rss_kib"] - baseline["rss_kib"] < RSS_BOUND_KIB, result["samples"]
    assert [s["requests"] for s in result["samples"]] == list(range(50, REQUESTS + 1, 50))
    assert "RSS" in proc.stdout and "fds" in proc.stdout
