"""The official SDKs against the shim's model endpoint (served by models/tests.rs against a
scripted gateway whose every reply is the text "Let me look." and one call of read_file with
{"path": "a.txt"}). The SDKs' own stream accumulators check the events' order and fields."""

import os
import sys

import openai

base = os.environ["TOLLGATE_TEST_ENDPOINT"]
client = openai.OpenAI(base_url=base + "/v1", api_key="placeholder", max_retries=0)
schema = {"type": "object", "properties": {"path": {"type": "string"}}}
messages = [{"role": "user", "content": "read a.txt"}]

# Chat Completions, streamed and gathered by the SDK's helper.
tools = [{"type": "function", "function": {"name": "read_file", "parameters": schema}}]
with client.chat.completions.stream(model="gpt-4o", messages=messages, tools=tools) as stream:
    for _ in stream:
        pass
    final = stream.get_final_completion()
choice = final.choices[0]
assert choice.finish_reason == "tool_calls", choice
assert choice.message.content == "Let me look.", choice
assert choice.message.tool_calls[0].id == "call_abc", choice
assert choice.message.tool_calls[0].function.arguments == '{"path":"a.txt"}', choice
assert final.model == "served-model", final

# Chat Completions, whole.
whole = client.chat.completions.create(model="gpt-4o", messages=messages, tools=tools)
assert whole.choices[0].message.tool_calls[0].function.name == "read_file", whole

# The Responses API, streamed and gathered by the SDK's helper.
rtools = [{"type": "function", "name": "read_file", "parameters": schema, "strict": False}]
with client.responses.stream(model="gpt-5-codex", input="read a.txt", tools=rtools, store=False) as stream:
    kinds = [event.type for event in stream]
    response = stream.get_final_response()
assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
assert response.output_text == "Let me look.", response
calls = [item for item in response.output if item.type == "function_call"]
assert calls[0].call_id == "call_abc" and calls[0].arguments == '{"path":"a.txt"}', response
assert response.usage.total_tokens == 17, response.usage

# The Responses API with reasoning: a reasoning item with its summary and encrypted content.
with client.responses.stream(model="gpt-5-codex", input="read a.txt", tools=rtools,
                             reasoning={"effort": "low", "summary": "auto"}) as stream:
    for _ in stream:
        pass
    response = stream.get_final_response()
reasoning = response.output[0]
assert reasoning.type == "reasoning" and reasoning.summary[0].text == "plan", response
assert reasoning.encrypted_content == "sig", reasoning

# A free-form (custom) tool: its call comes back as a custom_tool_call item. (The scripted
# reply's arguments have no "input" field, so the item's input is the arguments' text.)
custom = [{"type": "custom", "name": "read_file", "description": "reads a file"}]
with client.responses.stream(model="gpt-5-codex", input="read a.txt", tools=custom) as stream:
    for _ in stream:
        pass
    response = stream.get_final_response()
call = response.output[1]
assert call.type == "custom_tool_call" and call.input == '{"path":"a.txt"}', response

# The Responses API, whole.
response = client.responses.create(model="gpt-5-codex", input="hi")
assert response.output[1].name == "read_file", response

# Models, and a refusal that the SDK must not retry.
assert [m.id for m in client.models.list()][:2] == ["auto", "local"]
try:
    client.chat.completions.create(model="refuse", messages=messages)
    raise AssertionError("a refused call succeeded")
except openai.PermissionDeniedError as e:
    assert e.response.headers["x-should-retry"] == "false"

import anthropic

claude = anthropic.Anthropic(base_url=base, api_key="placeholder", max_retries=0)
atools = [{"name": "read_file", "input_schema": schema}]
with claude.messages.stream(model="claude-sonnet-4-5", max_tokens=100, messages=messages, tools=atools) as stream:
    for _ in stream:
        pass
    message = stream.get_final_message()
assert message.stop_reason == "tool_use", message
assert message.content[0].text == "Let me look.", message
assert message.content[1].type == "tool_use" and message.content[1].input == {"path": "a.txt"}, message
with claude.messages.stream(model="claude-sonnet-4-5", max_tokens=2000, messages=messages, tools=atools,
                            thinking={"type": "enabled", "budget_tokens": 1024}) as stream:
    for _ in stream:
        pass
    message = stream.get_final_message()
thinking = message.content[0]
assert thinking.type == "thinking" and thinking.thinking == "plan" and thinking.signature == "sig", message
assert [block.type for block in message.content] == ["thinking", "text", "tool_use"], message
message = claude.messages.create(model="claude-sonnet-4-5", max_tokens=100, messages=messages, tools=atools)
assert message.content[1].id == "call_abc", message
count = claude.messages.count_tokens(model="claude-sonnet-4-5", messages=messages, tools=atools)
assert count.input_tokens == 42, count
assert [m.id for m in claude.models.list()][:2] == ["auto", "local"]
print("sdk check: openai and anthropic passed")
