"""`zinc serve` and `zinc chat`: the server's options, checked, and the server started with them.

Owns: `ServeOptions`, `run_server` (options to a `ServerConfig` and a `CliLoader`; listens at once
and loads the model in the background), the serve-only option types and the two commands (zinc.cli
registers them). `--artifact DIR` serves with an artifact compiled elsewhere (checked against the
model, CPU and GPU here; never compiled), `--drain-delay` keeps serving after SIGTERM while
`/health` says 503 so a balancer moves traffic away first.
Imports: typer, rich, zinc.cli_common, zinc.cli_models, zinc.engine.manager, zinc.runtime.device,
zinc.server (inside `run_server` only), the stdlib.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import webbrowser
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from zinc.cli_common import CpuDriverOpt, DeviceOpt, ModelOpt, ThreadsOpt, err, fail
from zinc.cli_models import DEFAULT_MAX_QUEUE, CliLoader, check_artifact_dir, pick_model, registry
from zinc.engine.manager import EngineManager
from zinc.runtime.device import resolve_device
from zinc.runtime.session import DEFAULT_CONTEXT


@dataclass(frozen=True)
class ServeOptions:
    model: str | None
    device: str
    cpu_driver: str
    context: int
    host: str
    port: int
    parallel: int
    api_key: str | None
    kv_tokens: int | None = None  # KV slab positions (None: `parallel` whole contexts)
    threads: int | None = None  # local-task worker threads (None: the physical cores)
    max_queue: int = DEFAULT_MAX_QUEUE  # requests that may wait for a slot; past them, 429 at once
    prefill_chunk: int | None = None  # prompt tokens per scheduler iteration (None: one prefill call's)
    write_timeout: float = 30.0  # seconds a client may read nothing of a response before it is dropped
    max_connections: int = 1024  # open connections; past them a new one gets 503 and is closed
    shutdown_timeout: float = 10.0  # seconds running requests get to finish after SIGTERM/SIGINT
    embeddings: str | None = None  # pooling for /v1/embeddings over the GGUF's (mean|cls|last); None: the GGUF's
    drain_delay: float = 0.0  # seconds /health says 503 "draining" after SIGTERM, still serving
    artifact: Path | None = None  # a compiled artifact to serve the model with; never compile


def run_server(o: ServeOptions, *, chat_ui: bool = False) -> None:
    """Listen at once and load the model in the background (/health is 503 "loading" meanwhile)."""
    from zinc.server import ServerConfig, serve  # only serving needs the HTTP stack (0.3 s of imports)

    if o.parallel < 1:
        fail(f"--parallel must be at least 1, got {o.parallel}")
    if o.max_queue < 0:
        fail(f"--max-queue must be at least 0, got {o.max_queue}")
    if o.prefill_chunk is not None and o.prefill_chunk < 1:
        fail(f"--prefill-chunk must be at least 1, got {o.prefill_chunk}")
    if not 0 < o.write_timeout < math.inf:
        fail(f"--write-timeout must be a positive number of seconds, got {o.write_timeout}")
    if o.max_connections < 1:
        fail(f"--max-connections must be at least 1, got {o.max_connections}")
    if not 0 < o.shutdown_timeout < math.inf:
        fail(f"--shutdown-timeout must be a positive number of seconds, got {o.shutdown_timeout}")
    if not 0 <= o.drain_delay < math.inf:
        fail(f"--drain-delay must be a number of seconds >= 0, got {o.drain_delay}")
    if o.kv_tokens is not None and o.kv_tokens < o.context:
        fail(f"--kv-tokens must hold at least one context ({o.context} positions), got {o.kv_tokens}")
    if o.embeddings is not None and o.embeddings not in EMBEDDING_POOLINGS:
        fail(f"--embeddings takes {'|'.join(EMBEDDING_POOLINGS)}, got {o.embeddings!r}")
    spec = resolve_device(o.device, o.cpu_driver, o.threads)
    catalog = registry(o.context, spec)
    model_id, path = pick_model(o.model, catalog)
    if path is None:
        catalog.path(model_id)  # fail now, with the catalog's message, when it is not installed
    elif not path.is_file():
        fail(f"model file not found: {path}")
    paths = {model_id: path} if path is not None else {}
    loader = CliLoader(
        catalog, spec, o.context, paths, o.parallel, o.kv_tokens, o.max_queue, o.prefill_chunk, o.embeddings
    )
    if o.artifact is not None:
        gguf_path = catalog.path(model_id) if path is None else path
        loader.artifacts[model_id] = check_artifact_dir(o.artifact, gguf_path, spec)
    manager = EngineManager(loader=loader, registry=catalog)
    api_key = o.api_key or os.environ.get("ZINC_API_KEY")
    config = ServerConfig(
        host=o.host, port=o.port, parallel=o.parallel, max_queued_requests=o.max_queue, api_key=api_key,
        write_timeout_s=o.write_timeout, max_connections=o.max_connections,
        graceful_shutdown_timeout_s=o.shutdown_timeout, drain_delay_s=o.drain_delay,
    )  # fmt: skip
    # zinc's own loggers at INFO; others at WARNING (iree.compiler logs each iree-compile command
    # line at INFO on the root logger)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s", stream=sys.stderr, force=True)
    logging.getLogger("zinc").setLevel(logging.INFO)
    url = f"http://{o.host}:{o.port}"
    where = f"chat UI at {url}/ (API at {url}/v1)" if chat_ui else f"{url}/v1"
    err.print(
        f"zinc: serving [bold]{escape(model_id)}[/] on {spec.name} at {where} (context {o.context})",
        soft_wrap=True,
    )
    status = serve(manager, config, initial_model=model_id)
    if status:  # a second signal cut the shutdown short: exit now, whatever a thread still runs
        logging.shutdown()
        sys.stderr.flush()
        os._exit(status)


KvTokensOpt = Annotated[
    int | None,
    typer.Option(
        "--kv-tokens", help="KV cache positions for all requests together (default: parallel x ctx-size)"
    ),
]
MaxQueueOpt = Annotated[
    int,
    typer.Option("--max-queue", help="Requests that may wait for a slot; past them, 429 at once"),
]
PrefillChunkOpt = Annotated[
    int | None,
    typer.Option(
        "--prefill-chunk",
        help="Prompt tokens prefilled per step, all prompts together, between two decode steps "
        "(default: one prefill call's, 128, or on Vulkan as many as fit one K/V write); smaller: "
        "shorter stalls behind a long prompt",
    ),
]
WriteTimeoutOpt = Annotated[
    float,
    typer.Option(
        "--write-timeout",
        help="Seconds a client may read nothing of a response (e.g. a stream) before it is dropped "
        "and its generation cancelled",
    ),
]
MaxConnectionsOpt = Annotated[
    int,
    typer.Option(
        "--max-connections", help="Open connections at most; past them a new one gets 503 and is closed"
    ),
]
ShutdownTimeoutOpt = Annotated[
    float,
    typer.Option(
        "--shutdown-timeout",
        help="Seconds running requests get to finish after SIGTERM or SIGINT (and --drain-delay; new "
        "connections are refused meanwhile); then they are cancelled. A second signal exits at once",
    ),
]
DrainDelayOpt = Annotated[
    float,
    typer.Option(
        "--drain-delay",
        help="Seconds after SIGTERM during which /health answers 503 \"draining\" while requests are "
        "still served, so a load balancer takes this replica out before it stops listening",
    ),
]
ArtifactOpt = Annotated[
    Path | None,
    typer.Option(
        "--artifact",
        help="Serve with this compiled artifact (`zinc compile MODEL -o DIR`, built on another machine or "
        "in CI); never compiles, and says why when it does not fit this model, CPU or GPU",
    ),
]


EMBEDDING_POOLINGS = ("mean", "cls", "last")
EmbeddingsOpt = Annotated[
    str | None,
    typer.Option(
        "--embeddings",
        help="Serve /v1/embeddings with this pooling (mean|cls|last) for a model whose GGUF declares none "
        "(a chat model), or in place of the one it declares; compiles an artifact with the embed entry",
    ),
]

PortOpt = Annotated[int, typer.Option("--port", "-p", help="Port to listen on")]
HostOpt = Annotated[str, typer.Option("--host", help="Address to bind")]
ContextOpt = Annotated[int, typer.Option("--ctx-size", "-c", help="Context length (tokens)")]
ParallelOpt = Annotated[int, typer.Option("--parallel", help="Requests decoded together (continuous batching)")]
ApiKeyOpt = Annotated[str | None, typer.Option("--api-key", help="Require this Bearer key (or set ZINC_API_KEY)")]


def serve_cmd(
    model: ModelOpt = None,
    port: PortOpt = 8080,
    host: HostOpt = "127.0.0.1",
    context: ContextOpt = DEFAULT_CONTEXT,
    parallel: ParallelOpt = 8,
    kv_tokens: KvTokensOpt = None,
    max_queue: MaxQueueOpt = DEFAULT_MAX_QUEUE,
    prefill_chunk: PrefillChunkOpt = None,
    api_key: ApiKeyOpt = None,
    device: DeviceOpt = "auto",
    cpu_driver: CpuDriverOpt = "local-task",
    threads: ThreadsOpt = None,
    write_timeout: WriteTimeoutOpt = 30.0,
    max_connections: MaxConnectionsOpt = 1024,
    shutdown_timeout: ShutdownTimeoutOpt = 10.0,
    embeddings: EmbeddingsOpt = None,
    drain_delay: DrainDelayOpt = 0.0,
    artifact: ArtifactOpt = None,
) -> None:
    """Serve the OpenAI API (chat, completions, embeddings, models, health), model management and the chat UI."""
    run_server(
        ServeOptions(
            model, device, cpu_driver, context, host, port, parallel, api_key, kv_tokens, threads, max_queue,
            prefill_chunk, write_timeout, max_connections, shutdown_timeout, embeddings, drain_delay, artifact,
        )
    )


def chat_cmd(
    model: ModelOpt = None,
    port: PortOpt = 9090,
    host: HostOpt = "127.0.0.1",
    context: ContextOpt = DEFAULT_CONTEXT,
    parallel: ParallelOpt = 8,
    kv_tokens: KvTokensOpt = None,
    max_queue: MaxQueueOpt = DEFAULT_MAX_QUEUE,
    prefill_chunk: PrefillChunkOpt = None,
    api_key: ApiKeyOpt = None,
    device: DeviceOpt = "auto",
    cpu_driver: CpuDriverOpt = "local-task",
    threads: ThreadsOpt = None,
    open_browser: Annotated[bool, typer.Option("--open", help="Open the chat page in a browser")] = False,
    write_timeout: WriteTimeoutOpt = 30.0,
    max_connections: MaxConnectionsOpt = 1024,
    shutdown_timeout: ShutdownTimeoutOpt = 10.0,
) -> None:
    """Serve the built-in chat UI (port 9090 by default) together with the API."""
    if open_browser:
        timer = threading.Timer(1.0, webbrowser.open, [f"http://{host}:{port}/"])
        timer.daemon = True
        timer.start()
    options = ServeOptions(
        model, device, cpu_driver, context, host, port, parallel, api_key, kv_tokens, threads, max_queue,
        prefill_chunk, write_timeout, max_connections, shutdown_timeout,
    )
    run_server(options, chat_ui=True)
