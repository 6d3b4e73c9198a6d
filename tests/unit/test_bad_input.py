"""Bad model files, artifacts and devices: each is one clear `ZincError`, never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter, quants

from tests.conftest import artifact_copy
from zinc.artifact import MANIFEST, load_manifest
from zinc.compiler.build import ensure_artifact
from zinc.errors import ArtifactError, DeviceError, GGUFError, UnsupportedModelError
from zinc.model.gguf_file import open_gguf
from zinc.model.hparams import describe
from zinc.runtime import device as device_mod
from zinc.runtime.device import resolve_device
from zinc.runtime.session import ModelSession


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(GGUFError, match="not found"):
        open_gguf(tmp_path / "nope.gguf")


def test_not_gguf(tmp_path: Path) -> None:
    p = tmp_path / "x.gguf"
    p.write_text("hello, this is text")
    with pytest.raises(GGUFError, match="not a GGUF file"):
        open_gguf(p)


@pytest.mark.parametrize("keep", [0.0005, 0.5, 0.99])
def test_truncated(tmp_path: Path, tiny_models: dict[str, Path], keep: float) -> None:
    src = tiny_models["tiny-q8-q41"].read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(src[: max(8, int(len(src) * keep))])
    with pytest.raises(GGUFError, match=r"truncated|damaged"):
        open_gguf(p)


def _write(path: Path, arch: str, qtype: GGMLQuantizationType | None = None) -> Path:
    w = GGUFWriter(str(path), arch)
    w.add_block_count(1)
    data = np.ones((32, 64), np.float32)
    if qtype is None:
        w.add_tensor("token_embd.weight", data)
    else:
        w.add_tensor("token_embd.weight", quants.quantize(data, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unknown_architecture(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedModelError, match=r"'mamba' is not supported.*llama"):
        describe(open_gguf(_write(tmp_path / "m.gguf", "mamba")))


@pytest.mark.parametrize("qtype", ["MXFP4", "BF16"])  # no kernel; a kernel but IREE cannot index the file
def test_unsupported_quant_type(tmp_path: Path, qtype: str) -> None:
    from fixtures.make_fixtures import TinyLlama, write_fixture
    from zinc.compiler.build import plan

    spec = TinyLlama("tiny-unsupported", {"embd": "Q8_0", "attn": qtype, "ffn": "Q8_0", "output": "Q8_0"})
    path = write_fixture(spec, tmp_path / "unsupported.gguf")
    assert describe(open_gguf(path)).tensor_types["blk.0.attn_q.weight"] == qtype  # a valid model...
    with pytest.raises(UnsupportedModelError, match=rf"blk\.0\.attn_q\.weight has quant type {qtype}"):
        plan(path, "cpu")  # ...that zinc cannot compile (or load) yet


def test_corrupted_and_mismatched_artifact(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    cache = tmp_path / "cache"
    art = artifact_copy(tiny_models["tiny-q8-q41"], "cpu", cache)
    assert ensure_artifact(tiny_models["tiny-q8-q41"], "cpu", cache_dir=cache) == art  # found: used
    other = open_gguf(tiny_models["tiny-q40-f16"])
    with pytest.raises(ArtifactError, match="different GGUF"):
        load_manifest(art, other)
    with pytest.raises(ArtifactError, match="different GGUF"):
        ModelSession(art, other.path, resolve_device("cpu"))
    vmfb = next(art.glob("*.vmfb"))
    vmfb.write_bytes(vmfb.read_bytes()[:100])
    with pytest.raises(ArtifactError, match="corrupted"):
        load_manifest(art)
    # the cache does not trust a broken entry: it rebuilds it
    rebuilt = ensure_artifact(tiny_models["tiny-q8-q41"], "cpu", cache_dir=cache)
    assert rebuilt == art
    load_manifest(rebuilt, open_gguf(tiny_models["tiny-q8-q41"]))
    irpa = art / "weights.irpa"  # a file cut short (what a non-atomic writer could leave)
    os.truncate(irpa, irpa.stat().st_size - 4096)
    with pytest.raises(ArtifactError, match=r"weights.irpa is \d+ bytes, the manifest says \d+ \(a partial"):
        load_manifest(art, verify_vmfb=False)
    irpa.unlink()
    with pytest.raises(ArtifactError, match=r"weights\.irpa is missing"):
        load_manifest(art)
    (art / MANIFEST).write_text("{not json")
    with pytest.raises(ArtifactError, match="corrupted manifest"):
        load_manifest(art)
    shutil.rmtree(art)
    with pytest.raises(ArtifactError, match="not a zinc artifact"):
        load_manifest(art)


def test_an_artifact_of_other_weights_under_the_same_header_is_rebuilt(
    tmp_path: Path, tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GGUF's identity covers its header; an artifact that holds repacked weights also records a
    sample of the weights it was made from, so a file requantized in place (same header, same
    name) gets a new artifact instead of the old weights."""
    source = tiny_models["tiny-q8-q41"]
    cache = tmp_path / "cache"
    art = artifact_copy(source, "cpu", cache)
    assert (art / "weights.irpa").is_file() and load_manifest(art).weights_sample == open_gguf(source).weights_sample
    copy, changed = tmp_path / "copy" / source.name, tmp_path / "changed" / source.name
    for path in (copy, changed):
        path.parent.mkdir()
        shutil.copy(source, path)
    assert ensure_artifact(copy, "cpu", cache_dir=cache) == art  # the same file elsewhere: used
    info = open_gguf(source).tensors["blk.0.ffn_down.weight"]
    with changed.open("r+b") as f:  # one byte in the middle of a weight, as a requantization changes them all
        f.seek(info.offset + info.n_bytes // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert open_gguf(changed).identity == open_gguf(source).identity  # the header cannot tell them apart
    with pytest.raises(ArtifactError, match=r"same header .* but other tensor data"):
        load_manifest(art, open_gguf(changed))
    with pytest.raises(ArtifactError, match=r"same header .* but other tensor data"):
        ModelSession(art, changed, resolve_device("cpu"))

    def compile_model(*_args: object) -> Path:
        raise RuntimeError("rebuilt")

    monkeypatch.setattr("zinc.compiler.build.compile_model", compile_model)
    with pytest.raises(RuntimeError, match="rebuilt"):
        ensure_artifact(changed, "cpu", cache_dir=cache)


def test_unknown_format_version(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    art = artifact_copy(tiny_models["tiny-q8-q41"], "cpu", tmp_path)
    data = json.loads((art / MANIFEST).read_text())
    data["format_version"] = 999
    (art / MANIFEST).write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match=r"format version 999 .*compile it again"):
        load_manifest(art)


def test_missing_vulkan_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_mod, "vulkan_devices", lambda: ())
    with pytest.raises(DeviceError, match="no Vulkan device"):
        resolve_device("vulkan")
    assert resolve_device("auto").target == "cpu"


def test_auto_never_picks_a_software_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_mod, "vulkan_devices", lambda: ("llvmpipe (LLVM 15.0.6, 256 bits)",))
    assert resolve_device("auto").target == "cpu"
    assert resolve_device("vulkan").target == "vulkan"
    monkeypatch.setattr(device_mod, "vulkan_devices", lambda: ("NVIDIA H100 80GB HBM3",))
    assert resolve_device("auto").target == "vulkan"


def test_hostile_gguf_on_the_command_line_is_one_error_line(tmp_path: Path) -> None:
    """Arrays nested 10,000 deep (a RecursionError traceback before the header reader's limits)."""
    value = struct.pack("<IQ", 0, 0)
    for _ in range(10_000):
        value = struct.pack("<IQ", 9, 1) + value
    key = struct.pack("<Q", 4) + b"deep" + struct.pack("<I", 9)
    path = tmp_path / "hostile.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + key + value)
    out = subprocess.run([sys.executable, "-m", "zinc", "tokenize", "-m", str(path), "hi"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.count("error:") == 1 and "arrays nested more than 4 deep" in out.stderr
