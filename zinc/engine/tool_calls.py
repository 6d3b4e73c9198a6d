"""Tool calls in generated text: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks,
parsed as the text streams in.

Owns: `ToolCallParser`, `ToolCallDelta` and `ToolCall`. Text is fed in deltas; out come content
strings and `ToolCallDelta`s the way OpenAI streams `delta.tool_calls`: first the call's index,
id and function name (as soon as the name is complete), then the raw text of its `arguments`
value in fragments as it arrives, so the fragments join into exactly the JSON the model wrote.
A partial `<tool_call>` tag split across deltas is held back, never shown as content; whitespace
before the first call and between calls is dropped. A block that is not a JSON object with a
string `name` is given back as content, tags included. A block the generation cut short keeps
what it had (an announced call stays a call; its arguments may then be incomplete JSON). Feeding
the whole text at once gives the same calls and content as feeding it in pieces, so streamed and
whole responses agree.
Imports: the stdlib only.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
_WS = " \t\r\n"
_ARGUMENT_KEYS = ("arguments", "parameters")


@dataclass(frozen=True)
class ToolCallDelta:
    index: int
    id: str | None = None  # with the name, on a call's first delta only
    name: str | None = None
    arguments: str = ""


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str = ""


class _NotACallError(Exception):
    """The text inside `<tool_call>` is not a tool call object."""


@dataclass
class _Scan:
    name: str | None = None
    args_start: int | None = None
    args_end: int | None = None
    end: int | None = None  # just past the object's closing brace


def _skip_ws(buf: str, i: int) -> int:
    while i < len(buf) and buf[i] in _WS:
        i += 1
    return i


def _string_end(buf: str, i: int) -> int | None:
    """Index just past the JSON string starting at `buf[i] == '"'`, or None if it is not closed yet."""
    i += 1
    while i < len(buf):
        c = buf[i]
        if c == "\\":
            i += 2
            continue
        if c == '"':
            return i + 1
        i += 1
    return None


def _value_end(buf: str, i: int) -> int | None:
    """Index just past the JSON value starting at `i`, or None if the buffer ends inside it."""
    c = buf[i]
    if c == '"':
        return _string_end(buf, i)
    if c in "{[":
        depth = 0
        while i < len(buf):
            c = buf[i]
            if c == '"':
                end = _string_end(buf, i)
                if end is None:
                    return None
                i = end
                continue
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return None
    j = i
    while j < len(buf) and buf[j] not in _WS + ",}]":
        j += 1
    if j == len(buf):
        return None  # a number or literal may go on
    try:
        json.loads(buf[i:j])
    except ValueError:
        raise _NotACallError from None
    return j


def _scan(buf: str) -> _Scan:
    """How far the call object in `buf` is known; raises `_NotACallError` when it cannot be a call."""
    out = _Scan()
    i = _skip_ws(buf, 0)
    if i == len(buf):
        return out
    if buf[i] != "{":
        raise _NotACallError
    i += 1
    while True:
        i = _skip_ws(buf, i)
        if i == len(buf):
            return out
        if buf[i] == "}":
            if out.name is None:
                raise _NotACallError
            out.end = i + 1
            return out
        if buf[i] == ",":
            i += 1
            continue
        if buf[i] != '"':
            raise _NotACallError
        key_end = _string_end(buf, i)
        if key_end is None:
            return out
        key = json.loads(buf[i:key_end])
        i = _skip_ws(buf, key_end)
        if i == len(buf):
            return out
        if buf[i] != ":":
            raise _NotACallError
        i = _skip_ws(buf, i + 1)
        if i == len(buf):
            return out
        end = _value_end(buf, i)
        if key in _ARGUMENT_KEYS and out.args_start is None:
            out.args_start, out.args_end = i, end
        if end is None:
            return out
        if key == "name":
            name = json.loads(buf[i:end])
            if not isinstance(name, str) or not name:
                raise _NotACallError
            out.name = name
        i = end


def _partial_suffix(text: str, tag: str) -> int:
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


Event = str | ToolCallDelta


@dataclass
class ToolCallParser:
    calls: list[ToolCall] = field(default_factory=list)
    _held: str = ""  # text state: a possible tag start; call state: the block's text so far
    _in_call: bool = False
    _announced: bool = False
    _args_sent: int = 0  # index in the block text up to which arguments were streamed
    _skip_ws: bool = True  # drop whitespace before the first call and between calls

    def feed(self, text: str) -> list[Event]:
        out: list[Event] = []
        self._held += text
        while self._held:
            if self._in_call:
                if not self._step_call(out):
                    break
                continue
            held = self._held
            if self._skip_ws:
                held = held.lstrip(_WS)
                self._held = held
                if not held:
                    break
            start = held.find(OPEN)
            if start >= 0:
                self._emit_text(out, held[:start])
                self._held = held[start + len(OPEN) :]
                self._in_call, self._announced, self._args_sent = True, False, 0
                continue
            keep = _partial_suffix(held, OPEN)
            self._emit_text(out, held[: len(held) - keep])
            self._held = held[len(held) - keep :]
            break
        return out

    def finish(self) -> list[Event]:
        """The end of the output: complete or give back whatever is still open."""
        out: list[Event] = []
        if self._in_call:
            if self._announced:
                self._close_call(out, self._held, final=True)
            else:
                try:
                    scan = _scan(self._held)
                except _NotACallError:
                    scan = _Scan()
                if scan.end is not None and scan.name is not None:
                    self._announce(out, scan.name)
                    self._close_call(out, self._held, final=True)
                else:
                    self._emit_text(out, OPEN + self._held)
            self._in_call = False
        elif self._held and not (self._skip_ws and not self._held.strip(_WS)):
            self._emit_text(out, self._held)
        self._held = ""
        return out

    def _emit_text(self, out: list[Event], text: str) -> None:
        if text:
            self._skip_ws = False
            out.append(text)

    def _announce(self, out: list[Event], name: str) -> None:
        call = ToolCall(new_call_id(), name)
        self.calls.append(call)
        self._announced = True
        out.append(ToolCallDelta(len(self.calls) - 1, call.id, name))

    def _send_args(self, out: list[Event], fragment: str) -> None:
        if fragment:
            self.calls[-1].arguments += fragment
            out.append(ToolCallDelta(len(self.calls) - 1, arguments=fragment))

    def _close_call(self, out: list[Event], block: str, *, final: bool = False) -> None:
        """The call is over: send what is left of its arguments ("{}" when it had none)."""
        try:
            scan = _scan(block)
        except _NotACallError:
            scan = _Scan()
        call = self.calls[-1]
        if scan.args_start is not None:
            args_end = scan.args_end if scan.args_end is not None else len(block)
            value = block[scan.args_start : args_end]
            if value.startswith('"') and scan.args_end is not None and not call.arguments:
                self._send_args(out, str(json.loads(value)))  # arguments given as a JSON string
            else:
                self._send_args(out, block[max(self._args_sent, scan.args_start) : args_end])
        elif not call.arguments:
            self._send_args(out, "{}")
        self._in_call = False
        self._skip_ws = True

    def _step_call(self, out: list[Event]) -> bool:
        """Advance inside a block; False when more text is needed."""
        block = self._held
        close = block.find(CLOSE)
        inner = block if close < 0 else block[:close]
        try:
            scan = _scan(inner)
        except _NotACallError:
            if self._announced:
                scan = _Scan()
            elif close < 0:
                return False  # not a call: given back as text once the block ends
            else:
                self._emit_text(out, OPEN + block[: close + len(CLOSE)])
                self._in_call, self._held = False, block[close + len(CLOSE) :]
                return True
        if not self._announced and scan.name is not None:
            self._announce(out, scan.name)
        streaming = self._announced and scan.args_start is not None and scan.args_end is None
        if streaming and not inner[scan.args_start or 0 :].startswith('"'):  # an object's text as it comes
            self._send_args(out, inner[max(self._args_sent, scan.args_start or 0) :])
            self._args_sent = len(inner)
        if close >= 0 or scan.end is not None:
            after = inner[scan.end :].lstrip(_WS) if scan.end is not None else ""
            if close < 0 and CLOSE.startswith(after) and after != CLOSE:
                return False  # the object is complete; wait for the closing tag
            if not self._announced and scan.name is None:
                self._emit_text(out, OPEN + block[: close + len(CLOSE)] if close >= 0 else OPEN + block)
                self._in_call, self._held = False, block[close + len(CLOSE) :] if close >= 0 else ""
                return True
            self._close_call(out, inner)
            rest = block[close + len(CLOSE) :] if close >= 0 else inner[scan.end :].lstrip(_WS)
            self._held = rest
            return True
        return False
