"""Tier 2: f32 rounded to f16 with integer ops (compiler/bitops.py `f32_to_f16_bits`) and Vulkan's
f16x2 KV rows (compiler/paged.py `to_slab`), on the CPU and on Vulkan, against numpy.

The Vulkan KV slab holds f16 values two to an i32 word, because IREE 3.13's generic Vulkan target
computes f16 tensors wrong: the rounding must be numpy's `astype(np.float16)` bit for bit (the
reference model rounds the cached K/V so), ties to even included, past f16's range to inf, into
f16's subnormals, and to (signed) zero below them, and widening the bits again
(`f16_bits_to_f32` with `specials`) must give the half's value, inf and nan included. The packed
rows must be numpy's f16 rows viewed as int32 (value d in word d // 2, the low half for even d).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from tests.compile_pool import compile_kernel
from tests.conftest import DEVICES, device_params
from zinc.compiler import paged
from zinc.compiler.bitops import f16_bits_to_f32, f32_to_f16_bits
from zinc.compiler.emitter import Body, ModuleEmitter
from zinc.runtime.device import to_host
from zinc.runtime.module import LoadedModule

NKV, HD = 3, 64


def bits_module() -> str:
    """`bits(x [N] f32) -> [N] i32` (the half's bits) and `back(x) -> [N] f32` (rounded to f16 and
    widened), and `rows(x [T, NKV, HD]) -> (packed words, rows read back)`, `to_slab` for f16x2."""
    mod = ModuleEmitter()
    assert mod.kv_dtype == "f16x2"  # not tiled: Vulkan's slab
    vec, ivec = "tensor<?xf32>", "tensor<?xi32>"
    ident = "affine_map<(i) -> (i)>"
    funcs = []
    for name, out_t, body in (
        ("bits", "i32", [f32_to_f16_bits("%x", "%h"), "      linalg.yield %h : i32"]),
        ("back", "f32", [f32_to_f16_bits("%x", "%h"), f16_bits_to_f32("%h", "%w", specials=True), "      linalg.yield %w : f32"]),
    ):  # fmt: skip
        ty = ivec if out_t == "i32" else vec
        funcs.append("\n".join([
            f"func.func @{name}(%in: {vec}) -> {ty} {{",
            "  %c0 = arith.constant 0 : index",
            f"  %n = tensor.dim %in, %c0 : {vec}",
            f"  %e = tensor.empty(%n) : {ty}",
            f'  %r = linalg.generic {{indexing_maps = [{ident}, {ident}], iterator_types = ["parallel"]}} '
            f"ins(%in : {vec}) outs(%e : {ty}) {{",
            f"    ^bb0(%x: f32, %o: {out_t}):",
            *body,
            f"  }} -> {ty}",
            f"  return %r : {ty}",
            "}",
        ]))  # fmt: skip
    b = Body(mod, dynamic=True)
    rows = f"tensor<?x{NKV}x{HD}xf32>"
    b.emit("%c0 = arith.constant 0 : index")
    b.emit(f"%T = tensor.dim %k, %c0 : {rows}")
    words, back = paged.to_slab(b, "%k", "?", NKV, HD)
    packed = paged.rows_of("?", NKV, HD, mod.kv_dtype)
    funcs.append("\n".join([
        f"func.func @rows(%k: {rows}) -> ({packed}, {rows}) {{",
        *b.lines,
        f"  return {words}, {back} : {packed}, {rows}",
        "}",
    ]))  # fmt: skip
    mod.entries.extend(funcs)
    return mod.text("f16_bits")


EDGES = [
    65504.0, 65519.99, 65520.0, 65536.0, 1e5, 3e38, np.inf,  # the largest half, a tie below inf, overflow
    2.0**-14, 2.0**-14 - 2.0**-25, 2.0**-24, 2.0**-25, 2.0**-25 * (1 + 2.0**-23), 1.5 * 2.0**-24,  # subnormal edges
    2.0**-26, 1e-10, 1e-30, 1e-40, 1.4e-45, 2.0**-126, 0.0, 1.0, 0.1, 1 / 3, np.nan,  # to 0, f32 denormals
]  # fmt: skip


def f16_boundary_values() -> np.ndarray:
    """f32 values at every edge of the rounding: normals, ties either way, overflow, subnormal
    halves and ties between them, values that round to zero, signed zeros, inf, nan, f32 denormals."""
    rng = np.random.default_rng(3)
    halves = rng.integers(0, 0x7C00, 4000, dtype=np.uint16).view(np.float16)  # every finite magnitude
    halves = np.concatenate([halves, np.arange(0, 0x400, dtype=np.uint16).view(np.float16)])  # all subnormals
    lo = halves.astype(np.float64)
    hi = np.nextafter(halves, np.float16(np.inf)).astype(np.float64)
    mid = ((lo + hi) / 2).astype(np.float32)  # exact: a half's midpoint has 12 significant bits
    ulp = np.float32(np.inf)
    values = [
        halves.astype(np.float32), mid, np.nextafter(mid, ulp), np.nextafter(mid, -ulp),
        rng.standard_normal(2000).astype(np.float32) * np.float32(3.0),
        (rng.uniform(-1, 1, 2000) * 2.0 ** rng.integers(-30, 17, 2000)).astype(np.float32),
        np.array(EDGES, np.float32),
    ]
    x = np.concatenate(values)
    return np.concatenate([x, -x]).astype(np.float32)


@functools.cache
def compiled(device: str) -> LoadedModule:
    spec = DEVICES[device]()
    return LoadedModule(compile_kernel(bits_module(), spec.target), spec.uri)


@pytest.mark.parametrize("device", device_params("cpu", "vulkan"))
def test_f32_rounds_to_f16_bits_as_numpy(device: str) -> None:
    mod = compiled(device)
    x = f16_boundary_values()
    with np.errstate(over="ignore"):
        expect = x.astype(np.float16)
    got = to_host(mod.fn("bits")(mod.to_device(x)), mod.device)
    assert (got >> 16 == 0).all()
    nan = np.isnan(x)
    bits = got.astype(np.uint16)
    assert np.isnan(bits[nan].view(np.float16)).all()
    wrong = np.flatnonzero((bits != expect.view(np.uint16)) & ~nan)
    assert wrong.size == 0, [(float(x[i]), hex(bits[i]), hex(int(expect.view(np.uint16)[i]))) for i in wrong[:8]]
    back = to_host(mod.fn("back")(mod.to_device(x)), mod.device)
    widened = expect.astype(np.float32)
    assert np.array_equal(back.view(np.uint32)[~nan], widened.view(np.uint32)[~nan])  # -0.0 and inf too
    assert np.isnan(back[nan]).all()


@pytest.mark.parametrize("device", device_params("cpu", "vulkan"))
def test_kv_rows_pack_as_numpy_views_f16_rows(device: str) -> None:
    mod = compiled(device)
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((5, NKV, HD)) * 2.0 ** rng.integers(-20, 12, (5, NKV, 1))).astype(np.float32)
    x[1, 0, :4] = [70000.0, -0.0, 1e-9, 2.0**-24 * 1.5]
    words, back = (to_host(a, mod.device) for a in mod.fn("rows")(mod.to_device(x)))
    with np.errstate(over="ignore"):
        halves = x.astype(np.float16)
    assert words.dtype == np.int32 and words.shape == (5, NKV, HD // 2)
    assert np.array_equal(words, halves.view(np.int32))
    assert np.array_equal(back.view(np.uint32), halves.astype(np.float32).view(np.uint32))
