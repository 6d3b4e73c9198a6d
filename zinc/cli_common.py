"""What every `zinc` command shares: the stderr console, errors, progress lines and common options.

Owns: `err` (rich console on stderr), `fail` (one red line and a non-zero exit), `progress`,
`model_path` (what `-m` names, as a GGUF path) and the option types several commands take
(`--model`, `--device`, `--cpu-driver`, `--threads`).
Imports: typer, rich, zinc.cli_models, zinc.runtime.device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from zinc.cli_models import pick_model, registry
from zinc.runtime.device import DEVICE_CHOICES

err = Console(stderr=True, highlight=False)

ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help="GGUF file, or a catalog model id (zinc model list); default: the one chosen with `zinc model use`, else smollm2",
    ),
]
DeviceOpt = Annotated[str, typer.Option("--device", help=f"Where to run: {'|'.join(DEVICE_CHOICES)}")]
CpuDriverOpt = Annotated[str, typer.Option("--cpu-driver", help="IREE CPU driver: local-task|local-sync")]
ThreadsOpt = Annotated[
    int | None,
    typer.Option("--threads", help="CPU threads for the local-task driver (default: the physical cores)"),
]


def fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[bold red]zinc: error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)


def model_path(model: str | None) -> Path:
    """A GGUF path from `-m`: a file, a catalog id (installed), or the default model."""
    catalog = registry()
    model_id, path = pick_model(model, catalog)
    return path if path is not None else catalog.path(model_id)


def progress(message: str) -> None:
    err.print(f"[dim]zinc:[/] {escape(message)}", soft_wrap=True)


