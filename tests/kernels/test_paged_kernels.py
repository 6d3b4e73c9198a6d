"""Tier 2: the paged KV-cache ops (compiler/paged.py) on a slab with SmolLM2's geometry.

`kv_write` scatters rows into their slots in place and the prefill's gather reads them back by
slot (batched decode reads the slab inside its attention: tests/model/test_paged_batch.py). One
call of 300 or 400 rows writes far more than a Vulkan scatter running as one invocation writes on
lavapipe (62,597 elements of this width: its loops stop after 65,535 iterations in all), which is why
Vulkan's scatter is declared to have unique indices, spread over workgroups; the many-rows test
fails if that is lost.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tests.compile_pool import compile_kernel
from tests.conftest import DEVICES, device_params
from zinc.compiler import paged
from zinc.compiler.emitter import Body, ModuleEmitter
from zinc.runtime.device import to_host
from zinc.runtime.module import LoadedModule
from zinc.runtime.session import layer_major

L, HKV, HD = 30, 3, 64  # SmolLM2-135M: a slot is 11,520 floats


def paged_module(parallel: bool, tiled: bool) -> str:
    hp = SimpleNamespace(block_count=L, head_count_kv=HKV, key_length=HD)
    mod = ModuleEmitter(tiled=tiled)  # the slab is f16 on the CPU (tiled), f16x2 on Vulkan
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
    mod.entries.append(paged.kv_write(hp, parallel=parallel, dt=mod.kv_dtype))  # type: ignore[arg-type]
    return mod.text("paged")


@functools.cache
def compiled(device: str) -> tuple[LoadedModule, bool]:
    """The paged module of `device`, compiled once a run, and whether it is the Vulkan one."""
    spec = DEVICES[device]()
    vulkan = spec.target == "vulkan"
    return LoadedModule(compile_kernel(paged_module(vulkan, tiled=not vulkan), spec.target), spec.uri), vulkan


def stored(halves: np.ndarray[Any, Any], vulkan: bool) -> np.ndarray[Any, Any]:
    """f16 rows [..., HD] as the device's slab holds them: f16 on the CPU, on Vulkan two to an
    int32 word (f16x2: value d in word d // 2, the low half for an even d, as numpy views them)."""
    return halves.view(np.int32) if vulkan else halves


def filled_slab(mod: LoadedModule, vulkan: bool, rng: np.random.Generator, slots: int) -> tuple[Any, np.ndarray[Any, Any]]:
    """An empty slab of `slots` slots in the device's KV type (f16, on Vulkan in i32 words), and
    random f16 rows for every slot."""
    cache = mod.empty((slots, L, 2, HKV, HD // 2 if vulkan else HD), "i32" if vulkan else "f16")
    return cache, rng.standard_normal((slots, L, 2, HKV, HD)).astype(np.float16)


@pytest.mark.parametrize("device", device_params("cpu", "vulkan"))
def test_kv_write_and_gathers_by_slot(device: str) -> None:
    mod, vulkan = compiled(device)
    rng, slots = np.random.default_rng(5), 400
    cache, expect = filled_slab(mod, vulkan, rng, slots)
    for at in range(0, slots, 8):  # eight rows per write: 92,160 values
        mod.fn("kv_write")(
            cache,
            mod.to_device(layer_major(stored(expect[at : at + 8], vulkan))),
            mod.to_device(np.arange(at, at + 8, dtype=np.int32)),
        )
    rows = rng.standard_normal((3, L, 2, HKV, HD)).astype(np.float16)
    where = np.array([17, 3, 390], np.int32)
    mod.fn("kv_write")(cache, mod.to_device(layer_major(stored(rows, vulkan))), mod.to_device(where))
    expect[where] = rows
    assert np.array_equal(to_host(cache, mod.device), stored(expect, vulkan))
    ctx = rng.permutation(slots).astype(np.int32)
    one = to_host(mod.fn("one")(cache, mod.to_device(ctx)), mod.device)
    assert np.array_equal(one, expect[ctx, L - 1, 1].astype(np.float32))  # widened (unpacked) to f32 exactly


@pytest.mark.parametrize("device", device_params("cpu", "vulkan"))
def test_kv_write_of_many_rows_in_one_call(device: str) -> None:
    """One call writes every slot (400 rows: 4.6 million floats, 153,600 of each layer), a second
    300 rows at scattered slots and 20 padding rows, all at scratch slot 0: on lavapipe a scatter
    that one invocation runs stops after 62,597 (it failed so when Vulkan's kv_write was
    one such scatter per layer). Scratch slot 0 ends with any padding row's values, element by
    element (on Vulkan the padding rows' writes race there)."""
    mod, vulkan = compiled(device)
    rng, slots = np.random.default_rng(7), 400
    cache, expect = filled_slab(mod, vulkan, rng, slots)
    mod.fn("kv_write")(
        cache, mod.to_device(layer_major(stored(expect, vulkan))), mod.to_device(np.arange(slots, dtype=np.int32))
    )
    assert np.array_equal(to_host(cache, mod.device), stored(expect, vulkan))
    where = np.concatenate([rng.permutation(np.arange(1, slots))[:300], np.zeros(20, int)]).astype(np.int32)
    rows = stored(rng.standard_normal((where.size, L, 2, HKV, HD)).astype(np.float16), vulkan)
    mod.fn("kv_write")(cache, mod.to_device(layer_major(rows)), mod.to_device(where))
    want = stored(expect, vulkan)
    want[where[:300]] = rows[:300]
    got = to_host(cache, mod.device)
    assert np.array_equal(got[1:], want[1:])
    assert (got[0] == rows[300:]).any(axis=0).all()
