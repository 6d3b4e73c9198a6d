"""One real activation: a server started on a tiny fixture model switches to the bundled SmolLM2
through `POST /v1/models/activate`, using the CLI's loader (compile through the cache, then a
`LocalEngine`), and answers as llama.cpp does."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import DEVICES
from tests.serving import ServerThread
from zinc.catalog.registry import CatalogRegistry
from zinc.cli_models import CliLoader
from zinc.compiler.build import ensure_artifact
from zinc.engine.manager import EngineManager

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_activate_smollm2_in_a_running_server(
    tmp_path: Path, smollm2: Path, tiny_models: dict[str, Path]
) -> None:
    device = DEVICES["cpu"]()
    # compile first (cached): activation then only loads, well within the client's 20 s timeout
    for model in (smollm2, tiny_models["tiny-q8-q41"]):
        ensure_artifact(model, device.target)
    registry = CatalogRegistry(tmp_path, profile=device.name, context_length=512, supported={"llama"})
    assert registry.get("smollm2") is not None and registry.get("smollm2").installed  # type: ignore[union-attr]
    loader = CliLoader(registry, device, 512, {"tiny": tiny_models["tiny-q8-q41"]})
    manager = EngineManager(loader=loader, registry=registry)
    srv = ServerThread(manager)
    try:
        assert srv.post("/v1/models/activate", {"model": "tiny"}).status_code == 200
        assert srv.post("/v1/completions", {"prompt": "x", "max_tokens": 1}).json()["model"] == "tiny"
        r = srv.post("/v1/models/activate", {"model": "smollm2"})
        assert r.status_code == 200, r.text
        out = srv.post("/v1/completions", {"prompt": "The capital of France is", "max_tokens": 3}).json()
        assert out["model"] == "smollm2" and out["choices"][0]["text"] == " Paris.\n"
        listed = {m["id"]: m for m in srv.get("/v1/models").json()["data"]}
        assert listed["smollm2"]["active"] and listed["smollm2"]["context_length"] == 512
        health = srv.get("/health").json()
        assert health["model"] == "smollm2" and health["gpu_memory_weights_bytes"] > 90_000_000
    finally:
        srv.stop()
