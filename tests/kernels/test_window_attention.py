"""Tier 2: the linalg prefill attention (mlir/attention_window.mlir, what Vulkan runs) against
numpy, at every number of new rows a prefill call may take.

IREE 3.13 compiled the form that divided the weighted sum of values [T, HKV, G, HD] by the row
sums read transposed ([HKV, G, T]) into a Vulkan dispatch whose rows past the eighth came out inf
(lavapipe); Vulkan prefilled 8 tokens per call to stay clear of it. The kernel now divides the
probabilities by their sum first; T = 9, 33 and 127 are the counts the old form got wrong.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.compile_pool import compile_kernel
from tests.conftest import device_params
from tests.kernels.test_prefill_attention import reference
from zinc.compiler.emitter import f32_const
from zinc.compiler.kernels import t_dims, template
from zinc.runtime.device import resolve_device, to_host
from zinc.runtime.module import LoadedModule

SCALE = 0.3


def module(device: str, heads: int, heads_kv: int, hd: int, window: int) -> LoadedModule:
    subs = {
        "NAME": "aw", "HHD": str(heads * hd), "HKV": str(heads_kv), "G": str(heads // heads_kv), "HD": str(hd),
        "SCALE": f32_const(SCALE), "WINDOW": str(window or 2**31 - 1), "DYN_S": "%T, %S", **t_dims(True),
    }  # fmt: skip
    text = template("attention_window.mlir").substitute(subs).replace("func.func private @aw(", "func.func @aw(")
    spec = resolve_device(device)
    return LoadedModule(compile_kernel(f"module @m {{\n{text}}}\n", spec.target), spec.uri)


@pytest.mark.parametrize("device", device_params("cpu", "vulkan"))
@pytest.mark.parametrize(("heads", "heads_kv", "hd", "window"), [(9, 3, 64, 0), (4, 1, 256, 19)])
def test_window_attention_matches_numpy_at_every_row_count(
    device: str, heads: int, heads_kv: int, hd: int, window: int
) -> None:
    mod = module(device, heads, heads_kv, hd, window)
    fa = mod.fn("aw")
    rng = np.random.default_rng(hd)
    for t_n in (1, 8, 9, 33, 127):
        start = 5
        width = -(-(start + t_n) // 8) * 8  # the session pads ctx, so S, to a multiple of 8
        q = rng.standard_normal((t_n, heads * hd)).astype(np.float32)
        k, v = (rng.standard_normal((width, heads_kv, hd)).astype(np.float32) for _ in range(2))
        y = to_host(fa(*(mod.to_device(a) for a in (q, k, v)), start), mod.device)
        expect = reference(q, k, v, start, heads_kv, window)
        assert np.abs(y - expect).max() < 1e-5 * np.abs(expect).max() + 1e-6, t_n
