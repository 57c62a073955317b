//! The formats' tests: bodies built from canonical calls, replies and streams decoded.

use serde_json::{json, Value};
use tollgate_proto::v1 as pb;

use super::shared::text_delta;
use super::*;
use crate::sse::SseParser;

fn message(role: &str, content: &str) -> pb::ChatMessage {
    pb::ChatMessage {
        role: role.into(),
        content: content.into(),
        parts: Vec::new(),
    }
}

fn chat(stream: bool) -> ChatRequest {
    ChatRequest {
        model: "m".into(),
        call: pb::CompleteRequest {
            messages: vec![
                message("system", "be brief"),
                message("user", "hi"),
                message("user", "again"),
            ],
            max_tokens: 64,
            stream,
            ..Default::default()
        },
    }
}

fn body_of(api: Api, request: &ChatRequest) -> Value {
    let (_, bytes) = request_body(api, request);
    serde_json::from_slice(&bytes).unwrap()
}

fn request_body(api: Api, chat: &ChatRequest) -> (&'static str, Vec<u8>) {
    request(api, chat).unwrap()
}

#[test]
fn requests_are_built_for_each_format() {
    let openai = body_of(Api::Openai, &chat(true));
    assert_eq!(openai["stream_options"]["include_usage"], true);
    assert_eq!(openai["messages"].as_array().unwrap().len(), 3);
    assert_eq!(openai["max_tokens"], 64);
    assert!(body_of(Api::Openai, &chat(false))
        .get("stream_options")
        .is_none());
    let anthropic = body_of(Api::Anthropic, &chat(true));
    assert_eq!(
        anthropic["system"],
        json!([{"type": "text", "text": "be brief"}])
    );
    assert_eq!(
        anthropic["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "again"}]}])
    );
    assert_eq!(request_body(Api::Anthropic, &chat(true)).0, "/v1/messages");
    let responses = body_of(Api::OpenaiResponses, &chat(true));
    assert_eq!(
        request_body(Api::OpenaiResponses, &chat(true)).0,
        "/v1/responses"
    );
    assert_eq!(responses["instructions"], "be brief");
    assert_eq!(responses["store"], false);
    assert_eq!(responses["max_output_tokens"], 64);
    // An empty user turn is still a turn, as each API takes one.
    let mut empty = chat(false);
    empty.call.messages = vec![message("user", "")];
    assert_eq!(
        body_of(Api::OpenaiResponses, &empty)["input"],
        json!([{"role": "user", "content": ""}])
    );
    assert_eq!(
        body_of(Api::Openai, &empty)["messages"],
        json!([{"role": "user", "content": ""}])
    );
}

fn stream(api: Api, text: &str) -> Result<Vec<StreamItem>, WireError> {
    let mut parser = SseParser::new();
    let mut decoder = StreamDecoder::new(api);
    let mut items = Vec::new();
    for event in parser.push(text.as_bytes()).unwrap() {
        items.extend(decoder.event(&event)?);
    }
    Ok(items)
}

fn text_item(text: &str) -> StreamItem {
    StreamItem::Delta(text_delta(text))
}

#[test]
fn openai_streams_decode_with_and_without_a_usage_chunk() {
    let chunk = |delta: &str, finish: &str, usage: &str| {
        format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}],\"usage\":{usage}}}\n\n")
    };
    let text = [
        chunk("{\"role\":\"assistant\",\"content\":\"\"}", "null", "null"),
        chunk("{\"content\":\"Hel\"}", "null", "null"),
        chunk("{\"content\":\"lo\"}", "null", "null"),
        chunk("{}", "\"stop\"", "null"),
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":4}}\n\n".into(),
        "data: [DONE]\n\n".into(),
    ]
    .concat();
    assert_eq!(
        stream(Api::Openai, &text).unwrap(),
        vec![
            text_item("Hel"),
            text_item("lo"),
            StreamItem::Finish("stop".into()),
            StreamItem::Usage {
                prompt: Some(9),
                completion: Some(4)
            },
            StreamItem::Done,
        ]
    );
    let error = stream(
        Api::Openai,
        "data: {\"error\":{\"message\":\"bad key sk-abc\",\"type\":\"invalid_request_error\"}}\n\n",
    );
    assert_eq!(
        error,
        Err(WireError::Backend("invalid_request_error".into()))
    );
}

#[test]
fn anthropic_streams_decode_counts_and_finish() {
    let text = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":11,\"cache_read_input_tokens\":2,\"output_tokens\":1}}}\n\n\
                event: ping\ndata: {\"type\":\"ping\"}\n\n\
                event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n\
                event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":4}}\n\n\
                event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    assert_eq!(
        stream(Api::Anthropic, text).unwrap(),
        vec![
            StreamItem::Usage {
                prompt: Some(13),
                completion: Some(1)
            },
            text_item("Hi"),
            StreamItem::Finish("stop".into()),
            StreamItem::Usage {
                prompt: None,
                completion: Some(4)
            },
            StreamItem::Done,
        ]
    );
    let error = stream(
        Api::Anthropic,
        "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"x\"}}\n\n",
    );
    assert_eq!(error, Err(WireError::Backend("overloaded_error".into())));
}

#[test]
fn whole_replies_decode() {
    let openai = parse_reply(
        Api::Openai,
        br#"{"choices":[{"message":{"role":"assistant","content":"Hello"},"finish_reason":"length"}],"usage":{"prompt_tokens":9,"completion_tokens":4}}"#,
    )
    .unwrap();
    assert_eq!(
        (
            openai.text().as_str(),
            openai.finish_reason.as_str(),
            openai.prompt_tokens,
            openai.completion_tokens
        ),
        ("Hello", "length", Some(9), Some(4))
    );
    let anthropic = parse_reply(
        Api::Anthropic,
        br#"{"content":[{"type":"text","text":"Hel"},{"type":"text","text":"lo"}],"stop_reason":"max_tokens","usage":{"input_tokens":11,"output_tokens":4}}"#,
    )
    .unwrap();
    assert_eq!(
        (
            anthropic.text().as_str(),
            anthropic.finish_reason.as_str(),
            anthropic.prompt_tokens
        ),
        ("Hello", "length", Some(11))
    );
    assert!(parse_reply(Api::Openai, b"not json").is_err());
}

// ---- Tools, images and thinking: bodies built from one canonical conversation ----

fn part(part: pb::content_part::Part) -> pb::ContentPart {
    pb::ContentPart {
        part: Some(part),
        cache: false,
    }
}

fn cached(part: pb::content_part::Part) -> pb::ContentPart {
    pb::ContentPart {
        part: Some(part),
        cache: true,
    }
}

fn with_parts(role: &str, content: &str, parts: Vec<pb::ContentPart>) -> pb::ChatMessage {
    pb::ChatMessage {
        role: role.into(),
        content: content.into(),
        parts,
    }
}

fn tool_call(id: &str, name: &str, arguments: &str) -> pb::content_part::Part {
    pb::content_part::Part::ToolCall(pb::ToolCall {
        id: id.into(),
        name: name.into(),
        arguments_json: arguments.into(),
    })
}

fn tool_result(call_id: &str, content: Vec<pb::ContentPart>) -> pb::content_part::Part {
    pb::content_part::Part::ToolResult(pb::ToolResult {
        call_id: call_id.into(),
        content,
        is_error: false,
    })
}

fn text_part(text: &str) -> pb::content_part::Part {
    pb::content_part::Part::Text(text.into())
}

fn png() -> pb::content_part::Part {
    pb::content_part::Part::Image(pb::ImagePart {
        media_type: "image/png".into(),
        data: b"\x89PNG".to_vec(),
        url: String::new(),
    })
}

fn thinking(origin: &str, text: &str, signature: &str) -> pb::content_part::Part {
    pb::content_part::Part::Thinking(pb::ThinkingPart {
        text: text.into(),
        signature: signature.into(),
        origin: origin.into(),
        redacted: false,
        id: "rs_1".into(),
    })
}

fn weather_tool() -> pb::ToolDefinition {
    pb::ToolDefinition {
        name: "get_weather".into(),
        description: "Current weather".into(),
        parameters_json:
            r#"{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}"#
                .into(),
        strict: false,
        cache: true,
    }
}

/// A coding agent's turn: it asked, the model thought and called a tool, the tool answered
/// (as OpenAI's `tool` message), the model called another, and the agent sent that result
/// with more text and a screenshot (as Anthropic's user turn).
fn conversation(thinking_origin: &str) -> ChatRequest {
    ChatRequest {
        model: "m".into(),
        call: pb::CompleteRequest {
            messages: vec![
                with_parts("system", "You are terse.", vec![cached(text_part("Use tools."))]),
                with_parts("user", "Weather in Paris?", vec![part(png())]),
                with_parts(
                    "assistant",
                    "",
                    vec![
                        part(thinking(thinking_origin, "Need the tool.", "sig-1")),
                        part(text_part("Checking.")),
                        part(tool_call("call_1", "get_weather", r#"{"city":"Paris"}"#)),
                    ],
                ),
                with_parts(
                    "tool",
                    "",
                    vec![part(tool_result("call_1", vec![part(text_part("18C"))]))],
                ),
                with_parts(
                    "assistant",
                    "",
                    vec![part(tool_call("toolu_2", "get_weather", ""))],
                ),
                with_parts(
                    "user",
                    "",
                    vec![
                        part(tool_result(
                            "toolu_2",
                            vec![part(text_part("rain")), part(png())],
                        )),
                        cached(text_part("Thanks")),
                    ],
                ),
            ],
            max_tokens: 4096,
            stream: false,
            temperature: Some(0.5),
            top_p: Some(0.9),
            stop: vec!["END".into()],
            tools: vec![weather_tool()],
            tool_choice: Some(pb::ToolChoice {
                mode: pb::tool_choice::Mode::Named as i32,
                name: "get_weather".into(),
                parallel: Some(false),
            }),
            response_format_json: r#"{"type":"json_schema","json_schema":{"name":"w","schema":{"type":"object"},"strict":true}}"#.into(),
            reasoning: Some(pb::ReasoningConfig {
                budget_tokens: 2048,
                effort: "low".into(),
                summary: true,
            }),
            ..Default::default()
        },
    }
}

const PNG_URL: &str = "data:image/png;base64,iVBORw==";

#[test]
fn openai_chat_bodies_carry_tools_calls_results_and_images() {
    let body = body_of(Api::Openai, &conversation("anthropic"));
    assert_eq!(
        body["messages"],
        json!([
            {"role": "system", "content": "You are terse.\n\nUse tools."},
            {"role": "user", "content": [
                {"type": "text", "text": "Weather in Paris?"},
                {"type": "image_url", "image_url": {"url": PNG_URL}},
            ]},
            // Thinking from another format is dropped.
            {"role": "assistant", "content": "Checking.", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "toolu_2", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}},
            ]},
            // One tool message per result, then the rest (the result's image too) as a user turn.
            {"role": "tool", "tool_call_id": "toolu_2", "content": "rain"},
            {"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": PNG_URL}},
                {"type": "text", "text": "Thanks"},
            ]},
        ])
    );
    assert_eq!(
        body["tools"],
        json!([{"type": "function", "function": {
            "name": "get_weather",
            "description": "Current weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        }}])
    );
    assert_eq!(
        body["tool_choice"],
        json!({"type": "function", "function": {"name": "get_weather"}})
    );
    assert_eq!(body["parallel_tool_calls"], false);
    assert_eq!(body["response_format"]["json_schema"]["name"], "w");
    assert_eq!(body["reasoning_effort"], "low");
    assert_eq!(body["top_p"], json!(0.9f32));
    assert_eq!(body["stop"], json!(["END"]));
}

#[test]
fn anthropic_bodies_alternate_turns_and_keep_their_own_thinking() {
    let body = body_of(Api::Anthropic, &conversation("anthropic"));
    let cache = json!({"type": "ephemeral"});
    let image = json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw=="}});
    assert_eq!(
        body["system"],
        json!([
            {"type": "text", "text": "You are terse."},
            {"type": "text", "text": "Use tools.", "cache_control": cache},
        ])
    );
    assert_eq!(
        body["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}, image]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Need the tool.", "signature": "sig-1"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": [{"type": "text", "text": "18C"}]},
            ]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "rain"}, image]},
                {"type": "text", "text": "Thanks", "cache_control": cache},
            ]},
        ])
    );
    assert_eq!(
        body["tools"],
        json!([{
            "name": "get_weather",
            "description": "Current weather",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            "cache_control": cache,
        }])
    );
    assert_eq!(
        body["tool_choice"],
        json!({"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true})
    );
    assert_eq!(
        body["thinking"],
        json!({"type": "enabled", "budget_tokens": 2048})
    );
    // With thinking on, the API takes neither temperature nor top_p.
    assert!(body.get("temperature").is_none() && body.get("top_p").is_none());
    assert_eq!(body["stop_sequences"], json!(["END"]));

    // Another format's thinking is dropped; a tool-role turn merges with the user text after it.
    let mut chat = conversation("openai-responses");
    chat.call.reasoning = None;
    chat.call.messages[3]
        .parts
        .push(part(text_part("and more")));
    let body = body_of(Api::Anthropic, &chat);
    assert_eq!(body["messages"][1]["content"][0]["type"], "text");
    assert_eq!(
        body["messages"][2]["content"],
        json!([
            {"type": "tool_result", "tool_use_id": "call_1", "content": [{"type": "text", "text": "18C"}]},
            {"type": "text", "text": "and more"},
        ])
    );
    assert_eq!(body["temperature"], json!(0.5f32));
    assert!(body.get("thinking").is_none());
}

#[test]
fn anthropic_tool_choice_and_thinking_budget_follow_the_api_rules() {
    let mut chat = conversation("anthropic");
    chat.call.tool_choice = Some(pb::ToolChoice {
        mode: pb::tool_choice::Mode::Required as i32,
        name: String::new(),
        parallel: None,
    });
    // The budget stays below max_tokens; under the API's minimum, no thinking.
    chat.call.max_tokens = 1500;
    let body = body_of(Api::Anthropic, &chat);
    assert_eq!(body["tool_choice"], json!({"type": "any"}));
    assert_eq!(body["thinking"]["budget_tokens"], 1499);
    chat.call.max_tokens = 1000;
    assert!(body_of(Api::Anthropic, &chat).get("thinking").is_none());
}

#[test]
fn responses_bodies_carry_items_and_only_their_own_reasoning() {
    let body = body_of(Api::OpenaiResponses, &conversation("openai-responses"));
    assert_eq!(body["instructions"], "You are terse.\n\nUse tools.");
    assert_eq!(body["store"], false);
    assert_eq!(body["include"], json!(["reasoning.encrypted_content"]));
    assert_eq!(
        body["input"],
        json!([
            {"role": "user", "content": [
                {"type": "input_text", "text": "Weather in Paris?"},
                {"type": "input_image", "image_url": PNG_URL},
            ]},
            // No item ids: nothing is stored, so the backend knows none.
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Need the tool."}], "encrypted_content": "sig-1"},
            {"role": "assistant", "content": "Checking."},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
            {"type": "function_call", "call_id": "toolu_2", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "toolu_2", "output": [
                {"type": "input_text", "text": "rain"},
                {"type": "input_image", "image_url": PNG_URL},
            ]},
            {"role": "user", "content": [{"type": "input_text", "text": "Thanks"}]},
        ])
    );
    assert_eq!(
        body["tools"],
        json!([{
            "type": "function",
            "name": "get_weather",
            "description": "Current weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            "strict": false,
        }])
    );
    assert_eq!(
        body["tool_choice"],
        json!({"type": "function", "name": "get_weather"})
    );
    assert_eq!(
        body["text"]["format"],
        json!({"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": true})
    );
    assert_eq!(
        body["reasoning"],
        json!({"effort": "low", "summary": "auto"})
    );
    assert!(
        body.get("stop").is_none(),
        "the Responses API has no stop sequences"
    );
    // Anthropic's thinking is not sent here.
    let body = body_of(Api::OpenaiResponses, &conversation("anthropic"));
    assert!(!body["input"]
        .as_array()
        .unwrap()
        .iter()
        .any(|i| i["type"] == "reasoning"));
}

#[test]
fn calls_that_cannot_be_sent_say_why() {
    let mut chat = conversation("anthropic");
    chat.call.messages[2].parts[2] = part(tool_call("call_1", "get_weather", "[1]"));
    for api in [Api::Openai, Api::Anthropic, Api::OpenaiResponses] {
        let error = request(api, &chat).unwrap_err().to_string();
        assert!(error.contains("arguments are not a JSON object"), "{error}");
    }
    let mut chat = conversation("anthropic");
    chat.call.messages[1].parts[0] = part(pb::content_part::Part::Image(pb::ImagePart {
        url: "https://example.com/cat.png".into(),
        ..Default::default()
    }));
    let error = request(Api::Anthropic, &chat).unwrap_err().to_string();
    assert!(error.contains("never sent"), "{error}");
    let mut chat = conversation("anthropic");
    chat.call.tools[0].parameters_json = "{not json".into();
    let error = request(Api::Openai, &chat).unwrap_err().to_string();
    assert!(
        error.contains("tool \"get_weather\": the parameters are not JSON"),
        "{error}"
    );
}
