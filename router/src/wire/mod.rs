//! The wire formats model backends speak: OpenAI Chat Completions (every local preset, and
//! OpenAI-style cloud routes), Anthropic Messages and the OpenAI Responses API.
//!
//! A request body is built from scratch for each call from the canonical call
//! ([`pb::CompleteRequest`]: messages with their parts, tools, tool choice, response format,
//! reasoning), never from what the agent sent: no header, no unknown field travels. Each
//! format gets what it can carry: tool calls, their ids and their results cross between
//! formats (an Anthropic agent on a llama.cpp route keeps its tools), thinking goes back only
//! to the format that produced it, and Anthropic's cache marks only to Anthropic.
//!
//! Replies, whole ([`parse_reply`]) or streamed as server-sent events ([`StreamDecoder`]),
//! become canonical deltas ([`pb::CompleteDelta`]: text, pieces of tool calls, pieces of
//! thinking), a finish reason normalised to `stop`, `length`, `tool_calls`,
//! `content_filter` (or the backend's own word), and the server's token counts. Pure: the
//! I/O is `tollgate_router_backends`'.

mod anthropic;
pub mod openai_chat;
mod responses;

use serde_json::Value;
use tollgate_proto::v1 as pb;

use crate::config::Api;
use crate::sse::SseEvent;

/// Who said a message, as the canonical call names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Instructions (`system`, or OpenAI's `developer`).
    System,
    /// The user (the agent).
    User,
    /// The model.
    Assistant,
    /// Results of tool calls (its parts are `tool_result`s).
    Tool,
}

impl Role {
    /// From the canonical name: `system` (or `developer`), `user`, `assistant`, `tool`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "system" | "developer" => Some(Self::System),
            "user" => Some(Self::User),
            "assistant" => Some(Self::Assistant),
            "tool" => Some(Self::Tool),
            _ => None,
        }
    }

    /// The canonical name.
    pub fn name(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::User => "user",
            Self::Assistant => "assistant",
            Self::Tool => "tool",
        }
    }
}

/// A call as the router sends it to one route.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    /// The route's model.
    pub model: String,
    /// The canonical call, as it leaves: already redacted when the route redacts, and
    /// `max_tokens` the completion cap to send (already lowered to the budget). Its `route`
    /// and `local_only` are the router's and never sent.
    pub call: pb::CompleteRequest,
}

/// Why a request cannot be built or a reply cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The call holds something this format cannot carry, or that is not well formed.
    #[error("the call cannot be sent as {api}: {detail}")]
    Unsendable {
        /// Which format.
        api: &'static str,
        /// What was wrong and what would do.
        detail: String,
    },
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
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Completion {
    /// What the model said, in order: text, tool calls (each whole, in one delta) and
    /// thinking.
    pub deltas: Vec<pb::CompleteDelta>,
    /// `stop`, `length`, `tool_calls`, `content_filter` or what the server said.
    pub finish_reason: String,
    /// Prompt tokens, when the server counted them (Anthropic's cache reads and writes
    /// included).
    pub prompt_tokens: Option<u64>,
    /// Completion tokens, when the server counted them.
    pub completion_tokens: Option<u64>,
}

impl Completion {
    /// The reply's text, its text deltas joined.
    pub fn text(&self) -> String {
        self.deltas.iter().map(|d| d.text.as_str()).collect()
    }
}

/// Something a streamed reply said.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamItem {
    /// More of the reply: text, a piece of a tool call, or a piece of thinking.
    Delta(pb::CompleteDelta),
    /// Why it stopped (normalised: `stop`, `length`, `tool_calls`, ...).
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

/// The request path and JSON body of `request` for `api`.
pub fn request(api: Api, request: &ChatRequest) -> Result<(&'static str, Vec<u8>), WireError> {
    let (path, body) = match api {
        Api::Openai => ("/v1/chat/completions", openai_chat::body(request)?),
        Api::Anthropic => ("/v1/messages", anthropic::body(request)?),
        Api::OpenaiResponses => ("/v1/responses", responses::body(request)?),
    };
    Ok((path, body.to_string().into_bytes()))
}

/// Decodes a whole reply of `api`.
pub fn parse_reply(api: Api, body: &[u8]) -> Result<Completion, WireError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| malformed(api, e.to_string()))?;
    if let Some(kind) = error_type(&value) {
        return Err(WireError::Backend(kind));
    }
    match api {
        Api::Openai => openai_chat::parse(&value),
        Api::Anthropic => anthropic::parse(&value),
        Api::OpenaiResponses => responses::parse(&value),
    }
}

/// Decodes a streamed reply event by event. Stateful: a format's events refer to earlier
/// ones (Anthropic's content block index, the Responses API's output index, OpenAI's tool
/// call index), and each becomes the index of a tool call in this reply (0, 1, ... in the
/// order the calls began).
#[derive(Debug)]
pub struct StreamDecoder {
    api: Api,
    state: DecoderState,
}

#[derive(Debug)]
enum DecoderState {
    Openai(openai_chat::Stream),
    Anthropic(anthropic::Stream),
    Responses(responses::Stream),
}

impl StreamDecoder {
    /// A decoder at the start of a reply of `api`.
    pub fn new(api: Api) -> Self {
        let state = match api {
            Api::Openai => DecoderState::Openai(openai_chat::Stream::default()),
            Api::Anthropic => DecoderState::Anthropic(anthropic::Stream::default()),
            Api::OpenaiResponses => DecoderState::Responses(responses::Stream::default()),
        };
        Self { api, state }
    }

    /// Decodes the next event.
    pub fn event(&mut self, event: &SseEvent) -> Result<Vec<StreamItem>, WireError> {
        if self.api == Api::Openai && event.data.trim() == "[DONE]" {
            return Ok(vec![StreamItem::Done]);
        }
        let value: Value =
            serde_json::from_str(&event.data).map_err(|e| malformed(self.api, e.to_string()))?;
        if let Some(kind) = error_type(&value) {
            return Err(WireError::Backend(kind));
        }
        match &mut self.state {
            DecoderState::Openai(stream) => Ok(stream.event(&value)),
            DecoderState::Anthropic(stream) => Ok(stream.event(&value)),
            DecoderState::Responses(stream) => stream.event(&value),
        }
    }
}

/// The format's name in messages.
fn api_name(api: Api) -> &'static str {
    match api {
        Api::Openai => "OpenAI Chat Completions",
        Api::Anthropic => "Anthropic Messages",
        Api::OpenaiResponses => "OpenAI Responses",
    }
}

fn malformed(api: Api, detail: impl Into<String>) -> WireError {
    WireError::Malformed {
        api: api_name(api),
        detail: detail.into(),
    }
}

fn unsendable(api: Api, detail: impl Into<String>) -> WireError {
    WireError::Unsendable {
        api: api_name(api),
        detail: detail.into(),
    }
}

/// `end_turn`, `stop_sequence` → `stop`; `max_tokens` → `length`; `tool_use` (and OpenAI's
/// old `function_call`) → `tool_calls`; others unchanged.
fn normalise_finish(reason: &str) -> String {
    match reason {
        "end_turn" | "stop_sequence" => "stop".into(),
        "max_tokens" => "length".into(),
        "tool_use" | "function_call" => "tool_calls".into(),
        other => other.into(),
    }
}

/// The error type of an error reply (`{"error": {"type": ...}}`); `None` when `error` is
/// absent or null (the Responses API always has the field).
fn error_type(value: &Value) -> Option<String> {
    let error = value.get("error").filter(|e| !e.is_null())?;
    Some(
        error
            .get("type")
            .or_else(|| error.get("code"))
            .and_then(Value::as_str)
            .unwrap_or("error")
            .to_owned(),
    )
}

/// A delta of text.
fn text_delta(text: impl Into<String>) -> pb::CompleteDelta {
    pb::CompleteDelta {
        text: text.into(),
        ..Default::default()
    }
}

/// A delta of a tool call.
fn tool_delta(index: u32, id: &str, name: &str, arguments: &str) -> pb::CompleteDelta {
    pb::CompleteDelta {
        tool_call: Some(pb::ToolCallDelta {
            index,
            id: id.to_owned(),
            name: name.to_owned(),
            arguments: arguments.to_owned(),
        }),
        ..Default::default()
    }
}

/// A delta of thinking.
fn thinking_delta(thinking: pb::ThinkingDelta) -> pb::CompleteDelta {
    pb::CompleteDelta {
        thinking: Some(thinking),
        ..Default::default()
    }
}

/// The text of a message: its `content`, then its text parts, joined by blank lines (for
/// places that take one string: system prompts, tool results as text).
fn joined_text<'a>(
    content: &'a str,
    parts: impl IntoIterator<Item = &'a pb::ContentPart>,
) -> String {
    let mut texts: Vec<&str> = Vec::new();
    if !content.is_empty() {
        texts.push(content);
    }
    for part in parts {
        if let Some(pb::content_part::Part::Text(text)) = &part.part {
            if !text.is_empty() {
                texts.push(text);
            }
        }
    }
    texts.join("\n\n")
}

/// A tool definition's parameters as a JSON Schema object (an empty one when none are
/// given).
fn tool_schema(api: Api, tool: &pb::ToolDefinition) -> Result<Value, WireError> {
    if tool.parameters_json.trim().is_empty() {
        return Ok(serde_json::json!({"type": "object", "properties": {}}));
    }
    let schema: Value = serde_json::from_str(&tool.parameters_json).map_err(|e| {
        unsendable(
            api,
            format!("tool {:?}: the parameters are not JSON ({e})", tool.name),
        )
    })?;
    if !schema.is_object() {
        return Err(unsendable(
            api,
            format!(
                "tool {:?}: the parameters must be a JSON Schema object",
                tool.name
            ),
        ));
    }
    Ok(schema)
}

/// A tool call's arguments as a JSON object (`{}` when empty).
fn call_arguments(api: Api, call: &pb::ToolCall) -> Result<Value, WireError> {
    if call.arguments_json.trim().is_empty() {
        return Ok(Value::Object(serde_json::Map::new()));
    }
    match serde_json::from_str::<Value>(&call.arguments_json) {
        Ok(value) if value.is_object() => Ok(value),
        _ => Err(unsendable(
            api,
            format!(
                "tool call {:?}: its arguments are not a JSON object",
                call.id
            ),
        )),
    }
}

/// The tool choice's mode, `None` when it leaves the backend's default.
fn choice_mode(choice: Option<&pb::ToolChoice>) -> Option<pb::tool_choice::Mode> {
    let choice = choice?;
    match pb::tool_choice::Mode::try_from(choice.mode) {
        Ok(pb::tool_choice::Mode::Unspecified) | Err(_) => None,
        Ok(mode) => Some(mode),
    }
}

/// An image as a `data:` URL (inline bytes, or the `data:` URL it was given).
fn image_data_url(api: Api, image: &pb::ImagePart) -> Result<String, WireError> {
    use base64::Engine as _;
    if !image.data.is_empty() {
        let media = if image.media_type.is_empty() {
            "image/png"
        } else {
            image.media_type.as_str()
        };
        let data = base64::engine::general_purpose::STANDARD.encode(&image.data);
        return Ok(format!("data:{media};base64,{data}"));
    }
    if image.url.starts_with("data:") {
        return Ok(image.url.clone());
    }
    Err(unsendable(
        api,
        "an image must be inline data or a data: URL (a URL for the backend to fetch is never sent)",
    ))
}

/// An image's media type and base64 data (for Anthropic's `source`).
fn image_base64(api: Api, image: &pb::ImagePart) -> Result<(String, String), WireError> {
    let url = image_data_url(api, image)?;
    // data:<media>;base64,<data>
    let rest = url.strip_prefix("data:").unwrap_or_default();
    match rest.split_once(',') {
        Some((meta, data)) if meta.ends_with(";base64") => {
            Ok((meta.trim_end_matches(";base64").to_owned(), data.to_owned()))
        }
        _ => Err(unsendable(
            api,
            "an image's data: URL must be base64 (data:image/png;base64,...)",
        )),
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_replies;
