"""Tier 2: the decode matmuls that also prefetch a layer's cached K/V rows (compiler/kv_prefetch.py).

A prefetch changes no value, so the kernel with it must give the bits of the kernel without it,
for one row and a batch, whatever the rows' cached lengths (none, inside ctx, past its columns)
and with or without a sliding window. The decode graph puts one prefetch per layer on a decode
entry's matmuls: layer 0's on its q/k/v, layer l + 1's on layer l's gate/up; none in a prefill.
Skipped on a CPU without AVX2, like the kernels.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from tests.compile_pool import compile_kernel
from tests.conftest import DEVICES
from zinc.compiler import dot8, dot8_layout
from zinc.compiler.emitter import NO_WINDOW
from zinc.compiler.graph import emit_module
from zinc.compiler.kernels import QUANT_TYPES
from zinc.compiler.kv_prefetch import KvPrefetch
from zinc.model.gguf_file import open_gguf
from zinc.model.hparams import describe
from zinc.runtime.device import to_host
from zinc.runtime.module import LoadedModule

pytestmark = pytest.mark.skipif(not dot8_layout.host_supports(), reason="this CPU lacks AVX2, F16C or FMA")

N, K = 64, 128  # an even number of 8-row groups: on AVX-512 VNNI the batch kernel is the 512-bit one
SLOTS, COLUMNS = 50, 20  # the slab's slots, ctx's columns


def module(kv: KvPrefetch, planes: dict[str, str]) -> str:
    q = QUANT_TYPES["Q4_1"]
    slab, text = f"tensor<?x{kv.slab}>", ""
    text += "".join(
        f'util.global private @{p} = #flow.parameter.named<"model"::"{p}"> : {t}\n' for p, t in planes.items()
    )
    loads = "".join(f"  %{p} = util.global.load @{p} : {t}\n" for p, t in planes.items())
    names, types = ", ".join(f"%{p}" for p in planes), ", ".join(planes.values())
    for rows in (0, 3):
        r = rows or 1
        text += dot8.render_decode(q, N, K, rows) + dot8.render_decode(q, N, K, rows, kv)
        arg, res = f"tensor<{r}x{K}xf32>", f"tensor<{r}x{N}xf32>"
        text += (
            f"func.func @plain{r}(%x: {arg}) -> {res} {{\n{loads}"
            f"  %y = func.call @{dot8.decode_name(q, N, K, rows)}({names}, %x) : ({types}, {arg}) -> {res}\n"
            f"  return %y : {res}\n}}\n"
            f"func.func @prefetching{r}(%x: {arg}, %cache: {slab}, %ctx: tensor<{r}x?xi32>, %len: tensor<{r}xi32>)"
            f" -> {res} {{\n{loads}  %layer = arith.constant {kv.layer} : index\n"
            f"  %y = func.call @{dot8.decode_name(q, N, K, rows, kv)}({names}, %x, %cache, %ctx, %len, %layer) : "
            f"({types}, {arg}, {slab}, tensor<{r}x?xi32>, tensor<{r}xi32>, index) -> {res}\n"
            f"  return %y : {res}\n}}\n"
        )
    return text


@pytest.mark.parametrize("window", [NO_WINDOW, 5])
def test_prefetching_kernels_give_the_same_bits(window: int) -> None:
    spec = DEVICES["cpu"]()
    rng = np.random.default_rng(11)
    q = QUANT_TYPES["Q4_1"]
    raw = quants.quantize(rng.standard_normal((N, K)).astype(np.float32), GGMLQuantizationType.Q4_1)
    planes = dot8.repack(q, raw.reshape(-1).view(np.uint8), N, K)
    kv = KvPrefetch(layer=1, window=window, layers=2, heads_kv=2, head_dim=64, dtype="f16")
    text = module(kv, dot8.plane_types(q, N, K))
    assert text.count("memref.prefetch %kv_cache") == 2 * 8  # K and V of 2 x 64 f16: 8 lines, in 2 kernels
    mod = LoadedModule(compile_kernel(text, spec.target), spec.uri, parameter_arrays=planes)
    x = rng.standard_normal((3, K)).astype(np.float32)
    cache = mod.to_device(rng.standard_normal((SLOTS, 2, 2, 2, 64)).astype(np.float16))
    ctx = rng.integers(0, SLOTS, size=(3, COLUMNS), dtype=np.int32)
    for r, lens in ((1, [13]), (1, [0]), (1, [10**6]), (3, [0, 7, 10**6]), (3, [COLUMNS, 1, 3])):
        args = (
            mod.to_device(x[:r]),
            cache,
            mod.to_device(ctx[:r]),
            mod.to_device(np.array(lens, dtype=np.int32)),
        )
        plain = to_host(mod.fn(f"plain{r}")(mod.to_device(x[:r])), mod.device)
        prefetching = to_host(mod.fn(f"prefetching{r}")(*args), mod.device)
        assert np.array_equal(plain, prefetching), f"{r} rows, lengths {lens}"


def test_decode_entries_prefetch_each_layer_once(tiny_models: dict[str, Path]) -> None:
    desc = describe(open_gguf(tiny_models["tiny-q8-q41"]))
    layers = desc.hparams.block_count
    mod = emit_module(desc, tiled=True, dot8=True, batch_sizes=(1, 4))
    entries = {re.match(r"func\.func @(\w+)\(", e).group(1): e for e in mod.entries}  # type: ignore[union-attr]
    for name in ("decode_b1", "decode_b4"):
        layers_prefetched = re.findall(r"%kv_layer_\d+ = arith.constant (\d+) : index", entries[name])
        assert sorted(map(int, layers_prefetched)) == list(range(layers)), name
    for name in ("prefill", "prefill_kv"):
        assert "_kvw" not in entries[name], name
