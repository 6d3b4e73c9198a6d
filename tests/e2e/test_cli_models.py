"""`zinc model list|pull|rm|use` and model management in `zinc serve`, as subprocesses, with
`ZINC_HOME` in a tmp dir and a catalog whose models come from a local HTTP server (a tiny GGUF)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.file_server import FileServer
from zinc.catalog.entries import CatalogEntry

pytestmark = pytest.mark.e2e


# The catalog's two models are tiny fixtures under their own names: a pulled model is saved as
# `<id>.gguf`, so these share the artifacts the other tests compile (the cache keys by file name too).
TINY, TINY2 = "tiny-q8-q41", "tiny-q40-f16"


@pytest.fixture
def home(tmp_path: Path, tiny_models: dict[str, Path]) -> Iterator[tuple[Path, FileServer]]:
    data = {name: tiny_models[name].read_bytes() for name in (TINY, TINY2)}
    files = FileServer({f"{name}.gguf": blob for name, blob in data.items()})

    def entry(model_id: str, file: str = TINY, digest: str | None = None) -> dict[str, Any]:
        return CatalogEntry(
            id=model_id, display_name=f"Tiny {model_id}", source=files.url(f"{file}.gguf"),
            sha256=digest or hashlib.sha256(data[file]).hexdigest(), size_bytes=len(data[file]),
            architecture="llama", quantization={TINY: "Q8_0", TINY2: "Q4_0"}[file],
        ).to_json()  # fmt: skip

    models = [entry(TINY), entry(TINY2, TINY2), entry("broken", digest="f" * 64)]
    (tmp_path / "catalog.json").write_text(json.dumps({"models": models}))
    yield tmp_path, files
    files.close()


def zinc(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ZINC_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "zinc", *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300
    )


def listing(home: Path) -> dict[str, dict[str, Any]]:
    out = zinc(home, "model", "list", "--json")
    assert out.returncode == 0, out.stderr
    return {row["id"]: row for row in json.loads(out.stdout)}


def test_model_pull_use_rm(home: tuple[Path, FileServer]) -> None:
    path, _ = home
    before = listing(path)
    assert not before[TINY]["installed"] and before["smollm2"]["default"]
    pulled = zinc(path, "model", "pull", TINY)
    assert pulled.returncode == 0, pulled.stderr
    gguf = path / "models" / TINY / f"{TINY}.gguf"
    assert pulled.stdout.strip() == str(gguf) and gguf.is_file()
    again = zinc(path, "model", "pull", TINY)
    assert again.returncode == 0 and "already installed" in again.stderr
    used = zinc(path, "model", "use", TINY, "--no-compile")
    assert used.returncode == 0 and f"{TINY} is now the default model" in used.stderr, used.stderr
    assert json.loads((path / "config.json").read_text()) == {"default_model": TINY}
    table = zinc(path, "model", "list")
    rows = {
        line.split()[1] if line.startswith("*") else line.split()[0]: line
        for line in table.stdout.splitlines()[1:-1]
    }
    assert rows[TINY].startswith("*") and " yes " in rows[TINY] and not rows["smollm2"].startswith("*")
    assert "not yet (gemma3)" in rows["gemma3-270m"] or " yes" in rows["gemma3-270m"]
    removed = zinc(path, "model", "rm", TINY)
    assert removed.returncode == 0 and "default model is smollm2 again" in removed.stderr
    assert not gguf.parent.exists() and json.loads((path / "config.json").read_text()) == {}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("model", "pull", "broken"), "sha256 mismatch"),
        (("model", "pull", "../../x"), "Invalid model id"),
        (("model", "use", TINY2, "--no-compile"), "not installed"),
        (("serve", "-m", TINY2, "--device", "cpu"), "not installed"),
    ],
)
def test_model_command_errors_are_one_line(
    home: tuple[Path, FileServer], args: tuple[str, ...], message: str
) -> None:
    path, _ = home
    out = zinc(path, *args)
    assert out.returncode == 1 and message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and out.stderr.count("error:") == 1
    assert not (path / "models" / "broken").exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def call(port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_serve_loads_the_default_and_manages_models(home: tuple[Path, FileServer]) -> None:
    path, _ = home
    for model_id in (TINY, TINY2):
        assert zinc(path, "model", "pull", model_id).returncode == 0
    assert zinc(path, "model", "use", TINY, "--no-compile").returncode == 0
    port = free_port()
    env = {**os.environ, "ZINC_HOME": str(path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "zinc", "serve", "-p", str(port), "--device", "cpu", "-c", "512"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
    )  # fmt: skip
    try:
        statuses: list[int] = []
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status, health = call(port, "GET", "/health")
                statuses.append(status)
                if status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.05)
        assert health["model"] == TINY, (statuses, proc.poll())
        assert call(port, "POST", "/v1/models/activate", {"model": TINY2}) == (
            200, {"object": "model.activation", "id": TINY2, "active": True},
        )  # fmt: skip
        status, out = call(port, "POST", "/v1/completions", {"prompt": "the end", "max_tokens": 2})
        assert status == 200 and out["model"] == TINY2
        status, out = call(
            port, "POST", "/v1/completions", {"prompt": "the end", "max_tokens": 2, "model": TINY}
        )
        assert status == 200 and out["model"] == TINY
        status, out = call(port, "POST", "/v1/models/remove", {"model": TINY})
        assert status == 409
        status, out = call(port, "POST", "/v1/models/remove", {"model": TINY, "force": True})
        assert (
            status == 200
            and out["unloaded_from_gpu"]
            and out["deleted_model"]
            and out["cleared_active_selection"]
        )
        status, out = call(port, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 1})
        assert status == 503 and out["error"]["code"] == "service_unavailable"
        models = call(port, "GET", "/v1/models")[1]
        assert (
            models["active_model"] is None
            and {m["id"]: m["installed"] for m in models["data"]}[TINY] is False
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr and f"switched from {TINY} to {TINY2}" in stderr


def test_chat_command_defaults_to_port_9090(tmp_path: Path) -> None:
    out = zinc(tmp_path, "chat", "--help")
    assert out.returncode == 0 and "9090" in out.stdout and "chat UI" in out.stdout
