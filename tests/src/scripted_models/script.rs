//! What a scripted model server plays: turns of tool calls or text, and what each turn
//! expects to have come back; and the tool results it records.

use serde_json::Value;

/// One tool call a scripted turn makes.
#[derive(Debug, Clone)]
pub struct Call {
    /// The tool's name, as the agent declared it (`Write`, `exec_command`, `write_file`…).
    pub name: String,
    /// Its arguments (a JSON object).
    pub arguments: Value,
}

impl Call {
    /// A call of `name` with `arguments`.
    pub fn new(name: &str, arguments: Value) -> Self {
        Self {
            name: name.into(),
            arguments,
        }
    }
}

/// What a turn answers.
#[derive(Debug, Clone)]
pub enum Reply {
    /// Tool calls, in order (finish reason `tool_calls` / `tool_use`).
    Calls(Vec<Call>),
    /// A final text (finish reason `stop` / `end_turn`).
    Text(String),
}

/// One turn of the script.
#[derive(Debug, Clone)]
pub struct Turn {
    /// The answer.
    pub reply: Reply,
    /// Texts the request this turn answers must carry in what is new since the model's last
    /// turn (tool results, or the messages after the last assistant message), e.g. a command's
    /// output that must have come back to the model.
    pub expect: Vec<String>,
}

impl Turn {
    /// A turn making `calls`.
    pub fn calls(calls: Vec<Call>) -> Self {
        Self {
            reply: Reply::Calls(calls),
            expect: Vec::new(),
        }
    }

    /// A turn answering `text`.
    pub fn text(text: &str) -> Self {
        Self {
            reply: Reply::Text(text.into()),
            expect: Vec::new(),
        }
    }

    /// The same turn, served only when its request carries `text` in what is new.
    pub fn expecting(mut self, text: &str) -> Self {
        self.expect.push(text.into());
        self
    }
}

/// What the server plays.
#[derive(Debug, Clone, Default)]
pub struct ModelScript {
    /// The turns, in order.
    pub turns: Vec<Turn>,
    /// Requests that declare no tools are the agent's own side calls (titles, topic checks,
    /// quota probes) rather than turns of the task: they get `side_reply` and do not advance
    /// the script. False for agents that use no tool calling (aider's edit formats): then
    /// every request is a turn.
    pub tools_required: bool,
    /// The answer to side calls.
    pub side_reply: String,
    /// The models `GET /v1/models` lists.
    pub models: Vec<String>,
}

/// A tool result as the agent sent it back.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolResult {
    /// The call's id (ours).
    pub call_id: String,
    /// The tool's name (from the call).
    pub name: String,
    /// The result's text.
    pub output: String,
}
