"""Model management over HTTP: the catalog listing and pull, activate, remove.

Owns: `GET /v1/models` (the managed catalog with install state, the active model, fit on this
device, download progress and the active model's memory; a server without a catalog lists just
the model it serves, and a model served from a path outside the catalog is listed as unmanaged),
`POST /v1/models/pull` (200 installed or started, 202 when that model is already downloading,
409 while another downloads), `POST /v1/models/activate` (load, compiling if needed, then swap
once requests in flight finish) and `POST /v1/models/remove` (409 for the loaded model unless
`force`). Every model id is checked before use: ids never become paths unchecked.
Imports: zinc.engine.{manager, models, types}, zinc.errors, zinc.server.{exchange, openai_request}, orjson, the stdlib.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from zinc.engine.manager import EngineManager
from zinc.engine.models import ModelInfo
from zinc.engine.types import EngineStats
from zinc.errors import InvalidRequestError
from zinc.server.exchange import Exchange, HttpRequest
from zinc.server.openai_request import decode_json

Json = dict[str, Any]


def memory_fields(stats: EngineStats, prefix: str) -> Json:
    """The active model's memory, as /health (prefix "gpu_") and /v1/models ("active_") name it."""
    return {
        f"{prefix}memory_used_bytes": stats.weights_bytes + stats.context_reserved_bytes,
        f"{prefix}memory_weights_bytes": stats.weights_bytes,
        f"{prefix}context_reserved_bytes": stats.context_reserved_bytes,
        f"{prefix}context_active_bytes": stats.context_active_bytes,
        f"{prefix}context_tokens": stats.context_tokens,
        f"{prefix}context_capacity_tokens": stats.kv_capacity_tokens,
    }


def _model_id(payload: Json) -> str:
    model = payload.get("model")
    if model is None:
        raise InvalidRequestError("Field 'model' is required.", param="model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("'model' must be a non-empty string.", param="model")
    return model


class ModelsApi:
    """Handlers for /v1/models and its management endpoints."""

    def __init__(self, manager: EngineManager) -> None:
        self._manager = manager
        self._started = int(time.time())

    async def list(self, request: HttpRequest, exchange: Exchange) -> None:
        manager = self._manager
        registry = manager.registry
        stats = manager.stats()
        active = manager.model_id
        budget = registry.memory_budget_bytes if registry is not None else 0
        data = [self._card(info, budget, stats) for info in (registry.models() if registry else [])]
        if active and all(card["id"] != active for card in data):
            data.insert(0, self._unmanaged(active, stats))
        body: Json = {
            "object": "list",
            "profile": registry.profile if registry is not None else stats.device,
            "active_model": active or None,
            "loading_model": manager.loading,
            "active_memory_budget_bytes": budget,
            **memory_fields(stats, "active_"),
            "data": data,
        }
        await exchange.respond_json(200, orjson.dumps(body))

    def _card(self, info: ModelInfo, budget: int, stats: EngineStats) -> Json:
        active = info.id == self._manager.model_id
        fits = budget == 0 or info.required_memory_bytes <= budget
        return {
            "id": info.id,
            "object": "model",
            "created": self._started,
            "owned_by": "zinc",
            "context_length": stats.context_length if active else None,
            "display_name": info.display_name,
            "homepage_url": info.homepage_url,
            "family": info.family,
            "architecture": info.architecture,
            "quantization": info.quantization,
            "size_bytes": info.size_bytes,
            "source": info.source,
            "installed": info.installed,
            "active": active,
            "loading": info.id == self._manager.loading,
            "managed": True,
            "supported_on_current_gpu": info.supported,
            "fits_current_gpu": fits,
            "required_vram_bytes": info.required_memory_bytes,
            "required_vram_with_offload_bytes": info.required_memory_bytes,
            "requires_offload_to_fit": False,
            "fit_source": "catalog",
            "status": "supported" if info.supported else "unsupported",
            "supports_thinking_toggle": False,
            "downloading": info.download.downloading,
            "download_phase": info.download.phase,
            "downloaded_bytes": info.download.downloaded_bytes,
            "download_total_bytes": info.download.total_bytes,
            "download_error": info.download.error,
        }

    def _unmanaged(self, model_id: str, stats: EngineStats) -> Json:
        return {
            "id": model_id,
            "object": "model",
            "created": self._started,
            "owned_by": "zinc",
            "context_length": stats.context_length,
            "installed": True,
            "active": True,
            "managed": False,
            "status": "supported",
        }

    async def pull(self, request: HttpRequest, exchange: Exchange) -> None:
        model = _model_id(decode_json(await exchange.body()))
        registry = self._manager.require_registry()
        progress, already = registry.pull(model)
        body: Json = {"object": "model.pull", "id": model}
        if progress.phase == "done" and not already:
            body["state"] = "installed"
        else:
            body.update(
                state="downloading",
                downloaded_bytes=progress.downloaded_bytes,
                download_total_bytes=progress.total_bytes,
            )
        await exchange.respond_json(202 if already else 200, orjson.dumps(body))

    async def activate(self, request: HttpRequest, exchange: Exchange) -> None:
        model = _model_id(decode_json(await exchange.body()))
        registry = self._manager.registry
        if registry is not None and registry.get(model) is None and not self._loadable(model):
            raise InvalidRequestError(f"Unknown model '{model}'.", param="model", code="model_not_found")
        engine = await self._manager.activate(model)
        body = {"object": "model.activation", "id": engine.model_id, "active": True}
        await exchange.respond_json(200, orjson.dumps(body))

    def _loadable(self, model: str) -> bool:
        loader = self._manager.loader
        return loader is not None and loader.can_load(model)

    async def remove(self, request: HttpRequest, exchange: Exchange) -> None:
        payload = decode_json(await exchange.body())
        model = _model_id(payload)
        force = payload.get("force", False)
        if not isinstance(force, bool):
            raise InvalidRequestError("'force' must be a boolean.", param="force")
        result, unloaded = await self._manager.remove(model, force=force)
        body = {
            "object": "model.remove",
            "id": model,
            "removed": True,
            "unloaded_from_gpu": unloaded,
            "cleared_active_selection": result.cleared_active_selection,
            "deleted_model": result.deleted_model,
            "deleted_manifest": result.deleted_manifest,
            "removed_dir": result.removed_dir,
        }
        await exchange.respond_json(200, orjson.dumps(body))
