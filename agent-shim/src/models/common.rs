//! What the three APIs share: the request's refusal type, the parsed call, the pieces every
//! parser needs (images, stop sequences, tool choice) and the reply gathered from the
//! gateway's deltas.

use base64::Engine as _;
use serde_json::Value;
use tollgate_proto::v1 as pb;

/// A request the endpoint cannot carry, in one line that says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Invalid(pub(crate) String);

impl Invalid {
    /// A refusal saying `message`.
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// A request turned into a gateway call.
#[derive(Debug, Default)]
pub(crate) struct Call {
    /// The canonical call.
    pub(crate) request: pb::CompleteRequest,
    /// Tools that would run outside the gateway (hosted and server tools), dropped by name.
    pub(crate) dropped: Vec<String>,
    /// Whether an OpenAI chat stream asked for its usage chunk.
    pub(crate) include_usage: bool,
    /// The Responses API's custom (free-form) tools, carried as functions of one string
    /// `input` and turned back into `custom_tool_call` items in the reply.
    pub(crate) custom_tools: Vec<String>,
}

/// `value[key]` as a string, if it is one.
pub(crate) fn str_of<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str)
}

/// `value[key]` as an owned string, empty when absent.
pub(crate) fn string_of(value: &Value, key: &str) -> String {
    str_of(value, key).unwrap_or_default().to_owned()
}

/// `value[key]` when it is there and not `null`.
pub(crate) fn field<'a>(value: &'a Value, key: &str) -> Option<&'a Value> {
    value.get(key).filter(|v| !v.is_null())
}

/// `value[key]` as a float, if it is a number.
pub(crate) fn float_of(value: &Value, key: &str) -> Option<f32> {
    value.get(key).and_then(Value::as_f64).map(|f| f as f32)
}

/// The first of `keys` that holds a whole number, as a completion cap (0: none given).
pub(crate) fn cap_of(value: &Value, keys: &[&str]) -> u32 {
    keys.iter()
        .find_map(|key| value.get(*key).and_then(Value::as_u64))
        .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX))
}

/// Stop sequences: one string or a list of them.
pub(crate) fn stop_of(value: Option<&Value>) -> Vec<String> {
    match value {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    }
}

/// A text part.
pub(crate) fn text_part(text: impl Into<String>, cache: bool) -> pb::ContentPart {
    pb::ContentPart {
        part: Some(pb::content_part::Part::Text(text.into())),
        cache,
    }
}

/// Whether `value` carries Anthropic's prompt-caching mark.
pub(crate) fn cached(value: &Value) -> bool {
    field(value, "cache_control").is_some()
}

/// An image given as a `data:` URL. Any other URL is refused: a backend would fetch it from
/// outside the sandbox, and the sandbox's text must never name a place to fetch from.
pub(crate) fn image_from_url(url: &str) -> Result<pb::ImagePart, Invalid> {
    let Some(rest) = url.strip_prefix("data:") else {
        return Err(Invalid::new(
            "image URLs are not accepted (the backend would fetch them from outside the \
             sandbox): send the image inline as a data:image/...;base64, URL",
        ));
    };
    let Some((media_type, data)) = rest.split_once(";base64,") else {
        return Err(Invalid::new(
            "an image data: URL must be base64 (data:image/png;base64,...)",
        ));
    };
    image_from_base64(media_type, data)
}

/// An image given as base64 bytes and a media type.
pub(crate) fn image_from_base64(media_type: &str, data: &str) -> Result<pb::ImagePart, Invalid> {
    let data = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|e| Invalid::new(format!("an image's base64 data does not decode: {e}")))?;
    Ok(pb::ImagePart {
        media_type: media_type.to_owned(),
        data,
        url: String::new(),
    })
}

/// A message from its parts: a leading text part without a cache mark, when no other text
/// follows, becomes the message's `content` (what every backend reads first); the rest stay
/// parts, in order.
pub(crate) fn message(role: &str, mut parts: Vec<pb::ContentPart>) -> pb::ChatMessage {
    let is_text = |p: &pb::ContentPart| matches!(p.part, Some(pb::content_part::Part::Text(_)));
    let mut content = String::new();
    if parts.first().is_some_and(|p| is_text(p) && !p.cache) && !parts[1..].iter().any(is_text) {
        if let Some(pb::content_part::Part::Text(text)) = parts.remove(0).part {
            content = text;
        }
    }
    pb::ChatMessage {
        role: role.to_owned(),
        content,
        parts,
    }
}

/// A tool call part.
pub(crate) fn tool_call_part(id: &str, name: &str, arguments_json: String) -> pb::ContentPart {
    pb::ContentPart {
        part: Some(pb::content_part::Part::ToolCall(pb::ToolCall {
            id: id.to_owned(),
            name: name.to_owned(),
            arguments_json,
        })),
        cache: false,
    }
}

/// A tool result part.
pub(crate) fn tool_result_part(
    call_id: &str,
    content: Vec<pb::ContentPart>,
    is_error: bool,
    cache: bool,
) -> pb::ContentPart {
    pb::ContentPart {
        part: Some(pb::content_part::Part::ToolResult(pb::ToolResult {
            call_id: call_id.to_owned(),
            content,
            is_error,
        })),
        cache,
    }
}

/// The tool choice from its mode (`auto`, `none`, `required`/`any`, or a tool's name) and the
/// API's parallel-calls setting. A choice naming a tool the request does not carry (dropped,
/// or tools empty) falls back to what the model may do without it.
pub(crate) fn tool_choice(
    mode: Option<(pb::tool_choice::Mode, String)>,
    parallel: Option<bool>,
    tools: &[pb::ToolDefinition],
) -> Option<pb::ToolChoice> {
    if mode.is_none() && parallel.is_none() {
        return None;
    }
    let (mut mode, mut name) = mode.unwrap_or((pb::tool_choice::Mode::Unspecified, String::new()));
    if mode == pb::tool_choice::Mode::Named && !tools.iter().any(|t| t.name == name) {
        (mode, name) = (pb::tool_choice::Mode::Auto, String::new());
    }
    if tools.is_empty() && mode == pb::tool_choice::Mode::Required {
        mode = pb::tool_choice::Mode::Unspecified;
    }
    Some(pb::ToolChoice {
        mode: mode as i32,
        name,
        parallel,
    })
}

/// The parameters of a free-form tool carried as a function: one string, `input`.
pub(crate) fn input_schema() -> String {
    serde_json::json!({
        "type": "object",
        "properties": {"input": {"type": "string", "description": "The tool's input, as free text."}},
        "required": ["input"],
        "additionalProperties": false,
    })
    .to_string()
}

/// One block of a reply, in the order the model produced them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Block {
    /// Text.
    Text(String),
    /// Reasoning.
    Thinking(pb::ThinkingPart),
    /// A tool call, with its index among the reply's calls.
    Tool(u32, pb::ToolCall),
}

/// A whole reply, gathered from the gateway's deltas.
#[derive(Debug, Default)]
pub(crate) struct Reply {
    /// What the model produced.
    pub(crate) blocks: Vec<Block>,
    /// How it ended, and the counts.
    pub(crate) done: pb::CompleteDone,
}

impl Reply {
    /// Adds one delta: reasoning, then text, then a tool call's piece (a delta carries one of
    /// them in practice; this order is the order the APIs put them in).
    pub(crate) fn push(&mut self, delta: &pb::CompleteDelta) {
        if let Some(thinking) = delta.thinking.as_ref().filter(|t| !thinking_empty(t)) {
            match self.blocks.last_mut() {
                Some(Block::Thinking(last)) if continues(last, thinking) => {
                    last.text.push_str(&thinking.text);
                    last.signature.push_str(&thinking.signature);
                }
                _ => self.blocks.push(Block::Thinking(pb::ThinkingPart {
                    text: thinking.text.clone(),
                    signature: thinking.signature.clone(),
                    origin: thinking.origin.clone(),
                    redacted: thinking.redacted,
                    id: thinking.id.clone(),
                })),
            }
        }
        if !delta.text.is_empty() {
            match self.blocks.last_mut() {
                Some(Block::Text(text)) => text.push_str(&delta.text),
                _ => self.blocks.push(Block::Text(delta.text.clone())),
            }
        }
        if let Some(call) = &delta.tool_call {
            let known = self.blocks.iter_mut().find_map(|b| match b {
                Block::Tool(index, known) if *index == call.index => Some(known),
                _ => None,
            });
            match known {
                Some(known) => known.arguments_json.push_str(&call.arguments),
                None => self.blocks.push(Block::Tool(
                    call.index,
                    pb::ToolCall {
                        id: call.id.clone(),
                        name: call.name.clone(),
                        arguments_json: call.arguments.clone(),
                    },
                )),
            }
        }
    }

    /// The reply's text, all of it.
    pub(crate) fn text(&self) -> String {
        self.blocks
            .iter()
            .filter_map(|b| match b {
                Block::Text(text) => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }
}

/// Whether a thinking delta carries nothing.
pub(crate) fn thinking_empty(thinking: &pb::ThinkingDelta) -> bool {
    thinking.text.is_empty() && thinking.signature.is_empty() && !thinking.redacted
}

/// Whether `delta` goes on with the reasoning block `last` (rather than starting another).
pub(crate) fn continues(last: &pb::ThinkingPart, delta: &pb::ThinkingDelta) -> bool {
    !last.redacted && !delta.redacted && (delta.id.is_empty() || delta.id == last.id)
}

/// A tool call's id: the backend's, or one made from the call's id and the call's index when
/// the backend gave none (some local servers do not).
pub(crate) fn call_id(given: &str, call: &str, index: u32) -> String {
    if given.is_empty() {
        format!("call_{}_{index}", call.replace('-', ""))
    } else {
        given.to_owned()
    }
}

/// The canonical finish reason ("stop" when the backend said nothing).
pub(crate) fn finish(done: &pb::CompleteDone) -> &str {
    if done.finish_reason.is_empty() {
        "stop"
    } else {
        &done.finish_reason
    }
}

/// Prompt and completion tokens charged.
pub(crate) fn usage(done: &pb::CompleteDone) -> (u64, u64) {
    (
        done.prompt.map_or(0, |c| c.tokens),
        done.completion.map_or(0, |c| c.tokens),
    )
}

/// The model to name in a reply: the one that served the call.
pub(crate) fn served_model(started: &pb::CompleteStarted) -> &str {
    if started.model.is_empty() {
        &started.route
    } else {
        &started.model
    }
}

/// Seconds since the epoch.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta(text: &str, call: Option<(u32, &str, &str, &str)>) -> pb::CompleteDelta {
        pb::CompleteDelta {
            text: text.into(),
            tool_call: call.map(|(index, id, name, arguments)| pb::ToolCallDelta {
                index,
                id: id.into(),
                name: name.into(),
                arguments: arguments.into(),
            }),
            thinking: None,
        }
    }

    #[test]
    fn replies_gather_text_and_calls_by_index() {
        let mut reply = Reply::default();
        for d in [
            delta("Let me ", None),
            delta("look.", None),
            delta("", Some((0, "call_1", "read", "{\"pa"))),
            delta("", Some((1, "call_2", "list", "{}"))),
            delta("", Some((0, "", "", "th\":1}"))),
        ] {
            reply.push(&d);
        }
        assert_eq!(reply.text(), "Let me look.");
        assert_eq!(reply.blocks.len(), 3);
        let Block::Tool(0, call) = &reply.blocks[1] else {
            panic!("{:?}", reply.blocks)
        };
        assert_eq!(call.arguments_json, "{\"path\":1}");
    }

    #[test]
    fn a_lone_leading_text_becomes_content() {
        let m = message("user", vec![text_part("hi", false)]);
        assert_eq!((m.content.as_str(), m.parts.len()), ("hi", 0));
        let m = message("user", vec![text_part("a", false), text_part("b", false)]);
        assert_eq!((m.content.as_str(), m.parts.len()), ("", 2));
        let m = message("user", vec![text_part("a", true)]);
        assert_eq!((m.content.as_str(), m.parts.len()), ("", 1));
        let m = message(
            "assistant",
            vec![text_part("a", false), tool_call_part("c", "t", "{}".into())],
        );
        assert_eq!((m.content.as_str(), m.parts.len()), ("a", 1));
    }

    #[test]
    fn only_inline_images_are_accepted() {
        let image = image_from_url("data:image/png;base64,aGk=").unwrap();
        assert_eq!(
            (image.media_type.as_str(), image.data.as_slice()),
            ("image/png", &b"hi"[..])
        );
        assert!(image_from_url("https://example.com/x.png")
            .unwrap_err()
            .0
            .contains("not accepted"));
        assert!(image_from_url("data:image/png,raw").is_err());
    }
}
