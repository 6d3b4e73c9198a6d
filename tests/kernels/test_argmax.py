"""Tier 2: the greedy argmax on the device (compiler/emitter.py `Body.argmax`, `Body.argmax_rows`).

On the CPU a vocabulary that is a multiple of 16 takes the hand-written dispatch of
mlir/argmax_cpu.mlir (16 lanes, then the lanes); other vocabularies, and Vulkan, take the linalg
reductions of mlir/argmax.mlir (one row, or [T, V]). Over Gemma 3's 262,144
tokens the single-reduction form read only the first 65,535 logits on Vulkan (IREE runs it as one
invocation looping over the row, and lavapipe stops a shader's loops after 65,535 iterations), so a
token past them was never picked (Gemma 3 left llama.cpp's greedy path where its best token
was 236761): the large-vocabulary test fails on that form. Every form must give what a
first-to-last scan with a strict `>` gives: the first index on exact ties, never a NaN, and 0 for
a row with nothing above -inf.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from tests.compile_pool import KernelJob, compile_kernel
from tests.conftest import DEVICES, KERNEL_FORMS, for_device_target, lavapipe_subgroup_target, target_of
from zinc.compiler.emitter import Body, ModuleEmitter
from zinc.runtime.device import to_host
from zinc.runtime.module import LoadedModule


def argmax_module(vocab: int, cpu: bool, index_inputs: bool = False) -> str:
    mod = ModuleEmitter(tiled=cpu, index_inputs=index_inputs)  # tiled: the CPU's kernels
    rows = Body(mod, dynamic=True)
    out = rows.argmax_rows("%x", vocab)
    one = Body(mod, dynamic=False)
    token = one.argmax("%x", vocab)
    lines = [f"func.func @rows(%x: tensor<?x{vocab}xf32>) -> tensor<?xi32> {{", *rows.lines]
    lines += [f"  return {out} : tensor<?xi32>", "}"]
    lines += [f"func.func @one(%x: tensor<1x{vocab}xf32>) -> tensor<1xi32> {{", *one.lines]
    lines += [f"  return {token} : tensor<1xi32>", "}"]
    mod.entries.append("\n".join(lines))
    return mod.text("argmax")


def scan(row: np.ndarray) -> int:
    """The reference: the first index whose value is larger than every one before it and than -inf."""
    best, at = -np.inf, 0
    for j, v in enumerate(row.tolist()):
        if v > best:
            best, at = v, j
    return at


def cases(vocab: int) -> np.ndarray:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((10, vocab)).astype(np.float32)
    x[1, [5, 37, 46]] = 9.0  # ties in different lanes: the first
    x[2, [3, 19, 35]] = 9.0  # ties in the same lane (16 apart)
    x[3, [0, 4]] = np.nan  # NaN first, then a larger value later
    x[3, 41] = 8.0
    x[4] = -np.inf  # nothing above -inf: 0
    x[5] = np.nan  # all NaN: 0
    x[6, [7, 23]] = np.inf  # +inf twice
    x[7] = 1.5  # all equal: 0
    x[8, vocab - 1] = 20.0  # the last one
    x[9] = -np.inf  # a NaN, then nothing above -inf: 0
    x[9, 0] = np.nan
    return x


def compile_jobs(test: str, params: Mapping[str, Any]) -> list[KernelJob]:
    """The modules each test below compiles (tests/compile_pool.py compiles them ahead)."""
    if test == "test_greedy_argmax_takes_the_first_largest":
        return [(argmax_module(params["vocab"], params["cpu"]), target_of(params["device"]), ())]
    if test == "test_greedy_argmax_over_a_large_vocabulary":
        return [(argmax_module(262144, params["cpu"]), target_of(params["device"]), ())]
    if test == "test_the_named_gpu_targets_form_picks_the_same_tokens":
        texts = [argmax_module(vocab, cpu=False, index_inputs=True) for vocab in (50, 49152, 262144)]
        if params["subgroup_target"]:
            texts = [for_device_target(t, lavapipe_subgroup_target(8)) for t in texts]
        return [(t, "vulkan", ()) for t in texts]
    return []


@pytest.mark.parametrize("vocab", [160, 50])
@pytest.mark.parametrize(("device", "cpu"), KERNEL_FORMS)
def test_greedy_argmax_takes_the_first_largest(vocab: int, device: str, cpu: bool) -> None:
    spec = DEVICES[device]()
    text = argmax_module(vocab, cpu)
    assert ("argmax_cpu" in text) == (cpu and vocab % 16 == 0)
    mod = LoadedModule(compile_kernel(text, spec.target), spec.uri)
    x = cases(vocab)
    expect = [scan(r) for r in x]
    got = to_host(mod.fn("rows")(mod.to_device(x)), mod.device)
    assert got.tolist() == expect
    for i in range(len(x)):
        one = to_host(mod.fn("one")(mod.to_device(x[i : i + 1])), mod.device)
        assert one.tolist() == [expect[i]]


@pytest.mark.parametrize(("device", "cpu"), KERNEL_FORMS)
def test_greedy_argmax_over_a_large_vocabulary(device: str, cpu: bool) -> None:
    vocab = 262144  # Gemma 3's
    spec = DEVICES[device]()
    mod = LoadedModule(compile_kernel(argmax_module(vocab, cpu), spec.target), spec.uri)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, vocab)).astype(np.float32) * 3
    x[0, [532, 236764, 236761]] = [20.7, 21.2, 22.2]  # what Vulkan got wrong: the largest late
    x[1, [10, 200000]] = 30.0  # a tie far apart: the first
    x[2, vocab - 1] = 40.0
    expect = [int(np.argmax(r)) for r in x]
    assert expect[0] == 236761 and expect[1] == 10
    assert to_host(mod.fn("rows")(mod.to_device(x)), mod.device).tolist() == expect
    for i in range(len(x)):
        assert to_host(mod.fn("one")(mod.to_device(x[i : i + 1])), mod.device).tolist() == [expect[i]]


@pytest.mark.vulkan
@pytest.mark.parametrize("subgroup_target", [False, True], ids=["generic", "subgroups"])
def test_the_named_gpu_targets_form_picks_the_same_tokens(subgroup_target: bool) -> None:
    """On named GPU targets (ampere, rdna3, ...) the indices come from iota inputs; that form, run
    on lavapipe, gives the same tokens (tests/kernels/test_vulkan_targets.py compiles it for them),
    also compiled for a target declaring lavapipe's 8-wide subgroups, where IREE reduces SmolLM2's
    48 blocks in a workgroup of 3 subgroups (its padding of the 5 other lanes made a signed min of
    indices -1)."""
    spec = DEVICES["vulkan"]()
    for vocab in (50, 49152, 262144):
        text = argmax_module(vocab, cpu=False, index_inputs=True)
        assert "= linalg.index" not in text
        if subgroup_target:
            text = for_device_target(text, lavapipe_subgroup_target(8))
        mod = LoadedModule(compile_kernel(text, spec.target), spec.uri)
        x = cases(vocab)
        expect = [scan(r) for r in x]
        assert to_host(mod.fn("rows")(mod.to_device(x)), mod.device).tolist() == expect
        for i in range(len(x)):
            assert to_host(mod.fn("one")(mod.to_device(x[i : i + 1])), mod.device).tolist() == [expect[i]]
