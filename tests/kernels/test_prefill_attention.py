"""Tier 2: the CPU's prefill attention (compiler/attention_prefill.py, a hand-written flash
attention) against numpy, and against the linalg form it replaces there.

T new rows at positions start + t attend causally over the sequence's keys by position, with a
sliding window or without, at head widths 64, 128 and 256, with 1, 2, 4 and 8 query heads of a
KV head in a workgroup's lanes; T is not a multiple of a workgroup's rows, so the last block's
clamped lanes are exercised. A row's result must not
depend on how many other rows share its call (a prompt split into chunks gives the same bits
as a whole one).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.compile_pool import compile_kernel
from zinc.artifact import CTX_ALIGN
from zinc.compiler.attention_prefill import render_prefill_attention, tiling
from zinc.compiler.emitter import f32_const
from zinc.runtime.device import to_host
from zinc.runtime.module import LoadedModule

SCALE = 0.3


def module(heads: int, heads_kv: int, hd: int, window: int) -> LoadedModule:
    text = render_prefill_attention("fa", heads, heads_kv, hd, f32_const(SCALE), window or 2**31 - 1)
    text = text.replace("func.func private @fa(", "func.func @fa(")
    return LoadedModule(compile_kernel(f"module @m {{\n{text}}}\n", "cpu"), "local-task")


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int, heads_kv: int, window: int) -> np.ndarray:
    t_n, hhd = q.shape
    hd = k.shape[2]
    heads = hhd // hd
    out = np.zeros((t_n, hhd))
    for t in range(t_n):
        pos = start + t
        keep = [s for s in range(pos + 1) if not window or pos - s < window]
        for h in range(heads):
            g = h // (heads // heads_kv)
            s = k[keep, g].astype(np.float64) @ q[t, h * hd : (h + 1) * hd] * SCALE
            p = np.exp(s - s.max())
            out[t, h * hd : (h + 1) * hd] = (p / p.sum()) @ v[keep, g]
    return out


@pytest.mark.parametrize(
    ("heads", "heads_kv", "hd", "window"),
    [(6, 2, 64, 0), (4, 2, 128, 0), (2, 1, 256, 19), (9, 3, 64, 40), (8, 2, 64, 0), (16, 2, 64, 23)],
)
def test_prefill_attention_matches_numpy(heads: int, heads_kv: int, hd: int, window: int) -> None:
    check(heads, heads_kv, hd, window)


@pytest.mark.parametrize(("heads", "heads_kv", "hd", "window"), [(8, 2, 64, 0), (2, 1, 256, 19)])
def test_an_avx2_target_takes_8_lanes(
    monkeypatch: pytest.MonkeyPatch, heads: int, heads_kv: int, hd: int, window: int
) -> None:
    """Compiled for x86-64-v3 (AVX2's 16 registers of 8 floats), the kernel's vectors are 8 lanes
    wide, and it gives the same results."""
    monkeypatch.setenv("ZINC_CPU_TARGET", "x86-64-v3")
    assert tiling(heads, heads_kv, hd).lanes == 8
    check(heads, heads_kv, hd, window)


def check(heads: int, heads_kv: int, hd: int, window: int) -> None:
    """The kernel against numpy over a ragged last block of rows, and one row alone against its
    row in the whole call."""
    mod = module(heads, heads_kv, hd, window)
    rng = np.random.default_rng(hd + window)
    start, t_n = 93, 2 * tiling(heads, heads_kv, hd).rows + 3  # blocks of rows with a ragged last one
    width = -(-(start + t_n) // CTX_ALIGN) * CTX_ALIGN  # the session pads ctx, so S, to a multiple of CTX_ALIGN
    q = rng.standard_normal((t_n, heads * hd)).astype(np.float32)
    k, v = (rng.standard_normal((width, heads_kv, hd)).astype(np.float32) for _ in range(2))
    fa = mod.fn("fa")
    y = to_host(fa(*(mod.to_device(a) for a in (q, k, v)), start), mod.device)
    expect = reference(q, k, v, start, heads_kv, window)
    assert np.abs(y - expect).max() < 1e-5 * np.abs(expect).max() + 1e-6
    # a row alone, at its own position, gives the same bits as in the whole call
    for t in (0, t_n - 1):
        one = to_host(fa(*(mod.to_device(a) for a in (q[t : t + 1], k, v)), start + t), mod.device)
        assert np.array_equal(one[0], y[t])
