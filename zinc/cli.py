"""The `zinc` command line: compile, serve, chat, model, tokenize, and the prompt mode.

Owns: argument parsing (Typer), the progress display on stderr (rich), turning every `ZincError`
into one line on stderr and a non-zero exit, and wiring the compiler (compile on first use, via
the cache) to the runtime and engine. `zinc serve`/`zinc chat` live in zinc.cli_serve, the
`model` group in zinc.cli_models, what they share in zinc.cli_common; this module registers them.
Imports: typer, rich, and every zinc layer (this is the top of the stack).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from zinc.cli_common import CpuDriverOpt, DeviceOpt, ModelOpt, ThreadsOpt, err, fail, model_path, progress
from zinc.cli_models import model_app
from zinc.cli_serve import ServeOptions, chat_cmd, run_server, serve_cmd
from zinc.compiler.build import compile_model, ensure_artifact, plan
from zinc.compiler.targets import (
    CPU_TARGETS,
    GENERIC,
    TARGETS,
    VULKAN_TARGETS,
    check_target,
    check_vulkan_target,
    detected_vulkan_target,
)
from zinc.engine.generate import generate_ids
from zinc.errors import ZincError
from zinc.model.gguf_file import open_gguf
from zinc.runtime.device import DeviceSpec, resolve_device
from zinc.runtime.memory import check_memory
from zinc.runtime.sampling import SamplingParams
from zinc.runtime.session import DEFAULT_CONTEXT, ModelSession, memory_needed
from zinc.tokenizer import ChatTemplate, IncrementalDecoder, Tokenizer

app = typer.Typer(
    name="zinc",
    help="Compile GGUF models ahead of time with IREE and run them: prompt mode, or an OpenAI-compatible server.",
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(model_app, name="model")
app.command("serve")(serve_cmd)
app.command("chat")(chat_cmd)


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
    cpu_target: Annotated[
        str | None,
        typer.Option(
            "--cpu-target",
            help=f"CPU for --target cpu ({'|'.join(CPU_TARGETS)}; default host: this CPU and all its "
            "features); a level runs on every CPU that has it (or set ZINC_CPU_TARGET)",
        ),
    ] = None,
) -> None:
    """Compile MODEL.gguf into an artifact directory (vmfb + manifest.json)."""
    if cpu_target is not None:
        if target != "cpu":
            fail("--cpu-target needs --target cpu")
        if cpu_target not in CPU_TARGETS:
            fail(f"--cpu-target takes {'|'.join(CPU_TARGETS)}, got {cpu_target!r}")
        os.environ["ZINC_CPU_TARGET"] = cpu_target  # read by the compiler (zinc.compiler.targets)
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
        ids = loaded.tokenizer.encode(text, parse_special=True)  # as llama.cpp's completion tool reads a prompt
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
