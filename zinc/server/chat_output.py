"""Generated text -> what the response says: content, reasoning and tool calls, as it streams.

Owns: `OutputParser`. Chat output goes through the `<think>` splitter (reasoning_content) and,
when tools are active, the content through the `<tool_call>` parser (incremental
`tool_calls` deltas); text completions pass through untouched. The same parser serves whole and
streamed responses, so both say the same thing.
Imports: zinc.engine (reasoning, tool_calls, types), zinc.server.openai_response.
"""

from __future__ import annotations

from collections.abc import Sequence

from zinc.engine.reasoning import ReasoningSplitter
from zinc.engine.tool_calls import ToolCall, ToolCallDelta, ToolCallParser
from zinc.engine.types import TokenLogprob
from zinc.server.openai_response import Output


class OutputParser:
    def __init__(self, *, reasoning: bool = False, thinking_open: bool = False, tools: bool = False) -> None:
        self._settings = (reasoning, thinking_open, tools)
        self._reasoning = ReasoningSplitter(started=thinking_open) if reasoning else None
        self._tools = ToolCallParser() if tools else None

    def fresh(self) -> OutputParser:
        """A new parser with this one's settings (one per choice when a request has `n` > 1)."""
        reasoning, thinking_open, tools = self._settings
        return OutputParser(reasoning=reasoning, thinking_open=thinking_open, tools=tools)

    @property
    def calls(self) -> list[ToolCall]:
        return self._tools.calls if self._tools is not None else []

    def feed(self, text: str, logprobs: Sequence[TokenLogprob] = ()) -> Output:
        out = Output(logprobs=list(logprobs))
        if self._reasoning is None:
            self._content(out, text)
        else:
            self._pieces(out, self._reasoning.feed(text) if text else [])
        return out

    def finish(self) -> Output:
        """The end of the generation: everything still held back."""
        out = Output()
        if self._reasoning is not None:
            self._pieces(out, self._reasoning.flush())
        if self._tools is not None:
            self._events(out, self._tools.finish())
        return out

    def _pieces(self, out: Output, pieces: Sequence[tuple[str, str]]) -> None:
        for kind, text in pieces:
            if kind == "reasoning":
                out.reasoning += text
            else:
                self._content(out, text)

    def _content(self, out: Output, text: str) -> None:
        if self._tools is None:
            out.content += text
        elif text:
            self._events(out, self._tools.feed(text))

    @staticmethod
    def _events(out: Output, events: Sequence[str | ToolCallDelta]) -> None:
        for event in events:
            if isinstance(event, str):
                out.content += event
            else:
                out.tool_calls.append(event)
