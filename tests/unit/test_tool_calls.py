"""The streaming `<tool_call>` parser and the `<think>` splitter: any split of the text into
deltas (down to one character, so every tag is cut) gives the same content, calls and reasoning."""

from __future__ import annotations

import json

import pytest

from zinc.engine.reasoning import ReasoningSplitter, prompt_opens_thinking
from zinc.engine.tool_calls import ToolCallDelta, ToolCallParser

SPLITS = (1, 2, 3, 7, 10_000)


def parse(text: str, step: int) -> tuple[str, list[tuple[str, str]], list[tuple[str, str]]]:
    """(content, calls as parsed, calls as reassembled from the deltas the way the openai client does)."""
    parser = ToolCallParser()
    events = []
    for i in range(0, len(text), step):
        events += parser.feed(text[i : i + step])
    events += parser.finish()
    content = "".join(e for e in events if isinstance(e, str))
    assembled: dict[int, list[str]] = {}
    for e in events:
        if isinstance(e, ToolCallDelta):
            if e.id is not None:
                assert e.index not in assembled, "id and name come once, on a call's first delta"
                assert e.name and e.id.startswith("call_")
                assembled[e.index] = [e.name, ""]
            assembled[e.index][1] += e.arguments
    return content, [(c.name, c.arguments) for c in parser.calls], [(n, a) for n, a in assembled.values()]


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        (
            'Let me check.\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC", "x": [1, {"a": "}"}]}}\n'
            '</tool_call>\n<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>\n',
            "Let me check.\n",
            [("get_time", '{"tz": "UTC", "x": [1, {"a": "}"}]}'), ("b", "{}")],
        ),
        ('<tool_call>{"arguments": {"q": 1}, "name": "f"}</tool_call> after', "after", [("f", '{"q": 1}')]),
        ('<tool_call>{"name": "f", "arguments": "{\\"q\\": 1}"}</tool_call>', "", [("f", '{"q": 1}')]),
        ('<tool_call>\n{"name": "f"}\n</tool_call>', "", [("f", "{}")]),
        ('<tool_call>{"name": "f", "arguments": {"n": 12}}', "", [("f", '{"n": 12}')]),  # no closing tag
        ('<tool_call>\n{"name": "f", "arguments": {"q": "cut', "", [("f", '{"q": "cut')]),  # cut short
        ("<tool_call>not json</tool_call> hi <tool", "<tool_call>not json</tool_call> hi <tool", []),
        ('<tool_call>{"name": 5}</tool_call>', '<tool_call>{"name": 5}</tool_call>', []),
        ("a < b and <tool_cal but no call", "a < b and <tool_cal but no call", []),
        ("plain answer", "plain answer", []),
    ],
)
def test_tool_call_parser_any_split(text: str, content: str, calls: list[tuple[str, str]]) -> None:
    for step in SPLITS:
        got_content, parsed, assembled = parse(text, step)
        assert (got_content, parsed, assembled) == (content, calls, calls), f"split every {step}"


def test_arguments_stream_in_fragments_and_ids_differ() -> None:
    parser = ToolCallParser()
    text = '<tool_call>\n{"name": "f", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
    events = [e for i in range(0, len(text), 4) for e in parser.feed(text[i : i + 4])] + parser.finish()
    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    assert deltas[0].name == "f" and deltas[0].arguments == ""
    assert len(deltas) > 5 and all(d.id is None and d.name is None for d in deltas[1:])
    assert json.loads("".join(d.arguments for d in deltas)) == {"city": "Paris", "days": 3}
    assert not any(isinstance(e, str) for e in events)
    assert ToolCallParser().feed('<tool_call>{"name": "f"}</tool_call>')[0] != deltas[0]  # fresh ids


def test_partial_tag_is_never_shown_as_content() -> None:
    parser = ToolCallParser()
    assert parser.feed("Sure <tool") == ["Sure "]
    assert parser.feed("_ca") == []
    assert parser.feed("ll>") == []
    assert parser.feed('{"name": "f"') == [ToolCallDelta(0, parser.calls[0].id, "f")]


def split_reasoning(text: str, step: int, started: bool = False) -> tuple[str, str]:
    splitter = ReasoningSplitter(started=started)
    pieces = [
        p for i in range(0, len(text), step) for p in splitter.feed(text[i : i + step])
    ] + splitter.flush()
    return "".join(t for k, t in pieces if k == "reasoning"), "".join(t for k, t in pieces if k == "content")


@pytest.mark.parametrize(
    ("text", "started", "reasoning", "content"),
    [
        ("<think>\nLet me see.\n</think>\n\nParis.", False, "\nLet me see.\n", "Paris."),
        ("  <think>a<b</think>c", False, "a<b", "c"),
        (
            "just an answer <think>not at the start</think>",
            False,
            "",
            "just an answer <think>not at the start</think>",
        ),
        ("thinking already</think>Answer", True, "thinking already", "Answer"),
        ("<think>never closed", False, "never closed", ""),
        ("<thi", False, "", "<thi"),
        ("", False, "", ""),
    ],
)
def test_reasoning_split_any_split(text: str, started: bool, reasoning: str, content: str) -> None:
    for step in SPLITS:
        assert split_reasoning(text, step, started) == (reasoning, content), f"split every {step}"


def test_prompt_opens_thinking() -> None:
    assert prompt_opens_thinking("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")
