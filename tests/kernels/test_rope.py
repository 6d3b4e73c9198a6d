"""Tier 2: RoPE on the device (compiler/emitter.py `Body.rope`, adjacent pairs; `Body.rope_neox`,
dim i with dim i + head_dim/2, as qwen2, qwen3 and gemma3 take it).

On the CPU, where every dim rotates and the head is a multiple of 16 wide, the q projection takes
the hand-written dispatch of mlir/rope_norm_cpu.mlir; partial rotary, `by_hand=False` (the k
projection, which IREE fuses with the rounding to the slab's type), a module without the CPU's
kernels and Vulkan take the linalg form of mlir/rope_norm.mlir. Each must match the float64
rotation, and a row must come out the same alone ([1, n]) as among others ([T, n]).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pytest

from fixtures.real_shapes import llama3_rope_factors
from tests.compile_pool import KernelJob, compile_kernel
from tests.conftest import DEVICES, KERNEL_FORMS, target_of
from zinc.compiler.emitter import Body, ModuleEmitter
from zinc.runtime.device import to_host
from zinc.runtime.module import LoadedModule

HEADS, BASE = 3, 10000.0


def module_of(rope: Callable[[Body], str], hd: int, cpu: bool, name: str) -> str:
    """A module of two entries applying `rope(body)` to x at positions start..: `rows` ([T, n])
    and `one` ([1, n])."""
    mod = ModuleEmitter(tiled=cpu)  # tiled: the CPU's kernels
    n = HEADS * hd
    rows, one = Body(mod, dynamic=True), Body(mod, dynamic=False)
    out, single = rope(rows), rope(one)
    lines = [f"func.func @rows(%x: tensor<?x{n}xf32>, %start: index) -> tensor<?x{n}xf32> {{", "  %c0 = arith.constant 0 : index"]
    lines += [f"  %T = tensor.dim %x, %c0 : tensor<?x{n}xf32>", *rows.lines, f"  return {out} : tensor<?x{n}xf32>", "}"]
    lines += [f"func.func @one(%x: tensor<1x{n}xf32>, %start: index) -> tensor<1x{n}xf32> {{", "  %T = arith.constant 1 : index"]
    lines += [*one.lines, f"  return {single} : tensor<1x{n}xf32>", "}"]
    mod.entries.append("\n".join(lines))
    return mod.text(name)


def rope_module(hd: int, n_rot: int, cpu: bool, by_hand: bool, factors: tuple[float, ...] = ()) -> str:
    return module_of(
        lambda b: b.rope("%x", "%start", HEADS, hd, n_rot, BASE, "roped", by_hand, factors), hd, cpu, "rope"
    )


def reference(x: np.ndarray, start: int, hd: int, n_rot: int, factors: tuple[float, ...] = ()) -> np.ndarray:
    out = x.astype(np.float64).reshape(len(x), HEADS, hd)
    pos = np.arange(start, start + len(x), dtype=np.float64)[:, None]
    theta = pos * BASE ** (-2.0 * np.arange(n_rot // 2) / n_rot) / np.asarray(factors or 1.0)
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    x0, x1 = out[..., 0:n_rot:2].copy(), out[..., 1:n_rot:2].copy()
    out[..., 0:n_rot:2], out[..., 1:n_rot:2] = x0 * cos - x1 * sin, x0 * sin + x1 * cos
    return out.reshape(len(x), -1)


def test_only_q_and_full_rotary_take_the_cpu_dispatch() -> None:
    assert "rope_norm_cpu" in rope_module(64, 64, cpu=True, by_hand=True)
    assert "rope_norm_cpu" not in rope_module(64, 64, cpu=True, by_hand=False)  # k: IREE fuses the linalg form
    assert "rope_norm_cpu" not in rope_module(32, 16, cpu=True, by_hand=True)  # partial rotary


def compile_jobs(test: str, params: Mapping[str, Any]) -> list[KernelJob]:
    """The module each test below compiles (tests/compile_pool.py compiles them ahead)."""
    target, cpu = target_of(params.get("device", "cpu")), params.get("cpu", False)
    if test == "test_rope_matches_the_rotation_alone_and_in_rows":
        return [(rope_module(params["hd"], params["n_rot"], cpu, by_hand=True), target, ())]
    if test == "test_rope_with_frequency_factors_at_long_context":
        factors = tuple(float(f) for f in llama3_rope_factors(params["n_rot"], BASE, 8.0, old_ctx=512))
        return [(rope_module(params["hd"], params["n_rot"], cpu, by_hand=True, factors=factors), target, ())]
    if test == "test_neox_rope_matches_the_rotation_alone_and_in_rows":
        return [(neox_module(params["hd"], cpu), target, ())]
    return []


@pytest.mark.parametrize(("hd", "n_rot"), [(64, 64), (32, 16)])
@pytest.mark.parametrize(("device", "cpu"), KERNEL_FORMS)
def test_rope_matches_the_rotation_alone_and_in_rows(hd: int, n_rot: int, device: str, cpu: bool) -> None:
    spec = DEVICES[device]()
    text = rope_module(hd, n_rot, cpu, by_hand=True)
    assert ("rope_norm_cpu" in text) == (cpu and n_rot == hd)
    mod = LoadedModule(compile_kernel(text, spec.target), spec.uri)
    x = np.random.default_rng(9).standard_normal((5, HEADS * hd)).astype(np.float32)
    start = 37
    got = to_host(mod.fn("rows")(mod.to_device(x), start), mod.device)
    np.testing.assert_allclose(got, reference(x, start, hd, n_rot), rtol=1e-4, atol=1e-4)
    for i in range(len(x)):
        one = to_host(mod.fn("one")(mod.to_device(x[i : i + 1]), start + i), mod.device)
        assert np.array_equal(one[0], got[i]), f"row {i} alone differs from the same row among others"


@pytest.mark.parametrize(("hd", "n_rot"), [(64, 64), (32, 16)])
@pytest.mark.parametrize(("device", "cpu"), KERNEL_FORMS)
def test_rope_with_frequency_factors_at_long_context(hd: int, n_rot: int, device: str, cpu: bool) -> None:
    """Llama 3.1's per-pair frequency factors (1 for fast pairs, 8 for slow ones, smooth between)
    at positions past 32K, where ignoring them would turn the slow pairs by whole radians. The
    tolerance is the f32 rounding of such angles (pair 0's, 33000 rad, has an ulp of 4e-3: errors
    up to 7.5e-3 on Vulkan, 6.4e-3 on the CPU, with |x| up to 3.5)."""
    factors = tuple(float(f) for f in llama3_rope_factors(n_rot, BASE, 8.0, old_ctx=512))
    assert factors[0] == 1.0 and factors[-1] == 8.0 and any(1.0 < f < 8.0 for f in factors)
    spec = DEVICES[device]()
    text = rope_module(hd, n_rot, cpu, by_hand=True, factors=factors)
    assert ("rope_norm_cpu" in text) == (cpu and n_rot == hd)
    mod = LoadedModule(compile_kernel(text, spec.target), spec.uri)
    x = np.random.default_rng(10).standard_normal((5, HEADS * hd)).astype(np.float32)
    start = 33000
    got = to_host(mod.fn("rows")(mod.to_device(x), start), mod.device)
    np.testing.assert_allclose(got, reference(x, start, hd, n_rot, factors), rtol=0, atol=2e-2)
    assert np.abs(got - reference(x, start, hd, n_rot)).max() > 0.5  # the factors matter here
    for i in range(len(x)):
        one = to_host(mod.fn("one")(mod.to_device(x[i : i + 1]), start + i), mod.device)
        assert np.array_equal(one[0], got[i]), f"row {i} alone differs from the same row among others"


def neox_module(hd: int, cpu: bool, bias: np.ndarray | None = None) -> str:
    def rope(b: Body) -> str:
        bias_value = None
        if bias is not None:  # a constant in the module, as a projection's bias loaded from the GGUF
            bias_value = b.fresh("bias")
            values = ", ".join(f"{v:.9e}" for v in bias)
            b.emit(f"{bias_value} = arith.constant dense<[{values}]> : tensor<{len(bias)}xf32>")
        return b.rope_neox("%x", "%start", HEADS, hd, BASE, 0.5, "roped", bias=bias_value)

    return module_of(rope, hd, cpu, "rope_neox")


def neox_reference(x: np.ndarray, start: int, hd: int, freq_scale: float) -> np.ndarray:
    out = x.astype(np.float64).reshape(len(x), HEADS, hd)
    half = hd // 2
    pos = np.arange(start, start + len(x), dtype=np.float64)[:, None] * freq_scale
    theta = pos * BASE ** (-2.0 * np.arange(half) / hd)
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    x0, x1 = out[..., :half].copy(), out[..., half:].copy()
    out[..., :half], out[..., half:] = x0 * cos - x1 * sin, x0 * sin + x1 * cos
    return out.reshape(len(x), -1)


@pytest.mark.parametrize("hd", [64, 256])
@pytest.mark.parametrize(("device", "cpu"), KERNEL_FORMS)
def test_neox_rope_matches_the_rotation_alone_and_in_rows(hd: int, device: str, cpu: bool) -> None:
    spec = DEVICES[device]()
    mod = LoadedModule(compile_kernel(neox_module(hd, cpu), spec.target), spec.uri)
    x = np.random.default_rng(11).standard_normal((5, HEADS * hd)).astype(np.float32)
    start = 41
    got = to_host(mod.fn("rows")(mod.to_device(x), start), mod.device)
    np.testing.assert_allclose(got, neox_reference(x, start, hd, 0.5), rtol=1e-4, atol=1e-4)
    for i in range(len(x)):
        one = to_host(mod.fn("one")(mod.to_device(x[i : i + 1]), start + i), mod.device)
        assert np.array_equal(one[0], got[i]), f"row {i} alone differs from the same row among others"


@pytest.mark.parametrize(("device", "cpu"), KERNEL_FORMS)
def test_neox_rope_adds_a_projection_bias_before_it_rotates(device: str, cpu: bool) -> None:
    """qwen2's attn_q/k.bias, added inside the RoPE dispatch: RoPE of x + bias, each half its own
    part of the bias."""
    spec, hd = DEVICES[device](), 64
    rng = np.random.default_rng(12)
    bias = rng.standard_normal(HEADS * hd).astype(np.float32)
    mod = LoadedModule(compile_kernel(neox_module(hd, cpu, bias), spec.target), spec.uri)
    x = rng.standard_normal((4, HEADS * hd)).astype(np.float32)
    got = to_host(mod.fn("rows")(mod.to_device(x), 7), mod.device)
    np.testing.assert_allclose(got, neox_reference(x + bias, 7, hd, 0.5), rtol=1e-4, atol=1e-4)


def test_neox_rope_writes_both_halves_in_its_own_dispatch() -> None:
    """No copy dispatches: the rotated halves put side by side after the loop cost IREE one each
    (four a layer, q's and k's; 112 of a Qwen 2.5 1.5B decode step's 510)."""
    vmfb = compile_kernel(neox_module(64, cpu=True), "cpu")
    assert b"memcpy" not in vmfb
