"""The sections of docs/PERFORMANCE.md that the benchmarks write.

Owns: `replace_section` (one `## ` section of a report, replaced where it stands, or added just
above the hand-written Notes) and `publish` (a benchmark's raw figures to JSON, its section to the
report and stdout). Imports: the stdlib only (bench_gpu.py imports it on the GPU machine).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

NOTES = "## Notes"


def replace_section(doc: Path, section: str, title: str) -> None:
    """Put `section` (its first line is `title`) in place of the section headed by the line
    `title`, up to the next `## ` heading; where there is none, just above the Notes (or at the
    end). The other sections keep their places and text."""
    text = doc.read_text() if doc.exists() else ""
    head, sep, tail = text.partition(NOTES)
    lines = head.rstrip().split("\n") if head.strip() else []
    start = next((i for i, line in enumerate(lines) if line.rstrip() == title), len(lines))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    parts = ["\n".join(lines[:start]).strip(), section.strip(), "\n".join(lines[end:]).strip()]
    doc.write_text("\n\n".join(p for p in parts if p) + "\n\n" + sep + tail)


def publish(data: Any, section: str, title: str, raw: Path | None, doc: Path | None) -> None:
    """`data` as JSON in `raw`, `section` (headed `title`) in the report `doc`, each when given;
    the section printed."""
    if raw:
        raw.parent.mkdir(parents=True, exist_ok=True)
        raw.write_text(json.dumps(data, indent=1) + "\n")
    if doc:
        replace_section(doc, section, title)
    print(section)
