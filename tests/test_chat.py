"""Chat through the model's own Jinja template (llama.cpp's common chat code)."""
import json

import pytest

from polyllama import TemplateError
from polyllama._llamacpp import builtin_chat_template

from conftest import llama_completion

MESSAGES = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy?"},
]


def test_chat_prompt_equals_llama_cpp_builtin_formatter(llm):
    jinja = llm.apply_chat_template(MESSAGES)["prompt"]
    builtin = builtin_chat_template(llm.metadata["chat_template"], MESSAGES, True)
    assert jinja == builtin
    assert jinja.endswith("<|im_start|>assistant\n")


def test_template_adds_its_default_system_prompt(llm):
    # SmolLM2's own Jinja template inserts a system message when none is given: proof
    # that the model's template runs, not a generic ChatML formatter.
    prompt = llm.apply_chat_template([{"role": "user", "content": "Hi"}])["prompt"]
    assert prompt.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


def test_chat_reply_equals_llama_completion_on_the_formatted_prompt(llm, model_path):
    msgs = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"}]
    prompt = llm.apply_chat_template(msgs)["prompt"]
    expected = llama_completion(model_path, prompt, 48)
    r = llm.chat(msgs, max_tokens=48)
    # llama-completion marks the end-of-generation token with " [end of text]\n"
    assert expected.endswith(" [end of text]\n") and r.finish_reason == "stop"
    assert r.text == expected[:-len(" [end of text]\n")]
    assert "Paris" in r.text
    assert r.message["role"] == "assistant" and r.message["content"] == r.text


def test_chat_stream_equals_chat(llm):
    msgs = [{"role": "user", "content": "Name three colours."}]
    streamed = "".join(llm.chat(msgs, max_tokens=32, stream=True))
    assert streamed == llm.chat(msgs, max_tokens=32).text


def test_chat_json_schema_response_format(llm):
    import jsonschema
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    r = llm.chat([{"role": "user", "content": "Invent a person; reply in JSON with name and age."}],
                 max_tokens=64, response_format={"type": "json_schema", "json_schema": {"schema": schema}})
    # llama.cpp's output grammar may wrap the JSON in a ```json fence; the parsed
    # message (libcommon's chat parser) holds the JSON itself
    jsonschema.validate(json.loads(r.message["content"]), schema)
    r = llm.chat([{"role": "user", "content": "Give a JSON object with the keys name and colour of a cat."}],
                 max_tokens=256, response_format={"type": "json_object"})
    assert r.finish_reason == "stop"
    assert isinstance(json.loads(r.message["content"]), dict)


def test_bad_messages_raise(llm):
    with pytest.raises(ValueError, match="messages must be a non-empty list"):
        llm.chat([])
    with pytest.raises(ValueError, match="needs a 'role'"):
        llm.chat([{"content": "x"}])
    with pytest.raises(ValueError, match="response_format type"):
        llm.chat(MESSAGES, response_format={"type": "yaml"})


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def test_tools_with_a_template_that_has_them(model_path):
    # SmolLM2's template has no tools; llama.cpp's copy of Qwen2.5's has. libcommon then
    # puts the tool in the prompt, makes a grammar that starts at "<tool_call>", and
    # parses a reply into OpenAI-style tool_calls.
    from pathlib import Path
    from polyllama import LLM
    from polyllama._llamacpp import parse_chat_reply
    tpl = (Path(__file__).resolve().parent.parent / "thirdparty" / "llama.cpp" / "models" / "templates"
           / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
    with LLM(model_path, backend="cpu", n_threads=2, n_ctx=1024, chat_template=tpl) as m:
        chat = m.apply_chat_template([{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS)
        assert '"name": "get_weather"' in chat["prompt"]
        assert chat["grammar"] and chat["grammar_lazy"] and chat["grammar_triggers"] == ["<tool_call>\n"]
        reply = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        msg = parse_chat_reply(chat["format"], chat["generation_prompt"], chat["parser"], reply)
        assert msg["tool_calls"] == [{"type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}]
        r = m.chat([{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS, max_tokens=8)
        assert r.message["role"] == "assistant"


def test_tools_with_a_template_without_them_warn(llm, caplog):
    prompt = llm.apply_chat_template([{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS)["prompt"]
    assert "get_weather" not in prompt
    with caplog.at_level("WARNING", logger="polyllama"):
        llm.chat([{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS, max_tokens=2)
    assert "does not use tools" in caplog.text
