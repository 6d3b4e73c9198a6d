"""`POST /infill` end to end on a compiled model with FIM tokens (the tiny-fim fixture, Qwen2.5-Coder's
FIM tokens) on the CPU (issue 39): the server asks the model for exactly the ids `infill_prompt`
lays out from the GGUF's FIM token ids, so its answer equals a greedy completion of those ids;
streamed, the chunks add up to the same text."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.server_harness import RunningServer
from zinc.compiler.build import ensure_artifact
from zinc.engine.engine import LocalEngine
from zinc.model.gguf_file import open_gguf
from zinc.runtime.device import resolve_device
from zinc.runtime.session import ModelSession
from zinc.server.infill_api import infill_prompt, parse_infill
from zinc.tokenizer import ChatTemplate, Tokenizer

pytestmark = [pytest.mark.e2e]
CONTEXT = 256
BODY = {
    "input_prefix": "the quick brown ",
    "input_suffix": " over the lazy dog",
    "input_extra": [{"filename": "notes.txt", "text": "a fox and a dog"}],
    "n_predict": 8,
}


@pytest.fixture(scope="module")
def engine(tiny_models: dict[str, Path]) -> Iterator[LocalEngine]:
    path = tiny_models["tiny-fim"]
    spec = resolve_device("cpu")
    session = ModelSession(ensure_artifact(path, "cpu"), path, spec, CONTEXT, kv_slots=2 * CONTEXT + 32)
    meta = open_gguf(path).metadata
    tokenizer = Tokenizer.from_metadata(meta)
    eng = LocalEngine(session, tokenizer, ChatTemplate.from_metadata(meta, tokenizer), "tiny-fim", parallel=2)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def srv(engine: LocalEngine) -> Iterator[RunningServer]:
    running = RunningServer(engine, parallel=2)  # type: ignore[arg-type]
    yield running
    running.stop()


def infill(srv: RunningServer, body: dict[str, Any]) -> bytes:
    request = urllib.request.Request(
        f"http://127.0.0.1:{srv.port}/infill", json.dumps(body).encode(), {"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.status == 200
        data: bytes = response.read()
        return data


def test_infill_runs_the_fim_prompt_and_streams_the_same_text(srv: RunningServer, engine: LocalEngine) -> None:
    ids = infill_prompt(
        parse_infill(BODY),
        engine.special_tokens(),
        lambda s: engine.tokenize(s, add_special=False),
        None,  # the fixture adds no BOS
        CONTEXT,
    )
    answer = json.loads(infill(srv, BODY))
    assert answer["tokens_evaluated"] == len(ids) and answer["stop"] is True
    assert answer["prompt"] == engine.detokenize(ids)
    c = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=120)
    same = c.completions.create(model="tiny-fim", prompt=ids, max_tokens=8)
    assert answer["content"] and answer["content"] == same.choices[0].text
    assert answer["tokens_predicted"] == (same.usage.completion_tokens if same.usage else -1)
    lines = infill(srv, {**BODY, "stream": True}).decode().split("\n")
    events = [json.loads(line.removeprefix("data: ")) for line in lines if line]
    assert "".join(e["content"] for e in events) == answer["content"] and events[-1]["stop"] is True
