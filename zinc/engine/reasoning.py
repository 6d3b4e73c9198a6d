"""Splitting a reasoning model's `<think>...</think>` block from its answer, as text streams in.

Owns: `ReasoningSplitter`. A thinking block is recognised only at the start of the output
(after leading whitespace), or from the first token when the prompt itself ended inside an open
`<think>` (templates that open the block for the model). Text is fed in deltas and comes back as
("reasoning", text) and ("content", text) pieces; a tag split across deltas is held until it is
known, never leaked. The whitespace right after `</think>` is dropped. Text with no thinking
block passes through as content unchanged.
Imports: the stdlib only.
"""

from __future__ import annotations

from typing import Literal

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
Kind = Literal["reasoning", "content"]
Piece = tuple[Kind, str]


def prompt_opens_thinking(prompt: str) -> bool:
    """True when a rendered prompt ends inside an open thinking block."""
    tail = prompt.rstrip()
    return tail.endswith(THINK_OPEN)


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest tail of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ReasoningSplitter:
    def __init__(self, *, started: bool = False) -> None:
        self._state = "reasoning" if started else "start"
        self._held = ""
        self.saw_reasoning = started

    def feed(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        self._held += text
        while self._held:
            held = self._held
            if self._state == "start":
                stripped = held.lstrip()
                if stripped.startswith(THINK_OPEN):
                    self._state, self._held = "reasoning", stripped[len(THINK_OPEN) :]
                    self.saw_reasoning = True
                    continue
                if THINK_OPEN.startswith(stripped):
                    break  # still could be the opening tag
                self._state = "content"
                continue
            if self._state == "reasoning":
                end = held.find(THINK_CLOSE)
                if end >= 0:
                    if end:
                        out.append(("reasoning", held[:end]))
                    self._state, self._held = "after", held[end + len(THINK_CLOSE) :]
                    continue
                keep = _partial_suffix(held, THINK_CLOSE)
                if len(held) > keep:
                    out.append(("reasoning", held[: len(held) - keep]))
                self._held = held[len(held) - keep :]
                break
            if self._state == "after":
                stripped = held.lstrip()
                self._held = stripped
                if stripped:
                    self._state = "content"
                continue
            out.append(("content", held))  # "content": everything passes
            self._held = ""
        return out

    def flush(self) -> list[Piece]:
        """The end of the output: whatever is still held."""
        held, self._held = self._held, ""
        if not held or self._state == "after":
            return []
        return [("reasoning" if self._state == "reasoning" else "content", held)]
