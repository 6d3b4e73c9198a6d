"""The end-to-end tests' shared fixture: `engine`, the bundled SmolLM2 on the CPU behind zinc's
`LocalEngine`, one per test module (a module that needs another engine defines its own)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import SessionFactory
from zinc.engine.engine import LocalEngine
from zinc.model.gguf_file import open_gguf
from zinc.tokenizer import ChatTemplate, Tokenizer


@pytest.fixture(scope="module")
def engine(smollm2: Path, open_session: SessionFactory) -> LocalEngine:
    meta = open_gguf(smollm2).metadata
    tokenizer = Tokenizer.from_metadata(meta)
    return LocalEngine(
        open_session(smollm2, "cpu"), tokenizer, ChatTemplate.from_metadata(meta, tokenizer), "smollm2"
    )
