"""bench/cpu_profile.py: the weight bytes (and a prompt chunk's multiply-adds) a matmul kernel's
name gives, the step figures it makes of IREE's dispatch events, and real captures of SmolLM2's
CPU decode step and prompt chunk."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import cpu_profile

ROOT = Path(__file__).resolve().parents[2]


def test_matmul_bytes_from_the_kernel_name() -> None:
    assert cpu_profile.matmul_bytes("dot8_q4_0_1_2048x2048") == 2048 * (2048 // 32) * 18
    assert cpu_profile.matmul_bytes("dot8_q4_0_1_3072x2048_kvw2147483647") == 3072 * 64 * 18
    assert cpu_profile.matmul_bytes("dot8_q4_0_b8_6144x4096_p4096x1024x1024") == 6144 * 128 * 18
    assert cpu_profile.matmul_bytes("dot8_q6_k_b8_128256x4096") == 128256 * 16 * 210
    assert cpu_profile.matmul_bytes("dot8_q4_1_1_576x1536") == 576 * 48 * 20
    others = ("attention_decode_w2147483647_s0p125_1_16x32x8x64f16", "argmax_cpu_128256", "dot8_qx_1_8x8", "dot8_q4_0_b8_2048x8192_xq")
    for other in others:
        assert cpu_profile.matmul_bytes(other) is None


def test_matmul_macs_of_a_prompt_chunks_kernel() -> None:
    assert cpu_profile.matmul_macs("dot8_q4_0_t_2048x8192", 128) == 2048 * 8192 * 128
    assert cpu_profile.matmul_bytes("dot8_q5_k_t_16384x2048") == 16384 * 8 * 176
    for other in ("dot8_q4_0_1_2048x2048", "dot8_q4_0_b8_4096x4096", "dot8_q4_0_t_2048x8192_xq", "rope_norm_cpu_32x64"):
        assert cpu_profile.matmul_macs(other, 128) is None


def test_step_args_of_a_prompt_chunk() -> None:
    manifest = {"hparams": {"key_length": 64, "block_count": 16, "head_count_kv": 8}, "kv_cache": {"dtype": "f16"}}
    args = cpu_profile.argparse.Namespace(batch=1, position=128, prefill=100)
    assert cpu_profile.step_args(manifest, args) == [
        "--function=prefill_kv", "--input=256x16x2x8x64xf16=0", "--input=100xi32=100", "--input=0", "--input=112xi32=0",
    ]  # fmt: skip
    args.prefill = 0
    assert cpu_profile.step_args(manifest, args)[0] == "--function=decode_b1"


def test_step_args_of_a_late_prompt_chunk_give_each_position_its_own_slot() -> None:
    manifest = {"hparams": {"key_length": 64, "block_count": 16, "head_count_kv": 8}, "kv_cache": {"dtype": "f16"}}
    args = cpu_profile.argparse.Namespace(batch=1, position=128, prefill=100, start=300)
    flag, slab, ids, start, ctx = cpu_profile.step_args(manifest, args)
    assert (flag, slab, ids, start) == ("--function=prefill_kv", "--input=400x16x2x8x64xf16=0", "--input=100xi32=100", "--input=300")
    assert ctx == "--input=400xi32=" + " ".join(str(p) for p in range(400))


def test_decode_inputs_give_every_row_of_a_batch_its_token_position_and_slots() -> None:
    hp = {"key_length": 64, "block_count": 16, "head_count_kv": 8}
    args = cpu_profile.decode_inputs(hp, 9, "f16", 8)
    assert args == ["--input=256x16x2x8x64xf16=0", "--input=8xi32=100", "--input=8xi32=9", "--input=8x10xi32=0"]


def event(key: str, start: int, end: int, tiles_ns: int | None = None) -> dict[str, object]:
    return {"key": key, "start_host_time_ns": start, "end_host_time_ns": end, "duration_ns": end - start,
            "tile_duration_sum_ns": end - start if tiles_ns is None else tiles_ns}  # fmt: skip


def test_steps_spans_gaps_and_idle_workers() -> None:
    # two steps of: the embedding (one workgroup), a gap, a matmul whose second worker worked 60 of
    # its 100 ns, and an attention that overlaps the matmul's end (no barrier between them)
    events = []
    for base in (1000, 5000):
        events += [
            event("decode_b1_dispatch_0_gather", base, base + 10),
            event("dot8_q4_0_1_64x64", base + 30, base + 130, tiles_ns=160),
            event("attention_decode_1", base + 120, base + 150, tiles_ns=60),
        ]
    rows = [{"key": "dot8_q4_0_1_64x64", "count": 2, "total_ns": 200, "avg_ns": 100, "min_ns": 90},
            {"key": "attention_decode_1", "count": 2, "total_ns": 60, "avg_ns": 30, "min_ns": 30}]  # fmt: skip
    s = cpu_profile.summarize(rows, events[::-1], threads=2, top=5)
    assert s["steps"] == 2 and s["dispatches"] == 3
    assert s["span_ms"] * 1e6 == pytest.approx(150)
    assert s["walls_ms"] * 1e6 == pytest.approx(140)
    assert s["gaps_ms"] * 1e6 == pytest.approx(20)  # 10..30 uncovered; the overlap counts once
    assert s["idle_worker_ms"] * 1e6 == pytest.approx(10 + 40 + 0)
    first = s["kernels"][0]
    assert first["function"] == "dot8_q4_0_1_64x64" and first["calls"] == 1
    assert first["share"] == pytest.approx(200 / 260)
    assert first["idle_ms"] * 1e6 == pytest.approx(40)  # per step: 2 x 100 - 160
    assert s["kernels"][1]["idle_ms"] == 0  # its workers were busy for all of its 30 ns
    assert first["gbps_best"] == pytest.approx(64 * 2 * 18 / 90) and "gbps_mean" not in s["kernels"][1]


def test_a_real_capture_of_the_cpu_decode_step(tmp_path: Path) -> None:
    """IREE's tools as the installed wheel ships them, on the batch of 4 rows (its inputs as the
    compiled function takes them): the profile parses, every step has the same dispatches, and
    the matmuls take most of a step."""
    out = tmp_path / "profile.json"
    cmd = [sys.executable, str(ROOT / "bench" / "cpu_profile.py"), "--steps", "3", "--batch", "4", "--top", "40", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    s = json.loads(out.read_text())
    assert s["steps"] == 3 and s["dispatches"] == int(s["dispatches"]) > 30
    assert 0 < s["gaps_ms"] < s["span_ms"] and s["walls_ms"] > 0
    matmuls = [k for k in s["kernels"] if "gbps_best" in k]
    assert sum(k["share"] for k in matmuls) > 0.5
    assert all(k["gbps_best"] >= k["gbps_mean"] > 0 for k in matmuls)
    assert all("_b4_" in k["function"] for k in matmuls)
    assert "decode_b4 at position 128" in done.stdout and "GB/s mean / best" in done.stdout


def test_a_real_capture_of_a_cpu_prompt_chunk(tmp_path: Path) -> None:
    """`prefill_kv` over 24 tokens: its matmuls are the prompt kernels, with GMAC/s in place of GB/s."""
    out = tmp_path / "profile.json"
    cmd = [sys.executable, str(ROOT / "bench" / "cpu_profile.py"), "--steps", "2", "--prefill", "24", "--top", "40", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    s = json.loads(out.read_text())
    assert s["steps"] == 2 and s["step"] == "prefill_kv of 24 tokens"
    chunks = [k for k in s["kernels"] if "gmacs_best" in k]
    assert chunks and all("_t_" in k["function"] and k["gmacs_best"] >= k["gmacs_mean"] > 0 for k in chunks)
    assert sum(k["share"] for k in chunks) > 0.3
