//! The OpenAI Responses API (`POST /v1/responses`; routes with `api = "openai-responses"`).
//!
//! Sent with `store: false` (nothing of the run is kept by the backend) and
//! `include: ["reasoning.encrypted_content"]`, so reasoning comes back encrypted and can be
//! passed on in the next call. System messages become `instructions`; the chat becomes
//! `input` items: messages (`input_text`, `input_image`), the assistant's `function_call`s,
//! each tool result a `function_call_output`, and reasoning items only from thinking this
//! format produced (origin `openai-responses`). Item ids are never sent: without storage the
//! backend knows none. This format has no stop sequences (they are not sent) and no cache
//! marks.

use serde_json::{json, Map, Value};
use tollgate_proto::v1 as pb;

use super::shared::{
    call_arguments, image_data_url, insert_openai_tool_choice, joined_text, response_format,
    text_delta, thinking_delta, tool_delta, tool_schema, unsendable,
};
use super::types::{ChatRequest, Completion, Role, StreamItem, WireError};
use crate::config::Api;

const API: Api = Api::OpenaiResponses;
/// The origin of reasoning this format produces and takes back.
pub(super) const ORIGIN: &str = "openai-responses";

/// The request body for `request`.
pub(super) fn body(request: &ChatRequest) -> Result<Value, WireError> {
    let call = &request.call;
    let mut instructions: Vec<String> = Vec::new();
    let mut input: Vec<Value> = Vec::new();
    for (i, message) in call.messages.iter().enumerate() {
        let role = Role::parse(&message.role)
            .ok_or_else(|| unsendable(API, format!("message {i}: unknown role")))?;
        match role {
            Role::System => {
                let text = joined_text(&message.content, &message.parts);
                if !text.is_empty() {
                    instructions.push(text);
                }
            }
            Role::Assistant => assistant_items(message, &mut input)?,
            Role::User | Role::Tool => user_items(message, role, &mut input)?,
        }
    }
    let mut body = Map::new();
    body.insert("model".into(), json!(request.model));
    body.insert("input".into(), Value::Array(input));
    if !instructions.is_empty() {
        body.insert("instructions".into(), json!(instructions.join("\n\n")));
    }
    body.insert("max_output_tokens".into(), json!(call.max_tokens));
    body.insert("stream".into(), json!(call.stream));
    body.insert("store".into(), json!(false));
    body.insert("include".into(), json!(["reasoning.encrypted_content"]));
    if let Some(t) = call.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(p) = call.top_p {
        body.insert("top_p".into(), json!(p));
    }
    if !call.tools.is_empty() {
        let tools = call
            .tools
            .iter()
            .map(|tool| {
                let mut t = json!({
                    "type": "function",
                    "name": tool.name,
                    "parameters": tool_schema(API, tool)?,
                    "strict": tool.strict,
                });
                if !tool.description.is_empty() {
                    t["description"] = json!(tool.description);
                }
                Ok(t)
            })
            .collect::<Result<Vec<Value>, WireError>>()?;
        body.insert("tools".into(), Value::Array(tools));
        insert_openai_tool_choice(
            &mut body,
            call,
            |name| json!({"type": "function", "name": name}),
        );
    }
    if let Some(format) = response_format(API, call)? {
        body.insert("text".into(), json!({"format": text_format(&format)}));
    }
    if let Some(reasoning) = &call.reasoning {
        let mut r = Map::new();
        if !reasoning.effort.is_empty() {
            r.insert("effort".into(), json!(reasoning.effort));
        }
        if reasoning.summary {
            r.insert("summary".into(), json!("auto"));
        }
        if !r.is_empty() {
            body.insert("reasoning".into(), Value::Object(r));
        }
    }
    Ok(Value::Object(body))
}

/// Chat Completions' `response_format` as the Responses API's `text.format`: a JSON schema's
/// `name`, `schema` and `strict` move up a level.
fn text_format(format: &Value) -> Value {
    match format.get("json_schema") {
        Some(schema) if format["type"] == "json_schema" => {
            let mut out = json!({"type": "json_schema"});
            for key in ["name", "schema", "strict", "description"] {
                if let Some(v) = schema.get(key) {
                    out[key] = v.clone();
                }
            }
            out
        }
        _ => format.clone(),
    }
}

/// An assistant message's items: reasoning, text, function calls, in the message's order.
fn assistant_items(message: &pb::ChatMessage, input: &mut Vec<Value>) -> Result<(), WireError> {
    use pb::content_part::Part;
    let mut text = message.content.clone();
    let flush = |text: &mut String, input: &mut Vec<Value>| {
        if !text.is_empty() {
            input.push(json!({"role": "assistant", "content": std::mem::take(text)}));
        }
    };
    for part in &message.parts {
        match &part.part {
            Some(Part::Text(t)) if !t.is_empty() => {
                if !text.is_empty() {
                    text.push_str("\n\n");
                }
                text.push_str(t);
            }
            Some(Part::ToolCall(call)) => {
                flush(&mut text, input);
                call_arguments(API, call)?;
                let arguments = if call.arguments_json.trim().is_empty() {
                    "{}".to_owned()
                } else {
                    call.arguments_json.clone()
                };
                input.push(json!({
                    "type": "function_call",
                    "call_id": call.id,
                    "name": call.name,
                    "arguments": arguments,
                }));
            }
            Some(Part::Thinking(thinking)) if thinking.origin == ORIGIN => {
                flush(&mut text, input);
                let summary: Vec<Value> = if thinking.text.is_empty() {
                    Vec::new()
                } else {
                    vec![json!({"type": "summary_text", "text": thinking.text})]
                };
                let mut item = json!({"type": "reasoning", "summary": summary});
                if !thinking.signature.is_empty() {
                    item["encrypted_content"] = json!(thinking.signature);
                }
                input.push(item);
            }
            _ => {}
        }
    }
    flush(&mut text, input);
    Ok(())
}

/// A user or tool message's items: each tool result a `function_call_output`, then the rest
/// as one user message.
fn user_items(
    message: &pb::ChatMessage,
    role: Role,
    input: &mut Vec<Value>,
) -> Result<(), WireError> {
    use pb::content_part::Part;
    let mut rest: Vec<Value> = Vec::new();
    if !message.content.is_empty() {
        rest.push(json!({"type": "input_text", "text": message.content}));
    }
    for part in &message.parts {
        match &part.part {
            Some(Part::ToolResult(result)) => {
                let has_image = result
                    .content
                    .iter()
                    .any(|p| matches!(p.part, Some(Part::Image(_))));
                let output = if has_image {
                    let mut items = Vec::new();
                    for inner in &result.content {
                        match &inner.part {
                            Some(Part::Text(t)) if !t.is_empty() => {
                                items.push(json!({"type": "input_text", "text": t}));
                            }
                            Some(Part::Image(image)) => items.push(json!({
                                "type": "input_image",
                                "image_url": image_data_url(API, image)?,
                            })),
                            _ => {}
                        }
                    }
                    Value::Array(items)
                } else {
                    json!(joined_text("", &result.content))
                };
                input.push(json!({
                    "type": "function_call_output",
                    "call_id": result.call_id,
                    "output": output,
                }));
            }
            Some(Part::Text(t)) if !t.is_empty() => {
                rest.push(json!({"type": "input_text", "text": t}));
            }
            Some(Part::Image(image)) => rest.push(json!({
                "type": "input_image",
                "image_url": image_data_url(API, image)?,
            })),
            _ => {}
        }
    }
    if !rest.is_empty() {
        input.push(json!({"role": "user", "content": rest}));
    } else if role == Role::User && message.parts.is_empty() {
        // A user turn that said nothing still is a turn (the API refuses an empty list).
        input.push(json!({"role": "user", "content": ""}));
    }
    Ok(())
}

/// A reasoning item as a thinking delta: its summary's text, its encrypted content.
fn reasoning_delta(item: &Value) -> pb::CompleteDelta {
    let text: Vec<&str> = item
        .get("summary")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|s| s.get("text").and_then(Value::as_str))
        .collect();
    thinking_delta(pb::ThinkingDelta {
        text: text.join("\n\n"),
        signature: item
            .get("encrypted_content")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        origin: ORIGIN.into(),
        redacted: false,
        id: item
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
    })
}

/// The finish reason of a response: `length` or `content_filter` when it is incomplete for
/// that, `tool_calls` when it ends in calls, else `stop` (or its status).
fn finish(response: &Value, calls: bool) -> String {
    match response.get("status").and_then(Value::as_str) {
        Some("incomplete") => {
            match response
                .pointer("/incomplete_details/reason")
                .and_then(Value::as_str)
            {
                Some("max_output_tokens") => "length".into(),
                Some("content_filter") => "content_filter".into(),
                Some(other) => other.into(),
                None => "incomplete".into(),
            }
        }
        Some("completed") | None if calls => "tool_calls".into(),
        Some("completed") | None => "stop".into(),
        Some(other) => other.into(),
    }
}

fn usage(response: &Value) -> (Option<u64>, Option<u64>) {
    (
        response
            .pointer("/usage/input_tokens")
            .and_then(Value::as_u64),
        response
            .pointer("/usage/output_tokens")
            .and_then(Value::as_u64),
    )
}

/// Decodes a whole reply.
pub(super) fn parse(value: &Value) -> Result<Completion, WireError> {
    let output = value
        .get("output")
        .and_then(Value::as_array)
        .ok_or_else(|| super::shared::malformed(API, "no output"))?;
    let mut deltas = Vec::new();
    let mut calls = 0u32;
    for item in output {
        let str_at = |k: &str| item.get(k).and_then(Value::as_str).unwrap_or_default();
        match str_at("type") {
            "message" => {
                for content in item
                    .get("content")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    if content["type"] == "output_text" {
                        if let Some(text) = content.get("text").and_then(Value::as_str) {
                            deltas.push(text_delta(text));
                        }
                    }
                }
            }
            "function_call" => {
                deltas.push(tool_delta(
                    calls,
                    str_at("call_id"),
                    str_at("name"),
                    str_at("arguments"),
                ));
                calls += 1;
            }
            "reasoning" => deltas.push(reasoning_delta(item)),
            _ => {}
        }
    }
    let (prompt_tokens, completion_tokens) = usage(value);
    Ok(Completion {
        deltas,
        finish_reason: finish(value, calls > 0),
        prompt_tokens,
        completion_tokens,
    })
}

/// A streamed reply's state: the tool call begun at each output index.
#[derive(Debug, Default)]
pub(super) struct Stream {
    /// (output index, our call index) of each function call begun.
    calls: Vec<(u64, u32)>,
}

impl Stream {
    fn call_at(&self, output_index: u64) -> Option<u32> {
        self.calls
            .iter()
            .find(|(o, _)| *o == output_index)
            .map(|(_, c)| *c)
    }

    /// Decodes one event.
    pub(super) fn event(&mut self, value: &Value) -> Result<Vec<StreamItem>, WireError> {
        let mut items = Vec::new();
        let output_index = value
            .get("output_index")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let str_at = |k: &str| value.get(k).and_then(Value::as_str).unwrap_or_default();
        match str_at("type") {
            "response.output_text.delta" => {
                let delta = str_at("delta");
                if !delta.is_empty() {
                    items.push(StreamItem::Delta(text_delta(delta)));
                }
            }
            "response.output_item.added"
                if value.pointer("/item/type").and_then(Value::as_str) == Some("function_call") =>
            {
                let item = &value["item"];
                let index = self.calls.len() as u32;
                self.calls.push((output_index, index));
                let field = |k: &str| item.get(k).and_then(Value::as_str).unwrap_or_default();
                items.push(StreamItem::Delta(tool_delta(
                    index,
                    field("call_id"),
                    field("name"),
                    field("arguments"),
                )));
            }
            "response.function_call_arguments.delta" => {
                if let Some(index) = self.call_at(output_index) {
                    items.push(StreamItem::Delta(tool_delta(
                        index,
                        "",
                        "",
                        str_at("delta"),
                    )));
                }
            }
            "response.reasoning_summary_text.delta" => {
                items.push(StreamItem::Delta(thinking_delta(pb::ThinkingDelta {
                    text: str_at("delta").to_owned(),
                    origin: ORIGIN.into(),
                    id: str_at("item_id").to_owned(),
                    ..Default::default()
                })));
            }
            "response.output_item.done"
                if value.pointer("/item/type").and_then(Value::as_str) == Some("reasoning") =>
            {
                // The summary text already streamed; the encrypted content comes whole here.
                let mut delta = reasoning_delta(&value["item"]);
                if let Some(thinking) = delta.thinking.as_mut() {
                    thinking.text.clear();
                }
                items.push(StreamItem::Delta(delta));
            }
            "response.completed" | "response.incomplete" => {
                let response = &value["response"];
                items.push(StreamItem::Finish(finish(response, !self.calls.is_empty())));
                let (prompt, completion) = usage(response);
                items.push(StreamItem::Usage { prompt, completion });
                items.push(StreamItem::Done);
            }
            "response.failed" => {
                let kind = value
                    .pointer("/response/error/code")
                    .and_then(Value::as_str)
                    .unwrap_or("response.failed");
                return Err(WireError::Backend(kind.to_owned()));
            }
            "error" => {
                let kind = value.get("code").and_then(Value::as_str).unwrap_or("error");
                return Err(WireError::Backend(kind.to_owned()));
            }
            _ => {}
        }
        Ok(items)
    }
}
