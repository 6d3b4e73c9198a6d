"""Llama 3.1/3.2's RoPE frequency factors (`rope_freqs.weight`) from the GGUF to the compiled graph.

llama.cpp divides each RoPE pair's frequency by its factor (ggml_rope_ext's freq_factors):
theta_i = pos * base^(-2i/n_rot) / factors[i]. The reference model must do that (and the fixture
must make it matter), the compiled table's frequencies must round as llama.cpp's CPU rope cache
does, a model without factors keeps its MLIR, and the factors' values are part of the cache key
(the MLIR holds them as constants). tests/model/test_fixture_numerics.py runs the compiled
fixture against the reference; tests/kernels/test_rope.py the table at long-context positions.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
from pathlib import Path

import numpy as np

from fixtures.real_shapes import llama3_rope_factors
from zinc.compiler.build import artifact_key, plan
from zinc.compiler.emitter import rope_freqs
from zinc.model.gguf_file import open_gguf
from zinc.model.hparams import HParams, describe
from zinc.model.reference import ReferenceModel

FIXTURE = "tiny-llama3-ropefreqs"


def test_reference_rope_divides_each_pair_frequency(tiny_models: dict[str, Path]) -> None:
    ref = ReferenceModel(open_gguf(tiny_models[FIXTURE]))
    hp = ref.hp
    hd, base, factors = hp.key_length, hp.rope_freq_base, hp.rope_freq_factors
    assert len(factors) == hd // 2 and hp.rope_dimension_count == hd
    x = np.random.default_rng(0).standard_normal((1, hp.head_count, hd))
    pos = 37
    got = ref._rope(x, np.array([float(pos)]), 0)
    want = x.copy()  # closed form, one pair at a time
    for i in range(hd // 2):
        theta = pos / (base ** (2 * i / hd) * factors[i])
        c, s = math.cos(theta), math.sin(theta)
        x0, x1 = x[..., 2 * i], x[..., 2 * i + 1]
        want[..., 2 * i], want[..., 2 * i + 1] = x0 * c - x1 * s, x0 * s + x1 * c
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    ref.hp = dataclasses.replace(hp, rope_freq_factors=())
    plain = ref._rope(x, np.array([float(pos)]), 0)
    assert np.abs(plain - got).max() > 0.1  # the factors move pairs 1.. by large angles at position 37
    assert np.array_equal(plain[..., :2], got[..., :2])  # pair 0 has factor 1


def test_hparams_survive_the_manifest(tiny_models: dict[str, Path]) -> None:
    hp = describe(open_gguf(tiny_models[FIXTURE])).hparams
    back = HParams.from_json(json.loads(json.dumps(hp.to_json())))
    assert back == hp and hash(back) == hash(hp)


def ggml_rope_angles(pos: np.ndarray, base: float, n_rot: int, factors: np.ndarray) -> np.ndarray:
    """llama.cpp's CPU angles (ggml_rope_cache_init): theta starts at pos and is multiplied by
    theta_scale = powf(base, -2.0f/n_rot) once per pair, all in f32; pair i takes theta / ff[i]."""
    ts = np.float32(np.power(np.float32(base), np.float32(-2.0) / np.float32(n_rot)))
    theta = pos.astype(np.float32)
    out = np.empty((len(pos), n_rot // 2), dtype=np.float32)
    for i in range(n_rot // 2):
        out[:, i] = theta / factors[i]
        theta = (theta * ts).astype(np.float32)
    return out


def test_table_frequencies_follow_llama_cpp() -> None:
    """Llama 3.1 8B (head 128, base 500000, factor 8): the compiled table's angles pos * freq[i]
    against llama.cpp's and the exact ones, over positions up to 128K."""
    hd, base = 128, 500000.0
    factors = llama3_rope_factors(hd, base, 8.0)
    freqs = rope_freqs(base, -2.0 / hd, tuple(float(f) for f in factors), hd // 2)
    assert freqs.dtype == np.float32 and freqs.shape == (hd // 2,)
    pos = np.arange(0, 131072, 13, dtype=np.float32)
    ours = pos[:, None] * freqs[None, :]  # the table's f32 product
    exact = pos.astype(np.float64)[:, None] * base ** (-2.0 * np.arange(hd // 2) / hd) / factors
    llama = ggml_rope_angles(pos, base, hd, factors)
    # theta_scale^i accumulated in f32 drifts as llama.cpp's does, by up to 1.5e-6 at pair 63
    np.testing.assert_allclose(ours, exact, rtol=2e-6, atol=0)
    diff = np.abs(ours.astype(np.float64) - llama)
    assert diff.max() < 1.6e-2 and diff.mean() < 3e-4, (diff.max(), diff.mean())
    # partial rotary: pairs past the factors continue theta_scale^i with factor 1
    more = rope_freqs(base, -2.0 / hd, tuple(float(f) for f in factors[:8]), 10)
    np.testing.assert_allclose(more[8:], base ** (-2.0 * np.arange(8, 10) / hd), rtol=1e-6)


def test_factors_reach_the_mlir_and_the_cache_key(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    with_factors = tiny_models[FIXTURE]
    for target in ("cpu", "vulkan"):
        mlir = plan(with_factors, target).mlir
        tables = re.findall(r"func\.func private @(rope_table_\w+)\(", mlir)
        assert tables and all(re.search(r"_f[0-9a-f]{12}$", t) for t in tables), tables
        assert mlir.count("arith.constant dense<[1.000000000e+00, ") == len(tables)  # freq 0: 1 / factor 1
        assert "math.powf" not in mlir  # every table takes the constant frequencies
        assert "math.powf" in plan(tiny_models["tiny-q8-q41"], target).mlir
    # the same header (so the same GGUF identity) with other factor values: another artifact
    other = tmp_path / "other.gguf"
    shutil.copy(with_factors, other)
    model = open_gguf(with_factors)
    info = model.tensors["rope_freqs.weight"]
    with other.open("r+b") as f:
        f.seek(info.offset + 4 * (info.ne[0] - 1))
        f.write(np.float32(4.0).tobytes())  # the last factor: 8 -> 4
    changed = open_gguf(other)
    assert changed.identity == model.identity
    assert changed.read_f32("rope_freqs.weight")[-1] == 4.0
    assert artifact_key(changed, "cpu") != artifact_key(model, "cpu")
    assert plan(other, "cpu").mlir != plan(with_factors, "cpu").mlir
