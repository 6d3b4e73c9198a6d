"""Hypothesis strategies for the fuzz tier: hostile HTTP/1.1 request bytes and hostile JSON bodies.

Request bytes are built from parts a parser has to get right (method, target, version, header
names and values, line endings, Content-Length and chunked framing, pipelining), each drawn from
plausible, borderline and random values, so most cases get past the first byte. JSON bodies use
each endpoint's own field names with values of every JSON type (wrong types, huge and tiny
numbers, non-finite numbers, deep nesting, any unicode including lone surrogates), and sometimes
bytes that are not JSON at all.
"""

from __future__ import annotations

import json

from hypothesis import strategies as st

# ---- raw request bytes

METHODS = [
    b"GET",
    b"POST",
    b"HEAD",
    b"PUT",
    b"DELETE",
    b"OPTIONS",
    b"PRI",
    b"CONNECT",
    b"TRACE",
    b"get",
    b"P OST",
]
PATHS = [
    b"/health", b"/v1/models", b"/v1/chat/completions", b"/v1/completions", b"/v1/messages",
    b"/v1/messages/count_tokens", b"/metrics", b"/tokenize", b"/detokenize", b"/props", b"/",
    b"/v1/sessions/x", b"*", b"http://t/health", b"/%00", b"/../../etc/passwd", b"/v1/models?x=%ff",
]  # fmt: skip
VERSIONS = [
    b"HTTP/1.1",
    b"HTTP/1.0",
    b"HTTP/2.0",
    b"HTTP/0.9",
    b"HTTP/1.2",
    b"HTTP/11",
    b"HTTP/1.1 x",
    b"",
    b"http/1.1",
]
NAMES = [
    b"Host", b"Content-Length", b"Transfer-Encoding", b"Connection", b"Expect", b"Content-Type",
    b"Authorization", b"x-api-key", b"Accept", b"Upgrade", b"Origin", b"Content-Length ", b"Transfer-encoding",
]  # fmt: skip
VALUES = [
    b"t", b"0", b"1", b"-1", b"5", b"18446744073709551616", b"99999999999999999999999", b"1, 1", b"1,2",
    b" 3 ", b"0x10", b"chunked", b"gzip, chunked", b"chunked, gzip", b"identity", b"close", b"keep-alive",
    b"100-continue", b"application/json", b"Bearer x", b"", b"\x00", b"\xff\xfe", b"a\rb", b"a\nb",
]  # fmt: skip
EOL = st.sampled_from([b"\r\n"] * 8 + [b"\n", b"\r", b"\r\r\n", b"\n\r"])


@st.composite
def _headers(draw: st.DrawFn) -> list[tuple[bytes, bytes]]:
    names = st.sampled_from(NAMES) | st.binary(max_size=12)
    values = (
        st.sampled_from(VALUES)
        | st.binary(max_size=24)
        | st.integers(-(2**70), 2**70).map(lambda n: b"%d" % n)
    )
    return draw(st.lists(st.tuples(names, values), max_size=6))


@st.composite
def _chunked_body(draw: st.DrawFn) -> bytes:
    """A chunked body: sizes that match their data or not, extensions, trailers, bad endings."""
    out = b""
    for data in draw(st.lists(st.binary(max_size=40), max_size=4)):
        size = draw(
            st.sampled_from(
                [b"%x" % len(data)] * 4 + [b"%X" % (len(data) + 1), b"-1", b"g", b"ffffffffffffffffff", b""]
            )
        )
        ext = draw(st.sampled_from([b""] * 4 + [b";a=b", b"; x", b';q="\x01"']))
        out += size + ext + b"\r\n" + data + draw(st.sampled_from([b"\r\n"] * 4 + [b"", b"\n", b"xx"]))
    last = draw(
        st.sampled_from([b"0\r\n\r\n"] * 4 + [b"0\r\nX-Trailer: 1\r\n\r\n", b"0\r\n", b"", b"00\r\n\r\n"])
    )
    return out + last


@st.composite
def _request(draw: st.DrawFn) -> bytes:
    method = draw(st.sampled_from(METHODS) | st.binary(min_size=1, max_size=8))
    target = draw(st.sampled_from(PATHS) | st.binary(max_size=40))
    version = draw(st.sampled_from(VERSIONS) | st.binary(max_size=10))
    eol = draw(EOL)
    line = draw(st.sampled_from([b"%s %s %s", b"%s  %s %s", b"%s\t%s %s"])) % (method, target, version)
    headers = draw(_headers())
    if draw(st.booleans()):
        headers.insert(0, (b"Host", b"t"))
    body = draw(
        st.binary(max_size=200) | _chunked_body() | st.sampled_from([b'{"prompt": "hi", "max_tokens": 2}'])
    )
    framing = draw(st.sampled_from(["length", "chunked", "both", "none", "wrong-length"]))
    if framing in ("length", "both"):
        headers.append((b"Content-Length", b"%d" % len(body)))
    if framing in ("chunked", "both"):
        headers.append((b"Transfer-Encoding", b"chunked"))
    if framing == "wrong-length":
        headers.append((b"Content-Length", b"%d" % (len(body) + draw(st.integers(-len(body), 1000)))))
    fold = draw(st.sampled_from([b""] * 6 + [b" folded", b"\tfolded"]))
    head = (
        line
        + eol
        + b"".join(k + b":" + draw(st.sampled_from([b" ", b"", b"  "])) + v + eol for k, v in headers)
    )
    return head + (fold + eol if fold else b"") + eol + body


def request_bytes() -> st.SearchStrategy[bytes]:
    """One to three requests back to back (pipelined), or plain random bytes now and then."""
    pipelined = st.lists(_request(), min_size=1, max_size=3).map(b"".join)
    return st.one_of(pipelined, pipelined, pipelined, st.binary(max_size=512))


# ---- JSON bodies

CHAT_FIELDS = [
    "messages", "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
    "seed", "stop", "stream", "stream_options", "logit_bias", "n", "presence_penalty", "frequency_penalty",
    "repeat_penalty", "logprobs", "top_logprobs", "tools", "tool_choice", "response_format",
    "session_id", "enable_thinking", "chat_template_kwargs", "parallel_tool_calls", "user",
]  # fmt: skip
COMPLETION_FIELDS = [f for f in CHAT_FIELDS if f not in ("messages", "tools", "tool_choice")] + [
    "prompt",
    "echo",
    "suffix",
]
MESSAGES_FIELDS = [
    "model", "messages", "system", "max_tokens", "stop_sequences", "temperature", "top_p", "top_k", "stream",
    "tools", "tool_choice", "thinking", "metadata",
]  # fmt: skip
FIELDS = {
    "/v1/chat/completions": CHAT_FIELDS,
    "/v1/completions": COMPLETION_FIELDS,
    "/v1/messages": MESSAGES_FIELDS,
    "/v1/messages/count_tokens": MESSAGES_FIELDS,
}

NUMBERS = st.one_of(
    st.integers(-(2**64), 2**64),
    st.sampled_from([0, -1, 1, 2**31, 2**53 + 1, 2**63, -(2**63) - 1, 10**30, -(10**400), 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -1e308, 5e-324, -0.0, 0.5, 1.5]),
)
TEXT = st.text(max_size=30) | st.sampled_from(
    ["", "user", "assistant", "system", "tool", "text", "\u0000", "<|im_end|>", "\ud800", "🦊" * 10]
)
SCALARS = st.none() | st.booleans() | NUMBERS | TEXT
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=16,
)
BLOCK = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image", "tool_use", "tool_result", "thinking", "image_url", 5])},
    optional={"text": JSON, "id": JSON, "name": JSON, "input": JSON, "content": JSON, "tool_use_id": JSON},
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "developer", "x", None])},
    optional={"content": JSON | st.lists(BLOCK, max_size=3), "tool_calls": JSON, "name": JSON},
)
TOOL = st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "x"])},
    optional={"function": st.fixed_dictionaries({}, optional={"name": JSON, "parameters": JSON}), "name": JSON,
              "input_schema": JSON},
)  # fmt: skip


@st.composite
def json_body(draw: st.DrawFn, path: str, max_tokens_cap: int | None = None) -> bytes:
    """A body for `path`: its fields with fuzzed values, as JSON text (or, now and then, not JSON).
    With `max_tokens_cap`, integer token limits above it become it (a real model's generations
    stay short; wrong types and negative values stay as drawn)."""
    fields = FIELDS[path]
    special = {
        "messages": st.lists(MESSAGE, max_size=3) | JSON,
        "tools": st.lists(TOOL, max_size=2) | JSON,
        "max_tokens": NUMBERS | JSON | st.integers(0, 8),
    }
    keys = st.sampled_from(fields) | TEXT
    body = draw(st.dictionaries(keys, JSON, max_size=8))
    for key in draw(st.lists(st.sampled_from(list(special)), max_size=3, unique=True)):
        if key in fields:
            body[key] = draw(special[key])
    if draw(st.integers(0, 9)) == 0:  # sensible messages, so the request gets deep into the path
        body.setdefault("messages", [{"role": "user", "content": draw(TEXT)}])
        body.setdefault("prompt", draw(TEXT))
    if max_tokens_cap is not None:
        body.setdefault("max_tokens", max_tokens_cap)  # else 256 tokens by default
        for key in ("max_tokens", "max_completion_tokens"):
            value = body.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > max_tokens_cap:
                body[key] = max_tokens_cap
    text = json.dumps(body)  # Python's json writes huge ints, NaN/Infinity and lone surrogates
    choice = draw(st.integers(0, 19))
    if choice == 0:  # nested past any parser's limit, in a field or as the whole body
        depth = draw(st.sampled_from([100, 1_000, 100_000]))
        opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
        nested = opener * depth + "1" + closer * depth
        return (
            text[:-1] + (", " if body else "") + f'"{draw(st.sampled_from(fields))}": {nested}}}'
        ).encode()
    if choice == 1:
        return draw(st.binary(max_size=100))  # not JSON
    if choice == 2:
        return text.encode()[: draw(st.integers(0, len(text)))]  # cut short
    if choice == 3:
        return text.encode("utf-16")  # not UTF-8
    return text.encode()
