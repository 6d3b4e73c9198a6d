"""The model catalog: ids, the catalog file, and downloads from a local HTTP server
(progress, resume after a broken transfer, a server without ranges, checksum mismatch)."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest

from tests.file_server import FileServer
from zinc.catalog.download import DownloadError, download_model
from zinc.catalog.entries import BUILTIN, CatalogEntry, CatalogError, check_model_id, load_catalog, zinc_home
from zinc.catalog.registry import CatalogRegistry
from zinc.catalog.store import ModelStore
from zinc.engine.models import ModelConflictError
from zinc.errors import InvalidRequestError

BLOB = bytes(range(256)) * 4096  # 1 MiB


def entry(url: str, data: bytes = BLOB, model_id: str = "blob", sha256: str | None = None) -> CatalogEntry:
    return CatalogEntry(
        id=model_id,
        display_name="Blob",
        source=url,
        sha256=sha256 if sha256 is not None else hashlib.sha256(data).hexdigest(),
        size_bytes=len(data),
        architecture="llama",
        quantization="Q8_0",
    )


def write_catalog(home: Path, *entries: CatalogEntry) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "catalog.json").write_bytes(orjson.dumps({"models": [e.to_json() for e in entries]}))


@pytest.fixture
def files() -> Iterator[FileServer]:
    server = FileServer({"blob.gguf": BLOB})
    yield server
    server.close()


@pytest.mark.parametrize(
    "bad", ["", "..", "../etc", "a/b", "/abs", ".hidden", "a\\b", "x\x00", "a..b", "é", "x" * 97]
)
def test_ids_with_path_tricks_are_rejected(bad: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        check_model_id(bad)
    assert info.value.param == "model"


def test_good_ids_pass() -> None:
    for good in ("smollm2", "gemma3-270m", "Qwen3-0.6B_Q8.0"):
        assert check_model_id(good) == good


def test_zinc_home_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ZINC_HOME", str(tmp_path))
    assert zinc_home() == tmp_path
    monkeypatch.delenv("ZINC_HOME")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert zinc_home() == tmp_path / "xdg" / "zinc"


def test_catalog_file_adds_and_overrides_entries(tmp_path: Path) -> None:
    write_catalog(tmp_path, entry("https://example.invalid/a.gguf", model_id="extra"))
    catalog = load_catalog(tmp_path)
    assert {e.id for e in BUILTIN} | {"extra"} == set(catalog)
    assert catalog["extra"].source == "https://example.invalid/a.gguf"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{", "cannot read the catalog"),
        (b"[]", 'expected {"models"'),
        (orjson.dumps({"models": [{"id": "../x"}]}), "'display_name' must be"),
        (orjson.dumps({"models": [{**entry("https://h/x").to_json(), "id": "../x"}]}), "Invalid model id"),
        (
            orjson.dumps({"models": [{**entry("https://h/x").to_json(), "source": "file:///etc/passwd"}]}),
            "http(s) URL",
        ),
        (orjson.dumps({"models": [{**entry("https://h/x").to_json(), "sha256": "abc"}]}), "sha256"),
        (orjson.dumps({"models": [{**entry("https://h/x").to_json(), "size_bytes": -1}]}), "size_bytes"),
        (orjson.dumps({"models": [{**entry("https://h/x").to_json(), "colour": "red"}]}), "unknown field"),
    ],
)
def test_bad_catalog_files_give_clear_errors(tmp_path: Path, raw: bytes, message: str) -> None:
    (tmp_path / "catalog.json").write_bytes(raw)
    with pytest.raises(CatalogError, match=None) as info:
        load_catalog(tmp_path)
    assert message in info.value.message


def test_download_reports_progress_and_installs_atomically(tmp_path: Path, files: FileServer) -> None:
    store = ModelStore(tmp_path)
    seen: list[tuple[int, int]] = []
    phases: list[str] = []
    path = download_model(
        entry(files.url("blob.gguf")), store, lambda d, t: seen.append((d, t)), phases.append
    )
    assert path == tmp_path / "models" / "blob" / "blob.gguf" and path.read_bytes() == BLOB
    assert phases == ["downloading", "verifying"]
    assert seen[-1] == (len(BLOB), len(BLOB)) and any(0 < d < len(BLOB) for d, _ in seen)
    manifest = orjson.loads((path.parent / "manifest.json").read_bytes())
    assert manifest["sha256"] == hashlib.sha256(BLOB).hexdigest() and manifest["size_bytes"] == len(BLOB)
    assert sorted(p.name for p in path.parent.iterdir()) == ["blob.gguf", "manifest.json"]


def test_broken_transfer_is_resumed_with_a_range_request(tmp_path: Path, files: FileServer) -> None:
    files.drop_after, files.drops_left = 300_000, 1
    path = download_model(entry(files.url("blob.gguf")), ModelStore(tmp_path), retry_delay_s=0)
    assert path.read_bytes() == BLOB
    assert files.requests == [("blob.gguf", None), ("blob.gguf", "bytes=300000-")]
    assert files.sent_bytes == len(BLOB)  # nothing was fetched twice


def test_part_left_by_an_earlier_run_is_resumed(tmp_path: Path, files: FileServer) -> None:
    files.drop_after, files.drops_left = 400_000, 1
    store = ModelStore(tmp_path)
    with pytest.raises(DownloadError, match="run the pull again to resume"):
        download_model(entry(files.url("blob.gguf")), store, retries=0)
    assert store.part_path("blob").stat().st_size == 400_000
    assert not store.gguf_path("blob").exists()
    download_model(entry(files.url("blob.gguf")), store)
    assert files.requests[-1] == ("blob.gguf", "bytes=400000-")
    assert store.gguf_path("blob").read_bytes() == BLOB and not store.part_path("blob").exists()


def test_server_without_ranges_restarts_from_zero(tmp_path: Path, files: FileServer) -> None:
    store = ModelStore(tmp_path)
    store.part_path("blob").parent.mkdir(parents=True)
    store.part_path("blob").write_bytes(b"garbage" * 1000)
    files.ignore_range = True
    download_model(entry(files.url("blob.gguf")), store)
    assert store.gguf_path("blob").read_bytes() == BLOB


def test_checksum_mismatch_is_rejected_and_nothing_is_left(tmp_path: Path, files: FileServer) -> None:
    store = ModelStore(tmp_path)
    with pytest.raises(DownloadError, match="sha256 mismatch"):
        download_model(entry(files.url("blob.gguf"), sha256="0" * 64), store)
    assert not (tmp_path / "models" / "blob").exists()


def test_http_errors_and_wrong_sizes_fail_cleanly(tmp_path: Path, files: FileServer) -> None:
    store = ModelStore(tmp_path)
    with pytest.raises(DownloadError, match="HTTP 404"):
        download_model(entry(files.url("missing.gguf")), store)
    with pytest.raises(DownloadError, match="the catalog says"):
        download_model(entry(files.url("blob.gguf"), data=BLOB + b"x"), store)
    assert not (tmp_path / "models" / "blob").exists()


def test_registry_pulls_in_the_background(tmp_path: Path, files: FileServer) -> None:
    files.chunk, files.chunk_delay = 32 * 1024, 0.01  # about 0.3 s in all
    write_catalog(tmp_path, entry(files.url("blob.gguf")), entry(files.url("blob.gguf"), model_id="other"))
    registry = CatalogRegistry(tmp_path, supported={"llama"}, memory_budget_bytes=1 << 30)
    assert registry.get("blob") is not None and not registry.get("blob").installed  # type: ignore[union-attr]
    state, already = registry.pull("blob")
    assert state.phase == "downloading" and not already
    _, already = registry.pull("blob")
    assert already
    with pytest.raises(ModelConflictError):
        registry.pull("other")
    with pytest.raises(ModelConflictError):
        registry.remove("blob")
    progress = []
    deadline = time.monotonic() + 20
    while (
        (info := registry.get("blob")) is not None
        and info.download.downloading
        and time.monotonic() < deadline
    ):
        progress.append(info.download.downloaded_bytes)
        time.sleep(0.02)
    assert info is not None and info.installed and info.download.phase == "done"
    assert any(0 < p < len(BLOB) for p in progress)
    assert registry.pull("blob") == (registry.pull("blob")[0], False)  # installed: nothing starts
    result = registry.remove("blob")
    assert result.deleted_model and result.deleted_manifest and result.removed_dir
    assert not registry.get("blob").installed  # type: ignore[union-attr]


def test_a_model_is_reported_installed_only_when_its_pull_has_ended(tmp_path: Path, files: FileServer) -> None:
    """The file is moved into place a moment before the pull's phase becomes "done"."""
    installed_file, release = threading.Event(), threading.Event()

    def downloader(e: CatalogEntry, store: ModelStore, progress: Callable[[int, int], None],
                   phase: Callable[[str], None]) -> Path:
        path = download_model(e, store, progress, phase)
        installed_file.set()
        release.wait(20)
        return path

    write_catalog(tmp_path, entry(files.url("blob.gguf")))
    registry = CatalogRegistry(tmp_path, supported={"llama"}, downloader=downloader)
    registry.pull("blob")
    assert installed_file.wait(20)
    info = registry.get("blob")
    assert info is not None and info.download.phase == "verifying" and not info.installed
    assert registry.pull("blob") == (info.download, True)  # the pull is still running
    release.set()
    assert registry.wait("blob", timeout=20).phase == "done"
    assert registry.get("blob").installed  # type: ignore[union-attr]


def test_registry_records_a_failed_pull(tmp_path: Path, files: FileServer) -> None:
    write_catalog(tmp_path, entry(files.url("blob.gguf"), sha256="1" * 64))
    registry = CatalogRegistry(tmp_path, supported={"llama"})
    registry.pull("blob")
    final = registry.wait("blob", timeout=20)
    assert final.phase == "failed" and "sha256 mismatch" in final.error
    assert not (tmp_path / "models" / "blob").exists()


def test_wheel_models_and_default_selection(tmp_path: Path) -> None:
    registry = CatalogRegistry(tmp_path, supported={"llama"})
    smollm2 = registry.get("smollm2")
    assert smollm2 is not None and smollm2.supported and smollm2.source == "wheel:smollm2"
    gemma = registry.get("gemma3-270m")
    assert gemma is not None and not gemma.supported
    registry.store.set_default_model("smollm2")
    assert registry.store.default_model() == "smollm2"
    if smollm2.installed:
        result = registry.remove("smollm2")  # the wheel's file stays; the selection goes
        assert result.cleared_active_selection and not result.deleted_model
        assert registry.path("smollm2").is_file()
    assert registry.store.default_model() is None
    assert os.listdir(tmp_path) == ["config.json"]
