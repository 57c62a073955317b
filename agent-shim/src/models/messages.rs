//! Anthropic Messages (`POST /v1/messages`, `POST /v1/messages/count_tokens`): requests to
//! canonical calls, and replies (whole or as the Messages stream's named events) from the
//! gateway's events.

use serde_json::{json, Value};
use tollgate_proto::v1 as pb;

use super::common::{
    cached, call_id, cap_of, field, finish, float_of, image_from_base64, message, served_model,
    stop_of, str_of, string_of, text_part, tool_call_part, tool_choice, tool_result_part, usage,
    Block, Call, Invalid, Reply,
};
use super::reply::{Context, Encoder};

/// Where a reasoning block came from, as ThinkingPart.origin names it.
const ORIGIN: &str = "anthropic";

/// The gateway call a Messages request (or a count_tokens request) asks for.
pub(crate) fn parse(body: &Value) -> Result<Call, Invalid> {
    let mut messages = Vec::new();
    match field(body, "system") {
        None => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(s)) => {
            messages.push(message("system", vec![text_part(s.clone(), false)]))
        }
        Some(Value::Array(blocks)) => {
            let parts = blocks
                .iter()
                .map(|b| match str_of(b, "type") {
                    Some("text") => Ok(text_part(string_of(b, "text"), cached(b))),
                    other => Err(Invalid::new(format!(
                        "system blocks of type {} are not supported (text is)",
                        other.unwrap_or("unknown")
                    ))),
                })
                .collect::<Result<Vec<_>, _>>()?;
            messages.push(message("system", parts));
        }
        Some(_) => {
            return Err(Invalid::new(
                "system must be a string or a list of text blocks",
            ))
        }
    }
    for m in body
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| Invalid::new("messages must be a list of messages"))?
    {
        let role = str_of(m, "role").ok_or_else(|| Invalid::new("a message has no role"))?;
        messages.push(message(
            role,
            blocks(m.get("content").unwrap_or(&Value::Null))?,
        ));
    }
    let (mut tools, mut dropped) = (Vec::new(), Vec::new());
    for tool in field(body, "tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = string_of(tool, "name");
        // A custom tool has a schema (and no type, or "custom"). The rest are Anthropic's
        // server tools (web search, fetch, code execution), which run at Anthropic, outside
        // the gateway, and its schema-less client tools (bash, text editor, computer), whose
        // shape only Anthropic's models know.
        let custom = matches!(str_of(tool, "type"), None | Some("custom"));
        match field(tool, "input_schema") {
            Some(schema) if custom && !name.is_empty() => tools.push(pb::ToolDefinition {
                name,
                description: string_of(tool, "description"),
                parameters_json: schema.to_string(),
                strict: tool.get("strict").and_then(Value::as_bool).unwrap_or(false),
                cache: cached(tool),
            }),
            _ if name.is_empty() => dropped.push(string_of(tool, "type")),
            _ => dropped.push(name),
        }
    }
    let choice = field(body, "tool_choice");
    let mode = match choice.and_then(|c| str_of(c, "type")) {
        None => None,
        Some("auto") => Some((pb::tool_choice::Mode::Auto, String::new())),
        Some("any") => Some((pb::tool_choice::Mode::Required, String::new())),
        Some("none") => Some((pb::tool_choice::Mode::None, String::new())),
        Some("tool") => Some((
            pb::tool_choice::Mode::Named,
            choice.map(|c| string_of(c, "name")).unwrap_or_default(),
        )),
        Some(other) => {
            return Err(Invalid::new(format!(
                "tool_choice type {other:?} is not one of auto, any, tool or none"
            )))
        }
    };
    let parallel = choice
        .and_then(|c| c.get("disable_parallel_tool_use"))
        .and_then(Value::as_bool)
        .map(|disable| !disable);
    let reasoning = field(body, "thinking")
        .filter(|t| str_of(t, "type") == Some("enabled"))
        .map(|t| pb::ReasoningConfig {
            budget_tokens: cap_of(t, &["budget_tokens"]),
            ..Default::default()
        });
    Ok(Call {
        request: pb::CompleteRequest {
            route: string_of(body, "model"),
            messages,
            max_tokens: cap_of(body, &["max_tokens"]),
            stream: body.get("stream").and_then(Value::as_bool).unwrap_or(false),
            local_only: false,
            temperature: float_of(body, "temperature"),
            stop: stop_of(body.get("stop_sequences")),
            tool_choice: tool_choice(mode, parallel, &tools),
            tools,
            response_format_json: String::new(),
            reasoning,
            top_p: float_of(body, "top_p"),
        },
        dropped,
        include_usage: false,
        custom_tools: Vec::new(),
    })
}

/// A message's content: a string, or content blocks.
fn blocks(content: &Value) -> Result<Vec<pb::ContentPart>, Invalid> {
    match content {
        Value::String(text) if text.is_empty() => Ok(Vec::new()),
        Value::String(text) => Ok(vec![text_part(text.clone(), false)]),
        Value::Array(items) => items.iter().map(block).collect(),
        _ => Err(Invalid::new(
            "content must be a string or a list of content blocks",
        )),
    }
}

/// One content block.
fn block(b: &Value) -> Result<pb::ContentPart, Invalid> {
    use pb::content_part::Part;
    let cache = cached(b);
    let part = match str_of(b, "type") {
        Some("text") => Part::Text(string_of(b, "text")),
        Some("image") => Part::Image(image(b)?),
        Some("tool_use") => {
            let input = field(b, "input").map_or_else(|| "{}".to_owned(), Value::to_string);
            let mut part = tool_call_part(
                str_of(b, "id").unwrap_or_default(),
                &string_of(b, "name"),
                input,
            );
            part.cache = cache;
            return Ok(part);
        }
        Some("tool_result") => {
            let id = str_of(b, "tool_use_id")
                .ok_or_else(|| Invalid::new("a tool_result block has no tool_use_id"))?;
            let content = match field(b, "content") {
                None => Vec::new(),
                Some(Value::String(s)) => vec![text_part(s.clone(), false)],
                Some(Value::Array(items)) => items
                    .iter()
                    .map(|item| match str_of(item, "type") {
                        Some("text") => Ok(text_part(string_of(item, "text"), cached(item))),
                        Some("image") => Ok(pb::ContentPart {
                            part: Some(Part::Image(image(item)?)),
                            cache: cached(item),
                        }),
                        other => Err(Invalid::new(format!(
                            "tool_result content of type {} is not supported (text and image are)",
                            other.unwrap_or("unknown")
                        ))),
                    })
                    .collect::<Result<_, _>>()?,
                Some(_) => {
                    return Err(Invalid::new(
                        "a tool_result's content must be a string or a list of blocks",
                    ))
                }
            };
            let is_error = b.get("is_error").and_then(Value::as_bool).unwrap_or(false);
            return Ok(tool_result_part(id, content, is_error, cache));
        }
        Some("thinking") => Part::Thinking(pb::ThinkingPart {
            text: string_of(b, "thinking"),
            signature: string_of(b, "signature"),
            origin: ORIGIN.into(),
            ..Default::default()
        }),
        Some("redacted_thinking") => Part::Thinking(pb::ThinkingPart {
            signature: string_of(b, "data"),
            origin: ORIGIN.into(),
            redacted: true,
            ..Default::default()
        }),
        other => {
            return Err(Invalid::new(format!(
                "content blocks of type {} are not supported (text, image, tool_use, \
                 tool_result, thinking and redacted_thinking are)",
                other.unwrap_or("unknown")
            )))
        }
    };
    Ok(pb::ContentPart {
        part: Some(part),
        cache,
    })
}

/// An image block: base64 only (a URL would be fetched from outside the sandbox).
fn image(b: &Value) -> Result<pb::ImagePart, Invalid> {
    let source = b.get("source").unwrap_or(&Value::Null);
    match str_of(source, "type") {
        Some("base64") => image_from_base64(
            str_of(source, "media_type").unwrap_or_default(),
            str_of(source, "data").unwrap_or_default(),
        ),
        Some("url") => Err(Invalid::new(
            "image URL sources are not accepted (the backend would fetch them from outside the \
             sandbox): send the image as a base64 source",
        )),
        other => Err(Invalid::new(format!(
            "image sources of type {} are not supported (base64 is)",
            other.unwrap_or("unknown")
        ))),
    }
}

/// The canonical finish reason as Anthropic's `stop_reason`.
pub(crate) fn stop_reason(finish: &str) -> &str {
    match finish {
        "tool_calls" => "tool_use",
        "length" => "max_tokens",
        "stop" => "end_turn",
        "content_filter" => "refusal",
        other => other,
    }
}

/// A tool call's arguments as the `input` object ({} when the backend sent none).
fn input(arguments: &str) -> Value {
    if arguments.trim().is_empty() {
        return json!({});
    }
    serde_json::from_str(arguments).unwrap_or_else(|_| json!(arguments))
}

/// The whole reply to a call that did not stream.
pub(crate) fn reply(context: &Context, reply: &Reply) -> Value {
    let content: Vec<Value> = reply
        .blocks
        .iter()
        .map(|b| match b {
            Block::Text(text) => json!({"type": "text", "text": text}),
            Block::Thinking(t) if t.redacted => {
                json!({"type": "redacted_thinking", "data": t.signature})
            }
            Block::Thinking(t) => {
                json!({"type": "thinking", "thinking": t.text, "signature": t.signature})
            }
            Block::Tool(index, call) => json!({
                "type": "tool_use",
                "id": call_id(&call.id, &context.started.call_id, *index),
                "name": call.name,
                "input": input(&call.arguments_json),
            }),
        })
        .collect();
    let (prompt, completion) = usage(&reply.done);
    json!({
        "id": format!("msg_{}", context.started.call_id),
        "type": "message",
        "role": "assistant",
        "model": served_model(&context.started),
        "content": content,
        "stop_reason": stop_reason(finish(&reply.done)),
        "stop_sequence": null,
        "usage": {"input_tokens": prompt, "output_tokens": completion},
    })
}

/// The content block open in a stream.
#[derive(Debug, Clone, PartialEq)]
enum Open {
    Text,
    /// Reasoning, with its id (Responses API reasoning carried through).
    Thinking(String),
    /// A tool call, by its index among the reply's calls.
    Tool(u32),
}

/// A streamed reply as the Messages stream's events.
pub(crate) struct MessagesStream {
    context: Context,
    /// Blocks started so far (the next block's index).
    started: u32,
    open: Option<Open>,
}

/// A named event.
fn event(name: &str, data: Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

impl MessagesStream {
    /// The stream of `context`'s call.
    pub(crate) fn new(context: Context) -> Self {
        Self {
            context,
            started: 0,
            open: None,
        }
    }

    /// Closes the open block, if any.
    fn close(&mut self, out: &mut String) {
        if self.open.take().is_some() {
            let index = self.started - 1;
            out.push_str(&event(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            ));
        }
    }

    /// Closes the open block and starts `block` as the next.
    fn begin(&mut self, out: &mut String, open: Option<Open>, block: Value) -> u32 {
        self.close(out);
        let index = self.started;
        self.started += 1;
        out.push_str(&event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": block}),
        ));
        self.open = open;
        index
    }

    fn block_delta(&self, out: &mut String, delta: Value) {
        let index = self.started - 1;
        out.push_str(&event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": delta}),
        ));
    }
}

impl Encoder for MessagesStream {
    fn start(&mut self) -> String {
        let c = &self.context;
        event(
            "message_start",
            json!({"type": "message_start", "message": {"id": format!("msg_{}", c.started.call_id), "type": "message", "role": "assistant", "model": served_model(&c.started), "content": [], "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 0, "output_tokens": 0}}}),
        )
    }

    fn delta(&mut self, delta: &pb::CompleteDelta) -> String {
        let mut out = String::new();
        if let Some(t) = delta
            .thinking
            .as_ref()
            .filter(|t| !super::common::thinking_empty(t))
        {
            if t.redacted {
                self.begin(
                    &mut out,
                    None,
                    json!({"type": "redacted_thinking", "data": t.signature}),
                );
                let index = self.started - 1;
                out.push_str(&event(
                    "content_block_stop",
                    json!({"type": "content_block_stop", "index": index}),
                ));
            } else {
                let continues = matches!(&self.open, Some(Open::Thinking(id)) if t.id.is_empty() || *id == t.id);
                if !continues {
                    self.begin(
                        &mut out,
                        Some(Open::Thinking(t.id.clone())),
                        json!({"type": "thinking", "thinking": "", "signature": ""}),
                    );
                }
                if !t.text.is_empty() {
                    self.block_delta(
                        &mut out,
                        json!({"type": "thinking_delta", "thinking": t.text}),
                    );
                }
                if !t.signature.is_empty() {
                    self.block_delta(
                        &mut out,
                        json!({"type": "signature_delta", "signature": t.signature}),
                    );
                }
            }
        }
        if !delta.text.is_empty() {
            if self.open != Some(Open::Text) {
                self.begin(
                    &mut out,
                    Some(Open::Text),
                    json!({"type": "text", "text": ""}),
                );
            }
            self.block_delta(&mut out, json!({"type": "text_delta", "text": delta.text}));
        }
        if let Some(call) = &delta.tool_call {
            if self.open != Some(Open::Tool(call.index)) {
                let id = call_id(&call.id, &self.context.started.call_id, call.index);
                self.begin(
                    &mut out,
                    Some(Open::Tool(call.index)),
                    json!({"type": "tool_use", "id": id, "name": call.name, "input": {}}),
                );
            }
            if !call.arguments.is_empty() {
                self.block_delta(
                    &mut out,
                    json!({"type": "input_json_delta", "partial_json": call.arguments}),
                );
            }
        }
        out
    }

    fn done(&mut self, done: &pb::CompleteDone) -> String {
        let mut out = String::new();
        self.close(&mut out);
        let (prompt, completion) = usage(done);
        out.push_str(&event(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": stop_reason(finish(done)), "stop_sequence": null}, "usage": {"input_tokens": prompt, "output_tokens": completion}}),
        ));
        out.push_str(&event("message_stop", json!({"type": "message_stop"})));
        out
    }

    fn error(&mut self, status: &tonic::Status) -> String {
        let kind = super::reply::GatewayError::of(status).anthropic_kind();
        event(
            "error",
            json!({"type": "error", "error": {"type": kind, "message": status.message()}}),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::content_part::Part;

    #[test]
    fn blocks_tools_and_thinking_become_canonical() {
        let body = json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 1024,
            "system": [{"type": "text", "text": "You are Claude Code."}, {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": "list files"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "use ls", "signature": "sig"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "a.txt"}, {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGk="}}], "is_error": true},
                    {"type": "text", "text": "go on", "cache_control": {"type": "ephemeral"}},
                ]},
            ],
            "tools": [
                {"name": "Bash", "description": "runs", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}},
                {"type": "web_search_20250305", "name": "web_search"},
                {"type": "bash_20250124", "name": "bash"},
            ],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "thinking": {"type": "enabled", "budget_tokens": 2000},
            "stop_sequences": ["X"],
            "stream": true,
        });
        let call = parse(&body).unwrap();
        let r = &call.request;
        assert_eq!(
            call.dropped,
            vec!["web_search".to_owned(), "bash".to_owned()]
        );
        assert_eq!(r.messages[0].role, "system");
        assert_eq!(r.messages[0].parts.len(), 2);
        assert!(r.messages[0].parts[1].cache);
        assert_eq!(r.messages[1].content, "list files");
        let assistant = &r.messages[2].parts;
        assert!(
            matches!(&assistant[0].part, Some(Part::Thinking(t)) if t.text == "use ls" && t.signature == "sig" && t.origin == "anthropic")
        );
        assert!(
            matches!(&assistant[1].part, Some(Part::Thinking(t)) if t.redacted && t.signature == "opaque")
        );
        assert!(
            matches!(&assistant[2].part, Some(Part::ToolCall(c)) if c.id == "toolu_1" && c.arguments_json == r#"{"command":"ls"}"#)
        );
        let user = &r.messages[3];
        assert_eq!(user.role, "user");
        let Some(Part::ToolResult(result)) = &user.parts[0].part else {
            panic!("{user:?}")
        };
        assert!(result.is_error);
        assert_eq!(result.content.len(), 2);
        assert!(user.parts[1].cache);
        assert_eq!(r.tools.len(), 1);
        assert!(r.tools[0].cache);
        let choice = r.tool_choice.as_ref().unwrap();
        assert_eq!(
            (choice.mode(), choice.parallel),
            (pb::tool_choice::Mode::Required, Some(false))
        );
        assert_eq!(r.reasoning.as_ref().unwrap().budget_tokens, 2000);
        assert_eq!((r.max_tokens, r.stream, r.stop.len()), (1024, true, 1));
    }

    #[test]
    fn url_images_and_unknown_blocks_are_refused_in_one_line() {
        let url = json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://x.example/a.png"}}]}]});
        assert!(parse(&url).unwrap_err().0.contains("base64"));
        let doc = json!({"messages": [{"role": "user", "content": [{"type": "document"}]}]});
        assert!(parse(&doc).unwrap_err().0.contains("document"));
        let none = parse(&json!({"messages": [], "tools": []})).unwrap();
        assert!(none.request.tools.is_empty());
    }

    fn context() -> Context {
        Context {
            started: pb::CompleteStarted {
                call_id: "c1".into(),
                route: "cloud".into(),
                model: "claude-x".into(),
                ..Default::default()
            },
            created: 7,
            include_usage: false,
            custom_tools: Vec::new(),
        }
    }

    fn events(text: &str) -> Vec<(String, Value)> {
        text.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let (name, data) = e.split_once('\n').unwrap();
                (
                    name.strip_prefix("event: ").unwrap().to_owned(),
                    serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn streams_switch_blocks_with_the_right_indices() {
        let mut s = MessagesStream::new(context());
        let mut out = s.start();
        let thinking = |text: &str, signature: &str| pb::CompleteDelta {
            thinking: Some(pb::ThinkingDelta {
                text: text.into(),
                signature: signature.into(),
                origin: ORIGIN.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let text = |text: &str| pb::CompleteDelta {
            text: text.into(),
            ..Default::default()
        };
        let call = |index: u32, id: &str, name: &str, arguments: &str| pb::CompleteDelta {
            tool_call: Some(pb::ToolCallDelta {
                index,
                id: id.into(),
                name: name.into(),
                arguments: arguments.into(),
            }),
            ..Default::default()
        };
        for d in [
            thinking("hm", ""),
            thinking("", "sig"),
            text("I'll look."),
            call(0, "toolu_1", "Bash", ""),
            call(0, "", "", "{\"command\":"),
            call(0, "", "", "\"ls\"}"),
            call(1, "toolu_2", "Read", "{}"),
        ] {
            out += &s.delta(&d);
        }
        out += &s.done(&pb::CompleteDone {
            finish_reason: "tool_calls".into(),
            ..Default::default()
        });
        let e = events(&out);
        let names: Vec<&str> = e.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
        );
        assert_eq!(e[0].1["message"]["model"], "claude-x");
        assert_eq!(e[1].1["content_block"]["type"], "thinking");
        assert_eq!(
            e[3].1["delta"],
            json!({"type": "signature_delta", "signature": "sig"})
        );
        assert_eq!(e[5].1["index"], 1);
        assert_eq!(
            e[8].1["content_block"],
            json!({"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}})
        );
        assert_eq!(
            e[9].1["delta"],
            json!({"type": "input_json_delta", "partial_json": "{\"command\":"})
        );
        assert_eq!(
            (e[12].1["index"].clone(), e[14].1["index"].clone()),
            (json!(3), json!(3))
        );
        assert_eq!(e[15].1["delta"]["stop_reason"], "tool_use");
    }

    #[test]
    fn whole_replies_are_content_blocks() {
        let mut r = Reply::default();
        r.push(&pb::CompleteDelta {
            text: "ok".into(),
            ..Default::default()
        });
        r.push(&pb::CompleteDelta {
            tool_call: Some(pb::ToolCallDelta {
                index: 0,
                id: "toolu_1".into(),
                name: "Bash".into(),
                arguments: "{\"a\":1}".into(),
            }),
            ..Default::default()
        });
        r.done.finish_reason = "tool_calls".into();
        let body = reply(&context(), &r);
        assert_eq!(
            body["content"][1],
            json!({"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"a": 1}})
        );
        assert_eq!(body["stop_reason"], "tool_use");
        assert_eq!(body["model"], "claude-x");
    }
}
