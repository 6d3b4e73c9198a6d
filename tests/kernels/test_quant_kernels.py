"""Tier 2: every supported quant type's fused kernels against gguf's dequantize + numpy.

Each module holds the prefill matmul (dynamic T) and the decode matmul (T = 1), in the forms
the target's models take (on Vulkan over two reduction dims, the prefill's of a 32-weight block
type in its form over rows: zinc.compiler.subgroup_matmul), the embedding
row gather and the Vulkan GPU targets' prefill form (zinc.compiler.gemm: the weight dequantized,
then a GEMM; in f32, and on the CPU in f16 too, which lavapipe's target cannot run) for one type
and shape, with the weight bound as a parameter exactly as in a model.
Weights are valid GGUF blocks: `gguf.quants.quantize` of random floats where the gguf package
can quantize the type, otherwise random bytes with the f16 scale fields set to small finite
values (every other bit pattern of a K-quant block is valid). Every fourth row is tiny, so its
f16 scales are subnormal halves, as real Q6_K/Q4_K super-block scales often are. The reference is
`gguf.quants.dequantize` in float64, and errors are relative per weight row. A module is compiled once per target and loaded on each
device of that target (cpu and cpu-task share the llvm-cpu build).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from tests.compile_pool import KernelJob, compile_kernel
from tests.conftest import DEVICES, device_params, target_of
from zinc.compiler.bitops import bf16_to_f32, f16_to_f32
from zinc.compiler.gemm import dequant_name, gemm_name, render_dequant, render_gemm
from zinc.compiler.kernels import QUANT_TYPES, gather_name, matmul_name, render_gather, render_matmul
from zinc.runtime.device import to_host
from zinc.runtime.module import LoadedModule

Array = np.ndarray[Any, Any]

# (N rows out, K inputs) per block size; the K-quant shapes span one and three super-blocks.
SHAPES = {1: [(64, 128), (96, 32)], 32: [(64, 128), (96, 32), (32, 256)], 256: [(32, 256), (48, 768)]}
# byte offsets of the f16 fields of each K-quant block (d, and dmin where there is one)
F16_FIELDS = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def random_blocks(name: str, n: int, k: int, rng: np.random.Generator) -> Array:
    """Random valid blocks of a K-quant type, as uint8 [n, k / 256 * block_bytes]."""
    q = QUANT_TYPES[name]
    raw = rng.integers(0, 256, size=(n, k // q.block, q.block_bytes), dtype=np.uint8)
    shape = (n, k // q.block)
    for off in F16_FIELDS[name]:
        scale = rng.uniform(0.002, 0.02, size=shape) * rng.choice([-1, 1], size=shape)
        scale[::4] *= 1e-3  # subnormal halves: below 2^-14 = 6.1e-5
        raw[:, :, off : off + 2] = scale.astype(np.float16).view(np.uint8).reshape(*shape, 2)
    return raw.reshape(n, -1)


def quantized(name: str, n: int, k: int, rng: np.random.Generator) -> tuple[Array, Array]:
    """(parameter bytes as bound by zinc, dequantized float64 weights)."""
    q = QUANT_TYPES[name]
    w = rng.standard_normal((n, k)).astype(np.float32)
    w[::4] *= 1e-4  # their block scales (and F16 weights) are subnormal halves
    if name == "F32":
        return w, w.astype(np.float64)
    if name == "F16":
        h = w.astype(np.float16)
        return h.view(np.int8).reshape(n, k, 2), h.astype(np.float64)
    t = GGMLQuantizationType[name]
    raw = random_blocks(name, n, k, rng) if name in F16_FIELDS else quants.quantize(w, t)
    ref = quants.dequantize(raw, t).astype(np.float64)
    assert ref.shape == (n, k) and np.isfinite(ref).all()
    if name == "BF16":
        return raw.view(np.int8).reshape(n, k, 2), ref
    return raw.view(np.int8).reshape(n, k // q.block, q.block_bytes), ref


GEMM_ROWS = 5  # the rows of the GEMM functions' static x


def gemm_function(name: str, n: int, k: int, dt: str, rows: int = GEMM_ROWS) -> str:
    """`@gemm_<dt>`: x [rows, k] (static, as a padded prefill chunk's) times the weight `@w`
    dequantized to `dt`, as Body.linear calls the two on a Vulkan GPU target."""
    q = QUANT_TYPES[name]
    pt, wt = q.param_type(n, k), f"tensor<{n}x{k}x{dt}>"
    return (
        render_dequant(q, n, k, dt) + render_gemm(n, k, dt)
        + f"func.func @gemm_{dt}(%x: tensor<{rows}x{k}xf32>) -> tensor<{rows}x{n}xf32> {{\n"
        f"  %w = util.global.load @w : {pt}\n"
        f"  %wd = func.call @{dequant_name(q, n, k, dt)}(%w) : ({pt}) -> {wt}\n"
        f"  %xd = tensor.cast %x : tensor<{rows}x{k}xf32> to tensor<?x{k}xf32>\n"
        f"  %y = func.call @{gemm_name(n, k, dt)}(%xd, %wd) : (tensor<?x{k}xf32>, {wt}) -> tensor<?x{n}xf32>\n"
        f"  %ys = tensor.cast %y : tensor<?x{n}xf32> to tensor<{rows}x{n}xf32>\n"
        f"  return %ys : tensor<{rows}x{n}xf32>\n}}\n"
    )  # fmt: skip


def kernel_module(name: str, n: int, k: int, target: str) -> str:
    q = QUANT_TYPES[name]
    pt = q.param_type(n, k)
    text = f'util.global private @w = #flow.parameter.named<"model"::"w"> : {pt}\n'
    two = target == "vulkan"  # the forms the generic target's models take (zinc.compiler.subgroup_matmul)
    text += render_matmul(q, n, k, True, two, two) + render_matmul(q, n, k, False, two) + render_gather(q, n, k, True)
    text += "".join(gemm_function(name, n, k, dt) for dt in (("f32", "f16") if target == "cpu" else ("f32",)))
    for fn, callee, arg, res in (
        ("mm", matmul_name(q, n, k, True), f"tensor<?x{k}xf32>", f"tensor<?x{n}xf32>"),
        ("mv", matmul_name(q, n, k, False), f"tensor<1x{k}xf32>", f"tensor<1x{n}xf32>"),
        ("rows", gather_name(q, n, k, True), "tensor<?xi32>", f"tensor<?x{k}xf32>"),
    ):
        text += (
            f"func.func @{fn}(%x: {arg}) -> {res} {{\n  %w = util.global.load @w : {pt}\n"
            f"  %y = func.call @{callee}(%w, %x) : ({pt}, {arg}) -> {res}\n  return %y : {res}\n}}\n"
        )
    return text


@functools.cache
def compiled(name: str, n: int, k: int, target: str) -> bytes:
    return compile_kernel(kernel_module(name, n, k, target), target)


def compile_jobs(test: str, params: Mapping[str, Any]) -> list[KernelJob]:
    """The modules each test below compiles (tests/compile_pool.py compiles them ahead)."""
    target = target_of(params.get("device", "cpu"))
    if test == "test_kernels_match_dequantize":
        q = params["qtype"]
        return [(kernel_module(q, n, k, target), target, ()) for n, k in SHAPES[QUANT_TYPES[q].block]]
    if test == "test_half_decoding_is_exact":
        return [(decode_module(), target, ())]
    return []


def rel_err(y: Array, ref: Array, mag: Array) -> float:
    """Max abs error per weight row (a column of the result) over that row's max sum_k |x w|.

    Normalizing by sum |x w| rather than |sum x w| keeps a result that cancels to near zero from
    looking inaccurate, while a wrong scale on any one row still shows as a large error.
    """
    assert y.shape == ref.shape == mag.shape
    return float((np.abs(y - ref).max(axis=0) / mag.max(axis=0)).max())


def row_err(rows: Array, ref: Array) -> float:
    """Max abs error over max |ref| per gathered row."""
    return float((np.abs(rows - ref).max(axis=1) / np.abs(ref).max(axis=1)).max())


@pytest.mark.parametrize("device", device_params("cpu", "cpu-task", "vulkan"))
@pytest.mark.parametrize("qtype", list(QUANT_TYPES))
def test_kernels_match_dequantize(qtype: str, device: str) -> None:
    spec = DEVICES[device]()
    rng = np.random.default_rng(7)
    for n, k in SHAPES[QUANT_TYPES[qtype].block]:
        param, ref_w = quantized(qtype, n, k, rng)
        mod = LoadedModule(compiled(qtype, n, k, spec.target), spec.uri, parameter_arrays={"w": param})
        x = rng.standard_normal((5, k)).astype(np.float32)
        ref = x.astype(np.float64) @ ref_w.T
        mag = np.abs(x.astype(np.float64)) @ np.abs(ref_w.T)
        y = to_host(mod.fn("mm")(mod.to_device(x)), mod.device)
        assert y.shape == (5, n)
        assert rel_err(y, ref, mag) < 1e-5, f"{qtype} prefill matmul {n}x{k}: {rel_err(y, ref, mag):.2e}"
        y1 = to_host(mod.fn("mv")(mod.to_device(x[2:3])), mod.device)
        err1 = rel_err(y1, ref[2:3], mag[2:3])
        assert err1 < 1e-5, f"{qtype} decode matmul {n}x{k}: {err1:.2e}"
        ids = np.array([n - 1, 0, n // 2, 1, 4], np.int32)
        rows = to_host(mod.fn("rows")(mod.to_device(ids)), mod.device)
        assert rows.shape == (5, k)
        assert row_err(rows, ref_w[ids]) < 1e-6, f"{qtype} gather {n}x{k}: {row_err(rows, ref_w[ids]):.2e}"
        # f16 operands: each weight and input rounded to 11 significant bits
        for dt, tol in (("f32", 1e-5), ("f16", 2e-3)) if spec.target == "cpu" else (("f32", 1e-5),):
            yg = to_host(mod.fn(f"gemm_{dt}")(mod.to_device(x)), mod.device)
            assert yg.shape == (5, n)
            assert rel_err(yg, ref, mag) < tol, f"{qtype} {dt} GEMM {n}x{k}: {rel_err(yg, ref, mag):.2e}"


def test_random_blocks_are_varied_with_subnormal_scales() -> None:
    """The K-quant test data is not degenerate, and every fourth row has subnormal f16 scales."""
    rng = np.random.default_rng(0)
    for name in F16_FIELDS:
        raw = random_blocks(name, 8, 512, rng).reshape(8, 2, -1)
        for off in F16_FIELDS[name]:
            scales = np.abs(raw[:, :, off : off + 2].copy().view(np.float16)[..., 0].astype(np.float32))
            assert (scales[4] > 0).all() and (scales[4] < 2**-14).all(), name  # subnormal halves
            assert (scales[1] > 2**-14).all(), name
        ref = quants.dequantize(raw.reshape(8, -1), GGMLQuantizationType[name])
        assert len(np.unique(ref[1])) > 200, name


def decode_module() -> str:
    """@f16 and @bf16: every 16-bit pattern, given as little-endian byte pairs, decoded to f32."""
    text = ""
    for fn, frag in (("f16", f16_to_f32), ("bf16", bf16_to_f32)):
        text += f"""
func.func @{fn}(%x: tensor<65536x2xi8>) -> tensor<65536xf32> {{
  %lo = tensor.extract_slice %x[0, 0] [65536, 1] [1, 1] : tensor<65536x2xi8> to tensor<65536xi8>
  %hi = tensor.extract_slice %x[0, 1] [65536, 1] [1, 1] : tensor<65536x2xi8> to tensor<65536xi8>
  %e = tensor.empty() : tensor<65536xf32>
  %y = linalg.generic {{indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>, affine_map<(i) -> (i)>],
      iterator_types = ["parallel"]}} ins(%lo, %hi : tensor<65536xi8>, tensor<65536xi8>) outs(%e : tensor<65536xf32>) {{
    ^bb0(%l: i8, %h: i8, %o: f32):
{frag("%l", "%h", "%v")}
      linalg.yield %v : f32
  }} -> tensor<65536xf32>
  return %y : tensor<65536xf32>
}}
"""
    return text


@pytest.mark.parametrize("device", device_params("cpu", "vulkan"))
def test_half_decoding_is_exact(device: str) -> None:
    """Every finite f16 (subnormals and -0 included) and every bf16 decodes bit-exactly."""
    spec = DEVICES[device]()
    mod = LoadedModule(compile_kernel(decode_module(), spec.target), spec.uri)
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    x = mod.to_device(bits.view(np.int8).reshape(65536, 2))
    f16 = to_host(mod.fn("f16")(x), mod.device).view(np.uint32)
    finite = (bits & 0x7C00) != 0x7C00
    want = bits.view(np.float16).astype(np.float32).view(np.uint32)
    bad = np.flatnonzero(finite & (f16 != want))
    assert bad.size == 0, f"{bad.size} f16 patterns misdecoded, e.g. {[hex(b) for b in bits[bad[:4]]]}"
    bf16 = to_host(mod.fn("bf16")(x), mod.device).view(np.uint32)
    np.testing.assert_array_equal(bf16, bits.astype(np.uint32) << 16)
