"""`zinc serve`'s batching settings: how `--parallel` and `--kv-tokens` size the KV slab, that bad
values are one-line errors before anything loads, that `--max-queue` reaches both the HTTP
admission and the engine's scheduler and `--prefill-chunk` the scheduler, and (e2e) that the CLI's
loader gives the engine exactly that slab in pages."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import DEVICES
from tests.e2e.test_cli import assert_one_line_error, zinc
from zinc.catalog.registry import CatalogRegistry
from zinc.cli_models import DEFAULT_MAX_QUEUE, KV_PAGE_SIZE, CliLoader, kv_slots
from zinc.cli_serve import ServeOptions, run_server
from zinc.server import ServerConfig


def test_kv_slots_default_to_parallel_contexts_plus_a_scratch_page() -> None:
    assert KV_PAGE_SIZE == 16
    assert kv_slots(8, 2048) == 8 * 2048 + 16
    assert kv_slots(1, 100) == 112 + 16  # whole pages
    assert kv_slots(8, 512, kv_tokens=1000) == 1008 + 16
    assert kv_slots(8, 512, kv_tokens=512) == 512 + 16  # one context is the least


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--kv-tokens", "100", "-c", "512"],
            "--kv-tokens must hold at least one context (512 positions), got 100",
        ),
        (["--parallel", "0"], "--parallel must be at least 1, got 0"),
        (["--max-queue", "-1"], "--max-queue must be at least 0, got -1"),
        (["--prefill-chunk", "0"], "--prefill-chunk must be at least 1, got 0"),
        (["--threads", "0", "--device", "cpu"], "--threads must be between 1 and 1024, got 0"),
    ],
)
def test_bad_batching_settings_are_one_line_errors(args: list[str], message: str) -> None:
    proc = zinc("serve", "-m", "/nonexistent/model.gguf", "--port", "0", *args, timeout=60)
    assert_one_line_error(proc, message)


def test_max_queue_reaches_the_admission_and_the_loader(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """What `zinc serve --max-queue 3 --parallel 2 --prefill-chunk 32` hands the server (nothing is
    loaded or served)."""
    import logging

    import zinc.server

    model = tmp_path / "m.gguf"
    model.write_bytes(b"")  # only its existence is checked before serving
    seen: dict[str, object] = {}
    monkeypatch.setattr(
        zinc.server, "serve", lambda manager, config, initial_model: seen.update(m=manager, c=config)
    )
    monkeypatch.setattr(logging, "basicConfig", lambda **kwargs: None)
    run_server(
        ServeOptions(str(model), "cpu", "local-task", 128, "127.0.0.1", 0, 2, None, max_queue=3, prefill_chunk=32)
    )
    config, manager = seen["c"], seen["m"]
    assert isinstance(config, ServerConfig) and (config.parallel, config.max_queued_requests) == (2, 3)
    loader = manager.loader  # type: ignore[attr-defined]
    assert isinstance(loader, CliLoader) and (loader.parallel, loader.max_queue) == (2, 3)
    assert loader.prefill_chunk == 32
    assert (
        ServeOptions(None, "cpu", "local-task", 128, "127.0.0.1", 0, 2, None).max_queue == DEFAULT_MAX_QUEUE
    )
    assert ServerConfig().max_queued_requests == DEFAULT_MAX_QUEUE  # the server's own default agrees


@pytest.mark.e2e
def test_the_cli_loader_gives_the_engine_its_kv_tokens_in_pages(
    tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    device = DEVICES["cpu"]()
    registry = CatalogRegistry(tmp_path, profile=device.name, context_length=128, supported={"llama"})
    loader = CliLoader(
        registry, device, 128, {"tiny": tiny_models["tiny-q8-q41"]}, parallel=2, kv_tokens=300, max_queue=3,
        prefill_chunk=32,
    )
    engine = loader.load("tiny")
    try:
        stats = engine.stats()
        assert engine.context_length == 128 and engine.scheduler.parallel == 2
        assert (engine.scheduler.max_queue, engine.scheduler.prefill_chunk) == (3, 32)
        assert (stats.kv_page_size, stats.kv_pages_total, stats.kv_pages_free) == (
            16,
            19,
            19,
        )  # ceil(300 / 16)
        assert stats.context_reserved_bytes == engine.session.kv_cache_bytes()
        assert engine.session.kv_slots == 20 * 16  # the scratch page too
    finally:
        engine.close()
