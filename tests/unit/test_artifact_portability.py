"""Artifacts compiled once and used on other machines: the CPU target (this host or a portable
x86-64 level), the features a manifest records and the check that refuses what this CPU lacks,
`zinc serve --artifact DIR`, and a cache that must not compile (read-only, or ZINC_NO_COMPILE)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tests.conftest import artifact_copy
from zinc.artifact import MANIFEST
from zinc.cli import app
from zinc.cli_models import check_artifact_dir
from zinc.compiler import dot8_layout
from zinc.compiler.build import artifact_key, ensure_artifact
from zinc.compiler.targets import cpu_target, target_cpu_flags, target_flags
from zinc.errors import ArtifactError, ZincError
from zinc.model.gguf_file import open_gguf
from zinc.runtime import cpu_flags
from zinc.runtime.device import DeviceSpec, resolve_device
from zinc.runtime.session import ModelSession

MODEL = "tiny-q8-q41"


def test_a_cpu_level_names_its_features_and_the_kernels_follow_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ZINC_CPU_TARGET", raising=False)
    assert cpu_target() == "host"
    assert target_cpu_flags() == cpu_flags.host_cpu_flags() & cpu_flags.ISA_FLAGS
    assert target_flags("cpu")[-1] == "--iree-llvmcpu-target-cpu=host"
    monkeypatch.setenv("ZINC_CPU_TARGET", "x86-64-v3")
    assert {"avx2", "fma", "f16c"} <= target_cpu_flags() and "avx512f" not in target_cpu_flags()
    assert target_flags("cpu")[-1] == "--iree-llvmcpu-target-cpu=x86-64-v3"
    assert dot8_layout.host_supports() and not dot8_layout.vnni() and not dot8_layout.wide_enabled()  # AVX2 byte products
    monkeypatch.setenv("ZINC_CPU_TARGET", "x86-64-v4")
    assert "avx512bw" in target_cpu_flags() and not dot8_layout.vnni()  # v4 has no VNNI
    monkeypatch.setenv("ZINC_CPU_TARGET", "x86-64-v2")
    assert not dot8_layout.host_supports()  # no AVX2: the f32 kernels
    monkeypatch.setenv("ZINC_CPU_TARGET", "pentium")
    with pytest.raises(ZincError, match="unknown CPU target 'pentium'"):
        cpu_target()


def test_missing_cpu_features_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_flags, "host_cpu_flags", lambda: frozenset({"avx2", "fma"}))
    cpu_flags.check_cpu_features(["avx2"], "art", "x86-64-v3")
    with pytest.raises(ArtifactError, match=r"art was compiled for a CPU \(host\) with avx512bw, avx512f, which"):
        cpu_flags.check_cpu_features(["avx2", "avx512f", "avx512bw"], "art", "host")
    monkeypatch.setattr(cpu_flags, "host_cpu_flags", frozenset)  # no x86 flags to read: nothing checked
    cpu_flags.check_cpu_features(["avx512f"], "art", "host")


def test_the_cache_key_holds_the_cpu_target(monkeypatch: pytest.MonkeyPatch, tiny_models: dict[str, Path]) -> None:
    gguf = open_gguf(tiny_models[MODEL])
    monkeypatch.delenv("ZINC_CPU_TARGET", raising=False)
    host = artifact_key(gguf, "cpu")
    monkeypatch.setenv("ZINC_CPU_TARGET", "x86-64-v3")
    assert artifact_key(gguf, "cpu") != host


def test_a_portable_artifact_runs_here_and_one_needing_more_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    path = tiny_models[MODEL]
    monkeypatch.setenv("ZINC_CPU_TARGET", "x86-64-v3")
    art = ensure_artifact(path, "cpu", cache_dir=tmp_path)
    monkeypatch.delenv("ZINC_CPU_TARGET")
    manifest = json.loads((art / MANIFEST).read_text())
    assert manifest["cpu_features"] == sorted(cpu_flags.CPU_LEVELS["x86-64-v3"])
    assert "--iree-llvmcpu-target-cpu=x86-64-v3" in manifest["flags"]
    device = resolve_device("cpu")
    portable = ModelSession(art, path, device).prefill([1, 2, 3]).logits()
    native = ModelSession(artifact_copy(path, "cpu", tmp_path), path, device).prefill([1, 2, 3]).logits()
    np.testing.assert_allclose(portable, native, atol=1e-3 * float(np.abs(native).max()))
    manifest["cpu_features"].append("avx10_zinc_test")  # a feature no CPU has
    (art / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=r"x86-64-v3\) with avx10_zinc_test, which this CPU lacks"):
        ModelSession(art, path, device)


def test_serve_artifact_is_checked_before_serving(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    art = artifact_copy(tiny_models[MODEL], "cpu", tmp_path)
    cpu = resolve_device("cpu")
    assert check_artifact_dir(art, tiny_models[MODEL], cpu) == art
    with pytest.raises(ArtifactError, match="not a directory"):
        check_artifact_dir(tmp_path / "nowhere", tiny_models[MODEL], cpu)
    with pytest.raises(ArtifactError, match="different GGUF"):
        check_artifact_dir(art, tiny_models["tiny-q40-f16"], cpu)
    gpu = DeviceSpec("vulkan", "vulkan", "some GPU")
    with pytest.raises(ArtifactError, match=r"compiled for cpu, not for some GPU \(compile it with --target vulkan"):
        check_artifact_dir(art, tiny_models[MODEL], gpu)


def test_a_cache_that_must_not_compile_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    built = artifact_copy(tiny_models[MODEL], "cpu", tmp_path)
    monkeypatch.setenv("ZINC_NO_COMPILE", "1")
    assert ensure_artifact(tiny_models[MODEL], "cpu", cache_dir=tmp_path) == built  # found: used
    with pytest.raises(ArtifactError, match=r"no artifact of tiny-q40-f16\.gguf .* read-only here"):
        ensure_artifact(tiny_models["tiny-q40-f16"], "cpu", cache_dir=tmp_path)
    assert not list(tmp_path.glob("tiny-q40-f16*"))  # nothing written, not even a lock


def test_compile_refuses_a_bad_cpu_target() -> None:
    runner = CliRunner()
    bad = runner.invoke(app, ["compile", "smollm2", "--cpu-target", "pentium"])
    assert bad.exit_code == 1 and "--cpu-target takes host|x86-64-v2|x86-64-v3|x86-64-v4" in bad.output
    gpu = runner.invoke(app, ["compile", "smollm2", "--target", "vulkan", "--cpu-target", "x86-64-v3"])
    assert gpu.exit_code == 1 and "--cpu-target needs --target cpu" in gpu.output
