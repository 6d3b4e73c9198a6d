"""OpenAI request bodies to validated, typed parameters; no engine calls happen here.

Owns: decoding a JSON body, checking each field's type (a wrong one is a 400
`invalid_request_error` naming the `param`), defaults and clamping, for /v1/chat/completions and
/v1/completions. Sampling ranges are clamped, not refused (temperature 0..2, top_p and min_p
0..1, presence/frequency penalties -2..2, logit_bias -100..100); values with no meaning (a
non-positive repeat penalty, `n` outside 1..128 (OpenAI's bound; the server also refuses more
than `--parallel`), more than 4 stop sequences) are refused; `max_tokens` 0 is taken with `echo`
only (the prompt's logprobs, nothing generated). A negative
seed (llama.cpp's -1) means no fixed seed. `prompt` is a string, token ids, or an array of either
(a batch: each prompt gets its `n` choices); a `suffix` makes a text prompt fill in the middle.
Tools, `response_format` and logprobs are parsed by
zinc.server.openai_features.
Imports: zinc.engine.types, zinc.errors, zinc.server.openai_features, orjson, the stdlib.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from zinc.engine.types import Grammar, SamplingParams
from zinc.errors import InvalidRequestError
from zinc.server.openai_features import (
    ToolParams,
    check_tool_history,
    parse_chat_logprobs,
    parse_completion_logprobs,
    parse_response_format,
    parse_tools,
)

DEFAULT_MAX_TOKENS = 256
MAX_CHOICES = 128  # `n` at most (OpenAI's own bound); the server also caps it at --parallel
MAX_PROMPTS = 2048  # prompts in one /v1/completions batch at most (OpenAI's bound)
MAX_STOP_SEQUENCES = 4
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
RESERVED_TEMPLATE_KWARGS = frozenset({"messages", "add_generation_prompt"})
Json = dict[str, Any]
Prompt = str | tuple[int, ...]  # text to tokenize, or token ids as given


@dataclass(frozen=True)
class CommonParams:
    """Fields shared by chat and text completions."""

    model: str | None
    max_tokens: int
    sampling: SamplingParams
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    grammar: Grammar | None = None  # response_format as a constraint
    logprobs: int | None = None  # None: none; n: each token's logprob and n alternatives
    session_id: str | None = None  # keep the conversation's KV pages for its next turn
    n: int = 1  # choices, decoded together


@dataclass(frozen=True)
class ChatParams:
    common: CommonParams
    messages: tuple[Json, ...]  # content normalized to a string
    template_kwargs: Json
    tools: ToolParams = field(default_factory=ToolParams)


@dataclass(frozen=True)
class CompletionParams:
    common: CommonParams
    prompts: tuple[Prompt, ...]  # one, or a batch; each gets `common.n` choices
    echo: bool = False  # each choice's text starts with its prompt
    suffix: str = ""  # text after the completion: the prompt becomes a fill-in-the-middle one


def decode_json(body: bytes) -> Json:
    """The body as a JSON object, or a 400."""
    if not body.strip():
        raise InvalidRequestError("The request body is empty; expected a JSON object.")
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError(f"The request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidRequestError("The request body must be a JSON object.")
    return value


def parse_chat(payload: Json) -> ChatParams:
    common = _parse_common(payload)
    messages = payload.get("messages")
    if messages is None:
        raise InvalidRequestError("Field 'messages' is required.", param="messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("'messages' must be a non-empty array.", param="messages")
    normalized = tuple(_parse_message(i, m) for i, m in enumerate(messages))
    tools = parse_tools(payload)
    common = replace(common, logprobs=parse_chat_logprobs(payload))
    if tools.grammar() is not None and common.grammar is not None:
        raise InvalidRequestError(
            "'response_format' cannot be combined with a forced 'tool_choice'.", param="response_format"
        )
    kwargs: Json = dict(_typed(payload, "chat_template_kwargs", dict, {}))
    if "enable_thinking" in kwargs and not isinstance(kwargs["enable_thinking"], bool):
        raise InvalidRequestError(
            "'chat_template_kwargs.enable_thinking' must be a boolean.",
            param="chat_template_kwargs.enable_thinking",
        )
    if RESERVED_TEMPLATE_KWARGS & kwargs.keys():
        reserved = ", ".join(sorted(RESERVED_TEMPLATE_KWARGS))
        raise InvalidRequestError(
            f"'chat_template_kwargs' may not set {reserved}.", param="chat_template_kwargs"
        )
    thinking = _typed(payload, "enable_thinking", bool, None)
    if thinking is not None:
        kwargs["enable_thinking"] = thinking
    return ChatParams(common, normalized, kwargs, tools)


def parse_completion(payload: Json) -> CompletionParams:
    echo = bool(_typed(payload, "echo", bool, False))
    echo_only = echo and _integer(payload, "max_tokens") == 0  # the prompt (and its logprobs) alone
    common = _parse_common({**payload, "max_tokens": None} if echo_only else payload)
    if echo_only:
        common = replace(common, max_tokens=0)
    if payload.get("logprobs") is False:
        payload = {**payload, "logprobs": None}
    common = replace(common, logprobs=parse_completion_logprobs(payload))
    suffix = _typed(payload, "suffix", str, "")
    if echo and suffix and common.logprobs is not None:  # the tokens scored would be the FIM prompt's
        raise InvalidRequestError("'echo' with 'logprobs' takes no 'suffix'.", param="suffix")
    _refuse_if(payload, "best_of", lambda v: v is not None and v != common.n)
    return CompletionParams(common, _parse_prompts(payload.get("prompt")), echo, suffix)


def parse_common(payload: Json) -> CommonParams:
    """The fields every generation endpoint shares (zinc.server.infill_api uses them too)."""
    return _parse_common(payload)


def _parse_common(payload: Json) -> CommonParams:
    model = _typed(payload, "model", str, None) or None
    n = _integer(payload, "n")
    if n is not None and not 1 <= n <= MAX_CHOICES:
        raise InvalidRequestError(f"'n' must be from 1 to {MAX_CHOICES}.", param="n")
    max_tokens = _integer(payload, "max_completion_tokens")
    if max_tokens is None:
        max_tokens = _integer(payload, "max_tokens")
        name = "max_tokens"
    else:
        name = "max_completion_tokens"
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    elif max_tokens < 1:
        raise InvalidRequestError(f"'{name}' must be at least 1.", param=name)
    stream = bool(_typed(payload, "stream", bool, False))
    options = _typed(payload, "stream_options", dict, None) or {}
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise InvalidRequestError("'include_usage' must be a boolean.", param="stream_options.include_usage")
    session_id = _typed(payload, "session_id", str, None) or None  # "": stateless, as in the ZINC spec
    return CommonParams(
        model,
        max_tokens,
        _parse_sampling(payload),
        _parse_stop(payload),
        stream,
        include_usage,
        grammar=parse_response_format(payload),
        session_id=session_id,
        n=n or 1,
    )


def _parse_sampling(payload: Json) -> SamplingParams:
    repeat_penalty = _number(payload, "repeat_penalty", 1.0)
    if repeat_penalty <= 0:
        raise InvalidRequestError("'repeat_penalty' must be greater than 0.", param="repeat_penalty")
    return SamplingParams(
        temperature=_clamp(_number(payload, "temperature", 0.0), 0.0, 2.0),
        top_p=_clamp(_number(payload, "top_p", 1.0), 0.0, 1.0),
        top_k=max(0, _integer(payload, "top_k") or 0),
        min_p=_clamp(_number(payload, "min_p", 0.0), 0.0, 1.0),
        seed=_seed(_integer(payload, "seed")),
        presence_penalty=_clamp(_number(payload, "presence_penalty", 0.0), -2.0, 2.0),
        frequency_penalty=_clamp(_number(payload, "frequency_penalty", 0.0), -2.0, 2.0),
        repeat_penalty=repeat_penalty,
        logit_bias=_parse_logit_bias(payload.get("logit_bias")),
    )


def _seed(seed: int | None) -> int | None:
    """A negative seed (llama.cpp's -1) means "no fixed seed"."""
    return None if seed is None or seed < 0 else seed


def _parse_logit_bias(value: Any) -> dict[int, float]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequestError("'logit_bias' must be an object of token id to bias.", param="logit_bias")
    bias: dict[int, float] = {}
    for key, amount in value.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):
            raise InvalidRequestError(f"logit_bias key {key!r} is not a token id.", param="logit_bias")
        if not _is_number(amount):
            raise InvalidRequestError(f"logit_bias value for {key} must be a number.", param="logit_bias")
        bias[int(key)] = _clamp(float(amount), -100.0, 100.0)
    return bias


def _parse_stop(payload: Json) -> tuple[str, ...]:
    stop = payload.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise InvalidRequestError("'stop' must be a string or an array of strings.", param="stop")
    if len(stop) > MAX_STOP_SEQUENCES:
        raise InvalidRequestError(f"'stop' takes at most {MAX_STOP_SEQUENCES} sequences.", param="stop")
    return tuple(dict.fromkeys(s for s in stop if s))


def _parse_message(index: int, message: Any) -> Json:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise InvalidRequestError(f"'{where}' must be an object.", param=where)
    role = message.get("role")
    if not isinstance(role, str) or role not in CHAT_ROLES:
        allowed = ", ".join(sorted(CHAT_ROLES))
        raise InvalidRequestError(f"'{where}.role' must be one of {allowed}.", param=f"{where}.role")
    check_tool_history(index, message)
    return {**message, "content": _parse_content(where, message.get("content"))}


def _parse_content(where: str, content: Any) -> str:
    """A string, null, or an array of content blocks whose text parts are kept (others ignored)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequestError(
            f"'{where}.content' must be a string, null or an array.", param=f"{where}.content"
        )
    texts: list[str] = []
    for i, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            param = f"{where}.content[{i}]"
            raise InvalidRequestError(f"'{param}' must be an object with a 'type'.", param=param)
        if block["type"] == "text":
            text = block.get("text")
            if not isinstance(text, str):
                param = f"{where}.content[{i}].text"
                raise InvalidRequestError(f"'{param}' must be a string.", param=param)
            texts.append(text)
    return "\n".join(texts)


def _parse_prompts(prompt: Any) -> tuple[Prompt, ...]:
    """OpenAI's four forms: a string, token ids, an array of strings, an array of token-id arrays."""
    if prompt is None:
        raise InvalidRequestError("Field 'prompt' is required.", param="prompt")
    if isinstance(prompt, str):
        return (prompt,)
    if _token_ids(prompt):
        return (tuple(prompt),)
    if isinstance(prompt, list) and prompt:
        if len(prompt) > MAX_PROMPTS:
            raise InvalidRequestError(f"'prompt' holds at most {MAX_PROMPTS} prompts.", param="prompt")
        if all(isinstance(p, str) for p in prompt):
            return tuple(prompt)
        if all(_token_ids(p) for p in prompt):
            return tuple(tuple(p) for p in prompt)
    raise InvalidRequestError(
        "'prompt' must be a string, an array of token ids, or an array of strings or of token-id arrays.",
        param="prompt",
    )


def _token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(_is_int(t) and t >= 0 for t in value)


def _typed(payload: Json, name: str, kind: type, default: Any) -> Any:
    value = payload.get(name)
    if value is None:
        return default
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        noun = {bool: "a boolean", str: "a string", dict: "an object"}.get(kind, kind.__name__)
        raise InvalidRequestError(f"'{name}' must be {noun}.", param=name)
    return value


def _number(payload: Json, name: str, default: float) -> float:
    value = payload.get(name)
    if value is None:
        return default
    if not _is_number(value):
        raise InvalidRequestError(f"'{name}' must be a number.", param=name)
    return float(value)


def _integer(payload: Json, name: str) -> int | None:
    value = payload.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if not _is_int(value):
        raise InvalidRequestError(f"'{name}' must be an integer.", param=name)
    return int(value)


def _refuse_if(payload: Json, name: str, unsupported: Callable[[Any], bool]) -> None:
    if unsupported(payload.get(name)):
        raise InvalidRequestError(f"'{name}' with this value is not supported by this server.", param=name)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _clamp(value: float, low: float, high: float) -> float:
    return min(high, max(low, value))
