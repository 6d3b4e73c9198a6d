"""Tier 2: decode attention over the paged slab (compiler/paged.py `attention_batch`) against numpy.

Rows of a batch are sequences of different lengths whose cached positions sit at scattered slots;
each row's query attends over its own cached rows (masked past its length, and outside the sliding
window when there is one) plus its new key and value. On the CPU this is the hand-written
online-softmax dispatch (mlir/attention_decode.mlir), on Vulkan the linalg form
(mlir/attention_batch.mlir). A row computed alone must equal the same row in a batch bit for bit
on the CPU, however much longer the other rows are (greedy output must not depend on the batch).
The slab holds f16 values, widened as they are loaded: as f16 on the CPU, on Vulkan two to an
i32 word (f16x2, unpacked with integer ops).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tests.compile_pool import compile_kernel
from tests.conftest import DEVICES, device_params
from zinc.compiler import paged
from zinc.compiler.emitter import Body, ModuleEmitter
from zinc.runtime.device import to_host
from zinc.runtime.module import LoadedModule

L, H, HKV, HD = 3, 4, 2, 16  # GQA: two query heads per KV head
SCALE, LAYER, SLOTS = 0.25, 1, 1200


def attention_module(cpu: bool, window: int) -> str:
    hp = SimpleNamespace(block_count=L, head_count=H, head_count_kv=HKV, key_length=HD)
    mod = ModuleEmitter(tiled=cpu)
    for name, rows in (("batch", 3), ("one", 1)):
        b = Body(mod, dynamic=rows > 1)
        b.per_row, b.rows = True, rows if rows > 1 else 0
        t = b.t
        out = paged.attention_batch(b, hp, LAYER, "%q", ("%kn", "%vn"), "%len", SCALE, window)  # type: ignore[arg-type]
        new, q = f"tensor<{t}x{HKV}x{HD}xf32>", f"tensor<{t}x{H * HD}xf32>"
        sig = (
            f"func.func @{name}(%cache: {paged.slab_type(hp, mod.kv_dtype)}, %q: {q}, %ctx: tensor<{t}x?xi32>, "  # type: ignore[arg-type]
            f"%kn: {new}, %vn: {new}, %len: tensor<{t}xi32>) -> {q} {{"
        )
        mod.entries.append("\n".join([sig, *b.lines, f"  return {out} : {q}", "}"]))
    return mod.text("attention")


def reference(cache: np.ndarray, q: np.ndarray, ctx: np.ndarray, kn: np.ndarray, vn: np.ndarray,
              lens: np.ndarray, window: int) -> np.ndarray:  # fmt: skip
    out = np.zeros((len(q), H * HD))
    for t, n in enumerate(lens):
        keep = [s for s in range(n) if not window or n - s < window]
        k = np.concatenate([cache[ctx[t, keep], LAYER, 0], kn[t][None]]).astype(np.float64)  # [S+1, HKV, HD]
        v = np.concatenate([cache[ctx[t, keep], LAYER, 1], vn[t][None]]).astype(np.float64)
        for h in range(H):
            g = h // (H // HKV)
            s = k[:, g] @ q[t, h * HD : (h + 1) * HD].astype(np.float64) * SCALE
            p = np.exp(s - s.max())
            out[t, h * HD : (h + 1) * HD] = (p / p.sum()) @ v[:, g]
    return out


@pytest.mark.parametrize("window", [0, 21])
@pytest.mark.parametrize("device", device_params("cpu-task", "vulkan"))
def test_decode_attention_matches_numpy(device: str, window: int) -> None:
    spec = DEVICES[device]()
    cpu = spec.target == "cpu"
    mod = LoadedModule(compile_kernel(attention_module(cpu, window), spec.target), spec.uri)
    rng = np.random.default_rng(11)
    cache = (rng.standard_normal((SLOTS, L, 2, HKV, HD)) * 2).astype(np.float16)
    lens = np.array([1003, 5, 64], np.int32)  # one long row (many blocks), one inside a block, one whole
    width = 1008  # padded to a multiple of 8, as the session does
    ctx = np.zeros((3, width), np.int32)  # padding points at slot 0
    for t, n in enumerate(lens):
        ctx[t, :n] = rng.choice(np.arange(1, SLOTS), n, replace=False)
    q = rng.standard_normal((3, H * HD)).astype(np.float32)
    kn, vn = (rng.standard_normal((3, HKV, HD)).astype(np.float32) for _ in range(2))
    dev_cache = mod.to_device(cache if cpu else cache.view(np.int32))  # Vulkan: f16x2
    y = to_host(mod.fn("batch")(dev_cache, *(mod.to_device(a) for a in (q, ctx, kn, vn, lens))), mod.device)
    expect = reference(cache, q, ctx, kn, vn, lens, window)
    assert np.abs(y - expect).max() < 1e-5 * np.abs(expect).max() + 1e-6
    for t in range(3):  # alone, with only its own (padded) slots
        own = ctx[t : t + 1, : -(-int(lens[t]) // 8) * 8]
        args = (q[t : t + 1], own, kn[t : t + 1], vn[t : t + 1], lens[t : t + 1])
        y1 = to_host(mod.fn("one")(dev_cache, *(mod.to_device(a) for a in args)), mod.device)
        assert np.abs(y1[0] - expect[t]).max() < 1e-5 * np.abs(expect).max() + 1e-6
        if cpu:
            assert np.array_equal(y1[0], y[t]), f"row {t} alone differs from the same row in a batch"
