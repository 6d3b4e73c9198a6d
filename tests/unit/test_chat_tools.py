"""Tools in chat templates, for each supported family: a template that renders tools itself
(Qwen's format) gets them as they are; SmolLM2's GGUF template and the Gemma and ChatML fallbacks,
which cannot, get the tool list in the system prompt (the spec's format), past calls as
`<tool_call>` blocks and results as `<tool_response>` blocks."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import golden
from zinc.tokenizer import ChatTemplate
from zinc.tokenizer.tools import TemplateAbilities, tool_system_prompt

TOOL: dict[str, Any] = {"type": "function", "function": {
    "name": "get_time", "description": "Current time.",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}  # fmt: skip
USER = {"role": "user", "content": "Time in UTC?"}
CALLED = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'}}]}  # fmt: skip
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}
BLOCK = '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>'

# A template in Qwen 2.5 / Qwen 3's format (written for this test): tools into the system turn,
# assistant tool_calls as <tool_call> blocks, tool results as a user turn of <tool_response>s.
QWEN_STYLE = """
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' %}<|im_start|>assistant
{%- for tc in message.tool_calls %}
<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{ '<|im_start|>user' }}{% endif %}
{{ '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>
{% endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% endif %}{% endif %}"""


@pytest.fixture(scope="module")
def smollm2_template() -> ChatTemplate:
    return ChatTemplate(golden("smollm2")["chat_template"], bos_token="<|im_start|>", eos_token="<|im_end|>")


def test_qwen_style_template_renders_tools_itself() -> None:
    template = ChatTemplate(QWEN_STYLE)
    assert template.abilities == TemplateAbilities(tools=True, tool_calls=True, tool_results=True)
    text = template.render([USER, CALLED, RESULT], tools=[TOOL])
    assert json.dumps(TOOL) in text and "# Tools" in text
    # string arguments are handed to the template parsed, so `tojson` writes an object
    assert BLOCK in text
    assert "<|im_start|>user\n<tool_response>\n12:00\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert template.render([USER], enable_thinking=False).endswith("<think>\n\n</think>\n\n")


def test_smollm2_template_gets_tools_in_the_system_prompt(smollm2_template: ChatTemplate) -> None:
    assert smollm2_template.abilities == TemplateAbilities()
    text = smollm2_template.render([USER], tools=[TOOL])
    assert text.startswith("<|im_start|>system\n" + tool_system_prompt([TOOL]) + "<|im_end|>\n")
    assert "You are a helpful AI assistant named SmolLM" not in text  # our system turn replaces the default
    system = {"role": "system", "content": "Be brief."}
    text = smollm2_template.render([system, USER], tools=[TOOL])
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    history = smollm2_template.render([USER, CALLED, RESULT, RESULT], tools=[TOOL])
    assert f"<|im_start|>assistant\n{BLOCK}<|im_end|>" in history
    both = "<tool_response>\n12:00\n</tool_response>\n<tool_response>\n12:00\n</tool_response>"
    assert f"<|im_start|>user\n{both}<|im_end|>" in history  # consecutive results: one user turn
    assert "<|im_start|>tool" not in history


def test_spec_format_of_the_tool_list() -> None:
    text = tool_system_prompt([TOOL])
    assert text.startswith("# Tools\n\nYou may call one or more functions to assist with the user query.")
    assert f"<tools>\n{json.dumps(TOOL)}\n</tools>" in text
    assert text.endswith(
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


@pytest.mark.parametrize("architecture", ["gemma3", "llama"])
def test_fallback_templates_render_tools_as_text(architecture: str) -> None:
    template = ChatTemplate(None, bos_token="<bos>", architecture=architecture)
    text = template.render([USER, CALLED, RESULT], tools=[TOOL])
    assert "# Tools" in text and json.dumps(TOOL) in text and BLOCK in text
    assert "<tool_response>\n12:00\n</tool_response>" in text
    if architecture == "gemma3":  # system text goes before the first user message
        assert text.startswith("<bos><start_of_turn>user\n# Tools")
        assert f"<start_of_turn>model\n{BLOCK}<end_of_turn>" in text
    else:
        assert text.startswith("<|im_start|>system\n# Tools")


def test_no_tools_means_no_tool_text(smollm2_template: ChatTemplate) -> None:
    assert "# Tools" not in smollm2_template.render([USER])
    assert "# Tools" not in smollm2_template.render([USER], tools=[])
    # a past call is still rendered, even when no tools are offered now
    assert BLOCK in smollm2_template.render([USER, CALLED, RESULT])
