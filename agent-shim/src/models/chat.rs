//! OpenAI Chat Completions (`POST /v1/chat/completions`): requests to canonical calls, and
//! replies (whole or streamed as `chat.completion.chunk`s) from the gateway's events.

use serde_json::{json, Value};
use tollgate_proto::v1 as pb;

use super::common::{
    call_id, cap_of, field, finish, float_of, image_from_url, message, served_model, stop_of,
    str_of, string_of, text_part, tool_call_part, tool_choice, tool_result_part, usage, Block,
    Call, Invalid, Reply,
};
use super::reply::{Context, Encoder};

/// The gateway call a Chat Completions request asks for.
pub(crate) fn parse(body: &Value) -> Result<Call, Invalid> {
    if body.get("n").and_then(Value::as_u64).is_some_and(|n| n > 1) {
        return Err(Invalid::new("n > 1 is not supported: ask for one choice"));
    }
    let mut messages = Vec::new();
    for m in body
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| Invalid::new("messages must be a list of messages"))?
    {
        messages.push(chat_message(m)?);
    }
    let (tools, dropped) = tools(body)?;
    let mode = match field(body, "tool_choice") {
        None => None,
        Some(Value::String(s)) => Some((mode_named(s)?, String::new())),
        Some(choice) => match str_of(choice, "type") {
            Some("function") => Some((
                pb::tool_choice::Mode::Named,
                choice
                    .pointer("/function/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
            )),
            Some("allowed_tools") => Some((
                mode_named(
                    choice
                        .pointer("/allowed_tools/mode")
                        .and_then(Value::as_str)
                        .unwrap_or("auto"),
                )?,
                String::new(),
            )),
            _ => Some((pb::tool_choice::Mode::Auto, String::new())),
        },
    };
    let parallel = body.get("parallel_tool_calls").and_then(Value::as_bool);
    let response_format = match field(body, "response_format") {
        Some(format) if str_of(format, "type") != Some("text") => format.to_string(),
        _ => String::new(),
    };
    let reasoning = str_of(body, "reasoning_effort").map(|effort| pb::ReasoningConfig {
        effort: effort.to_owned(),
        ..Default::default()
    });
    Ok(Call {
        request: pb::CompleteRequest {
            route: string_of(body, "model"),
            messages,
            max_tokens: cap_of(body, &["max_completion_tokens", "max_tokens"]),
            stream: body.get("stream").and_then(Value::as_bool).unwrap_or(false),
            local_only: false,
            temperature: float_of(body, "temperature"),
            stop: stop_of(body.get("stop")),
            tool_choice: tool_choice(mode, parallel, &tools),
            tools,
            response_format_json: response_format,
            reasoning,
            top_p: float_of(body, "top_p"),
        },
        dropped,
        include_usage: body
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        custom_tools: Vec::new(),
    })
}

/// `auto`, `none` or `required`.
fn mode_named(mode: &str) -> Result<pb::tool_choice::Mode, Invalid> {
    match mode {
        "auto" => Ok(pb::tool_choice::Mode::Auto),
        "none" => Ok(pb::tool_choice::Mode::None),
        "required" => Ok(pb::tool_choice::Mode::Required),
        other => Err(Invalid::new(format!(
            "tool_choice {other:?} is not one of auto, none, required or a function"
        ))),
    }
}

/// The request's function tools, and the names of the others (dropped: they would run
/// outside the gateway).
fn tools(body: &Value) -> Result<(Vec<pb::ToolDefinition>, Vec<String>), Invalid> {
    let (mut tools, mut dropped) = (Vec::new(), Vec::new());
    for tool in field(body, "tools")
        .map(|t| {
            t.as_array()
                .ok_or_else(|| Invalid::new("tools must be a list"))
        })
        .transpose()?
        .into_iter()
        .flatten()
    {
        match str_of(tool, "type").unwrap_or("function") {
            "function" => {
                let function = tool.get("function").unwrap_or(tool);
                let name = str_of(function, "name")
                    .filter(|n| !n.is_empty())
                    .ok_or_else(|| Invalid::new("a function tool has no name"))?;
                tools.push(pb::ToolDefinition {
                    name: name.to_owned(),
                    description: string_of(function, "description"),
                    parameters_json: field(function, "parameters")
                        .map(Value::to_string)
                        .unwrap_or_default(),
                    strict: function
                        .get("strict")
                        .and_then(Value::as_bool)
                        .unwrap_or(false),
                    cache: false,
                });
            }
            // A free-form tool runs in the agent, so dropping it would change what the agent
            // asked for; this endpoint carries free-form tools on the Responses API only.
            "custom" => {
                return Err(Invalid::new(
                    "custom (free-form) tools are not supported on chat completions: declare \
                     them as functions, or use the Responses API (POST /v1/responses)",
                ))
            }
            // Hosted tools (web search and the like) run outside the gateway.
            other => dropped.push(
                tool.pointer(&format!("/{other}/name"))
                    .and_then(Value::as_str)
                    .unwrap_or(other)
                    .to_owned(),
            ),
        }
    }
    Ok((tools, dropped))
}

/// One chat message.
fn chat_message(m: &Value) -> Result<pb::ChatMessage, Invalid> {
    let role = str_of(m, "role")
        .ok_or_else(|| Invalid::new("a message has no role"))?
        .to_owned();
    let content = m.get("content").unwrap_or(&Value::Null);
    match role.as_str() {
        "tool" => {
            let id = str_of(m, "tool_call_id")
                .ok_or_else(|| Invalid::new("a tool message has no tool_call_id"))?;
            Ok(pb::ChatMessage {
                role,
                content: String::new(),
                parts: vec![tool_result_part(id, parts(content)?, false, false)],
            })
        }
        "function" => Err(Invalid::new(
            "function messages are not supported: send tool messages with tool_call_id",
        )),
        _ => {
            let mut all = parts(content)?;
            if role == "assistant" {
                for call in field(m, "tool_calls")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let function = call.get("function").unwrap_or(&Value::Null);
                    all.push(tool_call_part(
                        str_of(call, "id").unwrap_or_default(),
                        str_of(function, "name").unwrap_or_default(),
                        str_of(function, "arguments").unwrap_or("{}").to_owned(),
                    ));
                }
            }
            Ok(message(&role, all))
        }
    }
}

/// A message's content: a string, or text, image and refusal parts.
fn parts(content: &Value) -> Result<Vec<pb::ContentPart>, Invalid> {
    match content {
        Value::Null => Ok(Vec::new()),
        Value::String(text) if text.is_empty() => Ok(Vec::new()),
        Value::String(text) => Ok(vec![text_part(text.clone(), false)]),
        Value::Array(items) => items
            .iter()
            .map(|part| match str_of(part, "type") {
                Some("text") => Ok(text_part(string_of(part, "text"), false)),
                Some("refusal") => Ok(text_part(string_of(part, "refusal"), false)),
                Some("image_url") => {
                    let url = part
                        .pointer("/image_url/url")
                        .or_else(|| part.get("image_url"))
                        .and_then(Value::as_str)
                        .ok_or_else(|| Invalid::new("an image_url part has no url"))?;
                    Ok(pb::ContentPart {
                        part: Some(pb::content_part::Part::Image(image_from_url(url)?)),
                        cache: false,
                    })
                }
                other => Err(Invalid::new(format!(
                    "content parts of type {} are not supported (text and image_url are)",
                    other.unwrap_or("unknown")
                ))),
            })
            .collect(),
        _ => Err(Invalid::new(
            "content must be a string or a list of content parts",
        )),
    }
}

/// The whole reply to a call that did not stream.
pub(crate) fn reply(context: &Context, reply: &Reply) -> Value {
    let calls: Vec<Value> = reply
        .blocks
        .iter()
        .filter_map(|b| match b {
            Block::Tool(index, call) => Some(json!({
                "id": call_id(&call.id, &context.started.call_id, *index),
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments_json},
            })),
            _ => None,
        })
        .collect();
    let text = reply.text();
    let mut message = json!({
        "role": "assistant",
        "content": if text.is_empty() && !calls.is_empty() { Value::Null } else { json!(text) },
        "refusal": null,
    });
    if !calls.is_empty() {
        message["tool_calls"] = json!(calls);
    }
    let reasoning: String = reply
        .blocks
        .iter()
        .filter_map(|b| match b {
            Block::Thinking(t) => Some(t.text.as_str()),
            _ => None,
        })
        .collect();
    if !reasoning.is_empty() {
        // Where OpenAI-compatible servers (and litellm) put a model's reasoning.
        message["reasoning_content"] = json!(reasoning);
    }
    let (prompt, completion) = usage(&reply.done);
    json!({
        "id": format!("chatcmpl-{}", context.started.call_id),
        "object": "chat.completion",
        "created": context.created,
        "model": served_model(&context.started),
        "choices": [{"index": 0, "message": message, "finish_reason": finish(&reply.done), "logprobs": null}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    })
}

/// A streamed reply as `chat.completion.chunk`s.
pub(crate) struct ChatStream {
    context: Context,
    /// The indices of the tool calls already begun (their first chunk named id and name).
    begun: Vec<u32>,
}

impl ChatStream {
    /// The stream of `context`'s call.
    pub(crate) fn new(context: Context) -> Self {
        Self {
            context,
            begun: Vec::new(),
        }
    }

    fn chunk(&self, delta: Value, finish: Value) -> String {
        let c = &self.context;
        format!(
            "data: {}\n\n",
            json!({"id": format!("chatcmpl-{}", c.started.call_id), "object": "chat.completion.chunk", "created": c.created, "model": served_model(&c.started), "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}]})
        )
    }
}

impl Encoder for ChatStream {
    fn start(&mut self) -> String {
        self.chunk(json!({"role": "assistant", "content": ""}), Value::Null)
    }

    fn delta(&mut self, delta: &pb::CompleteDelta) -> String {
        let mut out = String::new();
        if let Some(thinking) = delta.thinking.as_ref().filter(|t| !t.text.is_empty()) {
            out.push_str(&self.chunk(json!({"reasoning_content": thinking.text}), Value::Null));
        }
        if !delta.text.is_empty() {
            out.push_str(&self.chunk(json!({"content": delta.text}), Value::Null));
        }
        if let Some(call) = &delta.tool_call {
            // The SDKs (openai, litellm) key calls by `index`; the first piece of each names
            // its id, type and function name, later ones only add arguments.
            let piece = if self.begun.contains(&call.index) {
                json!({"index": call.index, "function": {"arguments": call.arguments}})
            } else {
                self.begun.push(call.index);
                json!({
                    "index": call.index,
                    "id": call_id(&call.id, &self.context.started.call_id, call.index),
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                })
            };
            out.push_str(&self.chunk(json!({"tool_calls": [piece]}), Value::Null));
        }
        out
    }

    fn done(&mut self, done: &pb::CompleteDone) -> String {
        let mut out = self.chunk(json!({}), json!(finish(done)));
        if self.context.include_usage {
            let c = &self.context;
            let (prompt, completion) = usage(done);
            out.push_str(&format!(
                "data: {}\n\n",
                json!({"id": format!("chatcmpl-{}", c.started.call_id), "object": "chat.completion.chunk", "created": c.created, "model": served_model(&c.started), "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}})
            ));
        }
        out.push_str("data: [DONE]\n\n");
        out
    }

    fn error(&mut self, status: &tonic::Status) -> String {
        let kind = super::reply::GatewayError::of(status).openai_kind;
        format!(
            "data: {}\n\n",
            json!({"error": {"message": status.message(), "type": kind, "param": null, "code": kind}})
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tools_calls_and_results_become_canonical_parts() {
        let body = json!({
            "model": "gpt-4o",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "what is in "}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk="}}]},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "read", "arguments": "{\"path\":\"a\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "file text"},
            ],
            "tools": [
                {"type": "function", "function": {"name": "read", "description": "reads", "parameters": {"type": "object"}, "strict": true}},
                {"type": "web_search"},
            ],
            "tool_choice": {"type": "function", "function": {"name": "read"}},
            "parallel_tool_calls": false,
            "response_format": {"type": "json_object"},
            "max_completion_tokens": 32,
            "reasoning_effort": "low",
            "top_p": 0.5,
            "stop": "END",
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let call = parse(&body).unwrap();
        let r = &call.request;
        assert!(call.include_usage);
        assert_eq!(call.dropped, vec!["web_search".to_owned()]);
        assert_eq!(
            (r.route.as_str(), r.max_tokens, r.stream),
            ("gpt-4o", 32, true)
        );
        assert_eq!(r.stop, vec!["END".to_owned()]);
        assert_eq!(r.top_p, Some(0.5));
        assert_eq!(r.reasoning.as_ref().unwrap().effort, "low");
        assert_eq!(r.response_format_json, r#"{"type":"json_object"}"#);
        assert_eq!(r.messages[1].content, "what is in ");
        assert!(matches!(
            &r.messages[1].parts[0].part,
            Some(pb::content_part::Part::Image(i)) if i.data == b"hi"
        ));
        assert!(matches!(
            &r.messages[2].parts[0].part,
            Some(pb::content_part::Part::ToolCall(c)) if c.id == "call_1" && c.arguments_json == "{\"path\":\"a\"}"
        ));
        let Some(pb::content_part::Part::ToolResult(result)) = &r.messages[3].parts[0].part else {
            panic!("{:?}", r.messages[3])
        };
        assert_eq!(
            (r.messages[3].role.as_str(), result.call_id.as_str()),
            ("tool", "call_1")
        );
        assert_eq!(r.tools.len(), 1);
        assert!(r.tools[0].strict);
        let choice = r.tool_choice.as_ref().unwrap();
        assert_eq!(
            (choice.mode(), choice.name.as_str(), choice.parallel),
            (pb::tool_choice::Mode::Named, "read", Some(false))
        );
    }

    #[test]
    fn empty_tools_mean_none_and_remote_images_are_refused() {
        let call =
            parse(&json!({"messages": [{"role": "user", "content": "hi"}], "tools": []})).unwrap();
        assert!(call.request.tools.is_empty() && call.request.tool_choice.is_none());
        let remote = json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x.example/a.png"}}]}]});
        assert!(parse(&remote).unwrap_err().0.contains("data:"));
        assert!(parse(&json!({"messages": [], "n": 2})).is_err());
        let custom =
            json!({"messages": [], "tools": [{"type": "custom", "custom": {"name": "patch"}}]});
        assert!(parse(&custom).unwrap_err().0.contains("Responses API"));
    }

    fn context() -> Context {
        Context {
            started: pb::CompleteStarted {
                call_id: "c1".into(),
                route: "local".into(),
                model: "qwen".into(),
                ..Default::default()
            },
            created: 7,
            include_usage: true,
            custom_tools: Vec::new(),
        }
    }

    fn call_delta(index: u32, id: &str, name: &str, arguments: &str) -> pb::CompleteDelta {
        pb::CompleteDelta {
            tool_call: Some(pb::ToolCallDelta {
                index,
                id: id.into(),
                name: name.into(),
                arguments: arguments.into(),
            }),
            ..Default::default()
        }
    }

    fn chunks(text: &str) -> Vec<Value> {
        text.split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    }

    #[test]
    fn streamed_tool_calls_are_chunks_the_sdks_parse() {
        let mut stream = ChatStream::new(context());
        let mut out = stream.start();
        out += &stream.delta(&call_delta(0, "call_9", "read", "{\"pa"));
        out += &stream.delta(&call_delta(0, "", "", "th\":1}"));
        out += &stream.delta(&call_delta(1, "", "list", "{}"));
        out += &stream.done(&pb::CompleteDone {
            finish_reason: "tool_calls".into(),
            prompt: Some(pb::TokenCount {
                tokens: 5,
                source: 1,
            }),
            ..Default::default()
        });
        assert!(out.ends_with("data: [DONE]\n\n"));
        let c = chunks(&out);
        assert_eq!(c[0]["model"], "qwen");
        assert_eq!(
            c[1]["choices"][0]["delta"]["tool_calls"][0],
            json!({"index": 0, "id": "call_9", "type": "function", "function": {"name": "read", "arguments": "{\"pa"}})
        );
        assert_eq!(
            c[2]["choices"][0]["delta"]["tool_calls"][0],
            json!({"index": 0, "function": {"arguments": "th\":1}"}})
        );
        assert_eq!(
            c[3]["choices"][0]["delta"]["tool_calls"][0]["id"],
            "call_c1_1"
        );
        assert_eq!(c[4]["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(c[5]["usage"]["prompt_tokens"], 5);
    }

    #[test]
    fn whole_replies_carry_tool_calls() {
        let mut r = Reply::default();
        r.push(&call_delta(0, "call_9", "read", "{}"));
        r.done.finish_reason = "tool_calls".into();
        let body = reply(&context(), &r);
        let message = &body["choices"][0]["message"];
        assert_eq!(message["content"], Value::Null);
        assert_eq!(message["tool_calls"][0]["function"]["name"], "read");
        assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(body["model"], "qwen");
    }
}
