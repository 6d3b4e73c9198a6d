"""Model management through the HTTP API with fake engines: the catalog listing, pull from a local
HTTP server, activate (swapping only after requests in flight finish), the `model` field,
remove (409 unless forced, then 503), and /health while a model loads."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.fakes import FakeEngine
from tests.file_server import FileServer
from tests.serving import FakeLoader, ServerThread
from zinc.catalog.entries import CatalogEntry
from zinc.catalog.registry import CatalogRegistry
from zinc.engine.manager import EngineManager
from zinc.errors import GGUFError

pytestmark = pytest.mark.e2e
BLOB = bytes(range(256)) * 2048  # 512 KiB
HI = [{"role": "user", "content": "hi"}]


def catalog_entry(model_id: str, url: str, data: bytes = BLOB) -> dict[str, Any]:
    entry = CatalogEntry(
        id=model_id, display_name=model_id.title(), source=url, sha256=hashlib.sha256(data).hexdigest(),
        size_bytes=len(data), architecture="llama", quantization="Q8_0", family="Test",
    )  # fmt: skip
    return entry.to_json()


class Setup:
    def __init__(self, home: Path, files: FileServer, engine: FakeEngine | None) -> None:
        entries = [catalog_entry(i, files.url("blob.gguf")) for i in ("alpha", "beta")]
        (home / "catalog.json").write_bytes(orjson.dumps({"models": entries}))
        self.files = files
        self.registry = CatalogRegistry(
            home, supported={"llama"}, memory_budget_bytes=1 << 34, context_length=512
        )
        self.loader = FakeLoader({"fake-model"}, self.registry, token_delay=0.002)
        self.manager = EngineManager(engine, loader=self.loader, registry=self.registry)
        self.srv = ServerThread(self.manager)

    def install(self, *ids: str) -> None:
        for model_id in ids:
            r = self.srv.post("/v1/models/pull", {"model": model_id})
            assert r.status_code == 200, r.text
            assert self.registry.wait(model_id, 20).phase == "done"

    def chat(self, model: str | None = None, **extra: Any) -> Any:
        return self.srv.post(
            "/v1/chat/completions", {"messages": HI, "max_tokens": 3, "model": model, **extra}
        )


@pytest.fixture
def files() -> Iterator[FileServer]:
    server = FileServer({"blob.gguf": BLOB})
    yield server
    server.close()


@pytest.fixture
def setup(tmp_path: Path, files: FileServer) -> Iterator[Setup]:
    s = Setup(tmp_path, files, FakeEngine(token_delay=0.002))
    yield s
    s.srv.stop()


def cards(setup: Setup) -> dict[str, Any]:
    body = setup.srv.get("/v1/models").json()
    return {card["id"]: card for card in body["data"]}


def test_listing_shows_catalog_install_state_and_the_active_model(setup: Setup) -> None:
    body = setup.srv.get("/v1/models").json()
    assert body["object"] == "list" and body["active_model"] == "fake-model"
    assert (
        body["active_memory_budget_bytes"] == 1 << 34 and body["active_context_capacity_tokens"] == 64 * 16
    )  # the fake's KV pages
    by_id = {c["id"]: c for c in body["data"]}
    assert by_id["fake-model"]["active"] and not by_id["fake-model"]["managed"]
    alpha = by_id["alpha"]
    assert alpha["managed"] and not alpha["installed"] and not alpha["active"]
    assert alpha["download_phase"] == "idle" and alpha["size_bytes"] == len(BLOB)
    assert alpha["fits_current_gpu"] and alpha["status"] == "supported"
    assert by_id["gemma3-270m"]["status"] == "unsupported"
    assert "smollm2" in by_id


def test_pull_reports_progress_and_answers_202_while_downloading(setup: Setup, files: FileServer) -> None:
    files.chunk, files.chunk_delay = 16 * 1024, 0.01  # about 0.3 s
    r = setup.srv.post("/v1/models/pull", {"model": "alpha"})
    assert r.status_code == 200 and r.json()["state"] == "downloading", r.text
    again = setup.srv.post("/v1/models/pull", {"model": "alpha"})
    assert again.status_code == 202 and again.json()["state"] == "downloading"
    other = setup.srv.post("/v1/models/pull", {"model": "beta"})
    assert other.status_code == 409 and other.json()["error"]["type"] == "invalid_request_error"
    seen = []
    deadline = time.monotonic() + 20
    while not (card := cards(setup)["alpha"])["installed"] and time.monotonic() < deadline:
        seen.append((card["downloading"], card["downloaded_bytes"], card["download_total_bytes"]))
        time.sleep(0.02)
    assert card["installed"] and card["download_phase"] == "done"
    assert any(downloading and 0 < done < total == len(BLOB) for downloading, done, total in seen), seen
    done = setup.srv.post("/v1/models/pull", {"model": "alpha"})
    assert done.status_code == 200 and done.json() == {
        "object": "model.pull",
        "id": "alpha",
        "state": "installed",
    }


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "../../etc/passwd"}, 400, "model"),
        ({"model": "no-such-model"}, 400, "model"),
        ({}, 400, "model"),
        ({"model": 7}, 400, "model"),
    ],
)
def test_bad_management_requests(setup: Setup, body: dict[str, Any], status: int, param: str) -> None:
    for path in ("/v1/models/pull", "/v1/models/activate", "/v1/models/remove"):
        r = setup.srv.post(path, body)
        assert r.status_code == status and r.json()["error"]["param"] == param, (path, r.text)


def test_activate_swaps_models_and_requests_follow(setup: Setup) -> None:
    setup.install("alpha")
    r = setup.srv.post("/v1/models/activate", {"model": "alpha"})
    assert r.status_code == 200 and r.json() == {"object": "model.activation", "id": "alpha", "active": True}
    assert setup.chat().json()["model"] == "alpha"
    by_id = cards(setup)
    assert by_id["alpha"]["active"] and not by_id["beta"]["active"]
    assert "fake-model" not in by_id  # an unmanaged model is listed only while it is served
    not_installed = setup.srv.post("/v1/models/activate", {"model": "beta"})
    assert not_installed.status_code == 404 and not_installed.json()["error"]["code"] == "model_not_found"
    unsupported = setup.srv.post("/v1/models/activate", {"model": "gemma3-270m"})
    assert unsupported.status_code == 400 and unsupported.json()["error"]["code"] == "unsupported_model"


def test_activation_waits_for_requests_in_flight(setup: Setup) -> None:
    """The swap happens only once the streaming request (about 2 s long) has finished.

    Judged by the server's own count of requests in flight, not by the order in which two client
    threads see their responses (which the scheduler may swap on a loaded machine)."""
    setup.install("alpha")
    started = threading.Event()
    chunks: list[bytes] = []

    def stream() -> None:
        body = {"messages": HI, "max_tokens": 1000, "stream": True}
        with setup.srv.http.stream("POST", "/v1/chat/completions", json=body) as r:
            for chunk in r.iter_bytes():
                chunks.append(chunk)
                started.set()

    streamer = threading.Thread(target=stream)
    streamer.start()
    assert started.wait(10)
    assert setup.manager.in_flight == 1  # the stream is still generating when activation is asked for
    r = setup.srv.post("/v1/models/activate", {"model": "alpha"})
    assert r.status_code == 200, r.text
    assert setup.manager.in_flight == 0  # activation returned only after the stream had finished
    streamer.join(10)
    text = b"".join(chunks).decode()
    assert text.endswith("data: [DONE]\n\n") and '"model":"fake-model"' in text and '"alpha"' not in text
    assert '"finish_reason":"length"' in text  # the old model generated all of it
    assert setup.chat().json()["model"] == "alpha"


def test_model_field_switches_to_an_installed_model(setup: Setup) -> None:
    setup.install("alpha", "beta")
    assert setup.chat("beta").json()["model"] == "beta"
    assert setup.chat("alpha").json()["model"] == "alpha"
    assert setup.chat().json()["model"] == "alpha"
    assert setup.chat("fake-model").json()["model"] == "fake-model"  # the loader knows it too
    assert setup.loader.loaded == ["beta", "alpha", "fake-model"]
    unknown = setup.chat("gpt-4o")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"


def test_remove_refuses_the_loaded_model_unless_forced(setup: Setup, tmp_path: Path) -> None:
    setup.install("alpha")
    assert setup.srv.post("/v1/models/activate", {"model": "alpha"}).status_code == 200
    gguf = tmp_path / "models" / "alpha" / "alpha.gguf"
    refused = setup.srv.post("/v1/models/remove", {"model": "alpha"})
    assert refused.status_code == 409 and gguf.is_file()
    forced = setup.srv.post("/v1/models/remove", {"model": "alpha", "force": True})
    assert forced.status_code == 200, forced.text
    assert forced.json() == {
        "object": "model.remove", "id": "alpha", "removed": True, "unloaded_from_gpu": True,
        "cleared_active_selection": False, "deleted_model": True, "deleted_manifest": True, "removed_dir": True,
    }  # fmt: skip
    assert not gguf.parent.exists()
    r = setup.chat()
    assert r.status_code == 503 and r.json()["error"]["code"] == "service_unavailable"
    health = setup.srv.get("/health")
    assert health.status_code == 200 and health.json()["model"] == "none"
    assert setup.srv.get("/v1/models").json()["active_model"] is None
    assert setup.srv.post("/tokenize", {"content": "x"}).status_code == 503
    assert setup.chat("fake-model").json()["model"] == "fake-model"  # a request can load one again


def test_health_is_503_loading_until_the_first_model_is_loaded(tmp_path: Path, files: FileServer) -> None:
    s = Setup(tmp_path, files, None)
    try:
        s.loader.gate = threading.Event()
        result: list[Any] = []
        activation = threading.Thread(
            target=lambda: result.append(s.srv.post("/v1/models/activate", {"model": "fake-model"}))
        )
        activation.start()
        deadline = time.monotonic() + 10
        while s.manager.loading is None and time.monotonic() < deadline:
            time.sleep(0.005)
        health = s.srv.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "loading"
        assert health.json()["loading_model"] == "fake-model"
        busy = s.chat()
        assert busy.status_code == 503 and "loading" in busy.json()["error"]["message"]
        assert s.srv.get("/v1/models").json()["loading_model"] == "fake-model"
        s.loader.gate.set()
        activation.join(10)
        assert result[0].status_code == 200
        assert s.srv.get("/health").json()["status"] == "ok" and s.chat().status_code == 200
    finally:
        s.srv.stop()


def test_a_failed_activation_keeps_the_old_model(setup: Setup) -> None:
    setup.install("alpha")
    setup.loader.failures["alpha"] = GGUFError("alpha.gguf: damaged or truncated GGUF header")
    r = setup.srv.post("/v1/models/activate", {"model": "alpha"})
    assert r.status_code == 400 and "damaged" in r.json()["error"]["message"]
    assert setup.chat().json()["model"] == "fake-model" and setup.manager.load_error


def test_a_server_without_management_says_so() -> None:
    srv = ServerThread(FakeEngine())
    try:
        r = srv.post("/v1/models/activate", {"model": "x"})
        assert r.status_code == 501 and r.json()["error"]["code"] == "unsupported_operation"
        assert srv.post("/v1/models/pull", {"model": "x"}).status_code == 501
        assert [c["id"] for c in srv.get("/v1/models").json()["data"]] == ["fake-model"]
    finally:
        srv.stop()
