//! The canonical request and reply types every wire format builds from and decodes into. A
//! leaf of `wire`: the formats and the dispatch use it.

use tollgate_proto::v1 as pb;

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
