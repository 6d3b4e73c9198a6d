"""The fuzz tests' servers (module-scoped): the fake engine's, SmolLM2's, and what they log."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SessionFactory
from tests.fakes import FakeEngine
from tests.fuzz.harness import LIMITS, ErrorRecords
from tests.server_harness import RunningServer


@pytest.fixture(scope="module")
def errors() -> Iterator[ErrorRecords]:
    handler = ErrorRecords()
    logger = logging.getLogger("zinc")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


@pytest.fixture(scope="module")
def fake_srv() -> Iterator[RunningServer]:
    running = RunningServer(FakeEngine(context_length=4096), **LIMITS)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def real_srv(smollm2: Path, open_session: SessionFactory) -> Iterator[RunningServer]:
    from zinc.engine.engine import LocalEngine
    from zinc.model.gguf_file import open_gguf
    from zinc.tokenizer import ChatTemplate, Tokenizer

    meta = open_gguf(smollm2).metadata
    tokenizer = Tokenizer.from_metadata(meta)
    engine = LocalEngine(
        open_session(smollm2, "cpu"), tokenizer, ChatTemplate.from_metadata(meta, tokenizer), "smollm2"
    )
    running = RunningServer(engine, **LIMITS)  # type: ignore[arg-type]
    yield running
    running.stop()
