"""The local model's chat handler: its own template renders the prompt; its reply becomes calls or text."""

from __future__ import annotations

import json

import pytest

from localmodel.chat import AFTER_RESULT, AFTER_TOOLS, BEFORE_TOOLS, TemplateFailed, parse, render, review

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
                                         "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                        "required": ["path"]}}}


def test_the_prompt_is_the_models_own_template_with_the_tools_and_the_guidance() -> None:
    prompt = render(
        CHATML,
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "what is in a.txt?"},
            {"role": "tool", "content": "alpha", "tool_call_id": "c1"},
        ],
        [READ],
    )
    # Each tool by what it does, between the rule to call rather than guess and the one to answer from a result.
    assert prompt.startswith(
        f"<|im_start|>system\nBe brief.\n\n{BEFORE_TOOLS}\n- read_file: Read a file\n{AFTER_TOOLS}"
    )
    assert json.dumps(READ) in prompt and "<tool_response>alpha</tool_response>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    plain = render(CHATML, [{"role": "user", "content": "hi"}])
    assert AFTER_TOOLS not in plain
    assert plain == "<|im_start|>user\nhi<|im_end|><|im_start|>assistant\n"


def test_after_a_result_the_request_is_said_again_last() -> None:
    every = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    after = render(every, [{"role": "user", "content": "what is in a.txt?"},
                           {"role": "tool", "content": "alpha", "tool_call_id": "c1"}], [READ])
    assert after.endswith(f"[tool] alpha\n[system] {AFTER_RESULT} The request was: what is in a.txt?\n")
    before = render(every, [{"role": "user", "content": "what is in a.txt?"}], [READ])
    assert AFTER_RESULT not in before


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


ASKED = [{"role": "user", "content": "what is in a.txt?"}]


def test_a_fitting_call_or_a_plain_answer_goes_out_as_it_is() -> None:
    call = parse('<tool_call>{"name": "read_file", "arguments": {"path": "a.txt"}}</tool_call>', {"read_file"})
    assert review(call, ASKED, [READ]) is None
    assert review(parse("Hello! How can I help?", {"read_file"}), ASKED, [READ]) is None
    assert review(parse("no tools here", set()), ASKED, None) is None


def test_arguments_that_echo_the_schema_are_sent_back_with_what_is_wrong() -> None:
    echoed = parse('<tool_call>{"name": "read_file", "arguments": {"type": "object", "properties": '
                   '{"path": {"type": "string"}}}}</tool_call>', {"read_file"})
    note = review(echoed, ASKED, [READ])
    assert note is not None and "read_file" in note and "'path' is a required property" in note
    wrong_type = parse('<tool_call>{"name": "read_file", "arguments": {"path": 7}}</tool_call>', {"read_file"})
    note = review(wrong_type, ASKED, [READ])
    assert note is not None and note.startswith("Your call to read_file does not fit its parameters: path: 7 is not")


def test_the_call_whose_result_it_was_given_is_not_made_again() -> None:
    made = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'}}]}
    after = [*ASKED, made, {"role": "tool", "tool_call_id": "c1", "content": "alpha"}]
    again = parse('<tool_call>{"name": "read_file", "arguments": {"path": "a.txt"}}</tool_call>', {"read_file"})
    note = review(again, after, [READ])
    assert note is not None and "already called read_file" in note and "Answer the user" in note
    other = parse('<tool_call>{"name": "read_file", "arguments": {"path": "b.txt"}}</tool_call>', {"read_file"})
    assert review(other, after, [READ]) is None  # a different file is a new call


def test_a_tool_named_in_words_instead_of_called_is_asked_for_as_a_call() -> None:
    note = review(parse("I will use read_file to open a.txt.", {"read_file"}), ASKED, [READ])
    assert note is not None and "did not call it" in note and "<tool_call>" in note
    answered = [*ASKED, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "alpha"}]
    assert review(parse("read_file says: alpha", {"read_file"}), answered, [READ]) is None  # the answer itself


def test_only_invented_tools_are_sent_back_naming_the_real_ones() -> None:
    note = review(parse('<tool_call>{"name": "cat", "arguments": {}}</tool_call>', {"read_file"}), ASKED, [READ])
    assert note == "Those tools do not exist: 'cat' is not one of the offered tools (read_file). " \
        "Use one of the offered tools, or answer."


def test_worked_examples_are_shown_only_for_the_tools_offered() -> None:
    every = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    exec_tool = {"type": "function", "function": {"name": "exec", "description": "Run a command",
                                                  "parameters": {"type": "object"}}}
    both = render(every, [{"role": "user", "content": "hi"}], [READ, exec_tool])
    assert 'User: What is in letter.txt?\n<tool_call>{"name": "read_file", "arguments": {"path": "letter.txt"}}' \
           '</tool_call>' in both
    assert '"name": "exec"' in both and "memory_read" not in both  # memory_read is not offered: no example
    other = {"type": "function", "function": {"name": "lookup", "description": "Look a word up"}}
    assert "For example" not in render(every, [{"role": "user", "content": "hi"}], [other])


@pytest.mark.parametrize("text", ["I will read the file notes.txt from the workspace.", "Let me check that for you:",
                                  "Sure! I'll run the command."])
def test_an_action_announced_instead_of_taken_is_asked_for_as_a_call(text: str) -> None:
    note = review(parse(text, {"read_file"}), ASKED, [READ])
    assert note is not None and note.startswith("You said what you would do but did not do it")


def test_an_answer_that_merely_starts_like_an_announcement_goes_out() -> None:
    long = "I will say this: the file holds alpha.\nIt was written yesterday, and nothing else is in it."
    assert review(parse(long, {"read_file"}), ASKED, [READ]) is None  # more than one line: an answer
    assert review(parse("I will read it.", set()), ASKED, None) is None  # no tools offered: nothing to call
