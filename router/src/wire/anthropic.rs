//! Anthropic Messages (`POST /v1/messages`).
//!
//! System messages become the `system` blocks; the rest alternate between `user` and
//! `assistant` (consecutive turns of one role are merged, and tool results, which this
//! format carries in the user turn after the `tool_use`, lead their turn). The assistant's
//! tool calls become `tool_use` blocks (their arguments the `input` object), results
//! `tool_result` blocks (text and images, `is_error`), thinking from an Anthropic backend
//! goes back as `thinking` / `redacted_thinking` (first in its turn, as the API requires)
//! and any other thinking is dropped; a part's cache mark becomes `cache_control`.

use serde_json::{json, Map, Value};
use tollgate_proto::v1 as pb;

use super::shared::{
    call_arguments, choice_mode, image_base64, normalise_finish, text_delta, thinking_delta,
    tool_delta, tool_schema, unsendable,
};
use super::types::{ChatRequest, Completion, Role, StreamItem, WireError};
use crate::config::Api;

const API: Api = Api::Anthropic;
/// The origin of thinking this format produces and takes back.
pub(super) const ORIGIN: &str = "anthropic";
/// The smallest thinking budget the API accepts.
const MIN_THINKING_BUDGET: u32 = 1024;

/// The request body for `request`.
pub(super) fn body(request: &ChatRequest) -> Result<Value, WireError> {
    let call = &request.call;
    let mut system: Vec<Value> = Vec::new();
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for (i, message) in call.messages.iter().enumerate() {
        let role = Role::parse(&message.role)
            .ok_or_else(|| unsendable(API, format!("message {i}: unknown role")))?;
        let blocks = blocks(message)?;
        let role = match role {
            Role::System => {
                system.extend(blocks);
                continue;
            }
            Role::User | Role::Tool => "user",
            Role::Assistant => "assistant",
        };
        if blocks.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some((last, existing)) if *last == role => existing.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    let messages: Vec<Value> = turns
        .into_iter()
        .map(|(role, mut blocks)| {
            // Tool results lead a user turn; thinking leads an assistant turn.
            let lead = if role == "user" {
                "tool_result"
            } else {
                "thinking"
            };
            blocks.sort_by_key(|b| {
                let kind = b["type"].as_str().unwrap_or_default();
                !(kind == lead || (lead == "thinking" && kind == "redacted_thinking"))
            });
            json!({"role": role, "content": blocks})
        })
        .collect();
    let mut body = Map::new();
    body.insert("model".into(), json!(request.model));
    body.insert("max_tokens".into(), json!(call.max_tokens));
    body.insert("messages".into(), Value::Array(messages));
    body.insert("stream".into(), json!(call.stream));
    if !system.is_empty() {
        body.insert("system".into(), Value::Array(system));
    }
    let thinking = thinking_budget(call);
    if let Some(budget) = thinking {
        body.insert(
            "thinking".into(),
            json!({"type": "enabled", "budget_tokens": budget}),
        );
    } else {
        // With thinking on, the API accepts neither a temperature nor a narrow top_p.
        if let Some(t) = call.temperature {
            body.insert("temperature".into(), json!(t));
        }
        if let Some(p) = call.top_p {
            body.insert("top_p".into(), json!(p));
        }
    }
    if !call.stop.is_empty() {
        body.insert("stop_sequences".into(), json!(call.stop));
    }
    if !call.tools.is_empty() {
        let tools = call
            .tools
            .iter()
            .map(|tool| {
                let mut t = json!({"name": tool.name, "input_schema": tool_schema(API, tool)?});
                if !tool.description.is_empty() {
                    t["description"] = json!(tool.description);
                }
                if tool.cache {
                    t["cache_control"] = json!({"type": "ephemeral"});
                }
                Ok(t)
            })
            .collect::<Result<Vec<Value>, WireError>>()?;
        body.insert("tools".into(), Value::Array(tools));
        let choice = call.tool_choice.as_ref();
        let parallel = choice.and_then(|c| c.parallel);
        let mode = choice_mode(choice);
        if mode.is_some() || parallel == Some(false) {
            use pb::tool_choice::Mode;
            let mut value = match mode {
                None | Some(Mode::Auto | Mode::Unspecified) => json!({"type": "auto"}),
                Some(Mode::None) => json!({"type": "none"}),
                Some(Mode::Required) => json!({"type": "any"}),
                Some(Mode::Named) => {
                    json!({"type": "tool", "name": choice.map(|c| c.name.as_str()).unwrap_or_default()})
                }
            };
            if parallel == Some(false) && mode != Some(Mode::None) {
                value["disable_parallel_tool_use"] = json!(true);
            }
            body.insert("tool_choice".into(), value);
        }
    }
    Ok(Value::Object(body))
}

/// The thinking budget to ask for: the call's budget, or for an effort alone a budget of
/// that size (minimal 1024, low 2048, medium 8192, high 16384 tokens); lowered below the
/// completion cap, as the API requires; `None` (no thinking) when that leaves less than the
/// API's minimum of 1024.
fn thinking_budget(call: &pb::CompleteRequest) -> Option<u32> {
    let reasoning = call.reasoning.as_ref()?;
    let budget = match (reasoning.budget_tokens, reasoning.effort.as_str()) {
        (0, "minimal") => 1024,
        (0, "low") => 2048,
        (0, "medium") => 8192,
        (0, "high") => 16384,
        (0, _) => return None,
        (budget, _) => budget,
    };
    let budget = budget.min(call.max_tokens.saturating_sub(1));
    (budget >= MIN_THINKING_BUDGET).then_some(budget)
}

/// A message's content blocks, in order (its `content` text first).
fn blocks(message: &pb::ChatMessage) -> Result<Vec<Value>, WireError> {
    use pb::content_part::Part;
    let mut blocks = Vec::new();
    if !message.content.is_empty() {
        blocks.push(json!({"type": "text", "text": message.content}));
    }
    for part in &message.parts {
        let block = match &part.part {
            // The API refuses empty text blocks.
            Some(Part::Text(text)) if text.is_empty() => continue,
            Some(Part::Text(text)) => json!({"type": "text", "text": text}),
            Some(Part::Image(image)) => image_block(image)?,
            Some(Part::ToolCall(call)) => json!({
                "type": "tool_use",
                "id": call.id,
                "name": call.name,
                "input": call_arguments(API, call)?,
            }),
            Some(Part::ToolResult(result)) => {
                let mut content = Vec::new();
                for inner in &result.content {
                    match &inner.part {
                        Some(Part::Text(text)) if !text.is_empty() => {
                            content.push(json!({"type": "text", "text": text}));
                        }
                        Some(Part::Image(image)) => content.push(image_block(image)?),
                        _ => {}
                    }
                }
                let mut block = json!({
                    "type": "tool_result",
                    "tool_use_id": result.call_id,
                    "content": content,
                });
                if result.is_error {
                    block["is_error"] = json!(true);
                }
                block
            }
            Some(Part::Thinking(thinking)) if thinking.origin == ORIGIN => {
                if thinking.redacted {
                    json!({"type": "redacted_thinking", "data": thinking.signature})
                } else {
                    json!({"type": "thinking", "thinking": thinking.text, "signature": thinking.signature})
                }
            }
            // Another format's thinking means nothing here; an empty part says nothing.
            Some(Part::Thinking(_)) | None => continue,
        };
        let mut block = block;
        if part.cache {
            block["cache_control"] = json!({"type": "ephemeral"});
        }
        blocks.push(block);
    }
    Ok(blocks)
}

fn image_block(image: &pb::ImagePart) -> Result<Value, WireError> {
    let (media_type, data) = image_base64(API, image)?;
    Ok(json!({
        "type": "image",
        "source": {"type": "base64", "media_type": media_type, "data": data},
    }))
}

/// Input tokens, cache reads and writes included.
fn prompt_tokens(usage: Option<&Value>) -> Option<u64> {
    let usage = usage?;
    let input = usage.get("input_tokens").and_then(Value::as_u64)?;
    let cached = ["cache_creation_input_tokens", "cache_read_input_tokens"]
        .iter()
        .filter_map(|k| usage.get(*k).and_then(Value::as_u64))
        .fold(0u64, u64::saturating_add);
    Some(input.saturating_add(cached))
}

/// Decodes a whole reply.
pub(super) fn parse(value: &Value) -> Result<Completion, WireError> {
    let blocks = value
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| super::shared::malformed(API, "no content"))?;
    let mut deltas = Vec::new();
    let mut calls = 0u32;
    for block in blocks {
        let str_at = |k: &str| block.get(k).and_then(Value::as_str).unwrap_or_default();
        match str_at("type") {
            "text" => deltas.push(text_delta(str_at("text"))),
            "tool_use" => {
                let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
                deltas.push(tool_delta(
                    calls,
                    str_at("id"),
                    str_at("name"),
                    &input.to_string(),
                ));
                calls += 1;
            }
            "thinking" => deltas.push(thinking_delta(pb::ThinkingDelta {
                text: str_at("thinking").to_owned(),
                signature: str_at("signature").to_owned(),
                origin: ORIGIN.into(),
                ..Default::default()
            })),
            "redacted_thinking" => deltas.push(thinking_delta(pb::ThinkingDelta {
                signature: str_at("data").to_owned(),
                origin: ORIGIN.into(),
                redacted: true,
                ..Default::default()
            })),
            // Server tools' blocks (web search and the like) are not the agent's.
            _ => {}
        }
    }
    Ok(Completion {
        deltas,
        finish_reason: value
            .get("stop_reason")
            .and_then(Value::as_str)
            .map(normalise_finish)
            .unwrap_or_default(),
        prompt_tokens: prompt_tokens(value.get("usage")),
        completion_tokens: value
            .pointer("/usage/output_tokens")
            .and_then(Value::as_u64),
    })
}

/// What a content block of a streamed reply is.
#[derive(Debug)]
enum Block {
    Text,
    /// A tool call: our index, and whether any of its arguments came.
    Tool {
        index: u32,
        arguments: bool,
    },
    Thinking,
    Other,
}

/// A streamed reply's state: what each content block (by the API's index) is.
#[derive(Debug, Default)]
pub(super) struct Stream {
    blocks: Vec<(u64, Block)>,
    calls: u32,
}

impl Stream {
    fn block(&mut self, index: u64) -> Option<&mut Block> {
        self.blocks
            .iter_mut()
            .find(|(i, _)| *i == index)
            .map(|(_, b)| b)
    }

    /// Decodes one event.
    pub(super) fn event(&mut self, value: &Value) -> Vec<StreamItem> {
        let mut items = Vec::new();
        let index = value.get("index").and_then(Value::as_u64).unwrap_or(0);
        match value.get("type").and_then(Value::as_str) {
            Some("message_start") => items.push(StreamItem::Usage {
                prompt: prompt_tokens(value.pointer("/message/usage")),
                completion: value
                    .pointer("/message/usage/output_tokens")
                    .and_then(Value::as_u64),
            }),
            Some("content_block_start") => {
                let block = value.get("content_block").unwrap_or(&Value::Null);
                let str_at = |k: &str| block.get(k).and_then(Value::as_str).unwrap_or_default();
                let kind = match str_at("type") {
                    "text" => {
                        let text = str_at("text");
                        if !text.is_empty() {
                            items.push(StreamItem::Delta(text_delta(text)));
                        }
                        Block::Text
                    }
                    "tool_use" => {
                        let call = self.calls;
                        self.calls += 1;
                        items.push(StreamItem::Delta(tool_delta(
                            call,
                            str_at("id"),
                            str_at("name"),
                            "",
                        )));
                        Block::Tool {
                            index: call,
                            arguments: false,
                        }
                    }
                    "thinking" => Block::Thinking,
                    "redacted_thinking" => {
                        items.push(StreamItem::Delta(thinking_delta(pb::ThinkingDelta {
                            signature: str_at("data").to_owned(),
                            origin: ORIGIN.into(),
                            redacted: true,
                            ..Default::default()
                        })));
                        Block::Other
                    }
                    _ => Block::Other,
                };
                self.blocks.push((index, kind));
            }
            Some("content_block_delta") => {
                let delta = value.get("delta").unwrap_or(&Value::Null);
                let str_at = |k: &str| delta.get(k).and_then(Value::as_str).unwrap_or_default();
                match (str_at("type"), self.block(index)) {
                    ("text_delta", _) => {
                        let text = str_at("text");
                        if !text.is_empty() {
                            items.push(StreamItem::Delta(text_delta(text)));
                        }
                    }
                    ("input_json_delta", Some(Block::Tool { index, arguments })) => {
                        let partial = str_at("partial_json");
                        if !partial.is_empty() {
                            *arguments = true;
                            items.push(StreamItem::Delta(tool_delta(*index, "", "", partial)));
                        }
                    }
                    ("thinking_delta", _) => {
                        items.push(StreamItem::Delta(thinking_delta(pb::ThinkingDelta {
                            text: str_at("thinking").to_owned(),
                            origin: ORIGIN.into(),
                            ..Default::default()
                        })));
                    }
                    ("signature_delta", _) => {
                        items.push(StreamItem::Delta(thinking_delta(pb::ThinkingDelta {
                            signature: str_at("signature").to_owned(),
                            origin: ORIGIN.into(),
                            ..Default::default()
                        })));
                    }
                    _ => {}
                }
            }
            Some("content_block_stop") => {
                // A call without arguments streams none: its arguments are still an object.
                if let Some(Block::Tool {
                    index,
                    arguments: false,
                }) = self.block(index)
                {
                    let index = *index;
                    items.push(StreamItem::Delta(tool_delta(index, "", "", "{}")));
                }
            }
            Some("message_delta") => {
                if let Some(reason) = value.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    items.push(StreamItem::Finish(normalise_finish(reason)));
                }
                if let Some(usage) = value.get("usage") {
                    items.push(StreamItem::Usage {
                        prompt: prompt_tokens(Some(usage)),
                        completion: usage.get("output_tokens").and_then(Value::as_u64),
                    });
                }
            }
            Some("message_stop") => items.push(StreamItem::Done),
            _ => {}
        }
        items
    }
}
