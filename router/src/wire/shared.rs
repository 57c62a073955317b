//! What the formats share: names in errors, finish reasons, deltas, tool schemas and images.
//! A leaf of `wire` beside `types`: the formats use it, it uses none of them.

use serde_json::Value;
use tollgate_proto::v1 as pb;

use super::types::WireError;
use crate::config::Api;

/// The format's name in messages.
pub(super) fn api_name(api: Api) -> &'static str {
    match api {
        Api::Openai => "OpenAI Chat Completions",
        Api::Anthropic => "Anthropic Messages",
        Api::OpenaiResponses => "OpenAI Responses",
    }
}

pub(super) fn malformed(api: Api, detail: impl Into<String>) -> WireError {
    WireError::Malformed {
        api: api_name(api),
        detail: detail.into(),
    }
}

pub(super) fn unsendable(api: Api, detail: impl Into<String>) -> WireError {
    WireError::Unsendable {
        api: api_name(api),
        detail: detail.into(),
    }
}

/// `end_turn`, `stop_sequence` → `stop`; `max_tokens` → `length`; `tool_use` (and OpenAI's
/// old `function_call`) → `tool_calls`; others unchanged.
pub(super) fn normalise_finish(reason: &str) -> String {
    match reason {
        "end_turn" | "stop_sequence" => "stop".into(),
        "max_tokens" => "length".into(),
        "tool_use" | "function_call" => "tool_calls".into(),
        other => other.into(),
    }
}

/// The error type of an error reply (`{"error": {"type": ...}}`); `None` when `error` is
/// absent or null (the Responses API always has the field).
pub(super) fn error_type(value: &Value) -> Option<String> {
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
pub(super) fn text_delta(text: impl Into<String>) -> pb::CompleteDelta {
    pb::CompleteDelta {
        text: text.into(),
        ..Default::default()
    }
}

/// A delta of a tool call.
pub(super) fn tool_delta(index: u32, id: &str, name: &str, arguments: &str) -> pb::CompleteDelta {
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
pub(super) fn thinking_delta(thinking: pb::ThinkingDelta) -> pb::CompleteDelta {
    pb::CompleteDelta {
        thinking: Some(thinking),
        ..Default::default()
    }
}

/// The text of a message: its `content`, then its text parts, joined by blank lines (for
/// places that take one string: system prompts, tool results as text).
pub(super) fn joined_text<'a>(
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
pub(super) fn tool_schema(api: Api, tool: &pb::ToolDefinition) -> Result<Value, WireError> {
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
pub(super) fn call_arguments(api: Api, call: &pb::ToolCall) -> Result<Value, WireError> {
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
pub(super) fn choice_mode(choice: Option<&pb::ToolChoice>) -> Option<pb::tool_choice::Mode> {
    let choice = choice?;
    match pb::tool_choice::Mode::try_from(choice.mode) {
        Ok(pb::tool_choice::Mode::Unspecified) | Err(_) => None,
        Ok(mode) => Some(mode),
    }
}

/// An image as a `data:` URL (inline bytes, or the `data:` URL it was given).
pub(super) fn image_data_url(api: Api, image: &pb::ImagePart) -> Result<String, WireError> {
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
pub(super) fn image_base64(api: Api, image: &pb::ImagePart) -> Result<(String, String), WireError> {
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

/// The tool choice and parallel-calls setting in OpenAI's two formats' shape, into `body`:
/// they differ only in how a named tool is written (`named`).
pub(super) fn insert_openai_tool_choice(
    body: &mut serde_json::Map<String, Value>,
    call: &pb::CompleteRequest,
    named: impl FnOnce(&str) -> Value,
) {
    if let Some(mode) = choice_mode(call.tool_choice.as_ref()) {
        use pb::tool_choice::Mode;
        let choice = match mode {
            Mode::Auto | Mode::Unspecified => serde_json::json!("auto"),
            Mode::None => serde_json::json!("none"),
            Mode::Required => serde_json::json!("required"),
            Mode::Named => named(
                call.tool_choice
                    .as_ref()
                    .map(|c| c.name.as_str())
                    .unwrap_or_default(),
            ),
        };
        body.insert("tool_choice".into(), choice);
    }
    if let Some(parallel) = call.tool_choice.as_ref().and_then(|c| c.parallel) {
        body.insert("parallel_tool_calls".into(), serde_json::json!(parallel));
    }
}

/// The call's required reply shape, when it asks for one: a JSON object, else the call
/// cannot be sent in `api`.
pub(super) fn response_format(
    api: Api,
    call: &pb::CompleteRequest,
) -> Result<Option<Value>, WireError> {
    if call.response_format_json.trim().is_empty() {
        return Ok(None);
    }
    serde_json::from_str(&call.response_format_json)
        .ok()
        .filter(Value::is_object)
        .map(Some)
        .ok_or_else(|| unsendable(api, "the response format is not a JSON object"))
}
