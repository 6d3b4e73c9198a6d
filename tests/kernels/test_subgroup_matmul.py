"""Tier 2: the quantized matmuls of named GPU targets (zinc.compiler.subgroup_matmul) on lavapipe.

Named targets (ampere, rdna3, ...) compile the linalg matmuls with IREE's SubgroupReduce pipeline.
Their code assumes subgroups of 32 or 64 lanes and lavapipe's are 8 wide, so the matmuls are
compiled here for a target that declares lavapipe's subgroups (tests.conftest
`lavapipe_subgroup_target`): IREE takes the same pipeline, and lavapipe runs it. Under that
pipeline the templates' forms, looping over three reduction dims or more, gave rows 100% off
(at a width of 256 on 8-wide subgroups, up to 1,024 on 16-wide ones, 4,096 on 32-wide ones by the
same rule); the forms of two reduction dims must match x times the dequantized weights to float
rounding, for one token and for a prompt's rows, and the test checks that the pipeline under test
is the one IREE took.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import DEVICES, for_device_target, lavapipe_subgroup_target
from tests.kernels.test_quant_kernels import quantized
from zinc.compiler import subgroup_matmul
from zinc.compiler.emitter import Body, ModuleEmitter
from zinc.compiler.kernels import QUANT_TYPES
from zinc.compiler.targets import compile_mlir
from zinc.runtime.device import to_host
from zinc.runtime.module import LoadedModule

Array = np.ndarray[Any, Any]
ROWS = 3


def module(qname: str, n: int, k: int) -> str:
    """`main` (one token) and `rows` (a prompt's rows): x -> W x through Body.linear, as a named
    GPU target's model calls it."""
    mod = ModuleEmitter(index_inputs=True)
    lines = []
    for entry, dynamic in (("main", False), ("rows", True)):
        body = Body(mod, dynamic=dynamic)
        t = "?" if dynamic else "1"
        y = body.linear("w", QUANT_TYPES[qname], n, k, "%x", "y")
        lines += [f"func.func @{entry}(%x: tensor<{t}x{k}xf32>) -> tensor<{t}x{n}xf32> {{", *body.lines]
        lines += [f"  return {y} : tensor<{t}x{n}xf32>", "}"]
    mod.entries.append("\n".join(lines))
    return mod.text("subgroup")


def pipelines(dump: Path) -> set[str]:
    """The SPIR-V pipelines IREE configured for the matmul dispatches (i8 weights) of a compile."""
    found = set()
    for path in dump.glob("configured_*.mlir"):
        text = path.read_text()
        if re.search(r"func\.func @\w+_reduction_\w*i8", text):
            found.update(re.findall(r"spirv_pipeline<(\w+)>", text))
    return found


# widths whose reduction fits one workgroup of at most 8 x 8 lanes, where IREE takes SubgroupReduce
# on 8-wide subgroups (Q8_0, whose template has two reduction dims already, as a control)
CASES = [(q, n, k) for q in subgroup_matmul.FORMS for n, k in ((64, 256), (37, 512))] + [("Q8_0", 64, 256)]


@pytest.mark.vulkan
@pytest.mark.parametrize(("qname", "n", "k"), CASES, ids=[f"{q}-{n}x{k}" for q, n, k in CASES])
def test_subgroup_reduce_matmul_matches_dequantize(qname: str, n: int, k: int, tmp_path: Path) -> None:
    text = module(qname, n, k)
    if qname != "Q8_0":  # Q8_0's template already has two reduction dims
        assert "zinc.compiler.subgroup_matmul" in text and "= linalg.index" not in text
    flags = (f"--iree-hal-dump-executable-configurations-to={tmp_path}",)
    vmfb = compile_mlir(for_device_target(text, lavapipe_subgroup_target(8)), "vulkan", flags)
    assert pipelines(tmp_path) == {"SubgroupReduce"}
    rng = np.random.default_rng(3)
    raw, ref = quantized(qname, n, k, rng)
    spec = DEVICES["vulkan"]()
    mod = LoadedModule(vmfb, spec.uri, parameter_arrays={"w": raw})
    xs = rng.standard_normal((ROWS, k)).astype(np.float32)
    xs[1] *= 50.0
    one = to_host(mod.fn("main")(mod.to_device(xs[:1])), mod.device).astype(np.float64)
    rows = to_host(mod.fn("rows")(mod.to_device(xs)), mod.device).astype(np.float64)
    assert rows.shape == (ROWS, n)
    x64 = xs.astype(np.float64)
    for got, x in ((one, x64[:1]), (rows, x64)):
        mag = np.abs(x) @ np.abs(ref).T  # float rounding of each product and sum
        assert np.max(np.abs(got - x @ ref.T) / mag) < 1e-5
