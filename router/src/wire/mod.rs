//! The wire formats model backends speak: OpenAI Chat Completions (every local preset, and
//! OpenAI-style cloud routes), Anthropic Messages and the OpenAI Responses API.
//!
//! A request body is built from scratch for each call from the canonical call
//! ([`CompleteRequest`](tollgate_proto::v1::CompleteRequest): messages with their parts, tools, tool choice, response format,
//! reasoning), never from what the agent sent: no header, no unknown field travels. Each
//! format gets what it can carry: tool calls, their ids and their results cross between
//! formats (an Anthropic agent on a llama.cpp route keeps its tools), thinking goes back only
//! to the format that produced it, and Anthropic's cache marks only to Anthropic.
//!
//! Replies, whole ([`parse_reply`]) or streamed as server-sent events ([`StreamDecoder`]),
//! become canonical deltas ([`CompleteDelta`](tollgate_proto::v1::CompleteDelta): text, pieces of tool calls, pieces of
//! thinking), a finish reason normalised to `stop`, `length`, `tool_calls`,
//! `content_filter` (or the backend's own word), and the server's token counts. Pure: the
//! I/O is `tollgate_router_backends`'.

mod anthropic;
pub mod openai_chat;
mod responses;
mod shared;
mod types;

pub use types::{ChatRequest, Completion, Role, StreamItem, WireError};

use shared::{error_type, malformed};

use serde_json::Value;

use crate::config::Api;
use crate::sse::SseEvent;

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

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_replies;
