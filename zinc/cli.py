"""The `zinc` command line: compile, serve, chat, model, tokenize, and the prompt mode.

Owns: argument parsing (Typer), the progress display on stderr (rich), turning every `ZincError`
into one line on stderr and a non-zero exit, and wiring the compiler (compile on first use, via
the cache) to the runtime and engine. `zinc serve`/`zinc chat` hand an `EngineManager` with the
catalog and a loader (zinc.cli_models) to the server, which loads the model in the background.
Imports: typer, rich, and every zinc layer (this is the top of the stack).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import threading
import webbrowser
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from zinc.cli_models import DEFAULT_MAX_QUEUE, CliLoader, model_app, pick_model, registry
from zinc.compiler.build import compile_model, ensure_artifact, plan
from zinc.compiler.targets import (
    GENERIC,
    TARGETS,
    VULKAN_TARGETS,
    check_target,
    check_vulkan_target,
    detected_vulkan_target,
)
from zinc.engine.generate import generate_ids
from zinc.engine.manager import EngineManager
from zinc.errors import ZincError
from zinc.model.gguf_file import open_gguf
from zinc.runtime.device import DEVICE_CHOICES, DeviceSpec, resolve_device
from zinc.runtime.memory import check_memory
from zinc.runtime.sampling import SamplingParams
from zinc.runtime.session import DEFAULT_CONTEXT, ModelSession, memory_needed
from zinc.tokenizer import ChatTemplate, IncrementalDecoder, Tokenizer

err = Console(stderr=True, highlight=False)
app = typer.Typer(
    name="zinc",
    help="Compile GGUF models ahead of time with IREE and run them: prompt mode, or an OpenAI-compatible server.",
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(model_app, name="model")

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


def open_session(model: Path, device: DeviceSpec, context: int) -> ModelSession:
    with err.status(f"preparing {model.name} for {device.name}..."):
        artifact = ensure_artifact(model, device.target, progress)
        return ModelSession(artifact, model, device, context)


@app.command("compile")
def compile_cmd(
    model: Annotated[
        str, typer.Argument(help="GGUF model file, or a bundled model name (smollm2, gemma3-270m)")
    ],
    target: Annotated[
        str, typer.Option("--target", "-t", help=f"Compile target: {'|'.join(TARGETS)}")
    ] = "cpu",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Artifact directory (default: the cache)")
    ] = None,
    keep_ir: Annotated[bool, typer.Option("--keep-ir", help="Also write the generated MLIR")] = False,
    vulkan_target: Annotated[
        str | None,
        typer.Option(
            "--vulkan-target",
            help=f"IREE GPU target for --target vulkan ({'|'.join(VULKAN_TARGETS)}; default: this machine's GPU)",
        ),
    ] = None,
    batch: Annotated[
        str | None,
        typer.Option(
            "--batch", help="Decode batch buckets, e.g. 1,4,8,16 (default 1,4,8; 1 is always built)"
        ),
    ] = None,
) -> None:
    """Compile MODEL.gguf into an artifact directory (vmfb + manifest.json)."""
    path = model_path(model)
    sizes = parse_batch(batch)
    check_target(target)
    if vulkan_target is not None and target != "vulkan":
        fail("--vulkan-target needs --target vulkan")
    gpu = check_vulkan_target(vulkan_target) if vulkan_target else None
    with err.status(f"compiling {path.name} for {target}..."):
        if output is None:
            artifact = ensure_artifact(path, target, progress, batch_sizes=sizes, vulkan_target=gpu)
        else:
            gpu = gpu or (detected_vulkan_target() if target == "vulkan" else GENERIC)
            artifact = compile_model(plan(path, target, sizes, gpu), output, progress, keep_ir=keep_ir)
    typer.echo(str(artifact))


def parse_batch(text: str | None) -> tuple[int, ...] | None:
    """`--batch 1,4,8` -> (1, 4, 8); a bad list is a usage error."""
    if text is None:
        return None
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        fail(f"--batch takes comma-separated integers, got {text!r}")
    if not sizes or any(not 1 <= b <= 64 for b in sizes):
        fail(f"--batch sizes must be between 1 and 64, got {text!r}")
    return sizes


@dataclass
class Loaded:
    session: ModelSession
    tokenizer: Tokenizer
    chat: ChatTemplate
    model_id: str


def load(model: str | None, device: str, cpu_driver: str, context: int, threads: int | None) -> Loaded:
    path = model_path(model)
    gguf = open_gguf(path)
    spec = resolve_device(device, cpu_driver, threads)
    # before compiling or loading anything (the session checks again with the artifact's figures)
    check_memory(memory_needed(gguf, spec.target, context), path.stem, options="--ctx-size")
    tokenizer = Tokenizer.from_metadata(gguf.metadata)
    session = open_session(path, spec, context)
    return Loaded(session, tokenizer, ChatTemplate.from_metadata(gguf.metadata, tokenizer), path.stem)


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
    prefill_chunk: int | None = None  # prompt tokens per scheduler iteration (None: 128 CPU, 8 Vulkan)
    write_timeout: float = 30.0  # seconds a client may read nothing of a response before it is dropped
    max_connections: int = 1024  # open connections; past them a new one gets 503 and is closed
    shutdown_timeout: float = 10.0  # seconds running requests get to finish after SIGTERM/SIGINT
    embeddings: str | None = None  # pooling for /v1/embeddings over the GGUF's (mean|cls|last); None: the GGUF's


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
    manager = EngineManager(loader=loader, registry=catalog)
    api_key = o.api_key or os.environ.get("ZINC_API_KEY")
    config = ServerConfig(
        host=o.host, port=o.port, parallel=o.parallel, max_queued_requests=o.max_queue, api_key=api_key,
        write_timeout_s=o.write_timeout, max_connections=o.max_connections,
        graceful_shutdown_timeout_s=o.shutdown_timeout,
    )  # fmt: skip
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr, force=True)
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
        "(default: 128 on the CPU, 8 on Vulkan); smaller: shorter stalls behind a long prompt",
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
        help="Seconds running requests get to finish after SIGTERM or SIGINT (new connections are "
        "refused meanwhile); then they are cancelled. A second signal exits at once",
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


@app.command("serve")
def serve_cmd(
    model: ModelOpt = None,
    port: Annotated[int, typer.Option("--port", "-p", help="Port to listen on")] = 8080,
    host: Annotated[str, typer.Option("--host", help="Address to bind")] = "127.0.0.1",
    context: Annotated[
        int, typer.Option("--ctx-size", "-c", help="Context length (tokens)")
    ] = DEFAULT_CONTEXT,
    parallel: Annotated[
        int, typer.Option("--parallel", help="Requests decoded together (continuous batching)")
    ] = 8,
    kv_tokens: KvTokensOpt = None,
    max_queue: MaxQueueOpt = DEFAULT_MAX_QUEUE,
    prefill_chunk: PrefillChunkOpt = None,
    api_key: Annotated[
        str | None, typer.Option("--api-key", help="Require this Bearer key (or set ZINC_API_KEY)")
    ] = None,
    device: DeviceOpt = "auto",
    cpu_driver: CpuDriverOpt = "local-task",
    threads: ThreadsOpt = None,
    write_timeout: WriteTimeoutOpt = 30.0,
    max_connections: MaxConnectionsOpt = 1024,
    shutdown_timeout: ShutdownTimeoutOpt = 10.0,
    embeddings: EmbeddingsOpt = None,
) -> None:
    """Serve the OpenAI API (chat, completions, embeddings, models, health), model management and the chat UI."""
    run_server(
        ServeOptions(
            model, device, cpu_driver, context, host, port, parallel, api_key, kv_tokens, threads, max_queue,
            prefill_chunk, write_timeout, max_connections, shutdown_timeout, embeddings,
        )
    )


@app.command("chat")
def chat_cmd(
    model: ModelOpt = None,
    port: Annotated[int, typer.Option("--port", "-p", help="Port to listen on")] = 9090,
    host: Annotated[str, typer.Option("--host", help="Address to bind")] = "127.0.0.1",
    context: Annotated[
        int, typer.Option("--ctx-size", "-c", help="Context length (tokens)")
    ] = DEFAULT_CONTEXT,
    parallel: Annotated[
        int, typer.Option("--parallel", help="Requests decoded together (continuous batching)")
    ] = 8,
    kv_tokens: KvTokensOpt = None,
    max_queue: MaxQueueOpt = DEFAULT_MAX_QUEUE,
    prefill_chunk: PrefillChunkOpt = None,
    api_key: Annotated[
        str | None, typer.Option("--api-key", help="Require this Bearer key (or set ZINC_API_KEY)")
    ] = None,
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


@app.command("tokenize")
def tokenize_cmd(
    text: Annotated[str, typer.Argument(help="Text to tokenize ('-' reads stdin)")],
    model: ModelOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print ids with their pieces as JSON")] = False,
    no_special: Annotated[bool, typer.Option("--no-special", help="Do not add BOS/EOS")] = False,
) -> None:
    """Print the token ids of TEXT as the model's tokenizer (read from the GGUF) splits it."""
    tokenizer = Tokenizer.from_metadata(open_gguf(model_path(model)).metadata)
    ids = tokenizer.encode(read_text(text), add_special=not no_special)
    if as_json:
        pieces = [tokenizer.piece(i, skip_special=False).decode("utf-8", errors="replace") for i in ids]
        typer.echo(
            json.dumps([{"id": i, "piece": p} for i, p in zip(ids, pieces, strict=True)], ensure_ascii=False)
        )
    else:
        typer.echo(" ".join(str(i) for i in ids))


def read_text(arg: str) -> str:
    return sys.stdin.read() if arg == "-" else arg


@app.callback(invoke_without_command=True)
def main_cmd(
    ctx: typer.Context,
    model: ModelOpt = None,
    prompt: Annotated[str | None, typer.Option("--prompt", help="Prompt text ('-' reads stdin)")] = None,
    chat: Annotated[
        bool | None,
        typer.Option("--chat/--raw", help="Apply the chat template (default: when the model has one)"),
    ] = None,
    port: Annotated[
        int | None, typer.Option("--port", "-p", help="Serve the API on this port instead")
    ] = None,
    prompt_ids: Annotated[
        str | None, typer.Option("--prompt-ids", help="Prompt as comma-separated token ids, e.g. 1,2,3")
    ] = None,
    n_predict: Annotated[int, typer.Option("--n-predict", "-n", help="Tokens to generate")] = 64,
    temperature: Annotated[float, typer.Option("--temperature", help="0 = greedy")] = 0.0,
    seed: Annotated[int | None, typer.Option("--seed", help="Sampling seed")] = None,
    device: DeviceOpt = "auto",
    cpu_driver: CpuDriverOpt = "local-task",
    threads: ThreadsOpt = None,
    context: Annotated[
        int, typer.Option("--ctx-size", "-c", help="Context length (tokens)")
    ] = DEFAULT_CONTEXT,
    ignore_eos: Annotated[
        bool, typer.Option("--ignore-eos", help="Do not stop at end-of-generation tokens")
    ] = False,
) -> None:
    """Prompt mode: generate from a prompt and print the completion as it is produced."""
    if ctx.invoked_subcommand is not None:
        return
    if port is not None:
        run_server(ServeOptions(model, device, cpu_driver, context, "127.0.0.1", port, 8, None, threads=threads))
        return
    if prompt is None and prompt_ids is None:
        typer.echo(ctx.get_help())
        return
    sampling = SamplingParams(temperature=max(0.0, min(2.0, temperature)), seed=seed)
    ids = parse_ids(prompt_ids) if prompt_ids is not None else []
    loaded = load(model, device, cpu_driver, context, threads)
    if prompt_ids is not None:
        for token in generate_ids(loaded.session, ids, n_predict, sampling):
            sys.stdout.write(f"{token} ")
            sys.stdout.flush()
        sys.stdout.write("\n")
        return
    assert prompt is not None
    text = read_text(prompt)
    use_chat = chat if chat is not None else loaded.chat.kind == "gguf"
    if use_chat:
        ids = loaded.chat.encode(loaded.tokenizer, [{"role": "user", "content": text}])
    else:
        ids = loaded.tokenizer.encode(text)
    stop = frozenset() if ignore_eos else loaded.tokenizer.eog_ids
    decoder = IncrementalDecoder(loaded.tokenizer)
    for token in generate_ids(loaded.session, ids, n_predict, sampling, stop):
        if token in stop:
            break
        sys.stdout.write(decoder.add(token))
        sys.stdout.flush()
    sys.stdout.write(decoder.flush() + "\n")


def parse_ids(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        fail(f"--prompt-ids must be comma-separated integers, got {text!r}")
    if not ids:
        fail("--prompt-ids is empty")
    return ids


def main() -> None:
    try:
        app()
    except ZincError as exc:
        err.print(f"[bold red]zinc: error:[/] {escape(exc.message)}", soft_wrap=True)
        sys.exit(1)
    except KeyboardInterrupt:
        err.print("zinc: interrupted")
        sys.exit(130)
