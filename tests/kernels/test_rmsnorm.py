"""Tier 2: RMSNorm on the device (compiler/emitter.py `Body.rmsnorm`).

On the CPU a width that is a multiple of 16 takes the hand-written dispatch of
mlir/rmsnorm_cpu.mlir (the sum of squares in 16 lanes); other widths, and Vulkan, take the linalg
form of mlir/rmsnorm.mlir. Each must match the float64 reference, and a row must come out the same
alone (the one-token body, [1, d]) as among others (the dynamic body, [T, d]). The residual add
and the norm in one dispatch (`Body.add_rmsnorm`, mlir/add_rmsnorm_cpu.mlir) must give the bits
of the two run apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from tests.compile_pool import KernelJob, compile_kernel
from tests.conftest import DEVICES, KERNEL_FORMS, target_of
from zinc.compiler.emitter import Body, ModuleEmitter
from zinc.runtime.device import to_host
from zinc.runtime.module import LoadedModule

EPS = 1e-5


def norm_module(d: int, cpu: bool) -> str:
    mod = ModuleEmitter(tiled=cpu)  # tiled: the CPU's kernels
    rows = Body(mod, dynamic=True)
    out = rows.rmsnorm("%x", "%w", d, EPS, "normed")
    one = Body(mod, dynamic=False)
    single = one.rmsnorm("%x", "%w", d, EPS, "normed")
    lines = [f"func.func @rows(%x: tensor<?x{d}xf32>, %w: tensor<{d}xf32>) -> tensor<?x{d}xf32> {{", *rows.lines]
    lines += [f"  return {out} : tensor<?x{d}xf32>", "}"]
    lines += [f"func.func @one(%x: tensor<1x{d}xf32>, %w: tensor<{d}xf32>) -> tensor<1x{d}xf32> {{", *one.lines]
    lines += [f"  return {single} : tensor<1x{d}xf32>", "}"]
    mod.entries.append("\n".join(lines))
    return mod.text("rmsnorm")


def compile_jobs(test: str, params: Mapping[str, Any]) -> list[KernelJob]:
    """The module each test below compiles (tests/compile_pool.py compiles them ahead)."""
    render = {
        "test_rmsnorm_matches_the_reference_alone_and_in_rows": norm_module,
        "test_add_rmsnorm_gives_the_bits_of_the_add_and_the_norm_apart": add_norm_module,
    }.get(test)
    return [(render(params["d"], params["cpu"]), target_of(params["device"]), ())] if render else []


@pytest.mark.parametrize("d", [576, 40])
@pytest.mark.parametrize(("device", "cpu"), KERNEL_FORMS)
def test_rmsnorm_matches_the_reference_alone_and_in_rows(d: int, device: str, cpu: bool) -> None:
    spec = DEVICES[device]()
    text = norm_module(d, cpu)
    assert ("rmsnorm_cpu" in text) == (cpu and d % 16 == 0)
    mod = LoadedModule(compile_kernel(text, spec.target), spec.uri)
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((6, d)) * rng.uniform(0.01, 30.0, (6, 1))).astype(np.float32)
    x[3] = 0.0  # all zero: eps keeps it finite, the output is 0
    x[4, 7] = 1e4  # one outlier dominates the mean
    w = rng.standard_normal(d).astype(np.float32)
    wide = x.astype(np.float64)
    ref = wide / np.sqrt((wide**2).mean(axis=1, keepdims=True) + EPS) * w
    got = to_host(mod.fn("rows")(mod.to_device(x), mod.to_device(w)), mod.device)
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=1e-6)
    for i in range(len(x)):
        one = to_host(mod.fn("one")(mod.to_device(x[i : i + 1]), mod.to_device(w)), mod.device)
        assert np.array_equal(one[0], got[i]), f"row {i} alone differs from the same row among others"


def add_norm_module(d: int, cpu: bool) -> str:
    """`fused`: Body.add_rmsnorm of x + r; `apart`: the add and the norm as two calls."""
    mod = ModuleEmitter(tiled=cpu)
    fused, apart = Body(mod, dynamic=True), Body(mod, dynamic=True)
    s, y = fused.add_rmsnorm("%x", "%r", "%w", d, EPS, "normed")
    s2 = apart.elementwise("add", "%x", "%r", d, "sum")
    y2 = apart.rmsnorm(s2, "%w", d, EPS, "normed")
    one = Body(mod, dynamic=False)
    s1, y1 = one.add_rmsnorm("%x", "%r", "%w", d, EPS, "normed")
    act, single = f"tensor<?x{d}xf32>", f"tensor<1x{d}xf32>"
    for name, body, outs, ty in (("fused", fused, (s, y), act), ("apart", apart, (s2, y2), act), ("one", one, (s1, y1), single)):
        lines = [f"func.func @{name}(%x: {ty}, %r: {ty}, %w: tensor<{d}xf32>) -> ({ty}, {ty}) {{", *body.lines]
        lines += [f"  return {outs[0]}, {outs[1]} : {ty}, {ty}", "}"]
        mod.entries.append("\n".join(lines))
    return mod.text("add_rmsnorm")


@pytest.mark.parametrize("d", [576, 40])
@pytest.mark.parametrize(("device", "cpu"), KERNEL_FORMS)
def test_add_rmsnorm_gives_the_bits_of_the_add_and_the_norm_apart(d: int, device: str, cpu: bool) -> None:
    spec = DEVICES[device]()
    text = add_norm_module(d, cpu)
    assert ("add_rmsnorm_cpu" in text) == (cpu and d % 16 == 0)
    mod = LoadedModule(compile_kernel(text, spec.target), spec.uri)
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((5, d)) * rng.uniform(0.01, 30.0, (5, 1))).astype(np.float32)
    r = (rng.standard_normal((5, d)) * rng.uniform(0.01, 30.0, (5, 1))).astype(np.float32)
    r[2] = -x[2]  # the sum is all zero: eps keeps the norm finite
    w = rng.standard_normal(d).astype(np.float32)
    args = [mod.to_device(a) for a in (x, r, w)]
    s, y = (to_host(v, mod.device) for v in mod.fn("fused")(*args))
    s2, y2 = (to_host(v, mod.device) for v in mod.fn("apart")(*args))
    assert np.array_equal(s, x + r)
    assert np.array_equal(s, s2) and np.array_equal(y, y2)
    for i in range(len(x)):
        row = [mod.to_device(a[i : i + 1]) for a in (x, r)]
        s1, y1 = (to_host(v, mod.device) for v in mod.fn("one")(*row, args[2]))
        assert np.array_equal(s1[0], s[i]) and np.array_equal(y1[0], y[i]), f"row {i} alone differs"
