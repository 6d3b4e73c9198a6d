"""Hypothesis strategies for the fuzz tier: hostile HTTP/1.1 request bytes and hostile JSON bodies.

Request bytes are built from parts a parser has to get right (method, target, version, header
names and values, line endings, Content-Length and chunked framing, pipelining), each drawn from
plausible, borderline and random values, so most cases get past the first byte. JSON bodies use
each endpoint's own field names with values of every JSON type (wrong types, huge and tiny
numbers, non-finite numbers, deep nesting, any unicode including lone surrogates), and sometimes
bytes that are not JSON at all. Half the bodies are plausible ones (what a client could mean, at
and past each field's edges: sampling values, stop lists, logit_bias, token-id prompts, tools,
tool choices, JSON schemas, Anthropic content blocks), so that many cases reach generation.
"""

from __future__ import annotations

import json
from typing import Any

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
RESPONSES_FIELDS = [
    "model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "tools", "tool_choice",
    "text", "reasoning", "store", "previous_response_id", "metadata", "stream", "include", "top_logprobs",
    "parallel_tool_calls", "user",
]  # fmt: skip
EMBEDDINGS_FIELDS = ["model", "input", "encoding_format", "dimensions", "user"]
INFILL_FIELDS = ["input_prefix", "input_suffix", "input_extra", "prompt", "n_predict", "temperature", "stream", "seed"]
FIELDS = {
    "/v1/chat/completions": CHAT_FIELDS,
    "/v1/completions": COMPLETION_FIELDS,
    "/v1/messages": MESSAGES_FIELDS,
    "/v1/messages/count_tokens": MESSAGES_FIELDS,
    "/v1/responses": RESPONSES_FIELDS,
    "/v1/embeddings": EMBEDDINGS_FIELDS,
    "/infill": INFILL_FIELDS,
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


# Values a client could mean: mostly valid, at and past the edges of each field's range; text without
# lone surrogates (which no JSON parser takes), so that these bodies get past the parser.
TEXT_OK = st.text(st.characters(exclude_categories=("Cs",)), max_size=30) | st.sampled_from(
    ["", "user", "\u0000", "<|im_end|>", "<|im_start|>assistant", "{{ raise('x') }}", "🦊" * 10]
)
# (one_of picks a branch evenly: the valid ranges are listed three times so that most values are.)
_UNIT_EDGES = st.floats(-1, 3, allow_nan=False) | st.sampled_from([0, 1, 0.0, 1.0, 1e-9, 2.0000001])
UNIT = st.one_of(st.floats(0, 1), st.floats(0, 1), st.floats(0, 1), _UNIT_EDGES)
SMALL = st.one_of(st.integers(0, 20), st.integers(0, 20), st.integers(0, 20), st.integers(-2, 40),
                  st.sampled_from([0, 1, 2**31, 2**63 - 1]))  # fmt: skip
_TOKEN = st.one_of(st.integers(0, 49151), st.integers(0, 49151), st.integers(0, 49151),
                   st.integers(-3, 200_000), st.sampled_from([0, 1, 2, 49151, 49152, 2**31]))  # fmt: skip
TOKEN_IDS = st.lists(_TOKEN, min_size=1, max_size=8)
PROMPT_BATCH = st.lists(TEXT_OK, min_size=1, max_size=3) | st.lists(TOKEN_IDS, min_size=1, max_size=3)
NAME = st.from_regex(r"[a-z_]{1,12}", fullmatch=True) | TEXT_OK
SCHEMA = st.sampled_from([
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {"type": "object", "properties": {"s": {"type": "string", "enum": ["x", "y"]}}},
    {"type": "array", "items": {"type": "number"}, "maxItems": 2},
    {"type": "string", "pattern": "^[0-9]+$"},
    {}, {"type": "nonsense"}, {"$ref": "#/nowhere"}, {"type": "object", "additionalProperties": False},
]) | JSON  # fmt: skip
FUNCTION = st.fixed_dictionaries({"name": NAME}, optional={"description": TEXT_OK, "parameters": SCHEMA})
TOOL_CALL = st.fixed_dictionaries(
    {
        "id": TEXT_OK,
        "type": st.just("function"),
        "function": st.fixed_dictionaries({"name": NAME, "arguments": TEXT_OK}),
    }
)
CHAT_MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "developer"]), "content": TEXT_OK}),
    st.fixed_dictionaries({"role": st.just("user"), "content": st.lists(
        st.fixed_dictionaries({"type": st.just("text"), "text": TEXT_OK}), max_size=3)}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": st.none() | TEXT_OK,
                           "tool_calls": st.lists(TOOL_CALL, max_size=2)}),
    st.fixed_dictionaries({"role": st.just("tool"), "content": TEXT_OK, "tool_call_id": TEXT_OK}),
)  # fmt: skip
ANTHROPIC_BLOCK = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": TEXT_OK}),
    st.fixed_dictionaries({"type": st.just("tool_use"), "id": TEXT_OK, "name": NAME, "input": JSON}),
    st.fixed_dictionaries(
        {"type": st.just("tool_result"), "tool_use_id": TEXT_OK, "content": TEXT_OK | JSON}
    ),
    st.fixed_dictionaries({"type": st.just("thinking"), "thinking": TEXT_OK}),
)
ANTHROPIC_MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant"]),
        "content": TEXT_OK | st.lists(ANTHROPIC_BLOCK, max_size=3),
    }
)
OPENAI_PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "temperature": UNIT, "top_p": UNIT, "min_p": UNIT, "presence_penalty": UNIT, "frequency_penalty": UNIT,
    "repeat_penalty": UNIT, "top_k": SMALL, "seed": SMALL, "n": SMALL, "top_logprobs": SMALL,
    "max_completion_tokens": SMALL, "stop": TEXT_OK | st.lists(TEXT_OK, max_size=5),
    "logit_bias": st.dictionaries(st.integers(-5, 70_000).map(str) | TEXT_OK, UNIT | SMALL, max_size=4),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "logprobs": st.booleans() | SMALL, "session_id": TEXT_OK, "enable_thinking": st.booleans(),
    "chat_template_kwargs": st.dictionaries(TEXT_OK, JSON, max_size=3),
    "response_format": st.sampled_from([{"type": "json_object"}, {"type": "text"}])
    | st.builds(lambda schema: {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}, SCHEMA),
    "tools": st.lists(st.builds(lambda f: {"type": "function", "function": f}, FUNCTION), max_size=3),
    "tool_choice": st.sampled_from(["none", "auto", "required", {"type": "function", "function": {"name": "f"}}])
    | st.builds(lambda n: {"type": "function", "function": {"name": n}}, NAME),
    "parallel_tool_calls": st.booleans(), "echo": st.booleans(), "user": TEXT_OK,
}  # fmt: skip
ANTHROPIC_PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "system": TEXT_OK | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT_OK}), max_size=2),
    "stop_sequences": st.lists(TEXT_OK, max_size=4), "temperature": UNIT, "top_p": UNIT, "top_k": SMALL,
    "tools": st.lists(st.fixed_dictionaries({"name": NAME, "input_schema": SCHEMA}, optional={"description": TEXT_OK}),
                      max_size=3),
    "tool_choice": st.sampled_from([{"type": "auto"}, {"type": "any"}, {"type": "none"}])
    | st.builds(lambda n: {"type": "tool", "name": n}, NAME),
    "thinking": st.builds(lambda b: {"type": "enabled", "budget_tokens": b}, SMALL) | st.just({"type": "disabled"}),
    "metadata": st.dictionaries(TEXT_OK, TEXT_OK, max_size=2),
}  # fmt: skip


@st.composite
def plausible_body(draw: st.DrawFn, path: str) -> dict[str, Any]:
    """A body the endpoint should take, with some of its optional fields at and past their
    edges, and now and then one field of a wrong type: cases that reach generation."""
    anthropic = path.startswith("/v1/messages")
    if anthropic:
        body: dict[str, Any] = {"messages": draw(st.lists(ANTHROPIC_MESSAGE, min_size=1, max_size=3))}
        optional = ANTHROPIC_PLAUSIBLE
    elif path == "/v1/completions":
        body = {"prompt": draw(TEXT_OK | TOKEN_IDS | PROMPT_BATCH)}
        optional = {
            k: v
            for k, v in OPENAI_PLAUSIBLE.items()
            if k not in ("tools", "tool_choice", "parallel_tool_calls")
        }
        if draw(st.booleans()):
            optional["suffix"] = TEXT_OK
    else:
        body = {"messages": draw(st.lists(CHAT_MESSAGE, min_size=1, max_size=4))}
        optional = OPENAI_PLAUSIBLE
    body["max_tokens"] = draw(st.integers(1, 8) | SMALL)
    body["stream"] = draw(st.booleans())
    for key in draw(st.lists(st.sampled_from(sorted(optional)), max_size=4, unique=True)):
        body[key] = draw(optional[key])
    if draw(st.integers(0, 5)) == 0:
        body[draw(st.sampled_from(sorted(body)))] = draw(JSON)
    return body


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
    if draw(st.booleans()):
        body = draw(plausible_body(path))
    else:
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
