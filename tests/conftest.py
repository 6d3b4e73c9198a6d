"""Shared test fixtures: model paths, tiny GGUF fixtures, devices, and compiled sessions.

Compiled artifacts go to `.zinc-cache/` in the repository (or `$ZINC_CACHE`), so a second run
reuses them; a fresh clone compiles each model once per run.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import pytest

from fixtures.make_fixtures import FIXTURES, write_fixture
from tests import artifacts_ahead
from tests.compile_pool import JobsOf, cancel_pending, compile_ahead
from zinc.compiler import dot8_layout
from zinc.compiler.build import ensure_artifact
from zinc.errors import GGUFError
from zinc.model.gguf_file import default_model_path, open_gguf
from zinc.model.reference import ReferenceModel
from zinc.runtime.device import DeviceSpec, resolve_device, vulkan_devices
from zinc.runtime.session import ModelSession

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("ZINC_CACHE", str(ROOT / ".zinc-cache"))
NO_VULKAN = "no Vulkan device (install mesa-vulkan-drivers libvulkan1 for lavapipe)"
GOLDEN = ROOT / "fixtures" / "golden"  # llama.cpp's outputs for the bundled models (README.md there)

DEVICES = {
    "cpu": lambda: resolve_device("cpu", "local-sync"),
    "cpu-task": lambda: resolve_device("cpu", "local-task"),
    "vulkan": lambda: resolve_device("vulkan"),
}
# ("device", "cpu") of a `Body` op that has a hand-written CPU dispatch: that dispatch (a tiled,
# i.e. CPU, module), its linalg form on the CPU, and the linalg form on Vulkan
KERNEL_FORMS = [
    pytest.param("cpu", True, id="cpu"),
    pytest.param("cpu", False, id="cpu-linalg"),
    pytest.param("vulkan", False, marks=[pytest.mark.vulkan], id="vulkan"),
]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--sizes", action="store_true", help="run the sizes tier (real-shape models, `-m sizes`)")
    parser.addoption("--fuzz", action="store_true", help="run the fuzz tier (tests/fuzz, minutes; `-m fuzz`)")
    parser.addoption(
        "--golden-long", action="store_true",
        help="run the long golden tier (32 tokens of every prompt on Vulkan, minutes on lavapipe; `-m golden_long`)",
    )  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # the sizes, fuzz and long golden tiers are deselected, not skipped: they are opt-in
    for marker in ("sizes", "fuzz", "golden_long"):
        if config.getoption(marker):
            continue
        tier = [item for item in items if item.get_closest_marker(marker)]
        if tier:
            config.hook.pytest_deselected(items=tier)
            items[:] = [item for item in items if not item.get_closest_marker(marker)]
    # the unit tier first: it opens few compiled models, so it keeps a core busy while
    # tests/artifacts_ahead.py compiles the bundled models that the e2e tests open at once
    items.sort(key=lambda item: not item.path.is_relative_to(ROOT / "tests" / "unit"))


_AHEAD: list[subprocess.Popen[bytes]] = []


def pytest_collection_finish(session: pytest.Session) -> None:
    if os.environ.get("ZINC_ARTIFACTS_AHEAD") == "1" and session.items and not _AHEAD:
        _AHEAD.append(artifacts_ahead.start(Path(os.environ["ZINC_CACHE"]) / "artifacts-ahead.log"))


def pytest_sessionfinish(session: pytest.Session) -> None:
    while _AHEAD:
        artifacts_ahead.stop(_AHEAD.pop())


def vulkan_verdict(devices: tuple[str, ...], environ: Mapping[str, str]) -> tuple[str, str] | None:
    """What becomes of a `vulkan` test: None (it runs), ("skip", why) or ("fail", why). Without a
    Vulkan device (no driver, or one that fails to load) it is skipped, unless ZINC_REQUIRE_VULKAN=1
    (set by .ci/run), which makes it fail: CI must not pass with its Vulkan tests quietly skipped."""
    if devices:
        return None
    if environ.get("ZINC_REQUIRE_VULKAN") == "1":
        return "fail", f"{NO_VULKAN}, and ZINC_REQUIRE_VULKAN=1 requires one"
    return "skip", NO_VULKAN


def pytest_runtest_setup(item: pytest.Item) -> None:
    if "vulkan" not in item.keywords:
        return
    verdict = vulkan_verdict(vulkan_devices(), os.environ)
    if verdict is None:
        return
    kind, why = verdict
    if kind == "fail":
        pytest.fail(why, pytrace=False)
    pytest.skip(why)


@functools.cache
def golden(name: str) -> dict[str, Any]:
    """fixtures/golden/NAME.json, read once (callers must not modify it). A missing file is an
    error, never a skip: the files are part of the repository."""
    path = GOLDEN / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"golden file {path} is missing (fixtures/golden/README.md: how to make it)")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


@pytest.fixture(scope="module", autouse=True)
def _compile_ahead(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test module with `compile_jobs` (tests/compile_pool.py) has the modules of its selected,
    runnable tests compiled ahead, in the order they run; the unstarted rest is dropped at its end."""
    jobs_of: JobsOf | None = getattr(request.module, "compile_jobs", None)
    if jobs_of is None:
        yield
        return
    runs = [
        item for item in request.session.items
        if isinstance(item, pytest.Function) and item.module is request.module and _will_run(item)
    ]  # fmt: skip
    queued = compile_ahead(job for item in runs for job in jobs_of(item.originalname, _params(item)))
    yield
    cancel_pending(queued)


def _params(item: pytest.Function) -> dict[str, Any]:
    return dict(item.callspec.params) if hasattr(item, "callspec") else {}


def _will_run(item: pytest.Function) -> bool:
    if any(mark.args and mark.args[0] is True for mark in item.iter_markers("skipif")):
        return False
    return "vulkan" not in item.keywords or vulkan_verdict(vulkan_devices(), os.environ) is None


def lavapipe_subgroup_target(subgroup: int = 8) -> str:
    """A Vulkan device target that declares what lavapipe has (subgroups of `subgroup` lanes with
    shuffles and arithmetic, 4 x int8 dot products, 64-bit integers, 8- and 16-bit storage): IREE compiles for it
    as for a named GPU target, with its subgroup pipelines, and lavapipe runs the result. Named
    targets assume subgroups of 32 or 64 lanes, so their own code does not run right there."""
    return (
        '#hal.device.target<"vulkan", [#hal.executable.target<"vulkan-spirv", "vulkan-spirv-fb", '
        '{iree_codegen.target_info = #iree_gpu.target<arch = "", features = "spirv:v1.6,cap:Shader", '
        "wgp = <compute = fp32|fp16|int64|int32|int16|int8, storage = b32|b16|b8, subgroup = shuffle|arithmetic, "
        f"dot = dp4xi8toi32, mma = [], subgroup_size_choices = [{subgroup}], max_workgroup_sizes = [1024, 1024, 1024], "
        "max_thread_count_per_workgroup = 1024, max_workgroup_memory_bytes = 65536, "
        "max_workgroup_counts = [65535, 65535, 65535]>>}>]> : !hal.device"
    )


def for_device_target(mlir: str, target: str) -> str:
    """The module `mlir` ("module @name {...") compiled for the device target `target`."""
    head = mlir[: mlir.index("{")].rstrip()
    assert head.startswith("module @") and " attributes" not in head, head
    return f"{head} attributes {{hal.device.targets = [{target}]}} " + mlir[len(head) :].lstrip()


def artifact_copy(model: Path, target: str, cache_dir: Path) -> Path:
    """A copy in `cache_dir` of the run's artifact of `model` (compiled once, in the shared cache),
    where `ensure_artifact(model, target, cache_dir=cache_dir)` finds it: for tests that break or
    inspect an artifact of their own, without compiling it again."""
    shared = ensure_artifact(model, target)
    return Path(shutil.copytree(shared, cache_dir / shared.name))


def target_of(device: str) -> str:
    """The compile target of a `DEVICES` name, without opening the device."""
    return "vulkan" if device.startswith("vulkan") else "cpu"


def device_params(*names: str) -> list[object]:
    """Parametrize over devices; the vulkan one carries the `vulkan` marker."""
    return [pytest.param(n, marks=[pytest.mark.vulkan] if n == "vulkan" else [], id=n) for n in names]


# The golden tests' opt-in long Vulkan run (`--golden-long`): the device "vulkan" with every
# prompt and all its tokens, where the ordinary "vulkan" run checks a few.
VULKAN_LONG = pytest.param("vulkan-long", marks=[pytest.mark.vulkan, pytest.mark.golden_long], id="vulkan-long")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("tiny")
    return {name: write_fixture(spec, out / f"{name}.gguf") for name, spec in FIXTURES.items()}


@pytest.fixture(scope="session")
def smollm2() -> Path:
    try:
        path = default_model_path()
    except GGUFError as exc:
        pytest.skip(exc.message)
    return path


class SessionFactory(Protocol):
    def __call__(self, model: Path, device: str, batch_sizes: tuple[int, ...] | None = None) -> ModelSession: ...


# The decode buckets of a session that runs one sequence at a time: an artifact with only decode_b1
# compiles in under half the time of one with the default buckets (tiny-gemma3 on the CPU: 12 s,
# against 27 s), so a fixture that no batching test opens takes these.
ONE_SEQUENCE = (1,)


def reference_model(path: Path, device: str) -> ReferenceModel:
    """The numpy oracle for a model compiled for `device`: on the CPU with the integer
    dot-product kernels, its matmuls round activations to Q8 as those kernels do, and its cached
    keys and values are f16 as the slab's (on every device: on Vulkan two to an i32 word).

    The two still drift apart by more than f32 rounding: rounding to Q8 is discontinuous, so
    float64-vs-f32 differences flip some rounded values, and the flips grow through the layers
    (about 1e-3 of the largest logit on the 2-layer fixtures, 3e-2 on SmolLM2's 30). The model
    tests allow that much (`TOL_Q8`); tests/kernels/test_dot8_kernels.py checks the kernels
    themselves to f32 accuracy, and the golden tests check tokens against llama.cpp."""
    cpu = device.startswith("cpu")
    return ReferenceModel(open_gguf(path), q8_activations=cpu and dot8_layout.enabled(), kv_f16=True)


@pytest.fixture(scope="session")
def open_session() -> SessionFactory:
    """Open (compiling once, through the cache) a session for a model on a named device, with
    the default decode buckets or `batch_sizes`."""
    sessions: dict[tuple[Path, str, tuple[int, ...] | None], ModelSession] = {}

    def make(model: Path, device: str, batch_sizes: tuple[int, ...] | None = None) -> ModelSession:
        key = (model, device, batch_sizes)
        if key not in sessions:
            spec: DeviceSpec = DEVICES[device]()
            art = ensure_artifact(model, spec.target, batch_sizes=batch_sizes)
            sessions[key] = ModelSession(art, model, spec, context_length=512)
        return sessions[key]

    return make
