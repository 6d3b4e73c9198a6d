"""Embeddings below the HTTP layer: pooling and normalization (zinc.engine.embeddings), how a
request's inputs are grouped into device calls (`packs`), the request parser
(zinc.server.embeddings_api), the pooling metadata (`{arch}.pooling_type`), the `embed` entries
(and the CPU's packed `embed_x{N}`) in the emitted module, the operator's pooling (`zinc serve --embeddings`) and
`Scheduler.call` (an embedding's device call on the
scheduler's thread)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from tests.conftest import DEVICES
from tests.unit._fake_step_model import WAIT_S, FakeModel, prompt, solo
from tests.unit.test_batcher import Run
from zinc import cli_models
from zinc.catalog.registry import CatalogRegistry
from zinc.cli import app
from zinc.cli_models import CliLoader
from zinc.compiler.build import artifact_key, plan
from zinc.compiler.graph import emit_module, entry_points
from zinc.engine.batcher import Scheduler
from zinc.engine.embeddings import normalize, packs, pool
from zinc.errors import EngineClosedError, InvalidRequestError, QueueFullError, UnsupportedModelError
from zinc.model.gguf_file import open_gguf
from zinc.model.hparams import HParams, describe, with_pooling
from zinc.server.embeddings_api import MAX_INPUTS, parse_embeddings

HIDDEN = np.array([[1.0, 2.0, 2.0, 0.0], [3.0, 0.0, 4.0, 0.0], [0.0, 0.0, 0.0, 5.0]], np.float32)


def test_pooling_mean_cls_last() -> None:
    assert pool(HIDDEN, "cls").tolist() == [1.0, 2.0, 2.0, 0.0]
    assert pool(HIDDEN, "last").tolist() == [0.0, 0.0, 0.0, 5.0]
    assert np.allclose(pool(HIDDEN, "mean"), [4 / 3, 2 / 3, 2.0, 5 / 3])
    assert pool(HIDDEN, "mean").dtype == np.float32
    with pytest.raises(ValueError, match="rank"):
        pool(HIDDEN, "rank")
    with pytest.raises(ValueError, match="at least one token"):
        pool(HIDDEN[:0], "last")


def test_normalize_truncates_then_renormalizes() -> None:
    v = pool(HIDDEN, "cls")
    assert np.allclose(normalize(v), [1 / 3, 2 / 3, 2 / 3, 0.0])
    # Matryoshka: the first 2 values, back to unit length
    assert np.allclose(normalize(v, 2), [1 / np.sqrt(5), 2 / np.sqrt(5)])
    assert normalize(np.zeros(3, np.float32)).tolist() == [0.0, 0.0, 0.0]


def test_packs_group_inputs_in_order_within_both_limits() -> None:
    assert packs([3, 4, 5, 6, 7], most=2, tokens=100) == [[0, 1], [2, 3], [4]]
    assert packs([10, 10, 10, 10], most=8, tokens=25) == [[0, 1], [2, 3]]  # the token budget
    assert packs([5, 300, 5, 5], most=8, tokens=256) == [[0], [1], [2, 3]]  # too long: alone
    assert packs([1, 2, 3], most=0, tokens=256) == [[0], [1], [2]]  # no packed entry: one each
    assert packs([7], most=8, tokens=256) == [[0]] and packs([], most=8, tokens=256) == []
    assert packs([8] * 32, most=8, tokens=256) == [list(range(i, i + 8)) for i in range(0, 32, 8)]


def test_parse_input_shapes() -> None:
    assert parse_embeddings({"input": "hi"}).inputs == ["hi"]
    assert parse_embeddings({"input": ["a", "b"]}).inputs == ["a", "b"]
    assert parse_embeddings({"input": [3, 4]}).inputs == [[3, 4]]
    assert parse_embeddings({"input": [[3], [4, 5]]}).inputs == [[3], [4, 5]]
    params = parse_embeddings({"input": "hi", "model": "m", "encoding_format": "base64", "dimensions": 8})
    assert (params.model, params.encoding_format, params.dimensions) == ("m", "base64", 8)
    assert parse_embeddings({"input": "hi", "user": "u"}).encoding_format == "float"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "input"),
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": [[]]}, "input"),
        ({"input": [1, "a"]}, "input"),
        ({"input": [[1], "a"]}, "input"),
        ({"input": [[1, "a"]]}, "input"),
        ({"input": [True, 2]}, "input"),
        ({"input": [-1]}, "input"),
        ({"input": 5}, "input"),
        ({"input": {"text": "hi"}}, "input"),
        ({"input": ["x"] * (MAX_INPUTS + 1)}, "input"),
        ({"input": "hi", "encoding_format": "hex"}, "encoding_format"),
        ({"input": "hi", "dimensions": 0}, "dimensions"),
        ({"input": "hi", "dimensions": True}, "dimensions"),
        ({"input": "hi", "dimensions": "8"}, "dimensions"),
        ({"input": "hi", "model": 3}, "model"),
        ({"input": "hi", "user": 3}, "user"),
    ],
)
def test_parse_rejects_bad_fields(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse_embeddings(body)
    assert info.value.param == param and info.value.status == 400


def test_pooling_metadata_and_the_embed_entry(tiny_models: dict[str, Path]) -> None:
    embed = describe(open_gguf(tiny_models["tiny-qwen3-embed"]))
    chat = describe(open_gguf(tiny_models["tiny-qwen3"]))
    assert (embed.hparams.pooling_type, embed.hparams.pooling) == (3, "last")
    assert (chat.hparams.pooling_type, chat.hparams.pooling) == (0, "none")
    # a manifest written before pooling_type existed reads as no pooling
    old = {k: v for k, v in chat.hparams.to_json().items() if k != "pooling_type"}
    assert HParams.from_json(old) == chat.hparams
    text = emit_module(embed, tiled=True, batch_sizes=(1, 4)).text("m")
    assert "func.func @embed(%ids: tensor<?xi32>) -> tensor<?x64xf32>" in text
    packed = "func.func @embed_x4(%ids: tensor<?xi32>, %pos: tensor<?xi32>, %off0: index, %len0: index, "
    assert packed in text and "@embed_x8" not in text
    assert "@embed" not in emit_module(chat, tiled=True).text("m")
    assert "@embed_x" not in emit_module(embed, tiled=False).text("m")  # Vulkan: `embed` alone
    assert entry_points((1, 4), True, embed=True)[-2:] == ["embed", "embed_x4"]
    assert entry_points((1, 4), False, embed=True)[-1] == "embed"
    assert not any(e.startswith("embed") for e in entry_points((1, 4), True))


def started(model: FakeModel, **kwargs: Any) -> Scheduler:
    scheduler = Scheduler(model, **{"page_size": 16, "parallel": 8, "max_queue": 4, **kwargs})
    scheduler.start()
    return scheduler


def test_call_runs_on_the_scheduler_thread_between_steps() -> None:
    model = FakeModel(hold_at=3)  # the third call waits until the test has queued its own
    scheduler = started(model, prefill_chunk=8)
    try:
        runs = [Run(scheduler, prompt(i, 6), max_tokens=20) for i in range(3)]
        assert model.inside.wait(WAIT_S)
        seen: list[tuple[str, int]] = []

        def device_call() -> int:
            seen.append((threading.current_thread().name, len(model.calls)))
            return 7

        done = scheduler.call(device_call)
        model.go.set()
        assert done.result(WAIT_S) == 7
        failed = scheduler.call(lambda: 1 // 0)
        with pytest.raises(ZeroDivisionError):
            failed.result(WAIT_S)
        for i, run in enumerate(runs):  # the sequences went on, unchanged, around both calls
            assert run.wait().reason == "length" and run.tokens == solo(prompt(i, 6), 20)
        assert seen[0][0] == "zinc-scheduler" and 3 <= seen[0][1] < len(model.calls)
    finally:
        scheduler.close()


def test_calls_are_bounded_and_fail_when_the_engine_closes() -> None:
    scheduler = Scheduler(FakeModel(), page_size=16, parallel=2, max_queue=2)  # not started: nothing runs
    waiting = [scheduler.call(lambda: 1) for _ in range(2)]
    with pytest.raises(QueueFullError):
        scheduler.call(lambda: 1)
    scheduler.close()
    for future in waiting:
        with pytest.raises(EngineClosedError):
            future.result(WAIT_S)
    with pytest.raises(EngineClosedError):
        scheduler.call(lambda: 1)


def test_the_operators_pooling_over_the_ggufs(tiny_models: dict[str, Path]) -> None:
    path = tiny_models["tiny-qwen3"]
    chat = describe(open_gguf(path))
    assert with_pooling(chat, None) is chat
    assert with_pooling(chat, "mean").hparams.pooling == "mean"
    assert with_pooling(describe(open_gguf(tiny_models["tiny-qwen3-embed"])), "cls").hparams.pooling == "cls"
    with pytest.raises(UnsupportedModelError, match="'sum' is not one of"):
        with_pooling(chat, "sum")
    gguf = open_gguf(path)
    assert artifact_key(gguf, "cpu") != artifact_key(gguf, "cpu", pooling="mean")  # its own cache entry
    assert "func.func @embed(" in plan(path, "cpu", pooling="mean").mlir
    assert "func.func @embed(" not in plan(path, "cpu").mlir


def test_serve_refuses_an_unknown_pooling(tiny_models: dict[str, Path]) -> None:
    out = CliRunner().invoke(app, ["serve", "-m", str(tiny_models["tiny-qwen3"]), "--embeddings", "rank"])
    assert out.exit_code != 0 and "--embeddings takes mean|cls|last, got 'rank'" in out.output


def test_the_cli_loader_compiles_with_the_operators_pooling(
    tmp_path: Path, tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    class CompileCalledError(Exception):
        pass

    def ensure(path: Path, target: str, progress: Any = None, **kwargs: Any) -> Path:
        seen.update(kwargs)
        raise CompileCalledError

    monkeypatch.setattr(cli_models, "ensure_artifact", ensure)
    device = DEVICES["cpu"]()
    registry = CatalogRegistry(tmp_path, profile=device.name, context_length=64, supported={"qwen3"})
    loader = CliLoader(registry, device, 64, {"chat": tiny_models["tiny-qwen3"]}, parallel=1, pooling="cls")
    with pytest.raises(CompileCalledError):
        loader.load("chat")
    assert seen["pooling"] == "cls"
