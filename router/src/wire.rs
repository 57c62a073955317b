//! The two wire formats model backends speak: OpenAI Chat Completions (every local preset,
//! and OpenAI-style cloud routes) and Anthropic Messages. Request bodies are built from
//! scratch for each call (nothing of the caller's request is passed through: no headers, no
//! unknown fields); replies, whole or streamed as server-sent events, are decoded into text
//! deltas, a finish reason and the server's token counts where it gives them. Pure: the
//! supervisor does the I/O.

use serde_json::{json, Value};

use crate::config::Api;
use crate::sse::SseEvent;

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Instructions.
    System,
    /// The user (the agent).
    User,
    /// The model.
    Assistant,
}

impl Role {
    /// From the API's name (`system`, `user`, `assistant`; `developer` is `system`).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "system" | "developer" => Some(Self::System),
            "user" => Some(Self::User),
            "assistant" => Some(Self::Assistant),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::User => "user",
            Self::Assistant => "assistant",
        }
    }
}

/// One message of a chat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// Who said it.
    pub role: Role,
    /// What was said.
    pub content: String,
}

/// A chat request as the router sends it.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    /// The route's model.
    pub model: String,
    /// The messages (as sent: redacted when the route redacts).
    pub messages: Vec<ChatMessage>,
    /// The completion cap (already lowered to the budget).
    pub max_tokens: u32,
    /// Whether the reply streams.
    pub stream: bool,
    /// Sampling temperature, if asked.
    pub temperature: Option<f32>,
    /// Stop sequences.
    pub stop: Vec<String>,
}

/// The request path and JSON body for `api`.
pub fn request(api: Api, request: &ChatRequest) -> (&'static str, Vec<u8>) {
    let body = match api {
        Api::Openai => openai_body(request),
        Api::Anthropic => anthropic_body(request),
    };
    let path = match api {
        Api::Openai => "/v1/chat/completions",
        Api::Anthropic => "/v1/messages",
    };
    (path, body.to_string().into_bytes())
}

fn openai_body(request: &ChatRequest) -> Value {
    let messages: Vec<Value> = request
        .messages
        .iter()
        .map(|m| json!({"role": m.role.name(), "content": m.content}))
        .collect();
    let mut body = json!({
        "model": request.model,
        "messages": messages,
        "max_tokens": request.max_tokens,
        "stream": request.stream,
    });
    if request.stream {
        // Usage arrives in a last chunk only when asked for.
        body["stream_options"] = json!({"include_usage": true});
    }
    if let Some(t) = request.temperature {
        body["temperature"] = json!(t);
    }
    if !request.stop.is_empty() {
        body["stop"] = json!(request.stop);
    }
    body
}

fn anthropic_body(request: &ChatRequest) -> Value {
    // System text goes apart; consecutive turns of one role are merged (the API wants them
    // alternating).
    let system: Vec<&str> = request
        .messages
        .iter()
        .filter(|m| m.role == Role::System)
        .map(|m| m.content.as_str())
        .collect();
    let mut turns: Vec<(Role, String)> = Vec::new();
    for m in request.messages.iter().filter(|m| m.role != Role::System) {
        match turns.last_mut() {
            Some((role, text)) if *role == m.role => {
                text.push_str("\n\n");
                text.push_str(&m.content);
            }
            _ => turns.push((m.role, m.content.clone())),
        }
    }
    let messages: Vec<Value> = turns
        .into_iter()
        .map(|(role, content)| json!({"role": role.name(), "content": content}))
        .collect();
    let mut body = json!({
        "model": request.model,
        "max_tokens": request.max_tokens,
        "messages": messages,
        "stream": request.stream,
    });
    if !system.is_empty() {
        body["system"] = json!(system.join("\n\n"));
    }
    if let Some(t) = request.temperature {
        body["temperature"] = json!(t);
    }
    if !request.stop.is_empty() {
        body["stop_sequences"] = json!(request.stop);
    }
    body
}

/// Why a reply cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Not the JSON the format promises.
    #[error("the backend's reply is not valid {api} JSON: {detail}")]
    Malformed {
        /// Which format.
        api: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// The backend reported an error (its type only: messages may echo keys).
    #[error("the backend reported an error ({0})")]
    Backend(String),
}

/// A whole (not streamed) reply.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Completion {
    /// The text.
    pub text: String,
    /// `stop`, `length`, `content_filter` or what the server said.
    pub finish_reason: String,
    /// Prompt tokens, when the server counted them.
    pub prompt_tokens: Option<u64>,
    /// Completion tokens, when the server counted them.
    pub completion_tokens: Option<u64>,
}

/// Something a streamed reply said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamItem {
    /// More text.
    Delta(String),
    /// Why it stopped (normalised: `stop`, `length`, ...).
    Finish(String),
    /// Token counts (the latest report wins; Anthropic's are cumulative).
    Usage {
        /// Prompt tokens, if given.
        prompt: Option<u64>,
        /// Completion tokens, if given.
        completion: Option<u64>,
    },
    /// The stream is complete.
    Done,
}

fn malformed(api: Api, detail: impl Into<String>) -> WireError {
    WireError::Malformed {
        api: match api {
            Api::Openai => "OpenAI",
            Api::Anthropic => "Anthropic",
        },
        detail: detail.into(),
    }
}

/// `end_turn`, `stop_sequence` → `stop`; `max_tokens` → `length`; others unchanged.
fn normalise_finish(reason: &str) -> String {
    match reason {
        "end_turn" | "stop_sequence" => "stop".into(),
        "max_tokens" => "length".into(),
        other => other.into(),
    }
}

fn error_type(value: &Value) -> Option<String> {
    let error = value.get("error")?;
    Some(
        error
            .get("type")
            .or_else(|| error.get("code"))
            .and_then(Value::as_str)
            .unwrap_or("error")
            .to_owned(),
    )
}

/// Decodes a whole reply of `api`.
pub fn parse_reply(api: Api, body: &[u8]) -> Result<Completion, WireError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| malformed(api, e.to_string()))?;
    if let Some(kind) = error_type(&value) {
        return Err(WireError::Backend(kind));
    }
    match api {
        Api::Openai => {
            let choice = value
                .pointer("/choices/0")
                .ok_or_else(|| malformed(api, "no choices"))?;
            Ok(Completion {
                text: choice
                    .pointer("/message/content")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                finish_reason: choice
                    .get("finish_reason")
                    .and_then(Value::as_str)
                    .map(normalise_finish)
                    .unwrap_or_default(),
                prompt_tokens: value
                    .pointer("/usage/prompt_tokens")
                    .and_then(Value::as_u64),
                completion_tokens: value
                    .pointer("/usage/completion_tokens")
                    .and_then(Value::as_u64),
            })
        }
        Api::Anthropic => {
            let blocks = value
                .get("content")
                .and_then(Value::as_array)
                .ok_or_else(|| malformed(api, "no content"))?;
            Ok(Completion {
                text: blocks
                    .iter()
                    .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
                    .filter_map(|b| b.get("text").and_then(Value::as_str))
                    .collect(),
                finish_reason: value
                    .get("stop_reason")
                    .and_then(Value::as_str)
                    .map(normalise_finish)
                    .unwrap_or_default(),
                prompt_tokens: anthropic_prompt_tokens(value.get("usage")),
                completion_tokens: value
                    .pointer("/usage/output_tokens")
                    .and_then(Value::as_u64),
            })
        }
    }
}

/// Input tokens, cache reads and writes included.
fn anthropic_prompt_tokens(usage: Option<&Value>) -> Option<u64> {
    let usage = usage?;
    let input = usage.get("input_tokens").and_then(Value::as_u64)?;
    let cached = ["cache_creation_input_tokens", "cache_read_input_tokens"]
        .iter()
        .filter_map(|k| usage.get(*k).and_then(Value::as_u64))
        .fold(0u64, u64::saturating_add);
    Some(input.saturating_add(cached))
}

/// Decodes one server-sent event of a streamed reply of `api`.
pub fn stream_event(api: Api, event: &SseEvent) -> Result<Vec<StreamItem>, WireError> {
    if api == Api::Openai && event.data.trim() == "[DONE]" {
        return Ok(vec![StreamItem::Done]);
    }
    let value: Value =
        serde_json::from_str(&event.data).map_err(|e| malformed(api, e.to_string()))?;
    if let Some(kind) = error_type(&value) {
        return Err(WireError::Backend(kind));
    }
    let mut items = Vec::new();
    match api {
        Api::Openai => {
            if let Some(choice) = value.pointer("/choices/0") {
                if let Some(text) = choice.pointer("/delta/content").and_then(Value::as_str) {
                    if !text.is_empty() {
                        items.push(StreamItem::Delta(text.to_owned()));
                    }
                }
                if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                    items.push(StreamItem::Finish(normalise_finish(reason)));
                }
            }
            // Usage may come on its own last chunk or on the finish chunk.
            if let Some(usage) = value.get("usage").filter(|u| !u.is_null()) {
                items.push(StreamItem::Usage {
                    prompt: usage.get("prompt_tokens").and_then(Value::as_u64),
                    completion: usage.get("completion_tokens").and_then(Value::as_u64),
                });
            }
        }
        Api::Anthropic => match value.get("type").and_then(Value::as_str) {
            Some("message_start") => items.push(StreamItem::Usage {
                prompt: anthropic_prompt_tokens(value.pointer("/message/usage")),
                completion: value
                    .pointer("/message/usage/output_tokens")
                    .and_then(Value::as_u64),
            }),
            Some("content_block_delta")
                if value.pointer("/delta/type").and_then(Value::as_str) == Some("text_delta") =>
            {
                if let Some(text) = value.pointer("/delta/text").and_then(Value::as_str) {
                    items.push(StreamItem::Delta(text.to_owned()));
                }
            }
            Some("message_delta") => {
                if let Some(reason) = value.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    items.push(StreamItem::Finish(normalise_finish(reason)));
                }
                if let Some(usage) = value.get("usage") {
                    items.push(StreamItem::Usage {
                        prompt: anthropic_prompt_tokens(Some(usage)),
                        completion: usage.get("output_tokens").and_then(Value::as_u64),
                    });
                }
            }
            Some("message_stop") => items.push(StreamItem::Done),
            _ => {}
        },
    }
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::SseParser;

    fn chat(stream: bool) -> ChatRequest {
        ChatRequest {
            model: "m".into(),
            messages: vec![
                ChatMessage {
                    role: Role::System,
                    content: "be brief".into(),
                },
                ChatMessage {
                    role: Role::User,
                    content: "hi".into(),
                },
                ChatMessage {
                    role: Role::User,
                    content: "again".into(),
                },
            ],
            max_tokens: 64,
            stream,
            temperature: None,
            stop: vec![],
        }
    }

    fn body(api: Api, stream: bool) -> Value {
        let (_, bytes) = request(api, &chat(stream));
        serde_json::from_slice(&bytes).unwrap()
    }

    #[test]
    fn requests_are_built_for_each_format() {
        let openai = body(Api::Openai, true);
        assert_eq!(openai["stream_options"]["include_usage"], true);
        assert_eq!(openai["messages"].as_array().unwrap().len(), 3);
        assert_eq!(openai["max_tokens"], 64);
        assert!(body(Api::Openai, false).get("stream_options").is_none());
        let anthropic = body(Api::Anthropic, true);
        assert_eq!(anthropic["system"], "be brief");
        assert_eq!(
            anthropic["messages"],
            json!([{"role": "user", "content": "hi\n\nagain"}])
        );
        assert_eq!(request(Api::Anthropic, &chat(true)).0, "/v1/messages");
    }

    fn stream(api: Api, text: &str) -> Result<Vec<StreamItem>, WireError> {
        let mut parser = SseParser::new();
        let mut items = Vec::new();
        for event in parser.push(text.as_bytes()).unwrap() {
            items.extend(stream_event(api, &event)?);
        }
        Ok(items)
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
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":4}}\n\n"
                .into(),
            "data: [DONE]\n\n".into(),
        ]
        .concat();
        assert_eq!(
            stream(Api::Openai, &text).unwrap(),
            vec![
                StreamItem::Delta("Hel".into()),
                StreamItem::Delta("lo".into()),
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
                StreamItem::Delta("Hi".into()),
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
                openai.text.as_str(),
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
                anthropic.text.as_str(),
                anthropic.finish_reason.as_str(),
                anthropic.prompt_tokens
            ),
            ("Hello", "length", Some(11))
        );
        assert!(parse_reply(Api::Openai, b"not json").is_err());
    }
}
