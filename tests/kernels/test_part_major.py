"""Tier 2: a decode batch's stacked matmul written part-major (compiler/dot8.py `splits`).

q, k and v (and gate, up) of a layer come from one matmul over their stacked weights. With one
row, each part of its output is a contiguous slice; with a batch of rows, a row-major [rows, n]
output makes each part a strided block, which IREE copies out by a one-workgroup dispatch per
part. The part-major kernel writes part j as its own [rows, n_j] block, so the slices are views.
It must give the plain kernel's values, bit for bit, regrouped; and a decode batch's entry must
use it for its stacked matmuls, with no strided slice of a matmul's output left.
Skipped on a CPU without AVX2, like the kernels.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from tests.compile_pool import compile_kernel
from tests.conftest import DEVICES
from zinc.compiler import dot8, dot8_layout
from zinc.compiler.graph import emit_module
from zinc.compiler.kernels import QUANT_TYPES
from zinc.model.gguf_file import open_gguf
from zinc.model.hparams import describe
from zinc.runtime.device import to_host
from zinc.runtime.module import LoadedModule

pytestmark = pytest.mark.skipif(not dot8_layout.host_supports(), reason="this CPU lacks AVX2, F16C or FMA")

K = 128
PARTS = (64, 32, 32)  # whole 16-lane vectors: the 512-bit batch kernel where the host has one
N = sum(PARTS)


def module(rows: int, planes: dict[str, str]) -> str:
    q = QUANT_TYPES["Q4_1"]
    text = "".join(
        f'util.global private @{p} = #flow.parameter.named<"model"::"{p}"> : {t}\n' for p, t in planes.items()
    )
    loads = "".join(f"  %{p} = util.global.load @{p} : {t}\n" for p, t in planes.items())
    names, types = ", ".join(f"%{p}" for p in planes), ", ".join(planes.values())
    arg, res = f"tensor<{rows}x{K}xf32>", f"tensor<{rows}x{N}xf32>"
    text += dot8.render_decode(q, N, K, rows) + dot8.render_decode(q, N, K, rows, parts=PARTS)
    for fn, name in (("plain", dot8.decode_name(q, N, K, rows)), ("parts", dot8.decode_name(q, N, K, rows, parts=PARTS))):
        text += (
            f"func.func @{fn}(%x: {arg}) -> {res} {{\n{loads}"
            f"  %y = func.call @{name}({names}, %x) : ({types}, {arg}) -> {res}\n"
            f"  return %y : {res}\n}}\n"
        )
    return text


@pytest.mark.parametrize("rows", [3, 8])
def test_part_major_kernel_gives_each_part_as_a_block(rows: int) -> None:
    spec = DEVICES["cpu"]()
    rng = np.random.default_rng(7)
    q = QUANT_TYPES["Q4_1"]
    assert dot8.splits(q, N, rows, PARTS) and not dot8.splits(q, N, 1, PARTS)
    raw = quants.quantize(rng.standard_normal((N, K)).astype(np.float32), GGMLQuantizationType.Q4_1)
    planes = dot8.repack(q, raw.reshape(-1).view(np.uint8), N, K)
    mod = LoadedModule(compile_kernel(module(rows, dot8.plane_types(q, N, K)), spec.target), spec.uri, parameter_arrays=planes)
    x = mod.to_device(rng.standard_normal((rows, K)).astype(np.float32))
    plain = np.asarray(to_host(mod.fn("plain")(x), mod.device))
    flat = np.asarray(to_host(mod.fn("parts")(x), mod.device)).reshape(-1)
    bounds = np.cumsum((0, *PARTS))
    at = 0
    for lo, hi in itertools.pairwise(bounds):
        block = flat[at : at + rows * (hi - lo)].reshape(rows, hi - lo)
        assert np.array_equal(block, plain[:, lo:hi]), f"columns {lo}..{hi}"
        at += rows * (hi - lo)


def test_parts_that_straddle_a_vector_are_refused() -> None:
    q = QUANT_TYPES["Q4_1"]
    assert not dot8.splits(q, 64, 4, (36, 28))  # not whole 8-lane vectors
    assert not dot8.splits(q, 64, 4, (32, 16))  # not the whole output


def test_decode_batches_slice_stacked_matmuls_as_views(tiny_models: dict[str, Path]) -> None:
    desc = describe(open_gguf(tiny_models["tiny-q8-q41"]))
    mod = emit_module(desc, tiled=True, dot8=True, batch_sizes=(1, 4))
    entries = {re.match(r"func\.func @(\w+)\(", e).group(1): e for e in mod.entries}  # type: ignore[union-attr]
    batch, one = entries["decode_b4"], entries["decode_b1"]
    stacked = len(re.findall(r"call @dot8_\w+_b4_\w+_p\d+x", batch))
    assert stacked >= desc.hparams.block_count  # at least each layer's q/k/v
    assert not re.search(r"tensor\.extract_slice %\w+\[0, \d+\] \[%T, \d+\]", batch)  # no strided slice
    assert "_p" not in " ".join(re.findall(r"call @(dot8_\w+)", one))  # one row: slices are contiguous
    # this step's K/V rows go into the layer-major rows output as whole blocks
    assert re.search(r"tensor\.insert_slice %[\w#]+ into %\w+\[\d+, [01], 0, 0, 0\] \[1, 1, %T,", batch)
