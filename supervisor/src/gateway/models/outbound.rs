//! Everything of a call that leaves the host, as text the classifier can read.
//!
//! A call carries more than its messages' text: text parts, the tools offered (name,
//! description, parameter schema), the model's earlier tool calls (ids, names, arguments),
//! the tools' results, readable reasoning, stop sequences and the reply's required shape.
//! [`texts`] lists every one of them in a fixed order, [`apply`] puts the texts back (as a
//! redacting route sends them) in that same order, so nothing that leaves escapes the
//! classifier. What is not text is handled apart: images cannot be read (a call with one is
//! rated high), and opaque reasoning signatures go back only to where they came from (see
//! [`super::signatures`]).
//!
//! JSON fields (tool parameters, tool arguments, the response format) are checked and
//! rewritten in their canonical form before anything reads them, so an escape such as
//! `\u0041` cannot hide a secret's letters from the classifier, and a redaction inside them
//! keeps them valid JSON.

use serde_json::Value;
use tollgate_proto::v1 as pb;
use tollgate_proto::v1::content_part::Part;
use tollgate_router::Classifier;

use super::signatures::Signatures;

/// What a text is, so a redaction keeps it usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Free text.
    Text,
    /// JSON text, which must stay valid JSON.
    Json,
    /// An id or a name (tool call ids, tool names): classified like any text.
    Id,
}

/// The roles a message may have.
const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];
/// The wire formats whose reasoning a call may carry back.
const ORIGINS: [&str; 2] = ["anthropic", "openai-responses"];
/// The reasoning levels the APIs name ("": the backend's default).
const REASONING_EFFORTS: [&str; 7] = ["", "none", "minimal", "low", "medium", "high", "xhigh"];
/// Longest tool name (the APIs' own limit is 64; some servers allow 128).
pub const MAX_TOOL_NAME: usize = 128;

/// Calls `f` on every text of `request` that leaves the host, in a fixed order: each
/// message's content then its parts (text, a tool call's id, name and arguments, a tool
/// result's call id and its texts, readable reasoning and its item id), then the stop
/// sequences, the tools (name, description, parameters), the tool choice's name and the
/// response format.
fn visit(request: &mut pb::CompleteRequest, f: &mut impl FnMut(Kind, &mut String)) {
    for message in &mut request.messages {
        f(Kind::Text, &mut message.content);
        for part in &mut message.parts {
            visit_part(part, f);
        }
    }
    for stop in &mut request.stop {
        f(Kind::Text, stop);
    }
    for tool in &mut request.tools {
        f(Kind::Id, &mut tool.name);
        f(Kind::Text, &mut tool.description);
        f(Kind::Json, &mut tool.parameters_json);
    }
    if let Some(choice) = &mut request.tool_choice {
        f(Kind::Id, &mut choice.name);
    }
    f(Kind::Json, &mut request.response_format_json);
}

fn visit_part(part: &mut pb::ContentPart, f: &mut impl FnMut(Kind, &mut String)) {
    match &mut part.part {
        Some(Part::Text(text)) => f(Kind::Text, text),
        Some(Part::ToolCall(call)) => {
            f(Kind::Id, &mut call.id);
            f(Kind::Id, &mut call.name);
            f(Kind::Json, &mut call.arguments_json);
        }
        Some(Part::ToolResult(result)) => {
            f(Kind::Id, &mut result.call_id);
            for inner in &mut result.content {
                visit_part(inner, f);
            }
        }
        Some(Part::Thinking(thinking)) => {
            f(Kind::Text, &mut thinking.text);
            f(Kind::Id, &mut thinking.id);
        }
        // Pixels are not text: see `first_image`.
        Some(Part::Image(_)) | None => {}
    }
}

/// Every text of `request` that leaves the host, in [`visit`]'s order.
pub(crate) fn texts(request: &pb::CompleteRequest) -> Vec<(Kind, String)> {
    let mut copy = request.clone();
    let mut texts = Vec::new();
    visit(&mut copy, &mut |kind, text| {
        texts.push((kind, std::mem::take(text)));
    });
    texts
}

/// Puts `sent` (one text per [`texts`] entry, in its order) into `request`.
pub(crate) fn apply(request: &mut pb::CompleteRequest, sent: Vec<String>) {
    let mut sent = sent.into_iter();
    visit(request, &mut |_, text| {
        if let Some(next) = sent.next() {
            *text = next;
        }
    });
}

/// The number of the first message that carries an image (in a part or a tool result).
pub(crate) fn first_image(request: &pb::CompleteRequest) -> Option<usize> {
    fn has_image(part: &pb::ContentPart) -> bool {
        match &part.part {
            Some(Part::Image(_)) => true,
            Some(Part::ToolResult(result)) => result.content.iter().any(has_image),
            _ => false,
        }
    }
    request
        .messages
        .iter()
        .position(|m| m.parts.iter().any(has_image))
}

/// How many tool calls the request's messages carry (for the audit, never their names).
pub(crate) fn tool_calls_in(request: &pb::CompleteRequest) -> usize {
    request
        .messages
        .iter()
        .flat_map(|m| &m.parts)
        .filter(|p| matches!(p.part, Some(Part::ToolCall(_))))
        .count()
}

/// Drops each thinking part whose signature `route`'s backend did not issue for this run (it
/// cannot be read, so it could carry anything, and another route's may be made from text this
/// one may not receive); a message left with nothing is dropped too. Returns how many parts
/// were dropped.
pub(crate) fn drop_unissued_thinking(
    request: &mut pb::CompleteRequest,
    issued: &Signatures,
    route: &str,
) -> usize {
    let mut dropped = 0;
    for message in &mut request.messages {
        let before = message.parts.len();
        message.parts.retain(|part| match &part.part {
            Some(Part::Thinking(t)) => {
                t.signature.is_empty() || issued.issued(route, &t.origin, &t.signature)
            }
            _ => true,
        });
        let gone = before - message.parts.len();
        dropped += gone;
        if gone > 0 && message.parts.is_empty() && message.content.is_empty() {
            message.role.clear();
        }
    }
    request.messages.retain(|m| !m.role.is_empty());
    dropped
}

/// Checks what the bounds cannot: known roles, tool names, JSON fields that parse (each is
/// rewritten in canonical form), images inline, reasoning settings that are not free text.
/// The error is one line naming the field.
pub(crate) fn normalise(request: &mut pb::CompleteRequest) -> Result<(), String> {
    if request.messages.is_empty() {
        return Err("a call needs 1 or more messages".into());
    }
    for (i, message) in request.messages.iter_mut().enumerate() {
        if !ROLES.contains(&message.role.as_str()) {
            return Err(format!(
                "messages[{i}].role is not one of {} ({} bytes given)",
                ROLES.join(", "),
                message.role.len()
            ));
        }
        for (j, part) in message.parts.iter_mut().enumerate() {
            normalise_part(part, false).map_err(|e| format!("messages[{i}].parts[{j}]{e}"))?;
        }
    }
    for (i, tool) in request.tools.iter_mut().enumerate() {
        tool_name(&tool.name).map_err(|e| format!("tools[{i}].name {e}"))?;
        canonical_json(&mut tool.parameters_json, true)
            .map_err(|e| format!("tools[{i}].parameters_json {e}"))?;
    }
    if let Some(choice) = &request.tool_choice {
        let named = choice.mode == pb::tool_choice::Mode::Named as i32;
        if named {
            tool_name(&choice.name).map_err(|e| format!("tool_choice.name {e}"))?;
        } else if !choice.name.is_empty() {
            return Err("tool_choice.name is only for the named mode".into());
        }
    }
    canonical_json(&mut request.response_format_json, true)
        .map_err(|e| format!("response_format_json {e}"))?;
    if let Some(reasoning) = &request.reasoning {
        // Sent upstream as it is and never classified: only the APIs' own levels, so it
        // carries nothing but a choice among them.
        if !REASONING_EFFORTS.contains(&reasoning.effort.as_str()) {
            return Err(format!(
                "reasoning.effort {:?} is not one of {}",
                reasoning.effort.chars().take(32).collect::<String>(),
                REASONING_EFFORTS[1..].join(", ")
            ));
        }
    }
    Ok(())
}

fn normalise_part(part: &mut pb::ContentPart, in_result: bool) -> Result<(), String> {
    match &mut part.part {
        None => Err(" is empty".into()),
        Some(Part::Text(_)) => Ok(()),
        Some(Part::Image(image)) => {
            let inline = !image.data.is_empty();
            let url = !image.url.is_empty();
            if inline == url {
                return Err(".image carries either data or a url".into());
            }
            if url && !image.url.starts_with("data:image/") {
                return Err(".image.url must be a data: URL of an image (the backend fetches nothing a sandbox names)".into());
            }
            let media = &image.media_type;
            if inline
                && !(media.starts_with("image/")
                    && media.len() <= 64
                    && media[6..]
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"+.-".contains(&b)))
            {
                return Err(".image.media_type must name an image type (image/png)".into());
            }
            Ok(())
        }
        Some(_) if in_result => Err(": a tool result's content is text and images only".into()),
        Some(Part::ToolCall(call)) => {
            tool_name(&call.name).map_err(|e| format!(".tool_call.name {e}"))?;
            if call.arguments_json.is_empty() {
                call.arguments_json = "{}".into();
            }
            canonical_json(&mut call.arguments_json, true)
                .map_err(|e| format!(".tool_call.arguments_json {e}"))
        }
        Some(Part::ToolResult(result)) => {
            for (k, inner) in result.content.iter_mut().enumerate() {
                normalise_part(inner, true).map_err(|e| format!(".tool_result.content[{k}]{e}"))?;
            }
            Ok(())
        }
        Some(Part::Thinking(thinking)) => {
            if !thinking.origin.is_empty() && !ORIGINS.contains(&thinking.origin.as_str()) {
                return Err(format!(
                    ".thinking.origin is one of {}, or empty",
                    ORIGINS.join(", ")
                ));
            }
            Ok(())
        }
    }
}

fn tool_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_TOOL_NAME {
        return Err(format!("must be 1 to {MAX_TOOL_NAME} bytes"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b))
    {
        return Err("may hold only letters, digits, '_', '-', '.' and ':'".into());
    }
    Ok(())
}

/// Rewrites a JSON field in canonical form (escapes decoded, no insignificant space); an
/// empty field stays empty. `object`: it must be a JSON object.
fn canonical_json(field: &mut String, object: bool) -> Result<(), String> {
    if field.is_empty() {
        return Ok(());
    }
    let value: Value =
        serde_json::from_str(field).map_err(|e| format!("is not valid JSON ({e})"))?;
    if object && !value.is_object() {
        return Err("must be a JSON object".into());
    }
    *field = value.to_string();
    Ok(())
}

/// A JSON field as a redacting route sends it: `redacted` (the classifier's spans replaced
/// in the JSON text) when that is still valid JSON, else the original with each string
/// (and key) redacted on its own, which is valid JSON by construction.
pub(crate) fn redacted_json(classifier: &Classifier, original: &str, redacted: String) -> String {
    if redacted == original || serde_json::from_str::<serde::de::IgnoredAny>(&redacted).is_ok() {
        return redacted;
    }
    let Ok(mut value) = serde_json::from_str::<Value>(original) else {
        // Not reachable: every JSON field is checked by `normalise` first.
        return "{}".into();
    };
    redact_strings(classifier, &mut value);
    value.to_string()
}

fn redact_strings(classifier: &Classifier, value: &mut Value) {
    let redact = |text: &str| classifier.redact(text);
    match value {
        Value::String(text) => {
            if let Some(redacted) = redact(text) {
                *text = redacted;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| redact_strings(classifier, v)),
        Value::Object(map) => {
            let entries = std::mem::take(map);
            for (key, mut v) in entries {
                redact_strings(classifier, &mut v);
                map.insert(redact(&key).unwrap_or(key), v);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `reasoning.effort` leaves unclassified, so it may only name one of the APIs' levels: a
    /// free word would be a channel past the classifier.
    #[test]
    fn reasoning_effort_is_one_of_the_apis_levels() {
        let with = |effort: &str| pb::CompleteRequest {
            messages: vec![pb::ChatMessage {
                role: "user".into(),
                content: "hi".into(),
                parts: vec![],
            }],
            reasoning: Some(pb::ReasoningConfig {
                effort: effort.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        for effort in ["", "minimal", "low", "medium", "high", "xhigh"] {
            assert!(normalise(&mut with(effort)).is_ok(), "{effort}");
        }
        for effort in ["akiaiosfodnn", "secretword", "High"] {
            let error = normalise(&mut with(effort)).unwrap_err();
            assert!(error.contains("reasoning.effort"), "{error}");
        }
    }

    fn text_part(text: &str) -> pb::ContentPart {
        pb::ContentPart {
            part: Some(Part::Text(text.into())),
            cache: false,
        }
    }

    fn call_with_everything() -> pb::CompleteRequest {
        pb::CompleteRequest {
            messages: vec![
                pb::ChatMessage {
                    role: "user".into(),
                    content: "question".into(),
                    parts: vec![text_part("more")],
                },
                pb::ChatMessage {
                    role: "assistant".into(),
                    content: String::new(),
                    parts: vec![
                        pb::ContentPart {
                            part: Some(Part::Thinking(pb::ThinkingPart {
                                text: "musing".into(),
                                signature: "sig".into(),
                                origin: "anthropic".into(),
                                ..Default::default()
                            })),
                            cache: false,
                        },
                        pb::ContentPart {
                            part: Some(Part::ToolCall(pb::ToolCall {
                                id: "call_1".into(),
                                name: "run".into(),
                                arguments_json: r#"{ "cmd" : "l\u0073" }"#.into(),
                            })),
                            cache: false,
                        },
                    ],
                },
                pb::ChatMessage {
                    role: "tool".into(),
                    content: String::new(),
                    parts: vec![pb::ContentPart {
                        part: Some(Part::ToolResult(pb::ToolResult {
                            call_id: "call_1".into(),
                            content: vec![text_part("file.txt")],
                            is_error: false,
                        })),
                        cache: false,
                    }],
                },
            ],
            stop: vec!["END".into()],
            tools: vec![pb::ToolDefinition {
                name: "run".into(),
                description: "runs a command".into(),
                parameters_json: r#"{"type":"object"}"#.into(),
                ..Default::default()
            }],
            tool_choice: Some(pb::ToolChoice {
                mode: pb::tool_choice::Mode::Named as i32,
                name: "run".into(),
                parallel: None,
            }),
            response_format_json: r#"{"type":"json_object"}"#.into(),
            ..Default::default()
        }
    }

    #[test]
    fn every_text_that_leaves_is_listed_and_put_back_in_order() {
        let mut call = call_with_everything();
        normalise(&mut call).unwrap();
        let listed: Vec<String> = texts(&call).into_iter().map(|(_, t)| t).collect();
        assert_eq!(
            listed,
            [
                "question",
                "more",
                "",
                "musing",
                "",
                "call_1",
                "run",
                // Canonical: the escape decoded, so the classifier reads "ls".
                r#"{"cmd":"ls"}"#,
                "",
                "call_1",
                "file.txt",
                "END",
                "run",
                "runs a command",
                r#"{"type":"object"}"#,
                "run",
                r#"{"type":"json_object"}"#,
            ]
        );
        let upper: Vec<String> = listed.iter().map(|t| t.to_uppercase()).collect();
        apply(&mut call, upper.clone());
        let again: Vec<String> = texts(&call).into_iter().map(|(_, t)| t).collect();
        assert_eq!(again, upper);
    }

    #[test]
    fn bad_shapes_are_refused_naming_the_field() {
        type Breaks = fn(&mut pb::CompleteRequest);
        let cases: Vec<(Breaks, &str)> = vec![
            (|c| c.messages[0].role = "wizard".into(), "messages[0].role"),
            (
                |c| c.tools[0].parameters_json = "{nope".into(),
                "tools[0].parameters_json is not valid JSON",
            ),
            (
                |c| c.tools[0].name = "a b".into(),
                "tools[0].name may hold only",
            ),
            (
                |c| c.response_format_json = "[1]".into(),
                "response_format_json must be a JSON object",
            ),
            (
                |c| {
                    c.messages[0].parts[0].part = Some(Part::Image(pb::ImagePart {
                        url: "https://example.com/x.png".into(),
                        ..Default::default()
                    }))
                },
                "messages[0].parts[0].image.url must be a data: URL",
            ),
            (
                |c| {
                    if let Some(Part::ToolResult(r)) = &mut c.messages[2].parts[0].part {
                        r.content.push(pb::ContentPart {
                            part: Some(Part::ToolCall(Default::default())),
                            cache: false,
                        });
                    }
                },
                "tool_result.content[1]: a tool result's content is text and images only",
            ),
        ];
        for (break_it, expected) in cases {
            let mut call = call_with_everything();
            break_it(&mut call);
            let error = normalise(&mut call).unwrap_err();
            assert!(error.contains(expected), "{error} ({expected})");
        }
    }

    #[test]
    fn unissued_thinking_is_dropped_and_issued_thinking_kept() {
        let mut call = call_with_everything();
        let mut issued = Signatures::default();
        assert_eq!(
            drop_unissued_thinking(&mut call.clone(), &issued, "claude"),
            1
        );
        issued.remember("claude", "anthropic", "sig");
        // Issued by another route of the same format: not for this one.
        assert_eq!(
            drop_unissued_thinking(&mut call.clone(), &issued, "claude-public"),
            1
        );
        assert_eq!(drop_unissued_thinking(&mut call, &issued, "claude"), 0);
        // A message that was only unissued reasoning goes with it.
        call.messages[1].parts.truncate(1);
        let mut forged = call.clone();
        if let Some(Part::Thinking(t)) = &mut forged.messages[1].parts[0].part {
            t.signature = "made up".into();
        }
        assert_eq!(drop_unissued_thinking(&mut forged, &issued, "claude"), 1);
        assert_eq!(forged.messages.len(), 2);
    }

    #[test]
    fn a_redaction_that_breaks_json_is_done_string_by_string() {
        let classifier = Classifier::new(&Default::default()).unwrap();
        let key = format!("{}{}", "AKIA", "Q7LM2XV3RT4KP6WS");
        let original = format!(r#"{{"cmd":"echo {key}"}}"#);
        let classification = classifier.classify(&original);
        assert!(!classification.reasons.is_empty());
        // Valid after the classifier's own redaction: kept as is.
        let redacted = classification.redact(&original);
        assert_eq!(
            redacted_json(&classifier, &original, redacted.clone()),
            redacted
        );
        // A redaction that cut the JSON: each string redacted on its own instead.
        let broken = original.replacen('"', "", 3);
        let fixed = redacted_json(&classifier, &original, broken);
        let value: Value = serde_json::from_str(&fixed).unwrap();
        assert!(!fixed.contains(&key), "{fixed}");
        assert!(value["cmd"]
            .as_str()
            .unwrap()
            .starts_with("echo [REDACTED:"));
    }
}
