//! The formats' tests: bodies built from canonical calls, replies and streams decoded.

use serde_json::{json, Value};
use tollgate_proto::v1 as pb;

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
