"""The memory check before a model loads (zinc.runtime.memory, zinc.runtime.session.memory_needed):
the estimate (the weights an artifact binds, its KV slab, working buffers), the memory available
(MemAvailable, a cgroup's limit, `ZINC_MEMORY_LIMIT`), the one-line error naming both in GiB, and
that the CLI's loader fails with it before compiling or loading anything (the activate API's
answer). No model is compiled here; tests/e2e/test_memory_limit.py runs the CLI.
"""

from __future__ import annotations

from pathlib import Path

import iree.runtime as rt
import numpy as np
import pytest

from tests.conftest import DEVICES
from zinc.catalog.registry import CatalogRegistry
from zinc.cli_models import CliLoader, kv_slots
from zinc.errors import InsufficientMemoryError, ZincError
from zinc.model.gguf_file import open_gguf
from zinc.model.hparams import describe
from zinc.runtime.memory import (
    GIB,
    LIMIT_ENV,
    MIB,
    PROCESS_BYTES,
    Available,
    MemoryNeed,
    available_memory,
    check_memory,
    parse_size,
    weights_bytes,
)
from zinc.runtime.session import memory_needed
from zinc.server.error_table import describe as describe_error


@pytest.mark.parametrize(
    ("text", "size"),
    [("1073741824", GIB), ("8GiB", 8 * GIB), ("512 MiB", 512 * MIB), ("1.5G", 3 * GIB // 2), ("2GB", 2 * 10**9),
     ("64k", 64 << 10)],
)  # fmt: skip
def test_the_limit_takes_bytes_or_a_unit(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "8 parsecs", "-1GiB", "GiB"])
def test_a_bad_limit_is_a_one_line_error(text: str) -> None:
    with pytest.raises(ZincError, match=f"^{LIMIT_ENV} must be a size in bytes"):
        parse_size(text)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_available_is_mem_available_capped_by_the_cgroup_headroom(tmp_path: Path) -> None:
    meminfo = write(tmp_path / "meminfo", "MemTotal:  16777216 kB\nMemAvailable:   8388608 kB\n")  # 8 GiB
    root = tmp_path / "cgroup"
    own = write(tmp_path / "self-cgroup", "0::/box/job\n")
    none = available_memory({}, meminfo, root, own)
    assert none == Available(8 * GIB, "MemAvailable")
    # a limit on the parent group: 4 GiB, of which 3 GiB used, 1 GiB of it inactive page cache
    write(root / "box" / "memory.max", f"{4 * GIB}\n")
    write(root / "box" / "memory.current", f"{3 * GIB}\n")
    write(root / "box" / "memory.stat", f"anon {2 * GIB}\ninactive_file {GIB}\n")
    write(root / "box" / "job" / "memory.max", "max\n")  # none on the group itself
    capped = available_memory({}, meminfo, root, own)
    assert capped is not None and capped.bytes == 2 * GIB and "cgroup" in capped.source
    # ZINC_MEMORY_LIMIT overrides both
    assert available_memory({LIMIT_ENV: "12GiB"}, meminfo, root, own) == Available(12 * GIB, LIMIT_ENV)
    # nothing readable: nothing is known (and nothing is checked)
    assert available_memory({}, tmp_path / "none", tmp_path / "none", tmp_path / "none") is None


def test_a_cgroup_v1_limit_counts_and_its_no_limit_value_does_not(tmp_path: Path) -> None:
    meminfo = write(tmp_path / "meminfo", "MemAvailable:   8388608 kB\n")
    root = tmp_path / "cgroup"
    own = write(tmp_path / "self-cgroup", "4:memory:/elsewhere\n0::/\n")  # not under the mount: its root
    write(root / "memory" / "memory.limit_in_bytes", "9223372036854771712\n")
    assert available_memory({}, meminfo, root, own) == Available(8 * GIB, "MemAvailable")
    write(root / "memory" / "memory.limit_in_bytes", f"{GIB}\n")
    write(root / "memory" / "memory.usage_in_bytes", f"{GIB // 2}\n")
    write(root / "memory" / "memory.stat", "total_inactive_file 0\n")
    limited = available_memory({}, meminfo, root, own)
    assert limited is not None and limited.bytes == GIB // 2


def test_the_error_names_what_is_needed_and_what_is_available() -> None:
    need = MemoryNeed(weights=GIB, kv_cache=GIB // 2, working=GIB // 4)
    check_memory(need, "big", Available(2 * GIB, "MemAvailable"))  # fits: nothing happens
    with pytest.raises(InsufficientMemoryError) as caught:
        check_memory(need, "big", Available(GIB // 2, LIMIT_ENV))
    message = caught.value.message
    assert "\n" not in message
    assert message.startswith("big does not fit in memory: it needs 1.75 GiB (weights 1.00 GiB, KV cache 0.50 GiB")
    assert "and 0.50 GiB is available (ZINC_MEMORY_LIMIT)" in message
    status, body = describe_error(caught.value)  # what the activate API answers
    assert status == 400 and body["error"]["code"] == "model_does_not_fit"


def test_the_estimate_counts_the_weights_the_kv_slab_and_the_step_buffers(tiny_models: dict[str, Path]) -> None:
    gguf = open_gguf(tiny_models["tiny-q8-q41"])
    hp = describe(gguf).hparams
    need = memory_needed(gguf, "cpu", context_length=128, kv_slots=1000)
    assert need.weights == sum(t.n_bytes for t in gguf.tensors.values())  # not compiled: every tensor
    assert need.kv_cache == 1000 * hp.block_count * 2 * hp.head_count_kv * hp.key_length * 2  # f16 on the CPU
    assert need.working > PROCESS_BYTES
    vulkan = memory_needed(gguf, "vulkan", context_length=128, kv_slots=1000)
    assert vulkan.kv_cache == need.kv_cache  # f16 on Vulkan too (two to an i32 word)
    default = memory_needed(gguf, "cpu")  # a whole context and the scratch slots
    assert default.kv_cache == (min(2048, hp.context_length) + 64) * need.kv_cache // 1000


def test_the_weights_of_an_artifact_are_its_archive_and_the_tensors_it_does_not_repack(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    gguf = open_gguf(tiny_models["tiny-q8-q41"])
    archive = tmp_path / "weights.irpa"
    planes = {
        "blk.0.attn_q.weight+blk.0.attn_k.weight.qs": np.zeros(1000, np.uint8),
        "blk.0.attn_q.weight+blk.0.attn_k.weight.d": np.zeros(100, np.uint16),
        "token_embd.weight.qs": np.zeros(500, np.uint8),  # a tied output head, repacked
    }
    rt.save_archive_file(planes, archive)
    replaced = gguf.tensors["blk.0.attn_q.weight"].n_bytes + gguf.tensors["blk.0.attn_k.weight"].n_bytes
    everything = sum(t.n_bytes for t in gguf.tensors.values())
    # the embedding rows are still read from the GGUF
    assert weights_bytes(gguf, [archive]) == everything - replaced + archive.stat().st_size


def test_the_cli_loader_refuses_a_model_that_does_not_fit_before_compiling(
    tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import zinc.cli_models

    def never(*args: object, **kwargs: object) -> Path:
        raise AssertionError("compiled a model that does not fit")

    monkeypatch.setattr(zinc.cli_models, "ensure_artifact", never)
    monkeypatch.setenv(LIMIT_ENV, "0.1GiB")
    device = DEVICES["cpu"]()
    registry = CatalogRegistry(tmp_path, profile=device.name, context_length=128, supported={"llama"})
    loader = CliLoader(registry, device, 128, {"tiny": tiny_models["tiny-q8-q41"]}, parallel=4)
    with pytest.raises(InsufficientMemoryError, match=r"^tiny does not fit in memory: it needs 0\.\d\d GiB"):
        loader.load("tiny")
    gguf = open_gguf(tiny_models["tiny-q8-q41"])
    need = memory_needed(gguf, "cpu", 128, kv_slots(4, 128))
    monkeypatch.setenv(LIMIT_ENV, str(need.total))  # exactly enough: it goes on to compile
    with pytest.raises(AssertionError, match="compiled"):
        loader.load("tiny")
