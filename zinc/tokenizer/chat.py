"""Chat templates: OpenAI-style messages -> the prompt text a model was trained on.

Owns: `ChatTemplate` and `normalize_messages`.
- A GGUF's `tokenizer.chat_template` is untrusted input: it is rendered with jinja2's
  `ImmutableSandboxedEnvironment` the way HF transformers does (`trim_blocks`, `lstrip_blocks`,
  loop controls, a `tojson` filter that keeps non-ASCII, `raise_exception`, `strftime_now`, and
  `{% generation %}` blocks rendered as plain text). Reaching for an unsafe attribute
  (`''.__class__`) is an error, not an empty string; the output is capped at `MAX_OUTPUT_CHARS`.
- The context holds `messages`, `add_generation_prompt`, `tools`, `bos_token`, `eos_token`,
  `enable_thinking` (only when given) and any extra keyword arguments.
- Message `content` may be a string, None ("") or a list of content parts: the `{"type": "text"}`
  parts are joined with "\n", other parts (images, ...) are ignored.
- Without a template (e.g. the Gemma 3 270M base model): Gemma architectures get Gemma's turn
  format, `<bos><start_of_turn>user\n...<end_of_turn>\n<start_of_turn>model\n`, with system
  text put before the first user message (as Gemma's own template does), `assistant` named
  `model` and contents trimmed; every other architecture gets ChatML,
  `<|im_start|>role\n...<|im_end|>\n`.
- Tools (zinc.tokenizer.tools): a template that renders `tools`, assistant `tool_calls` and `tool`
  messages itself (Qwen's) gets them as they are; whatever a template cannot render (SmolLM2's,
  the fallbacks) is turned into text first: the tool list into the system message in Qwen's
  format, past calls into `<tool_call>` blocks, results into a user turn of `<tool_response>`s.
Every failure is `InvalidRequestError` with a one-line message. `encode` renders and tokenizes
the way llama.cpp's server does: special tokens in the text are parsed, and a BOS written by the
template is dropped when the tokenizer adds one itself.
Imports: jinja2, zinc.errors, zinc.tokenizer.tokenizer, zinc.tokenizer.tools.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.exceptions import SecurityError
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from zinc.errors import InvalidRequestError
from zinc.tokenizer.tokenizer import Tokenizer
from zinc.tokenizer.tools import TemplateAbilities, prepare_tool_messages

MAX_OUTPUT_CHARS = 16 * 1024 * 1024


class _SafeUndefined(jinja2.Undefined):
    """Undefined that fails loudly when it stands for a refused (unsafe) attribute."""

    def __str__(self) -> str:
        if self._undefined_exception is SecurityError:
            self._fail_with_undefined_error()
        return super().__str__()

    def __bool__(self) -> bool:
        if self._undefined_exception is SecurityError:
            self._fail_with_undefined_error()
        return super().__bool__()


class _GenerationBlock(Extension):
    """HF's `{% generation %}...{% endgeneration %}` marks assistant text; here it just renders."""

    tags = {"generation"}  # noqa: RUF012 (jinja2's Extension API)

    def parse(self, parser: Any) -> list[nodes.Node]:
        next(parser.stream)
        body: list[nodes.Node] = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return body


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=_SafeUndefined,
        extensions=["jinja2.ext.loopcontrols", _GenerationBlock],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _content_text(content: Any, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        texts = []
        for part in content:
            if not isinstance(part, Mapping):
                raise InvalidRequestError(
                    f"messages[{index}].content parts must be objects", param="messages"
                )
            if part.get("type") == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise InvalidRequestError(
                        f"messages[{index}].content text part has no string 'text'", param="messages"
                    )
                texts.append(text)
        return "\n".join(texts)
    raise InvalidRequestError(
        f"messages[{index}].content must be a string, null or a list of parts", param="messages"
    )


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Copies of the messages with `content` made a string; other keys (tool_calls, ...) kept."""
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise InvalidRequestError("messages must be a list of message objects", param="messages")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InvalidRequestError(f"messages[{i}] must be an object", param="messages")
        if not isinstance(message.get("role"), str):
            raise InvalidRequestError(f"messages[{i}].role must be a string", param="messages")
        copy = dict(message)
        copy["content"] = _content_text(message.get("content"), i)
        out.append(copy)
    return out


def _render_gemma(messages: list[dict[str, Any]], add_generation_prompt: bool, bos: str) -> str:
    system = "\n\n".join(m["content"].strip() for m in messages if m["role"] == "system")
    turns = [m for m in messages if m["role"] != "system"]
    parts = [bos]
    if system and not turns:
        parts.append(f"<start_of_turn>user\n{system}<end_of_turn>\n")
    for i, m in enumerate(turns):
        role = "model" if m["role"] == "assistant" else m["role"]
        prefix = system + "\n\n" if i == 0 and system else ""
        parts.append(f"<start_of_turn>{role}\n{prefix}{m['content'].strip()}<end_of_turn>\n")
    if add_generation_prompt:
        parts.append("<start_of_turn>model\n")
    return "".join(parts)


def _render_chatml(messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


class ChatTemplate:
    """One model's chat format: its GGUF template, or a documented fallback (`kind`)."""

    def __init__(
        self, source: str | None, *, bos_token: str = "", eos_token: str = "", architecture: str = ""
    ) -> None:
        self.source = source or None
        self.bos_token = bos_token
        self.eos_token = eos_token
        if self.source is not None:
            self.kind = "gguf"
        else:
            self.kind = "gemma" if architecture.startswith("gemma") else "chatml"
        self._compiled: jinja2.Template | None = None
        self._abilities: TemplateAbilities | None = None

    @property
    def abilities(self) -> TemplateAbilities:
        """Which tool parts the template renders by itself (none for the fallbacks)."""
        if self._abilities is None:
            if self.kind != "gguf":
                self._abilities = TemplateAbilities()
            else:
                self._abilities = TemplateAbilities.probe(
                    lambda messages, tools: self._render_gguf(messages, True, tools, None, {})
                )
        return self._abilities

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any], tokenizer: Tokenizer) -> ChatTemplate:
        source = meta.get("tokenizer.chat_template")
        return cls(
            source if isinstance(source, str) else None,
            bos_token=tokenizer.bos_text,
            eos_token=tokenizer.eos_text,
            architecture=str(meta.get("general.architecture", "")),
        )

    def _template(self) -> jinja2.Template:
        if self._compiled is None:
            assert self.source is not None
            try:
                self._compiled = _environment().from_string(self.source)
            except jinja2.TemplateError as exc:
                raise InvalidRequestError(
                    f"the model's chat template does not compile: {_one_line(exc)}"
                ) from exc
        return self._compiled

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        enable_thinking: bool | None = None,
        **extra: Any,
    ) -> str:
        """The prompt text for `messages`; any template failure is `InvalidRequestError`."""
        msgs = normalize_messages(messages)
        if tools or any(m.get("tool_calls") or m["role"] == "tool" for m in msgs):
            msgs, tools = prepare_tool_messages(msgs, tools, self.abilities)
        if self.kind == "gemma":
            return _render_gemma(msgs, add_generation_prompt, self.bos_token)
        if self.kind == "chatml":
            return _render_chatml(msgs, add_generation_prompt)
        return self._render_gguf(msgs, add_generation_prompt, tools, enable_thinking, extra)

    def _render_gguf(
        self,
        msgs: list[dict[str, Any]],
        add_generation_prompt: bool,
        tools: Sequence[Mapping[str, Any]] | None,
        enable_thinking: bool | None,
        extra: Mapping[str, Any],
    ) -> str:
        context: dict[str, Any] = dict(extra)
        context.update(
            messages=msgs,
            add_generation_prompt=add_generation_prompt,
            tools=list(tools) if tools is not None else None,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )
        if enable_thinking is not None:
            context["enable_thinking"] = enable_thinking
        template = self._template()
        chunks: list[str] = []
        size = 0
        try:
            for chunk in template.generate(context):
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_OUTPUT_CHARS:
                    raise InvalidRequestError(f"chat template output exceeds {MAX_OUTPUT_CHARS} characters")
        except InvalidRequestError:
            raise
        except Exception as exc:  # the template is untrusted: anything it raises is a bad request
            raise InvalidRequestError(f"chat template error: {_one_line(exc)}", param="messages") from exc
        return "".join(chunks)

    def encode(
        self,
        tokenizer: Tokenizer,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> list[int]:
        """Render and tokenize (special tokens parsed; no doubled BOS/EOS), as llama.cpp's server does."""
        text = self.render(messages, add_generation_prompt=add_generation_prompt, **kwargs)
        bos, eos = tokenizer.bos_text, tokenizer.eos_text
        if tokenizer.add_bos and bos and text.startswith(bos):
            text = text[len(bos) :]
        if tokenizer.add_eos and eos and text.endswith(eos):
            text = text[: -len(eos)]
        return tokenizer.encode(text, add_special=True, parse_special=True)
