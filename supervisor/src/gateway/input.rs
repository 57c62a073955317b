//! What an agent may send and get back: every bound on a request's fields, checked once per
//! call before anything checks, uses or audits them, and the sizes of what a tool returns.

use tollgate_proto::v1 as pb;
use tollgate_proto::v1::call_tool_request::Tool;

use super::models::{MAX_STOPS, MAX_STOP_LEN, MAX_TEXT, MAX_TOOL_NAME};

/// Most bytes one `fs.read` returns (read on with `offset`).
pub const MAX_READ: u64 = 1 << 20;
/// Most entries one `fs.list` returns.
pub const MAX_LIST: usize = 10_000;
/// Most bytes one `fs.write` carries (one atomic change).
pub const MAX_WRITE: usize = tollgate_shim_protocol::plan::MAX_WRITE_BYTES;
/// Most bytes of stdin one `exec` carries.
pub const MAX_STDIN: usize = (4 << 20) - 4096;
/// Longest path (a host path, a `cwd`, a mount target, a workdir) an agent may send:
/// `PATH_MAX`. A longer one is refused as such, before anything looks at it.
pub const MAX_PATH: usize = 4096;
/// Most items of an argv (or of an exec list, a child's grants, its environment).
pub const MAX_ITEMS: usize = 256;
/// Most bytes of an argv (or an environment) altogether.
pub const MAX_ARGV_BYTES: usize = 64 << 10;
/// Longest name or id an agent may send (route names, run and receipt ids, a subject).
pub const MAX_NAME: usize = 256;
/// Longest free text an agent may send (a stop reason).
pub const MAX_REASON: usize = 1024;

/// The audit name of a `CallTool` request's tool (`none` when it names none).
pub fn tool_name(tool: Option<&Tool>) -> &'static str {
    match tool {
        Some(Tool::FsRead(_)) => "fs.read",
        Some(Tool::FsList(_)) => "fs.list",
        Some(Tool::FsStat(_)) => "fs.stat",
        Some(Tool::FsWrite(_)) => "fs.write",
        Some(Tool::FsDelete(_)) => "fs.delete",
        Some(Tool::Exec(_)) => "exec",
        None => "none",
    }
}

/// What an agent sends, bounded field by field before anything checks, uses or audits it.
pub trait AgentInput {
    /// The first field over its bound, as a one-line reason.
    fn bound(&self) -> Result<(), String>;
}

fn text(field: &str, value: &str, max: usize) -> Result<(), String> {
    if value.len() > max {
        return Err(format!(
            "{field} is {} bytes; at most {max} are accepted",
            value.len()
        ));
    }
    Ok(())
}

fn list<'a>(
    field: &str,
    values: impl ExactSizeIterator<Item = &'a str>,
    each: usize,
) -> Result<(), String> {
    if values.len() > MAX_ITEMS {
        return Err(format!(
            "{field} has {} items; at most {MAX_ITEMS} are accepted",
            values.len()
        ));
    }
    let mut total = 0;
    for (i, value) in values.enumerate() {
        text(&format!("{field}[{i}]"), value, each)?;
        total += value.len();
    }
    if total > MAX_ARGV_BYTES {
        return Err(format!(
            "{field} is {total} bytes in all; at most {MAX_ARGV_BYTES} are accepted"
        ));
    }
    Ok(())
}

impl AgentInput for pb::CallToolRequest {
    fn bound(&self) -> Result<(), String> {
        match &self.tool {
            Some(Tool::FsRead(r)) => text("path", &r.path, MAX_PATH),
            Some(Tool::FsList(r)) => text("path", &r.path, MAX_PATH),
            Some(Tool::FsStat(r)) => text("path", &r.path, MAX_PATH),
            Some(Tool::FsWrite(r)) => text("path", &r.path, MAX_PATH),
            Some(Tool::FsDelete(r)) => text("path", &r.path, MAX_PATH),
            Some(Tool::Exec(r)) => {
                list("argv", r.argv.iter().map(String::as_str), MAX_ARGV_BYTES)?;
                text("cwd", &r.cwd, MAX_PATH)
            }
            None => Ok(()),
        }
    }
}

impl AgentInput for pb::DelegateRequest {
    fn bound(&self) -> Result<(), String> {
        let Some(spec) = &self.child else {
            return Ok(());
        };
        text("child.subject", &spec.subject, MAX_NAME)?;
        if let Some(agent) = &spec.agent {
            list(
                "child.agent.argv",
                agent.argv.iter().map(String::as_str),
                MAX_ARGV_BYTES,
            )?;
            let env: Vec<&str> = agent
                .env
                .iter()
                .flat_map(|(k, v)| [k.as_str(), v.as_str()])
                .collect();
            list("child.agent.env", env.into_iter(), MAX_ARGV_BYTES)?;
            text("child.agent.workdir", &agent.workdir, MAX_PATH)?;
        }
        list(
            "child.fs",
            spec.fs
                .iter()
                .flat_map(|g| [g.path.as_str(), g.mount.as_str()])
                .collect::<Vec<_>>()
                .into_iter(),
            MAX_PATH,
        )?;
        list("child.exec", spec.exec.iter().map(String::as_str), MAX_PATH)?;
        list(
            "child.routes",
            spec.routes.iter().map(|r| r.name.as_str()),
            MAX_NAME,
        )
    }
}

impl AgentInput for pb::StartChildRequest {
    fn bound(&self) -> Result<(), String> {
        text("receipt_id", &self.receipt_id, MAX_NAME)?;
        list("argv", self.argv.iter().map(String::as_str), MAX_ARGV_BYTES)
    }
}

impl AgentInput for pb::WatchChildRequest {
    fn bound(&self) -> Result<(), String> {
        text("run_id", &self.run_id, MAX_NAME)
    }
}

impl AgentInput for pb::StopChildRequest {
    fn bound(&self) -> Result<(), String> {
        text("run_id", &self.run_id, MAX_NAME)?;
        text("reason", &self.reason, MAX_REASON)
    }
}

/// Most messages one model call may carry (a long agent session's history fits: every
/// message holds at least one part or text, and a call holds at most [`MAX_PARTS`] parts).
pub const MAX_MESSAGES: usize = MAX_PARTS;
/// Most tools one model call may offer.
pub const MAX_TOOLS: usize = 128;
/// Most parts (text, images, tool calls and results, reasoning; a result's own parts
/// included) one model call may carry.
pub const MAX_PARTS: usize = 16_384;
/// Most bytes of one opaque reasoning signature (Anthropic's, or the Responses API's
/// encrypted reasoning).
pub const MAX_SIGNATURE: usize = 256 << 10;

/// The sizes of a model call's fields as it is walked: the text that leaves (classified, at
/// most [`MAX_TEXT`] bytes in all), the image bytes (at most as much again) and the parts.
#[derive(Default)]
struct CallSize {
    text: usize,
    images: usize,
    parts: usize,
}

impl CallSize {
    fn text(&mut self, field: &str, value: &str, max: usize) -> Result<(), String> {
        text(field, value, max)?;
        self.text += value.len();
        Ok(())
    }

    fn part(&mut self, field: &str, part: &pb::ContentPart, depth: usize) -> Result<(), String> {
        use pb::content_part::Part;
        self.parts += 1;
        if self.parts > MAX_PARTS {
            return Err(format!(
                "the call has more than {MAX_PARTS} parts; at most {MAX_PARTS} are accepted"
            ));
        }
        match &part.part {
            Some(Part::Text(t)) => self.text(field, t, MAX_TEXT),
            Some(Part::Image(image)) => {
                text(
                    &format!("{field}.image.media_type"),
                    &image.media_type,
                    MAX_NAME,
                )?;
                self.images += image.data.len() + image.url.len();
                if self.images > MAX_TEXT {
                    return Err(format!(
                        "the call's images are {} bytes or more; at most {MAX_TEXT} are accepted",
                        self.images
                    ));
                }
                Ok(())
            }
            Some(Part::ToolCall(call)) => {
                self.text(&format!("{field}.tool_call.id"), &call.id, MAX_NAME)?;
                self.text(&format!("{field}.tool_call.name"), &call.name, MAX_NAME)?;
                self.text(
                    &format!("{field}.tool_call.arguments_json"),
                    &call.arguments_json,
                    MAX_TEXT,
                )
            }
            Some(Part::ToolResult(result)) => {
                self.text(
                    &format!("{field}.tool_result.call_id"),
                    &result.call_id,
                    MAX_NAME,
                )?;
                // A result holds text and images; anything deeper is refused here, before
                // a walk could follow it.
                if depth > 0 {
                    return Err(format!("{field}: a tool result may not hold a tool result"));
                }
                for (i, inner) in result.content.iter().enumerate() {
                    self.part(
                        &format!("{field}.tool_result.content[{i}]"),
                        inner,
                        depth + 1,
                    )?;
                }
                Ok(())
            }
            Some(Part::Thinking(thinking)) => {
                self.text(&format!("{field}.thinking.text"), &thinking.text, MAX_TEXT)?;
                self.text(&format!("{field}.thinking.id"), &thinking.id, MAX_NAME)?;
                text(
                    &format!("{field}.thinking.origin"),
                    &thinking.origin,
                    MAX_NAME,
                )?;
                // Opaque: never sent unless this run's backend issued it, but held while
                // checked, so counted with the images.
                text(
                    &format!("{field}.thinking.signature"),
                    &thinking.signature,
                    MAX_SIGNATURE,
                )?;
                self.images += thinking.signature.len();
                Ok(())
            }
            None => Ok(()),
        }
    }
}

impl AgentInput for pb::CompleteRequest {
    fn bound(&self) -> Result<(), String> {
        text("route", &self.route, MAX_NAME)?;
        if self.messages.len() > MAX_MESSAGES {
            return Err(format!(
                "messages has {} items; at most {MAX_MESSAGES} are accepted",
                self.messages.len()
            ));
        }
        let mut size = CallSize::default();
        for (i, message) in self.messages.iter().enumerate() {
            text(&format!("messages[{i}].role"), &message.role, MAX_NAME)?;
            size.text(
                &format!("messages[{i}].content"),
                &message.content,
                MAX_TEXT,
            )?;
            for (j, part) in message.parts.iter().enumerate() {
                size.part(&format!("messages[{i}].parts[{j}]"), part, 0)?;
            }
        }
        if self.tools.len() > MAX_TOOLS {
            return Err(format!(
                "tools has {} items; at most {MAX_TOOLS} are accepted",
                self.tools.len()
            ));
        }
        for (i, tool) in self.tools.iter().enumerate() {
            size.text(&format!("tools[{i}].name"), &tool.name, MAX_TOOL_NAME)?;
            size.text(
                &format!("tools[{i}].description"),
                &tool.description,
                MAX_TEXT,
            )?;
            size.text(
                &format!("tools[{i}].parameters_json"),
                &tool.parameters_json,
                MAX_TEXT,
            )?;
        }
        if let Some(choice) = &self.tool_choice {
            size.text("tool_choice.name", &choice.name, MAX_TOOL_NAME)?;
        }
        size.text("response_format_json", &self.response_format_json, MAX_TEXT)?;
        if let Some(reasoning) = &self.reasoning {
            text("reasoning.effort", &reasoning.effort, MAX_NAME)?;
        }
        if self.stop.len() > MAX_STOPS {
            return Err(format!(
                "stop has {} items; at most {MAX_STOPS} are accepted",
                self.stop.len()
            ));
        }
        for (i, stop) in self.stop.iter().enumerate() {
            size.text(&format!("stop[{i}]"), stop, MAX_STOP_LEN)?;
        }
        if size.text > MAX_TEXT {
            return Err(format!(
                "the call carries {} bytes of text (messages, tools, arguments, results); at most {MAX_TEXT} are accepted",
                size.text
            ));
        }
        Ok(())
    }
}

impl AgentInput for pb::RecordRefusedCallRequest {
    fn bound(&self) -> Result<(), String> {
        text("api", &self.api, MAX_NAME)?;
        text("request", &self.request, MAX_PATH)?;
        text("reason", &self.reason, MAX_REASON)?;
        text("model", &self.model, MAX_NAME)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::content_part::Part;

    fn part(part: Part) -> pb::ContentPart {
        pb::ContentPart {
            part: Some(part),
            cache: false,
        }
    }

    fn call() -> pb::CompleteRequest {
        pb::CompleteRequest {
            messages: vec![pb::ChatMessage {
                role: "user".into(),
                content: "hi".into(),
                parts: vec![],
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_model_call_is_bounded_field_by_field_and_in_all() {
        assert_eq!(call().bound(), Ok(()));
        let tool = |name: &str| pb::ToolDefinition {
            name: name.into(),
            ..Default::default()
        };
        let mut many = call();
        many.tools = vec![tool("t"); MAX_TOOLS + 1];
        assert!(many.bound().unwrap_err().contains("tools has 129 items"));
        let mut long = call();
        long.tools = vec![tool(&"n".repeat(MAX_TOOL_NAME + 1))];
        assert!(long
            .bound()
            .unwrap_err()
            .starts_with("tools[0].name is 129 bytes"));
        // Every text counts towards one total.
        let mut big = call();
        big.tools = vec![pb::ToolDefinition {
            description: "d".repeat(MAX_TEXT / 2),
            ..tool("t")
        }];
        big.messages[0].content = "m".repeat(MAX_TEXT / 2 + 1);
        assert!(big.bound().unwrap_err().contains("bytes of text"));
        let mut nested = call();
        nested.messages[0].parts = vec![part(Part::ToolResult(pb::ToolResult {
            call_id: "c".into(),
            content: vec![part(Part::ToolResult(Default::default()))],
            is_error: false,
        }))];
        assert!(nested
            .bound()
            .unwrap_err()
            .contains("a tool result may not hold a tool result"));
        let mut images = call();
        let image = pb::ImagePart {
            media_type: "image/png".into(),
            data: vec![0; MAX_TEXT / 2 + 1],
            url: String::new(),
        };
        images.messages[0].parts = vec![part(Part::Image(image.clone())), part(Part::Image(image))];
        assert!(images.bound().unwrap_err().contains("images"));
        let mut signature = call();
        signature.messages[0].parts = vec![part(Part::Thinking(pb::ThinkingPart {
            signature: "s".repeat(MAX_SIGNATURE + 1),
            ..Default::default()
        }))];
        assert!(signature
            .bound()
            .unwrap_err()
            .contains("thinking.signature"));
    }
}
