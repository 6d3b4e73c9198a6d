"""bench/bench_interactive.py's report: the section's rows and target, and its place in
docs/PERFORMANCE.md (written above the Notes, replaced on a rerun, the other sections kept)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bench_interactive
from report import replace_section

RUN = {
    "date": "2026-11-27 23:09 UTC", "cpu": "AMD EPYC", "delay_s": 0.15, "runs": 3,
    "models": {"llama-3.2-1b": {
        "zinc": {"idle_s": [0.06, 0.07, 0.05], "chunk_s": [0.44, 0.45, 0.43], "behind_s": [0.35, 0.34, 0.33],
                 "long_tokens": 1203},
        "llama-server": {"idle_s": [0.17] * 3, "chunk_s": [0.83] * 3, "behind_s": [9.69] * 3, "long_tokens": 1203},
    }},
}  # fmt: skip


def test_a_row_per_server_with_medians_and_the_target() -> None:
    text = bench_interactive.section(RUN)
    assert text.startswith(bench_interactive.TITLE + "\n")
    # target: twice the median idle time plus the median chunk
    assert "| llama-3.2-1b Q4_0 | zinc | 1,203 | 0.06 | 0.44 | 0.34 | 0.56 |" in text
    assert "| llama-3.2-1b Q4_0 | llama-server | 1,203 | 0.17 | 0.83 | 9.69 | 1.17 |" in text


def test_the_section_goes_above_the_notes_and_a_rerun_replaces_it(tmp_path: Path) -> None:
    doc = tmp_path / "PERFORMANCE.md"
    doc.write_text("# Performance\n\n## Sizes\n\nsizes table\n\n## Notes\n\nby hand\n")
    replace_section(doc, bench_interactive.section(RUN), bench_interactive.TITLE)
    first = doc.read_text()
    assert first.index("## Sizes") < first.index(bench_interactive.TITLE) < first.index("## Notes")
    later = {**RUN, "date": "2026-11-28 09:00 UTC"}
    replace_section(doc, bench_interactive.section(later), bench_interactive.TITLE)
    text = doc.read_text()
    assert text.count(bench_interactive.TITLE) == 1 and "2026-11-28 09:00 UTC" in text and "23:09" not in text
    assert "sizes table" in text and text.endswith("## Notes\n\nby hand\n")
