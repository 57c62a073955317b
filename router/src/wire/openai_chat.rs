//! OpenAI Chat Completions (`POST /v1/chat/completions`): OpenAI's cloud and every local
//! preset (llama.cpp, vLLM, Ollama, LM Studio).
//!
//! Messages: text stays a string when a message is only text, else an array of `text` and
//! `image_url` (a `data:` URL) parts; the assistant's tool calls become `tool_calls`; every
//! tool result becomes its own `tool` message (right after the assistant's calls, as the API
//! wants), and what else a message carried (text, images, the images of tool results)
//! follows in one `user` message. Thinking is dropped (this format takes none back), and so
//! are cache marks.

use serde_json::{json, Map, Value};
use tollgate_proto::v1 as pb;

use super::shared::{
    call_arguments, image_data_url, insert_openai_tool_choice, joined_text, normalise_finish,
    response_format, text_delta, tool_delta, tool_schema, unsendable,
};
use super::types::{ChatRequest, Completion, Role, StreamItem, WireError};
use crate::config::Api;

const API: Api = Api::Openai;

/// The request body for `request`.
pub fn body(request: &ChatRequest) -> Result<Value, WireError> {
    let call = &request.call;
    let mut body = Map::new();
    body.insert("model".into(), json!(request.model));
    body.insert("messages".into(), Value::Array(messages(call)?));
    body.insert("max_tokens".into(), json!(call.max_tokens));
    body.insert("stream".into(), json!(call.stream));
    if call.stream {
        // Usage arrives in a last chunk only when asked for.
        body.insert("stream_options".into(), json!({"include_usage": true}));
    }
    if let Some(t) = call.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(p) = call.top_p {
        body.insert("top_p".into(), json!(p));
    }
    if !call.stop.is_empty() {
        body.insert("stop".into(), json!(call.stop));
    }
    if !call.tools.is_empty() {
        let tools = call
            .tools
            .iter()
            .map(|tool| {
                let mut function = json!({
                    "name": tool.name,
                    "parameters": tool_schema(API, tool)?,
                });
                if !tool.description.is_empty() {
                    function["description"] = json!(tool.description);
                }
                if tool.strict {
                    function["strict"] = json!(true);
                }
                Ok(json!({"type": "function", "function": function}))
            })
            .collect::<Result<Vec<Value>, WireError>>()?;
        body.insert("tools".into(), Value::Array(tools));
        insert_openai_tool_choice(
            &mut body,
            call,
            |name| json!({"type": "function", "function": {"name": name}}),
        );
    }
    if let Some(format) = response_format(API, call)? {
        body.insert("response_format".into(), format);
    }
    if let Some(effort) = call
        .reasoning
        .as_ref()
        .map(|r| r.effort.as_str())
        .filter(|e| !e.is_empty())
    {
        body.insert("reasoning_effort".into(), json!(effort));
    }
    Ok(Value::Object(body))
}

/// The chat as this format's messages.
fn messages(call: &pb::CompleteRequest) -> Result<Vec<Value>, WireError> {
    use pb::content_part::Part;
    let mut out = Vec::new();
    for (i, message) in call.messages.iter().enumerate() {
        let role = Role::parse(&message.role)
            .ok_or_else(|| unsendable(API, format!("message {i}: unknown role")))?;
        match role {
            Role::System => {
                out.push(json!({"role": "system", "content": joined_text(&message.content, &message.parts)}));
            }
            Role::Assistant => {
                let text = joined_text(&message.content, &message.parts);
                let calls = message
                    .parts
                    .iter()
                    .filter_map(|p| match &p.part {
                        Some(Part::ToolCall(call)) => Some(call),
                        _ => None,
                    })
                    .map(|c| {
                        // Arguments go as the JSON text they are (checked to be an object).
                        call_arguments(API, c)?;
                        let arguments = if c.arguments_json.trim().is_empty() {
                            "{}".to_owned()
                        } else {
                            c.arguments_json.clone()
                        };
                        Ok(json!({
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": arguments},
                        }))
                    })
                    .collect::<Result<Vec<Value>, WireError>>()?;
                let mut m = json!({"role": "assistant"});
                m["content"] = if text.is_empty() && !calls.is_empty() {
                    Value::Null
                } else {
                    json!(text)
                };
                if !calls.is_empty() {
                    m["tool_calls"] = Value::Array(calls);
                }
                out.push(m);
            }
            Role::User | Role::Tool => {
                // Tool results first, each its own message; then the rest as one user turn.
                let mut rest: Vec<Value> = Vec::new();
                if !message.content.is_empty() {
                    rest.push(json!({"type": "text", "text": message.content}));
                }
                for part in &message.parts {
                    match &part.part {
                        Some(Part::ToolResult(result)) => {
                            let text = joined_text("", &result.content);
                            out.push(json!({
                                "role": "tool",
                                "tool_call_id": result.call_id,
                                "content": text,
                            }));
                            for inner in &result.content {
                                if let Some(Part::Image(image)) = &inner.part {
                                    rest.push(image_part(image)?);
                                }
                            }
                        }
                        Some(Part::Text(text)) if !text.is_empty() => {
                            rest.push(json!({"type": "text", "text": text}));
                        }
                        Some(Part::Image(image)) => rest.push(image_part(image)?),
                        // Calls and thinking are the assistant's; empty text says nothing.
                        _ => {}
                    }
                }
                let only_text = rest.iter().all(|p| p["type"] == "text");
                if rest.is_empty() {
                    // A user turn that said nothing still is a turn (a tool message has
                    // its results).
                    if role == Role::User && message.parts.is_empty() {
                        out.push(json!({"role": "user", "content": ""}));
                    }
                } else if only_text {
                    let text: Vec<&str> = rest.iter().filter_map(|p| p["text"].as_str()).collect();
                    out.push(json!({"role": "user", "content": text.join("\n\n")}));
                } else {
                    out.push(json!({"role": "user", "content": rest}));
                }
            }
        }
    }
    Ok(out)
}

fn image_part(image: &pb::ImagePart) -> Result<Value, WireError> {
    Ok(json!({"type": "image_url", "image_url": {"url": image_data_url(API, image)?}}))
}

/// Decodes a whole reply.
pub(super) fn parse(value: &Value) -> Result<Completion, WireError> {
    let choice = value
        .pointer("/choices/0")
        .ok_or_else(|| super::shared::malformed(API, "no choices"))?;
    let mut deltas = Vec::new();
    if let Some(text) = choice
        .pointer("/message/content")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
    {
        deltas.push(text_delta(text));
    }
    let calls = choice
        .pointer("/message/tool_calls")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    for (index, call) in calls.iter().enumerate() {
        let str_at = |p: &str| call.pointer(p).and_then(Value::as_str).unwrap_or_default();
        deltas.push(tool_delta(
            index as u32,
            str_at("/id"),
            str_at("/function/name"),
            str_at("/function/arguments"),
        ));
    }
    let mut finish_reason = choice
        .get("finish_reason")
        .and_then(Value::as_str)
        .map(normalise_finish)
        .unwrap_or_default();
    // Some servers (Ollama, older vLLM) say `stop` after tool calls.
    if !calls.is_empty() && finish_reason == "stop" {
        finish_reason = "tool_calls".into();
    }
    Ok(Completion {
        deltas,
        finish_reason,
        prompt_tokens: value
            .pointer("/usage/prompt_tokens")
            .and_then(Value::as_u64),
        completion_tokens: value
            .pointer("/usage/completion_tokens")
            .and_then(Value::as_u64),
    })
}

/// A streamed reply's state: which tool calls have begun.
#[derive(Debug, Default)]
pub(super) struct Stream {
    /// Upstream tool-call index of each call begun, in order (its position is ours).
    calls: Vec<u64>,
}

impl Stream {
    /// Decodes one chunk.
    pub(super) fn event(&mut self, value: &Value) -> Vec<StreamItem> {
        let mut items = Vec::new();
        if let Some(choice) = value.pointer("/choices/0") {
            if let Some(text) = choice.pointer("/delta/content").and_then(Value::as_str) {
                if !text.is_empty() {
                    items.push(StreamItem::Delta(text_delta(text)));
                }
            }
            let calls = choice
                .pointer("/delta/tool_calls")
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default();
            for call in calls {
                let str_at = |p: &str| call.pointer(p).and_then(Value::as_str).unwrap_or_default();
                let id = str_at("/id");
                // A server that gives no index sends each call whole: a new id is a new call.
                let upstream = call
                    .get("index")
                    .and_then(Value::as_u64)
                    .unwrap_or_else(|| {
                        if id.is_empty() {
                            self.calls.last().copied().unwrap_or(0)
                        } else {
                            self.calls.len() as u64
                        }
                    });
                let index = match self.calls.iter().position(|c| *c == upstream) {
                    Some(index) => index,
                    None => {
                        self.calls.push(upstream);
                        self.calls.len() - 1
                    }
                };
                items.push(StreamItem::Delta(tool_delta(
                    index as u32,
                    id,
                    str_at("/function/name"),
                    str_at("/function/arguments"),
                )));
            }
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                let mut reason = normalise_finish(reason);
                if !self.calls.is_empty() && reason == "stop" {
                    reason = "tool_calls".into();
                }
                items.push(StreamItem::Finish(reason));
            }
        }
        // Usage may come on its own last chunk or on the finish chunk.
        if let Some(usage) = value.get("usage").filter(|u| !u.is_null()) {
            items.push(StreamItem::Usage {
                prompt: usage.get("prompt_tokens").and_then(Value::as_u64),
                completion: usage.get("completion_tokens").and_then(Value::as_u64),
            });
        }
        items
    }
}
