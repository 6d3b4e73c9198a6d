"""Tier 2: the paged KV-cache ops (compiler/paged.py) on a slab with SmolLM2's geometry.

`kv_write` scatters rows into their slots in place and the prefill's gather reads them back by
slot (batched decode reads the slab inside its attention: tests/model/test_paged_batch.py). The slab is big enough that a single Vulkan scatter
dispatch would leave elements unwritten (IREE 3.13 writes only about 65,000 per dispatch), which
is why Vulkan artifacts scatter per layer; this test fails if that split is lost.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tests.conftest import DEVICES, device_params
from zinc.compiler import paged
from zinc.compiler.emitter import Body, ModuleEmitter
from zinc.compiler.targets import compile_mlir
from zinc.runtime.device import to_host
from zinc.runtime.module import LoadedModule
from zinc.runtime.session import layer_major

L, HKV, HD = 30, 3, 64  # SmolLM2-135M: a slot is 11,520 floats


def paged_module(per_layer: bool, tiled: bool) -> str:
    hp = SimpleNamespace(block_count=L, head_count_kv=HKV, key_length=HD)
    mod = ModuleEmitter(tiled=tiled)  # the slab is f16 on the CPU (tiled), f32 on Vulkan
    ct = paged.slab_type(hp, mod.kv_dtype)  # type: ignore[arg-type]
    b = Body(mod, dynamic=True)
    out = paged.gather_kv(b, hp, "%ctx", L - 1, 1)  # type: ignore[arg-type]
    res = f"tensor<?x{HKV}x{HD}xf32>"
    lines = [
        f"func.func @one(%cache: {ct}, %ctx: tensor<?xi32>) -> {res} {{",
        *b.lines,
        f"  return {out} : {res}",
        "}",
    ]
    mod.entries.append("\n".join(lines))
    mod.entries.append(paged.kv_write(hp, per_layer=per_layer, dt=mod.kv_dtype))  # type: ignore[arg-type]
    return mod.text("paged")


@pytest.mark.parametrize("device", device_params("cpu", "vulkan"))
def test_kv_write_and_gathers_by_slot(device: str) -> None:
    spec = DEVICES[device]()
    vulkan = spec.target == "vulkan"
    mod = LoadedModule(compile_mlir(paged_module(vulkan, tiled=not vulkan), spec.target), spec.uri)
    rng = np.random.default_rng(5)
    slots = 400
    dt, np_dt = ("f32", np.float32) if vulkan else ("f16", np.float16)
    cache = mod.empty((slots, L, 2, HKV, HD), dt)
    expect = rng.standard_normal((slots, L, 2, HKV, HD)).astype(np_dt)
    for at in range(0, slots, 8):  # eight rows per write, as a Vulkan prefill chunk: 92,160 floats
        mod.fn("kv_write")(
            cache, mod.to_device(layer_major(expect[at : at + 8])), mod.to_device(np.arange(at, at + 8, dtype=np.int32))
        )
    rows = rng.standard_normal((3, L, 2, HKV, HD)).astype(np_dt)
    where = np.array([17, 3, 390], np.int32)
    mod.fn("kv_write")(cache, mod.to_device(layer_major(rows)), mod.to_device(where))
    expect[where] = rows
    assert np.array_equal(to_host(cache, mod.device), expect)
    ctx = rng.permutation(slots).astype(np.int32)
    one = to_host(mod.fn("one")(cache, mod.to_device(ctx)), mod.device)
    assert np.array_equal(one, expect[ctx, L - 1, 1].astype(np.float32))  # widened to f32 exactly
