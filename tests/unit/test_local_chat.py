"""The local model's chat handler: its own template renders the prompt; its reply becomes calls or text."""

from __future__ import annotations

import json

import pytest

from localmodel.chat import AFTER_TOOLS, TemplateFailed, parse, render

# A ChatML template with tools, written for these tests in the style such GGUFs carry.
CHATML = """{%- if tools %}<|im_start|>system
{{ messages[0].content if messages[0].role == 'system' else '' }}
Tools:
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}<|im_end|>
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' and tools %}{%- elif message.role == 'tool' %}
<|im_start|>user
<tool_response>{{ message.content }}</tool_response><|im_end|>
{%- else %}
<|im_start|>{{ message.role }}
{{ message.content or '' }}<|im_end|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
<|im_start|>assistant
{% endif %}"""
READ = {"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                         "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}


def test_the_prompt_is_the_models_own_template_with_the_tools_and_the_guidance() -> None:
    prompt = render(CHATML, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "what is in a.txt?"},
                             {"role": "tool", "content": "alpha", "tool_call_id": "c1"}], [READ])
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\n" + AFTER_TOOLS)
    assert json.dumps(READ) in prompt and "<tool_response>alpha</tool_response>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    plain = render(CHATML, [{"role": "user", "content": "hi"}])
    assert AFTER_TOOLS not in plain
    assert plain == "<|im_start|>user\nhi<|im_end|><|im_start|>assistant\n"


def test_a_template_cannot_reach_outside_its_sandbox() -> None:
    with pytest.raises(TemplateFailed, match="chat template failed"):
        render("{{ ''.__class__.__mro__[1].__subclasses__() }}", [{"role": "user", "content": "x"}])
    with pytest.raises(TemplateFailed, match="only user and assistant"):
        render("{{ raise_exception('only user and assistant') }}", [{"role": "user", "content": "x"}])


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call>',
    'Let me look.\n```json\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n```',
    '{"name": "read_file", "arguments": "{\\"path\\": \\"a.txt\\"}"}',
    '<tool_call>{"name": "read_file", "parameters": {"path": "a.txt"}}',  # cut off before its closing tag
    '<tools>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tools>',  # its prompt's tag, echoed
    '<tools>{"type": "function", "function": {"name": "read_file", "arguments": {"path": "a.txt"}}}</tools>',
])
def test_tool_calls_are_read_from_the_formats_small_models_write(text: str) -> None:
    reply = parse(text, {"read_file", "exec"})
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in reply.tool_calls] == \
        [("read_file", {"path": "a.txt"})]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in reply.tool_calls)
    assert "read_file" not in reply.content and not reply.refused


def test_several_calls_and_an_invented_tool() -> None:
    text = ('<tool_call>{"name": "read_file", "arguments": {"path": "a"}}</tool_call>\n'
            '<tool_call>{"name": "delete_everything", "arguments": {}}</tool_call>')
    reply = parse(text, {"read_file"})
    assert [c["function"]["name"] for c in reply.tool_calls] == ["read_file"]
    assert reply.refused == ["'delete_everything' is not one of the offered tools (read_file)"]


def test_plain_answers_and_json_that_is_not_a_call_stay_text() -> None:
    assert parse("The file says alpha.", {"read_file"}).content == "The file says alpha."
    assert parse('{"answer": 42}', {"read_file"}).tool_calls == []
    broken = parse("<tool_call>{not json</tool_call>", {"read_file"})
    assert broken.tool_calls == [] and broken.refused == [] and "not json" in broken.content
