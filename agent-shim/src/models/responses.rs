//! The OpenAI Responses API (`POST /v1/responses`): input items to canonical calls, and the
//! response object (whole, or built up by the Responses stream's events) from the gateway's
//! events. Nothing is stored: `store` is accepted and ignored, `previous_response_id` is
//! refused (the agent sends the whole input, as Codex does with `store: false`).

use serde_json::{json, Value};
use tollgate_proto::v1 as pb;

use super::common::{
    call_id, cap_of, field, finish, float_of, image_from_url, input_schema, message, served_model,
    str_of, string_of, text_part, tool_call_part, tool_choice, tool_result_part, usage, Block,
    Call, Invalid, Reply,
};
use super::reply::{Context, Encoder};

/// Where a reasoning item came from, as ThinkingPart.origin names it.
const ORIGIN: &str = "openai-responses";

/// Input items of hosted tools' calls: they ran outside this sandbox's gateway (the tools are
/// dropped from requests), so a history that still holds them is carried without them.
const HOSTED_ITEMS: &[&str] = &[
    "web_search_call",
    "file_search_call",
    "code_interpreter_call",
    "image_generation_call",
    "computer_call",
    "computer_call_output",
    "mcp_call",
    "mcp_list_tools",
    "mcp_approval_request",
    "mcp_approval_response",
];

/// The gateway call a Responses request asks for.
pub(crate) fn parse(body: &Value) -> Result<Call, Invalid> {
    if field(body, "previous_response_id").is_some() || field(body, "conversation").is_some() {
        return Err(Invalid::new(
            "previous_response_id is not supported: this endpoint keeps no responses, send the \
             whole input (store: false)",
        ));
    }
    let mut messages = Vec::new();
    if let Some(instructions) = str_of(body, "instructions").filter(|i| !i.is_empty()) {
        messages.push(message("system", vec![text_part(instructions, false)]));
    }
    match field(body, "input") {
        None => {
            return Err(Invalid::new(
                "input is missing: send a string or a list of items",
            ))
        }
        Some(Value::String(text)) => {
            messages.push(message("user", vec![text_part(text.clone(), false)]))
        }
        Some(Value::Array(items)) => items_to_messages(items, &mut messages)?,
        Some(_) => return Err(Invalid::new("input must be a string or a list of items")),
    }
    let (mut tools, mut dropped, mut custom_tools) = (Vec::new(), Vec::new(), Vec::new());
    for tool in field(body, "tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = string_of(tool, "name");
        match str_of(tool, "type") {
            Some("function") if !name.is_empty() => tools.push(pb::ToolDefinition {
                name,
                description: string_of(tool, "description"),
                parameters_json: field(tool, "parameters")
                    .map(Value::to_string)
                    .unwrap_or_default(),
                strict: tool.get("strict").and_then(Value::as_bool).unwrap_or(false),
                cache: false,
            }),
            Some("custom") if !name.is_empty() => {
                // A free-form tool (Codex's apply_patch): a function of one string, `input`,
                // whose grammar, if any, the description carries for the model.
                let mut description = string_of(tool, "description");
                if let Some(format) =
                    field(tool, "format").filter(|f| str_of(f, "type") == Some("grammar"))
                {
                    description.push_str(&format!(
                        "\n\nThe input must follow this {} grammar:\n{}",
                        str_of(format, "syntax").unwrap_or("lark"),
                        str_of(format, "definition").unwrap_or_default()
                    ));
                }
                custom_tools.push(name.clone());
                tools.push(pb::ToolDefinition {
                    name,
                    description,
                    parameters_json: input_schema(),
                    strict: false,
                    cache: false,
                });
            }
            other if name.is_empty() => dropped.push(other.unwrap_or("unknown").to_owned()),
            _ => dropped.push(name),
        }
    }
    let mode = match field(body, "tool_choice") {
        None => None,
        Some(Value::String(mode)) => Some((mode_named(mode)?, String::new())),
        Some(choice) => match str_of(choice, "type") {
            Some("function" | "custom") => {
                Some((pb::tool_choice::Mode::Named, string_of(choice, "name")))
            }
            Some("allowed_tools") => Some((
                mode_named(str_of(choice, "mode").unwrap_or("auto"))?,
                String::new(),
            )),
            // A hosted tool's choice: that tool is dropped, the model decides.
            _ => Some((pb::tool_choice::Mode::Auto, String::new())),
        },
    };
    let parallel = body.get("parallel_tool_calls").and_then(Value::as_bool);
    let reasoning = field(body, "reasoning").map(|r| pb::ReasoningConfig {
        effort: string_of(r, "effort"),
        summary: str_of(r, "summary").is_some_and(|s| s != "none"),
        ..Default::default()
    });
    let response_format = match field(body, "text").and_then(|t| field(t, "format")) {
        Some(f) if str_of(f, "type") == Some("json_schema") => {
            let mut schema = json!({"name": string_of(f, "name"), "schema": f.get("schema").cloned().unwrap_or(json!({}))});
            for key in ["strict", "description"] {
                if let Some(v) = field(f, key) {
                    schema[key] = v.clone();
                }
            }
            json!({"type": "json_schema", "json_schema": schema}).to_string()
        }
        Some(f) if str_of(f, "type") == Some("json_object") => {
            json!({"type": "json_object"}).to_string()
        }
        _ => String::new(),
    };
    Ok(Call {
        request: pb::CompleteRequest {
            route: string_of(body, "model"),
            messages,
            max_tokens: cap_of(body, &["max_output_tokens"]),
            stream: body.get("stream").and_then(Value::as_bool).unwrap_or(false),
            local_only: false,
            temperature: float_of(body, "temperature"),
            stop: Vec::new(),
            tool_choice: tool_choice(mode, parallel, &tools),
            tools,
            response_format_json: response_format,
            reasoning,
            top_p: float_of(body, "top_p"),
        },
        dropped,
        include_usage: false,
        custom_tools,
    })
}

/// `auto`, `none` or `required`.
fn mode_named(mode: &str) -> Result<pb::tool_choice::Mode, Invalid> {
    match mode {
        "auto" => Ok(pb::tool_choice::Mode::Auto),
        "none" => Ok(pb::tool_choice::Mode::None),
        "required" => Ok(pb::tool_choice::Mode::Required),
        other => Err(Invalid::new(format!(
            "tool_choice {other:?} is not one of auto, none, required or a tool"
        ))),
    }
}

/// Input items as messages: the model's own items in a row (reasoning, its messages, its
/// tool calls) become one assistant message, as one turn of a chat; each tool output is a
/// tool message.
fn items_to_messages(items: &[Value], messages: &mut Vec<pb::ChatMessage>) -> Result<(), Invalid> {
    let mut assistant: Vec<pb::ContentPart> = Vec::new();
    let flush = |assistant: &mut Vec<pb::ContentPart>, messages: &mut Vec<pb::ChatMessage>| {
        if !assistant.is_empty() {
            messages.push(message("assistant", std::mem::take(assistant)));
        }
    };
    for item in items {
        let kind = str_of(item, "type").unwrap_or(if item.get("role").is_some() {
            "message"
        } else {
            ""
        });
        match kind {
            "message" => {
                let role = str_of(item, "role")
                    .ok_or_else(|| Invalid::new("a message item has no role"))?;
                let parts = content(item.get("content").unwrap_or(&Value::Null))?;
                if role == "assistant" {
                    assistant.extend(parts);
                } else {
                    flush(&mut assistant, messages);
                    messages.push(message(role, parts));
                }
            }
            "reasoning" => {
                let summary: Vec<&str> = item
                    .get("summary")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|s| str_of(s, "text"))
                    .collect();
                let (origin, redacted, id) =
                    reasoning_origin(str_of(item, "id").unwrap_or_default());
                assistant.push(pb::ContentPart {
                    part: Some(pb::content_part::Part::Thinking(pb::ThinkingPart {
                        text: summary.join("\n\n"),
                        signature: string_of(item, "encrypted_content"),
                        origin: origin.into(),
                        redacted,
                        id,
                    })),
                    cache: false,
                });
            }
            "function_call" => assistant.push(tool_call_part(
                &call_id_of(item)?,
                &string_of(item, "name"),
                str_of(item, "arguments").unwrap_or("{}").to_owned(),
            )),
            "custom_tool_call" => assistant.push(tool_call_part(
                &call_id_of(item)?,
                &string_of(item, "name"),
                json!({"input": string_of(item, "input")}).to_string(),
            )),
            "function_call_output" | "custom_tool_call_output" => {
                flush(&mut assistant, messages);
                let output = match field(item, "output") {
                    None => Vec::new(),
                    Some(Value::String(s)) => vec![text_part(s.clone(), false)],
                    Some(list @ Value::Array(_)) => content(list)?,
                    Some(_) => {
                        return Err(Invalid::new(
                            "a tool output must be a string or a list of content",
                        ))
                    }
                };
                messages.push(pb::ChatMessage {
                    role: "tool".into(),
                    content: String::new(),
                    parts: vec![tool_result_part(&call_id_of(item)?, output, false, false)],
                });
            }
            "item_reference" => {
                return Err(Invalid::new(
                    "item_reference is not supported: this endpoint keeps no responses, send the \
                     items themselves",
                ))
            }
            hosted if HOSTED_ITEMS.contains(&hosted) => {
                tracing::debug!(item = hosted, "a hosted tool's item left out of the input");
            }
            other => {
                return Err(Invalid::new(format!(
                    "input items of type {} are not supported (message, reasoning, \
                     function_call, function_call_output, custom_tool_call and \
                     custom_tool_call_output are)",
                    if other.is_empty() { "unknown" } else { other }
                )))
            }
        }
    }
    flush(&mut assistant, messages);
    Ok(())
}

/// An item's `call_id`.
fn call_id_of(item: &Value) -> Result<String, Invalid> {
    str_of(item, "call_id")
        .map(str::to_owned)
        .ok_or_else(|| Invalid::new("a tool call or output item has no call_id"))
}

/// A message's content: a string, or input/output text and image parts.
fn content(content: &Value) -> Result<Vec<pb::ContentPart>, Invalid> {
    match content {
        Value::Null => Ok(Vec::new()),
        Value::String(text) if text.is_empty() => Ok(Vec::new()),
        Value::String(text) => Ok(vec![text_part(text.clone(), false)]),
        Value::Array(parts) => parts
            .iter()
            .map(|part| match str_of(part, "type") {
                Some("input_text" | "output_text" | "text" | "summary_text") => Ok(text_part(string_of(part, "text"), false)),
                Some("refusal") => Ok(text_part(string_of(part, "refusal"), false)),
                Some("input_image") => {
                    let url = str_of(part, "image_url").ok_or_else(|| {
                        Invalid::new("an input_image needs an image_url (file ids are not supported: this endpoint keeps no files)")
                    })?;
                    Ok(pb::ContentPart { part: Some(pb::content_part::Part::Image(image_from_url(url)?)), cache: false })
                }
                other => Err(Invalid::new(format!(
                    "content of type {} is not supported (input_text, output_text and input_image are)",
                    other.unwrap_or("unknown")
                ))),
            })
            .collect(),
        _ => Err(Invalid::new("content must be a string or a list of content parts")),
    }
}

/// The response's id.
fn response_id(context: &Context) -> String {
    format!("resp_{}", context.started.call_id.replace('-', ""))
}

/// An output item's id: `prefix`, the call and the item's place in the output.
fn item_id(context: &Context, prefix: &str, index: usize) -> String {
    format!(
        "{prefix}_{}{index}",
        context.started.call_id.replace('-', "")
    )
}

/// Reasoning item ids that say the reasoning came from an Anthropic backend (its signature in
/// `encrypted_content`), so that when the agent sends the item back it goes back to Anthropic
/// as a thinking block — which Anthropic requires before tool use while thinking is on.
const ANTHROPIC_IDS: &str = "rs_anthropic_";
/// The same for Anthropic's redacted thinking.
const ANTHROPIC_REDACTED_IDS: &str = "rs_anthropic-redacted_";

/// A reasoning item's id: the Responses backend's own, or one made for this reply that
/// carries where the reasoning came from.
fn reasoning_id(
    context: &Context,
    origin: &str,
    redacted: bool,
    given: &str,
    index: usize,
) -> String {
    match origin {
        "anthropic" if redacted => {
            item_id(context, ANTHROPIC_REDACTED_IDS.trim_end_matches('_'), index)
        }
        "anthropic" => item_id(context, ANTHROPIC_IDS.trim_end_matches('_'), index),
        _ if !given.is_empty() => given.to_owned(),
        _ => item_id(context, "rs", index),
    }
}

/// Where a reasoning item the agent sent back came from (ThinkingPart's origin, redacted, id)
/// by its id (see `reasoning_id`).
fn reasoning_origin(id: &str) -> (&'static str, bool, String) {
    if id.starts_with(ANTHROPIC_REDACTED_IDS) {
        ("anthropic", true, String::new())
    } else if id.starts_with(ANTHROPIC_IDS) {
        ("anthropic", false, String::new())
    } else {
        (ORIGIN, false, id.to_owned())
    }
}

/// `status` and `incomplete_details` for how the call ended.
fn status(done: &pb::CompleteDone) -> (&'static str, Value) {
    match finish(done) {
        "length" => ("incomplete", json!({"reason": "max_output_tokens"})),
        "content_filter" => ("incomplete", json!({"reason": "content_filter"})),
        _ => ("completed", Value::Null),
    }
}

/// The response object: `status`, its output items and usage (null while in progress).
fn response(
    context: &Context,
    status: &str,
    output: &[Value],
    usage_of: Option<&pb::CompleteDone>,
) -> Value {
    let usage = usage_of.map_or(Value::Null, |done| {
        let (input, output) = usage(done);
        json!({
            "input_tokens": input,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input + output,
        })
    });
    let incomplete = usage_of.map_or(Value::Null, |done| self::status(done).1);
    json!({
        "id": response_id(context),
        "object": "response",
        "created_at": context.created,
        "status": status,
        "error": null,
        "incomplete_details": incomplete,
        "instructions": null,
        "max_output_tokens": null,
        "model": served_model(&context.started),
        "output": output,
        "parallel_tool_calls": true,
        "previous_response_id": null,
        "reasoning": {"effort": null, "summary": null},
        "store": false,
        "temperature": null,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": null,
        "truncation": "disabled",
        "usage": usage,
        "metadata": {},
    })
}

/// A reasoning item.
fn reasoning_item(id: &str, text: &str, encrypted: &str) -> Value {
    let summary = if text.is_empty() {
        json!([])
    } else {
        json!([{"type": "summary_text", "text": text}])
    };
    let mut item = json!({"id": id, "type": "reasoning", "summary": summary});
    if !encrypted.is_empty() {
        item["encrypted_content"] = json!(encrypted);
    }
    item
}

/// A finished assistant message item.
fn message_item(id: &str, text: &str) -> Value {
    json!({"id": id, "type": "message", "status": "completed", "role": "assistant", "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]})
}

/// A tool call item: a `custom_tool_call` for a free-form tool (its `input` unwrapped from
/// the function's arguments), else a `function_call`.
fn call_item(
    context: &Context,
    id: &str,
    call_id: &str,
    name: &str,
    arguments: &str,
    status: &str,
) -> Value {
    if context.custom_tools.iter().any(|t| t == name) {
        let input = serde_json::from_str::<Value>(arguments)
            .ok()
            .and_then(|v| v.get("input").and_then(Value::as_str).map(str::to_owned))
            .unwrap_or_else(|| arguments.to_owned());
        json!({"id": id, "type": "custom_tool_call", "status": status, "call_id": call_id, "name": name, "input": input})
    } else {
        json!({"id": id, "type": "function_call", "status": status, "call_id": call_id, "name": name, "arguments": arguments})
    }
}

/// The whole response to a call that did not stream.
pub(crate) fn reply(context: &Context, reply: &Reply) -> Value {
    let output: Vec<Value> = reply
        .blocks
        .iter()
        .enumerate()
        .map(|(n, b)| match b {
            Block::Text(text) => message_item(&item_id(context, "msg", n), text),
            Block::Thinking(t) => {
                let id = reasoning_id(context, &t.origin, t.redacted, &t.id, n);
                reasoning_item(&id, &t.text, &t.signature)
            }
            Block::Tool(index, call) => call_item(
                context,
                &item_id(context, "fc", n),
                &call_id(&call.id, &context.started.call_id, *index),
                &call.name,
                &call.arguments_json,
                "completed",
            ),
        })
        .collect();
    response(context, status(&reply.done).0, &output, Some(&reply.done))
}

/// The output item open in a stream.
#[derive(Debug)]
enum Open {
    Message {
        id: String,
        text: String,
    },
    Reasoning {
        id: String,
        text: String,
        encrypted: String,
        summary_open: bool,
    },
    Call {
        index: u32,
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

/// A streamed reply as the Responses stream's events, each with its `sequence_number`.
pub(crate) struct ResponsesStream {
    context: Context,
    sequence: u64,
    /// Finished output items.
    output: Vec<Value>,
    open: Option<Open>,
}

impl ResponsesStream {
    /// The stream of `context`'s call.
    pub(crate) fn new(context: Context) -> Self {
        Self {
            context,
            sequence: 0,
            output: Vec::new(),
            open: None,
        }
    }

    /// One event: `data` with its type and sequence number.
    fn event(&mut self, out: &mut String, kind: &str, mut data: Value) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        out.push_str(&format!("event: {kind}\ndata: {data}\n\n"));
    }

    fn index(&self) -> usize {
        self.output.len()
    }

    /// Finishes the open item, if any.
    fn close(&mut self, out: &mut String) {
        let index = self.index();
        let item = match self.open.take() {
            None => return,
            Some(Open::Message { id, text }) => {
                self.event(out, "response.output_text.done", json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}));
                self.event(out, "response.content_part.done", json!({"item_id": id, "output_index": index, "content_index": 0, "part": {"type": "output_text", "text": text, "annotations": [], "logprobs": []}}));
                message_item(&id, &text)
            }
            Some(Open::Reasoning {
                id,
                text,
                encrypted,
                summary_open,
            }) => {
                if summary_open {
                    self.event(out, "response.reasoning_summary_text.done", json!({"item_id": id, "output_index": index, "summary_index": 0, "text": text}));
                    self.event(out, "response.reasoning_summary_part.done", json!({"item_id": id, "output_index": index, "summary_index": 0, "part": {"type": "summary_text", "text": text}}));
                }
                reasoning_item(&id, &text, &encrypted)
            }
            Some(Open::Call {
                id,
                call_id,
                name,
                arguments,
                ..
            }) => {
                let item = call_item(&self.context, &id, &call_id, &name, &arguments, "completed");
                if item["type"] == "function_call" {
                    self.event(
                        out,
                        "response.function_call_arguments.done",
                        json!({"item_id": id, "output_index": index, "arguments": arguments}),
                    );
                } else {
                    // The input is inside the function's JSON arguments, readable only
                    // once they are whole: one delta with all of it, then done.
                    let input = item["input"].clone();
                    self.event(
                        out,
                        "response.custom_tool_call_input.delta",
                        json!({"item_id": id, "output_index": index, "delta": input}),
                    );
                    self.event(
                        out,
                        "response.custom_tool_call_input.done",
                        json!({"item_id": id, "output_index": index, "input": input}),
                    );
                }
                item
            }
        };
        self.event(
            out,
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        self.output.push(item);
    }

    /// Finishes the open item and starts `open`, announcing `item`.
    fn begin(&mut self, out: &mut String, open: Open, item: Value) {
        self.close(out);
        let index = self.index();
        self.event(
            out,
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        );
        self.open = Some(open);
    }
}

impl Encoder for ResponsesStream {
    fn start(&mut self) -> String {
        let mut out = String::new();
        let response = response(&self.context, "in_progress", &[], None);
        self.event(&mut out, "response.created", json!({"response": response}));
        self.event(
            &mut out,
            "response.in_progress",
            json!({"response": response}),
        );
        out
    }

    fn delta(&mut self, delta: &pb::CompleteDelta) -> String {
        let mut out = String::new();
        if let Some(t) = delta
            .thinking
            .as_ref()
            .filter(|t| !super::common::thinking_empty(t))
        {
            let continues = matches!(&self.open, Some(Open::Reasoning { id, .. }) if t.id.is_empty() || *id == t.id);
            if !continues || t.redacted {
                let id = reasoning_id(&self.context, &t.origin, t.redacted, &t.id, self.index());
                let item = json!({"id": id, "type": "reasoning", "summary": []});
                self.begin(
                    &mut out,
                    Open::Reasoning {
                        id,
                        text: String::new(),
                        encrypted: String::new(),
                        summary_open: false,
                    },
                    item,
                );
            }
            let index = self.index();
            let mut summary_added = None;
            if let Some(Open::Reasoning {
                id,
                text,
                encrypted,
                summary_open,
            }) = &mut self.open
            {
                encrypted.push_str(&t.signature);
                if !t.text.is_empty() {
                    if !*summary_open {
                        *summary_open = true;
                        summary_added = Some(id.clone());
                    }
                    text.push_str(&t.text);
                }
                let id = id.clone();
                if let Some(added) = summary_added {
                    self.event(&mut out, "response.reasoning_summary_part.added", json!({"item_id": added, "output_index": index, "summary_index": 0, "part": {"type": "summary_text", "text": ""}}));
                }
                if !t.text.is_empty() {
                    self.event(&mut out, "response.reasoning_summary_text.delta", json!({"item_id": id, "output_index": index, "summary_index": 0, "delta": t.text}));
                }
            }
        }
        if !delta.text.is_empty() {
            if !matches!(self.open, Some(Open::Message { .. })) {
                let id = item_id(&self.context, "msg", self.index());
                let item = json!({"id": id, "type": "message", "status": "in_progress", "role": "assistant", "content": []});
                self.begin(
                    &mut out,
                    Open::Message {
                        id: id.clone(),
                        text: String::new(),
                    },
                    item,
                );
                let index = self.index();
                self.event(&mut out, "response.content_part.added", json!({"item_id": id, "output_index": index, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}));
            }
            let index = self.index();
            if let Some(Open::Message { id, text }) = &mut self.open {
                text.push_str(&delta.text);
                let id = id.clone();
                self.event(&mut out, "response.output_text.delta", json!({"item_id": id, "output_index": index, "content_index": 0, "delta": delta.text, "logprobs": []}));
            }
        }
        if let Some(call) = &delta.tool_call {
            if !matches!(&self.open, Some(Open::Call { index, .. }) if *index == call.index) {
                let id = item_id(&self.context, "fc", self.index());
                let call_id = call_id(&call.id, &self.context.started.call_id, call.index);
                let mut item =
                    call_item(&self.context, &id, &call_id, &call.name, "", "in_progress");
                if item["type"] == "custom_tool_call" {
                    item["input"] = json!("");
                }
                self.begin(
                    &mut out,
                    Open::Call {
                        index: call.index,
                        id,
                        call_id,
                        name: call.name.clone(),
                        arguments: String::new(),
                    },
                    item,
                );
            }
            let index = self.index();
            let custom = matches!(&self.open, Some(Open::Call { name, .. }) if self.context.custom_tools.contains(name));
            if let Some(Open::Call { id, arguments, .. }) = &mut self.open {
                arguments.push_str(&call.arguments);
                // A free-form tool's input is inside the function's JSON arguments: it is
                // sent whole when the call ends.
                if !custom && !call.arguments.is_empty() {
                    let id = id.clone();
                    self.event(
                        &mut out,
                        "response.function_call_arguments.delta",
                        json!({"item_id": id, "output_index": index, "delta": call.arguments}),
                    );
                }
            }
        }
        out
    }

    fn done(&mut self, done: &pb::CompleteDone) -> String {
        let mut out = String::new();
        self.close(&mut out);
        let (status, _) = status(done);
        let response = response(&self.context, status, &self.output, Some(done));
        let kind = if status == "completed" {
            "response.completed"
        } else {
            "response.incomplete"
        };
        self.event(&mut out, kind, json!({"response": response}));
        out
    }

    fn error(&mut self, status: &tonic::Status) -> String {
        let mut out = String::new();
        let kind = super::reply::GatewayError::of(status).openai_kind;
        let mut response = response(&self.context, "failed", &self.output, None);
        response["error"] = json!({"code": kind, "message": status.message()});
        self.event(&mut out, "response.failed", json!({"response": response}));
        out
    }
}

#[cfg(test)]
mod tests;
