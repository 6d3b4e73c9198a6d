"""GGUF tensors that IREE cannot map in place are bound from an aligned copy in a CPU artifact's .irpa.

IREE's local-task driver (zinc's CPU device) uses a parameter's file pages directly only where
its bytes start at a multiple of 64 (local-sync maps it either way); GGUF aligns tensors to 32
bytes, so about half of them are read into memory of IREE's own while the module loads, and the
file pages they were read from stay mapped too (Llama 3.2 1B: its 205 MiB of token embeddings, of
which a step reads a few rows, counted twice). The first test pins that premise down with IREE
alone; the others check the plan, the archive's bytes, the compiled model's logits and the memory
estimate with the copies (every misaligned tensor copied).
"""

from __future__ import annotations

import re
from pathlib import Path

import iree.runtime as rt
import numpy as np
import pytest
from iree.compiler import compile_str

from tests.conftest import DEVICES, ONE_SEQUENCE, SessionFactory
from zinc.artifact import COPY_PLANE
from zinc.compiler import build
from zinc.model.gguf_file import open_gguf
from zinc.runtime import memory
from zinc.runtime.session import ModelSession

FIXTURE = "tiny-qwen2"  # every tensor of it is at an offset of 32 modulo 64
MIB = 1 << 20


def _rss_anon() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


@pytest.mark.parametrize(("offset", "copied"), [(64, False), (32, True)], ids=["aligned", "misaligned"])
def test_iree_copies_a_parameter_only_at_a_misaligned_offset(
    tmp_path: Path, offset: int, copied: bool
) -> None:
    n = 48 * MIB
    vmfb = compile_str(  # synchronous calls (zinc's own flags make them take fences)
        f'util.global private @w = #flow.parameter.named<"model"::"w"> : tensor<{n}xi8>\n'
        f"func.func @total() -> tensor<i32> {{\n  %w = util.global.load @w : tensor<{n}xi8>\n"
        "  %z = arith.constant 0 : i32\n  %e = tensor.empty() : tensor<i32>\n"
        "  %a = linalg.fill ins(%z : i32) outs(%e : tensor<i32>) -> tensor<i32>\n"
        "  %s = linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> ()>],"
        ' iterator_types = ["reduction"]}\n'
        f"      ins(%w : tensor<{n}xi8>) outs(%a : tensor<i32>) {{\n"
        "  ^bb0(%x: i8, %acc: i32):\n    %v = arith.extsi %x : i8 to i32\n"
        "    %r = arith.addi %acc, %v : i32\n    linalg.yield %r : i32\n  } -> tensor<i32>\n"
        "  return %s : tensor<i32>\n}\n",
        target_backends=["llvm-cpu"],
    )
    data = np.arange(n + offset, dtype=np.uint8)
    path = tmp_path / "w.bin"
    data.tofile(path)
    index = rt.ParameterIndex()
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    handle = rt.FileHandle.wrap_memory(mapped, readable=True, writable=False)
    index.add_from_file_handle("w", handle, n, offset)
    config = rt.Config("local-task")
    params = rt.create_io_parameters_module(config.vm_instance, index.create_provider(scope="model"))
    before = _rss_anon()
    module = rt.VmModule.copy_buffer(config.vm_instance, vmfb)
    context = rt.SystemContext(vm_modules=[params, module], config=config)
    total = int(np.asarray(context.modules.module["total"]().to_host()))  # reads every byte of w
    grown = _rss_anon() - before
    assert total == int(data[offset : offset + n].view(np.int8).sum(dtype=np.int64))
    assert (grown > n // 2) == copied, f"anonymous memory grew by {grown / MIB:.1f} MiB"


def test_the_plan_binds_misaligned_tensors_from_their_copy(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tiny_models[FIXTURE]
    gguf = open_gguf(path)
    default = build.plan(path, "cpu")
    assert default.copied == ()  # the fixture's tensors are under COPY_MIN_BYTES
    monkeypatch.setattr(build, "COPY_MIN_BYTES", 0)
    p = build.plan(path, "cpu", ONE_SEQUENCE)
    assert "token_embd.weight" in p.copied and "output_norm.weight" in p.copied
    bound = set(re.findall(r'"model"::"([^"]+)"', p.mlir))
    assert {f"{name}.{COPY_PLANE}" for name in p.copied} <= bound
    raw = {name for name in bound if name in gguf.tensors}
    assert all(gguf.tensors[name].offset % build.PARAM_ALIGN == 0 for name in raw)
    assert build.plan(path, "vulkan").copied == ()  # Vulkan copies every weight to the device anyway


def test_a_model_with_copies_gives_the_same_logits(
    tiny_models: dict[str, Path],
    open_session: SessionFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = tiny_models[FIXTURE]
    gguf = open_gguf(path)
    monkeypatch.setattr(build, "COPY_MIN_BYTES", 0)
    p = build.plan(path, "cpu", ONE_SEQUENCE)
    out = build.compile_model(p, tmp_path / "artifact")
    archive = out / build.REPACKED_ARCHIVE
    index = rt.ParameterIndex()
    index.load(str(archive))
    entries = dict(index.items())
    data = archive.read_bytes()
    for name in p.copied:
        info = gguf.tensors[name]
        entry = entries[f"{name}.{COPY_PLANE}"]
        _, at = entry.file_storage
        assert entry.length == info.n_bytes and at % build.PARAM_ALIGN == 0
        assert data[at : at + info.n_bytes] == path.read_bytes()[info.offset : info.offset + info.n_bytes]
    planes = [key.rsplit(".", 1) for key in entries]
    repacked = {t for tensors, plane in planes if plane != COPY_PLANE for t in tensors.split("+")}
    bound = [n for n in gguf.tensors if n not in p.copied and (n not in repacked or n in memory.ALWAYS_BOUND)]
    from_gguf = sum(gguf.tensors[n].n_bytes for n in bound)
    assert memory.weights_bytes(gguf, [archive]) == archive.stat().st_size + from_gguf

    session = ModelSession(out, path, DEVICES["cpu"](), context_length=512)
    plain = open_session(path, "cpu", ONE_SEQUENCE)  # test_fixture_numerics' artifact: no copies
    prompt = [3, 17, 200, 5, 9, 11]
    assert np.array_equal(session.prefill(prompt).logits(), plain.prefill(prompt).logits())
    for pos, token in enumerate((7, 100, 42), start=len(prompt)):
        assert np.array_equal(session.decode(token, pos).logits(), plain.decode(token, pos).logits())
