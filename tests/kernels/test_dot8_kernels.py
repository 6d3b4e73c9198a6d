"""Tier 2: the integer dot-product CPU kernels (compiler/dot8.py) against gguf's dequantize + numpy.

Each GGUF tensor is repacked as `zinc compile` does it. The decode kernels (one token, batches of
3 and 9 rows) and the prefill kernel (T = ?, 9 rows: a tile of 8 and a padded one) must equal the
weight times the activations rounded to Q8 per 32-block (`zinc.model.reference.q8_round`, the
rounding the kernels do) to f32 accuracy, and agree bit for bit on the same row. Weights are
`gguf.quants.quantize` of random floats (K-quants: random valid blocks); Q5_0 and Q5_1 also get
blocks of random bytes, so every fifth-bit pattern occurs. Skipped, with the reason, on a CPU without AVX2
(those machines compile the f32 tiled kernels instead).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from tests.compile_pool import KernelJob, compile_kernel
from tests.conftest import DEVICES, device_params
from tests.kernels.test_quant_kernels import random_blocks
from zinc.compiler import dot8, dot8_layout
from zinc.compiler.kernels import QUANT_TYPES
from zinc.errors import ZincError
from zinc.model.reference import q8_round
from zinc.runtime.device import to_host
from zinc.runtime.module import LoadedModule

SHAPES = [(64, 128), (40, 32), (8, 576), (136, 96)]  # N a multiple of 8 (groups), K of 32 (blocks)
K_SHAPES = [(16, 256), (40, 768)]  # for Q4_K, Q5_K and Q6_K: K a multiple of its 256-weight super-block
pytestmark = pytest.mark.skipif(not dot8_layout.host_supports(), reason="this CPU lacks AVX2, F16C or FMA")


def random_q5(n: int, k: int, rng: np.random.Generator, qtype: str = "Q5_0") -> np.ndarray:
    """Q5_0 (or Q5_1) blocks of random bytes (random nibbles and fifth bits) with small f16
    scales (and minimums), every fourth row's subnormal, as uint8 [n, k / 32 * block bytes]."""
    size, fields = (22, (0,)) if qtype == "Q5_0" else (24, (0, 2))
    raw = rng.integers(0, 256, size=(n, k // 32, size), dtype=np.uint8)
    for at in fields:
        d = rng.uniform(0.002, 0.02, size=(n, k // 32)) * rng.choice([-1, 1], size=(n, k // 32))
        d[::4] *= 1e-3
        raw[:, :, at : at + 2] = d.astype(np.float16).view(np.uint8).reshape(n, k // 32, 2)
    return raw.reshape(n, -1)


def weights(qtype: str, rng: np.random.Generator) -> list[tuple[int, int, np.ndarray]]:
    """(n, k, GGUF bytes [n, row bytes]) cases of one type."""
    q = QUANT_TYPES[qtype]
    if q.block == 256:
        return [(n, k, random_blocks(qtype, n, k, rng)) for n, k in K_SHAPES]
    out = []
    for n, k in SHAPES:
        w = rng.standard_normal((n, k)).astype(np.float32)
        out.append((n, k, quants.quantize(w, GGMLQuantizationType[qtype])))
    if qtype in ("Q5_0", "Q5_1"):
        out += [(n, k, random_q5(n, k, rng, qtype)) for n, k in SHAPES[:2]]
    return out


def kernel_module(qtype: str, n: int, k: int) -> str:
    q = QUANT_TYPES[qtype]
    planes = dot8.plane_types(q, n, k)
    text = "".join(
        f'util.global private @{p} = #flow.parameter.named<"model"::"{p}"> : {t}\n' for p, t in planes.items()
    )
    text += dot8.render_decode(q, n, k) + dot8.render_prefill(q, n, k)
    text += dot8.render_decode(q, n, k, 3) + dot8.render_decode(q, n, k, 9)
    loads = "".join(f"  %{p} = util.global.load @{p} : {t}\n" for p, t in planes.items())
    names, types = ", ".join(f"%{p}" for p in planes), ", ".join(planes.values())
    for fn, callee, t in (
        ("mv", dot8.decode_name(q, n, k), "1"), ("mm", dot8.prefill_name(q, n, k), "?"),
        ("b3", dot8.decode_name(q, n, k, 3), "3"), ("b9", dot8.decode_name(q, n, k, 9), "9"),
    ):  # fmt: skip
        arg, res = f"tensor<{t}x{k}xf32>", f"tensor<{t}x{n}xf32>"
        text += (
            f"func.func @{fn}(%x: {arg}) -> {res} {{\n{loads}"
            f"  %y = func.call @{callee}({names}, %x) : ({types}, {arg}) -> {res}\n  return %y : {res}\n}}\n"
        )
    return text


VNNI_FORMS = [
    pytest.param("avx2", id="avx2"),
    pytest.param(
        "vnni", id="vnni", marks=pytest.mark.skipif(not dot8_layout.host_vnni(), reason="this CPU lacks VNNI")
    ),
    pytest.param(
        "wide",
        id="wide",
        marks=pytest.mark.skipif(not dot8_layout.host_wide(), reason="this CPU lacks AVX-512 VNNI"),
    ),
]


def set_form(mp: pytest.MonkeyPatch, form: str) -> None:
    """The kernels' instruction form: "avx2", "vnni" or "wide" (512-bit VNNI)."""
    mp.setenv("ZINC_CPU_VNNI", "0" if form == "avx2" else "1")
    mp.setenv("ZINC_CPU_WIDE", "1" if form == "wide" else "0")


def compile_jobs(test: str, params: Mapping[str, Any]) -> list[KernelJob]:
    """The modules each test below compiles (tests/compile_pool.py compiles them ahead)."""
    if test != "test_dot8_kernels_match_dequantize":
        return []
    with pytest.MonkeyPatch.context() as mp:
        set_form(mp, params["form"])
        shapes = [(n, k) for n, k, _ in weights(params["qtype"], np.random.default_rng(5))]
        return [(kernel_module(params["qtype"], n, k), "cpu", ()) for n, k in shapes]


@pytest.mark.parametrize("form", VNNI_FORMS)
@pytest.mark.parametrize("device", device_params("cpu", "cpu-task"))
@pytest.mark.parametrize("qtype", list(dot8_layout.DOT8_TYPES))
def test_dot8_kernels_match_dequantize(
    qtype: str, device: str, form: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_form(monkeypatch, form)
    assert dot8_layout.vnni() == (form != "avx2") and dot8_layout.wide_enabled() == (form == "wide")
    # the 512-bit form pairs the groups of 8 rows where their count is even (the shapes have both),
    # in the planes and so in every kernel, the single-token one compared bit for bit below too
    if form == "wide" and qtype in dot8_layout.WIDE_TYPES:
        shapes = [n for n, _, _ in weights(qtype, np.random.default_rng(0))]
        assert {dot8_layout.lanes(QUANT_TYPES[qtype], n, 9) for n in shapes} == {8, 16}
        assert {dot8_layout.lanes(QUANT_TYPES[qtype], n, 1) for n in shapes} == {8, 16}
    spec = DEVICES[device]()
    q = QUANT_TYPES[qtype]
    rng = np.random.default_rng(5)
    for n, k, raw in weights(qtype, rng):
        ref_w = quants.dequantize(raw, GGMLQuantizationType[qtype]).astype(np.float64)
        planes = dot8.repack(q, raw.reshape(-1).view(np.uint8), n, k)
        if q.block == 32:  # a byte shuffle, same size
            assert sum(p.nbytes for p in planes.values()) == raw.nbytes
        if qtype in ("Q4_K", "Q5_K"):  # a byte of scale and of minimum per 32 weights: 4 more bytes per 256
            assert sum(p.nbytes for p in planes.values()) == raw.nbytes + 4 * (n * k // 256)
        if qtype in ("Q5_0", "Q5_1"):  # the quantized floats use every fifth-bit value and quant 0..31
            at = 2 if qtype == "Q5_0" else 4
            qh = raw.reshape(n, k // 32, q.block_bytes)[:, :, at : at + 4].copy().view("<u4")
            assert 0 < np.unpackbits(qh.view(np.uint8)).mean() < 1
        mod = LoadedModule(
            compile_kernel(kernel_module(qtype, n, k), spec.target), spec.uri, parameter_arrays=planes
        )
        # activations with outliers, one all-zero block and one block at a single value
        x = (rng.standard_normal((9, k)) * np.exp(2 * rng.standard_normal((9, k)))).astype(np.float32)
        x[1, :32] = 0.0
        x[2, :32] = -3.5
        exact = x.astype(np.float64) @ ref_w.T
        ref = q8_round(x.astype(np.float64)) @ ref_w.T
        scale = np.abs(ref).max()
        y = to_host(mod.fn("mm")(mod.to_device(x)), mod.device)
        assert y.shape == (9, n)
        assert np.abs(y - ref).max() / scale < 1e-5, f"{qtype} prefill {n}x{k}"
        y1 = to_host(mod.fn("mv")(mod.to_device(x[4:5])), mod.device)
        assert np.abs(y1 - ref[4:5]).max() / scale < 1e-5, f"{qtype} decode {n}x{k}"
        y3 = to_host(mod.fn("b3")(mod.to_device(x[:3])), mod.device)
        assert np.abs(y3 - ref[:3]).max() / scale < 1e-5, f"{qtype} batched decode of 3 rows {n}x{k}"
        y9 = to_host(mod.fn("b9")(mod.to_device(x)), mod.device)
        assert np.abs(y9 - ref).max() / scale < 1e-5, f"{qtype} batched decode of 9 rows {n}x{k}"
        # each row of a batch is computed exactly as that token alone would be
        assert np.array_equal(y9[4:5], y1), f"{qtype}: a batch row differs from the single-token kernel"
        assert np.array_equal(y[4:5], y1), f"{qtype}: a prompt row differs from the single-token kernel"
        # and the rounding costs what Q8 costs: a few percent of the largest output at most
        assert np.abs(y1 - exact[4:5]).max() / np.abs(exact[4:5]).max() < 5e-2


def test_dot8_layout_applies_to_whole_groups_of_the_byte_types() -> None:
    q41 = QUANT_TYPES["Q4_1"]
    assert dot8_layout.supports(q41, 40, 64) and not dot8_layout.supports(q41, 36, 64)
    q50 = QUANT_TYPES["Q5_0"]
    assert dot8_layout.supports(q50, 64, 64) and dot8_layout.supports(q50, 2048, 640) and not dot8_layout.supports(q50, 36, 64)
    assert dot8_layout.supports(QUANT_TYPES["Q5_1"], 64, 64) and not dot8_layout.supports(QUANT_TYPES["F16"], 64, 64)
    assert dot8_layout.supports(QUANT_TYPES["Q5_K"], 16, 512) and not dot8_layout.supports(QUANT_TYPES["Q5_K"], 16, 96)
    q4k = QUANT_TYPES["Q4_K"]
    assert dot8_layout.supports(q4k, 16, 512) and not dot8_layout.supports(q4k, 16, 96)
    assert dot8_layout.supports(QUANT_TYPES["Q6_K"], 8, 256)


def test_the_reference_rounds_activations_for_every_type_the_kernels_take() -> None:
    """zinc.model.reference follows these kernels' Q8 rounding by type; a type added here and not
    there (Q5_1 and Q5_K were) fails the sizes tier's comparisons only."""
    from zinc.model.reference import Q8_WEIGHTS

    assert set(Q8_WEIGHTS) == set(dot8_layout.DOT8_TYPES)


def test_int8_kernels_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZINC_CPU_INT8", "0")
    assert not dot8_layout.enabled()
    monkeypatch.setenv("ZINC_CPU_INT8", "1")
    assert dot8_layout.enabled() == dot8_layout.host_supports()


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0", "Q6_K"])
def test_prefetch_changes_no_result(qtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The quants' software prefetch (on by default; its last groups' run past the plane) gives
    the same bits as the kernels without it, for one row, a batch and a prompt chunk. The first
    shape has an even number of groups, so on a host with AVX-512 VNNI the batch and prompt
    kernels of each type prefetch for two groups side by side."""
    spec = DEVICES["cpu"]()
    q = QUANT_TYPES[qtype]
    n, k, raw = weights(qtype, np.random.default_rng(7))[0]
    assert (n // dot8_layout.G) % 2 == 0
    planes = dot8.repack(q, raw.reshape(-1).view(np.uint8), n, k)
    x = np.random.default_rng(8).standard_normal((9, k)).astype(np.float32)
    outs = []
    for ahead in (str(dot8.PREFETCH_BLOCKS), "0"):
        monkeypatch.setenv("ZINC_CPU_PREFETCH", ahead)
        text = kernel_module(qtype, n, k)
        assert ("memref.prefetch" in text) == (ahead != "0")
        assert ("locality<2>" in text) == (ahead != "0")  # into L2
        mod = LoadedModule(compile_kernel(text, spec.target), spec.uri, parameter_arrays=planes)
        outs.append([to_host(mod.fn(f)(mod.to_device(x[:r])), mod.device) for f, r in (("mv", 1), ("b9", 9), ("mm", 9))])
    for with_prefetch, without in zip(*outs, strict=True):
        assert np.array_equal(with_prefetch, without)


def test_a_bad_prefetch_distance_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZINC_CPU_PREFETCH", "2k")
    with pytest.raises(ZincError, match="ZINC_CPU_PREFETCH must be a whole number of blocks"):
        dot8.prefetch_blocks()
    monkeypatch.setenv("ZINC_CPU_PREFETCH", "")
    assert dot8.prefetch_blocks() == dot8.PREFETCH_BLOCKS


def _workgroup_count(text: str, name: str) -> int:
    """The workgroup count of kernel `name`'s export in a module's text: its constant, or for a
    prompt chunk's kernel the constant per 8-row tile."""
    export = text[text.index(f"stream.executable private @{name}_ex") :]
    key = "%nwg = arith.constant " if "%nwg = " in export.split("builtin.module", 1)[0] else "%x = arith.constant "
    return int(export.split(key, 1)[1].split(" ", 1)[0])


@pytest.mark.parametrize("qtype", ["Q4_0", "Q6_K"])
def test_a_large_matrix_splits_finer_and_gives_the_same_bits(qtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Over `SPLIT_BYTES` of weights or more a batch kernel runs in `BATCH_SPLIT` workgroups per
    CPU instead of one, and a prompt chunk's in `PREFILL_SPLIT` per tile instead of
    `PREFILL_WORKGROUPS`; each output is still summed by one workgroup in the same order, so the
    results are bit for bit those of the coarser split. One token's kernel keeps one per CPU."""
    spec = DEVICES["cpu"]()
    q = QUANT_TYPES[qtype]
    n, k = 2048, 256  # 128 units of 16 rows (64 of 8 on an AVX2 host): finer splits below 32 CPUs
    rng = np.random.default_rng(9)
    raw = (
        random_blocks(qtype, n, k, rng)
        if q.block == 256
        else quants.quantize(rng.standard_normal((n, k)).astype(np.float32), GGMLQuantizationType[qtype])
    )
    planes = dot8.repack(q, raw.reshape(-1).view(np.uint8), n, k)
    x = np.random.default_rng(10).standard_normal((9, k)).astype(np.float32)
    names = [dot8.decode_name(q, n, k, 9), dot8.prefill_name(q, n, k), dot8.decode_name(q, n, k)]
    outs, counts = [], []
    for threshold in (dot8.SPLIT_BYTES, 0):  # this matrix is small: 0 makes it "large"
        monkeypatch.setattr(dot8, "SPLIT_BYTES", threshold)
        text = kernel_module(qtype, n, k)
        counts.append([_workgroup_count(text, name) for name in names])
        mod = LoadedModule(compile_kernel(text, spec.target), spec.uri, parameter_arrays=planes)
        outs.append([to_host(mod.fn(f)(mod.to_device(x[:r])), mod.device) for f, r in (("b9", 9), ("mm", 9), ("mv", 1))])
    cpus = dot8._workgroups(prefill=False)
    units = [n // dot8_layout.lanes(q, n, r) for r in (9, 8, 1)]

    def count(u: int, wanted: int) -> int:  # as dot8._render spreads u units over `wanted` workgroups
        return -(-u // max(1, -(-u // wanted)))

    assert counts[0] == [count(units[0], cpus), count(units[1], dot8.PREFILL_WORKGROUPS), count(units[2], cpus)]
    assert counts[1] == [count(units[0], dot8.BATCH_SPLIT * cpus), count(units[1], dot8.PREFILL_SPLIT), counts[0][2]]
    assert counts[1][0] > counts[0][0] and counts[1][1] > counts[0][1]
    for coarse, fine in zip(*outs, strict=True):
        assert np.array_equal(coarse, fine)
