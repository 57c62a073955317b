//! Replies with tool calls and thinking, whole and streamed, as the APIs' documentation
//! shows them, decoded into canonical deltas.

use serde_json::json;
use tollgate_proto::v1 as pb;

use super::*;
use crate::sse::SseParser;

fn decode(api: Api, text: &str) -> Vec<StreamItem> {
    let mut parser = SseParser::new();
    let mut decoder = StreamDecoder::new(api);
    let mut items = Vec::new();
    for event in parser.push(text.as_bytes()).unwrap() {
        items.extend(decoder.event(&event).unwrap());
    }
    items
}

fn sse(events: &[Value]) -> String {
    events
        .iter()
        .map(|e| {
            format!(
                "event: {}\ndata: {e}\n\n",
                e["type"].as_str().unwrap_or("x")
            )
        })
        .collect()
}

/// The tool calls the deltas make, joined: (index, id, name, arguments).
fn calls(deltas: &[pb::CompleteDelta]) -> Vec<(u32, String, String, String)> {
    let mut calls: Vec<(u32, String, String, String)> = Vec::new();
    for call in deltas.iter().filter_map(|d| d.tool_call.as_ref()) {
        match calls.iter_mut().find(|c| c.0 == call.index) {
            Some(c) => {
                c.1.push_str(&call.id);
                c.2.push_str(&call.name);
                c.3.push_str(&call.arguments);
            }
            None => calls.push((
                call.index,
                call.id.clone(),
                call.name.clone(),
                call.arguments.clone(),
            )),
        }
    }
    calls
}

fn deltas(items: &[StreamItem]) -> Vec<pb::CompleteDelta> {
    items
        .iter()
        .filter_map(|i| match i {
            StreamItem::Delta(d) => Some(d.clone()),
            _ => None,
        })
        .collect()
}

fn finish(items: &[StreamItem]) -> Option<&str> {
    items.iter().find_map(|i| match i {
        StreamItem::Finish(f) => Some(f.as_str()),
        _ => None,
    })
}

fn call(index: u32, id: &str, name: &str, arguments: &str) -> (u32, String, String, String) {
    (index, id.into(), name.into(), arguments.into())
}

#[test]
fn openai_whole_replies_with_tool_calls() {
    let reply = parse_reply(
        Api::Openai,
        json!({
            "id": "chatcmpl-abc123", "object": "chat.completion", "model": "gpt-4.1",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_abc123", "type": "function", "function": {"name": "get_current_weather", "arguments": "{\n\"location\": \"Boston, MA\"\n}"}},
                {"id": "call_def456", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
            ]}, "logprobs": null, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 82, "completion_tokens": 17, "total_tokens": 99},
        })
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    assert_eq!(
        calls(&reply.deltas),
        vec![
            call(
                0,
                "call_abc123",
                "get_current_weather",
                "{\n\"location\": \"Boston, MA\"\n}"
            ),
            call(1, "call_def456", "get_time", "{}"),
        ]
    );
    assert_eq!(reply.text(), "");
    assert_eq!(
        (
            reply.finish_reason.as_str(),
            reply.prompt_tokens,
            reply.completion_tokens
        ),
        ("tool_calls", Some(82), Some(17))
    );
}

#[test]
fn openai_streamed_tool_calls_join_by_index() {
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    let text = [
        chunk(json!({"role": "assistant", "content": null, "tool_calls": [{"index": 0, "id": "call_DdmO9pD3xa9XTPNJ32zg2hcA", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]}), json!(null)),
        chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\""}}]}), json!(null)),
        chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "location\":\"Paris\"}"}}]}), json!(null)),
        chunk(json!({"tool_calls": [{"index": 1, "id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}), json!(null)),
        chunk(json!({}), json!("tool_calls")),
        "data: [DONE]\n\n".into(),
    ]
    .concat();
    let items = decode(Api::Openai, &text);
    assert_eq!(
        calls(&deltas(&items)),
        vec![
            call(
                0,
                "call_DdmO9pD3xa9XTPNJ32zg2hcA",
                "get_weather",
                "{\"location\":\"Paris\"}"
            ),
            call(1, "call_2", "get_time", "{}"),
        ]
    );
    assert_eq!(finish(&items), Some("tool_calls"));
    assert_eq!(items.last(), Some(&StreamItem::Done));
    // A server that sends whole calls without an index, and says `stop` after them.
    let text = [
        chunk(
            json!({"tool_calls": [{"id": "a", "function": {"name": "x", "arguments": "{}"}}]}),
            json!(null),
        ),
        chunk(
            json!({"tool_calls": [{"id": "b", "function": {"name": "y", "arguments": "{}"}}]}),
            json!("stop"),
        ),
    ]
    .concat();
    let items = decode(Api::Openai, &text);
    assert_eq!(
        calls(&deltas(&items)),
        vec![call(0, "a", "x", "{}"), call(1, "b", "y", "{}")]
    );
    assert_eq!(finish(&items), Some("tool_calls"));
}

#[test]
fn anthropic_whole_replies_with_thinking_and_tool_use() {
    let reply = parse_reply(
        Api::Anthropic,
        json!({
            "id": "msg_01Aq9w938a90dw8q", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
            "content": [
                {"type": "thinking", "thinking": "The user wants the weather.", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"},
                {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP"},
                {"type": "text", "text": "I'll check."},
                {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "get_weather", "input": {"location": "San Francisco, CA"}},
            ],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 2095, "output_tokens": 503, "cache_creation_input_tokens": 10, "cache_read_input_tokens": 100},
        })
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    let thinking: Vec<&pb::ThinkingDelta> = reply
        .deltas
        .iter()
        .filter_map(|d| d.thinking.as_ref())
        .collect();
    assert_eq!(thinking.len(), 2);
    assert_eq!(
        (
            thinking[0].text.as_str(),
            thinking[0].origin.as_str(),
            thinking[0].redacted
        ),
        ("The user wants the weather.", "anthropic", false)
    );
    assert!(thinking[0].signature.starts_with("EqQB"));
    assert!(thinking[1].redacted && thinking[1].signature.starts_with("EmwK"));
    assert_eq!(reply.text(), "I'll check.");
    assert_eq!(
        calls(&reply.deltas),
        vec![call(
            0,
            "toolu_01A09q90qw90lq917835lq9",
            "get_weather",
            r#"{"location":"San Francisco, CA"}"#
        )]
    );
    assert_eq!(reply.finish_reason, "tool_calls");
    assert_eq!(
        reply.prompt_tokens,
        Some(2205),
        "cache reads and writes count"
    );
}

#[test]
fn anthropic_streams_map_content_blocks_to_calls() {
    let text = sse(&[
        json!({"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 472, "output_tokens": 2}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Let me think"}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "EqQBCgIYAhIM"}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Okay"}}),
        json!({"type": "content_block_stop", "index": 1}),
        json!({"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "name": "get_weather", "input": {}}}),
        json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": ""}}),
        json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{\"location\": \"San Fra"}}),
        json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "ncisco, CA\"}"}}),
        json!({"type": "content_block_stop", "index": 2}),
        json!({"type": "content_block_start", "index": 3, "content_block": {"type": "tool_use", "id": "toolu_2", "name": "get_time", "input": {}}}),
        json!({"type": "content_block_stop", "index": 3}),
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 89}}),
        json!({"type": "message_stop"}),
    ]);
    let items = decode(Api::Anthropic, &text);
    let deltas = deltas(&items);
    assert_eq!(
        calls(&deltas),
        vec![
            call(
                0,
                "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
                "get_weather",
                "{\"location\": \"San Francisco, CA\"}"
            ),
            // A call without arguments still has an object.
            call(1, "toolu_2", "get_time", "{}"),
        ]
    );
    let thinking: Vec<&pb::ThinkingDelta> =
        deltas.iter().filter_map(|d| d.thinking.as_ref()).collect();
    assert_eq!(thinking[0].text, "Let me think");
    assert_eq!(thinking[1].signature, "EqQBCgIYAhIM");
    assert!(thinking.iter().all(|t| t.origin == "anthropic"));
    assert_eq!(
        deltas.iter().map(|d| d.text.as_str()).collect::<String>(),
        "Okay"
    );
    assert_eq!(finish(&items), Some("tool_calls"));
    assert_eq!(items.last(), Some(&StreamItem::Done));
}

#[test]
fn responses_whole_replies_with_reasoning_and_calls() {
    let reply = parse_reply(
        Api::OpenaiResponses,
        json!({
            "id": "resp_67ccd2bed1ec8190", "object": "response", "status": "completed", "error": null,
            "incomplete_details": null, "model": "gpt-5",
            "output": [
                {"type": "reasoning", "id": "rs_6820f383d7c08191", "summary": [{"type": "summary_text", "text": "**Checking weather**"}], "encrypted_content": "gAAAAABoISQ24OyVRYbkYfukuT8="},
                {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
                {"type": "function_call", "id": "fc_12345xyz", "call_id": "call_12345xyz", "name": "get_weather", "arguments": "{\"location\":\"Paris, France\"}"},
            ],
            "usage": {"input_tokens": 291, "output_tokens": 23, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 314},
        })
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    let thinking = reply.deltas[0].thinking.as_ref().unwrap();
    assert_eq!(
        (
            thinking.text.as_str(),
            thinking.signature.as_str(),
            thinking.origin.as_str(),
            thinking.id.as_str()
        ),
        (
            "**Checking weather**",
            "gAAAAABoISQ24OyVRYbkYfukuT8=",
            "openai-responses",
            "rs_6820f383d7c08191"
        )
    );
    assert_eq!(reply.text(), "Let me look.");
    assert_eq!(
        calls(&reply.deltas),
        vec![call(
            0,
            "call_12345xyz",
            "get_weather",
            "{\"location\":\"Paris, France\"}"
        )]
    );
    assert_eq!(
        (
            reply.finish_reason.as_str(),
            reply.prompt_tokens,
            reply.completion_tokens
        ),
        ("tool_calls", Some(291), Some(23))
    );
    let cut = parse_reply(
        Api::OpenaiResponses,
        br#"{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[],"error":null}"#,
    )
    .unwrap();
    assert_eq!(cut.finish_reason, "length");
}

#[test]
fn responses_streams_follow_output_items() {
    let text = sse(&[
        json!({"type": "response.created", "sequence_number": 0, "response": {"status": "in_progress"}}),
        json!({"type": "response.output_item.added", "output_index": 0, "item": {"type": "reasoning", "id": "rs_1", "summary": []}}),
        json!({"type": "response.reasoning_summary_text.delta", "item_id": "rs_1", "output_index": 0, "summary_index": 0, "delta": "Thinking"}),
        json!({"type": "response.output_item.done", "output_index": 0, "item": {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Thinking"}], "encrypted_content": "gAAAA"}}),
        json!({"type": "response.output_item.added", "output_index": 1, "item": {"type": "message", "id": "msg_1", "role": "assistant", "content": []}}),
        json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 1, "content_index": 0, "delta": "Hi"}),
        json!({"type": "response.output_item.added", "output_index": 2, "item": {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather", "arguments": ""}}),
        json!({"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 2, "delta": "{\"city\":"}),
        json!({"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 2, "delta": "\"Paris\"}"}),
        json!({"type": "response.function_call_arguments.done", "item_id": "fc_1", "output_index": 2, "arguments": "{\"city\":\"Paris\"}"}),
        json!({"type": "response.completed", "response": {"status": "completed", "error": null, "usage": {"input_tokens": 37, "output_tokens": 11}}}),
    ]);
    let items = decode(Api::OpenaiResponses, &text);
    let deltas = deltas(&items);
    assert_eq!(
        calls(&deltas),
        vec![call(0, "call_1", "get_weather", "{\"city\":\"Paris\"}")]
    );
    let thinking: Vec<&pb::ThinkingDelta> =
        deltas.iter().filter_map(|d| d.thinking.as_ref()).collect();
    assert_eq!(
        (thinking[0].text.as_str(), thinking[0].id.as_str()),
        ("Thinking", "rs_1")
    );
    assert_eq!(
        (thinking[1].text.as_str(), thinking[1].signature.as_str()),
        ("", "gAAAA"),
        "the summary is not repeated"
    );
    assert_eq!(
        deltas.iter().map(|d| d.text.as_str()).collect::<String>(),
        "Hi"
    );
    assert_eq!(
        &items[items.len() - 3..],
        &[
            StreamItem::Finish("tool_calls".into()),
            StreamItem::Usage {
                prompt: Some(37),
                completion: Some(11)
            },
            StreamItem::Done,
        ]
    );
    let mut decoder = StreamDecoder::new(Api::OpenaiResponses);
    let failed = SseEvent {
        event: None,
        data: json!({"type": "response.failed", "response": {"status": "failed", "error": {"code": "server_error", "message": "x"}}}).to_string(),
    };
    assert_eq!(
        decoder.event(&failed),
        Err(WireError::Backend("server_error".into()))
    );
}
