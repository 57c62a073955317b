//! What every API's reply is built from: the call's context, the encoder of its
//! server-sent events, and how a gateway refusal is answered. A leaf: the API modules and the
//! server all use it, and it uses none of them.

use hyper::StatusCode;
use tollgate_proto::v1 as pb;

/// What a reply is built from, besides the gateway's events.
pub(crate) struct Context {
    /// Where the call went (its id and the model that serves it).
    pub(crate) started: pb::CompleteStarted,
    /// When the reply was made, in seconds since the epoch.
    pub(crate) created: u64,
    /// Whether an OpenAI chat stream ends with a usage chunk.
    pub(crate) include_usage: bool,
    /// The Responses API's free-form tools, by name.
    pub(crate) custom_tools: Vec<String>,
}

/// Turns the gateway's events into one API's server-sent events.
pub(crate) trait Encoder: Send {
    /// What opens the stream.
    fn start(&mut self) -> String;
    /// A piece of the completion.
    fn delta(&mut self, delta: &pb::CompleteDelta) -> String;
    /// The end: why it finished, and the counts.
    fn done(&mut self, done: &pb::CompleteDone) -> String;
    /// The call failed after the stream began.
    fn error(&mut self, status: &tonic::Status) -> String;
}

/// How a gateway refusal is answered.
pub(crate) struct GatewayError {
    /// The HTTP status.
    pub(crate) status: StatusCode,
    /// The OpenAI error `type` (and `code`).
    pub(crate) openai_kind: &'static str,
    /// Whether a retry may help (else `x-should-retry: false`).
    pub(crate) retry: bool,
}

impl GatewayError {
    /// The answer to the gateway's `status`.
    pub(crate) fn of(status: &tonic::Status) -> Self {
        let (code, openai_kind, retry) = match status.code() {
            tonic::Code::PermissionDenied => (StatusCode::FORBIDDEN, "tollgate_refused", false),
            tonic::Code::ResourceExhausted if status.message().contains("the backend answered") => {
                (
                    StatusCode::TOO_MANY_REQUESTS,
                    "tollgate_backend_rate_limited",
                    false,
                )
            }
            // OpenAI's own name for a spent quota, which agents (Codex) and SDKs know not to
            // retry.
            tonic::Code::ResourceExhausted => {
                (StatusCode::TOO_MANY_REQUESTS, "insufficient_quota", false)
            }
            tonic::Code::InvalidArgument => {
                (StatusCode::BAD_REQUEST, "invalid_request_error", false)
            }
            tonic::Code::FailedPrecondition => {
                (StatusCode::BAD_GATEWAY, "tollgate_backend_error", false)
            }
            // A gateway that does not serve this call (an older supervisor): asking again
            // cannot help.
            tonic::Code::Unimplemented => (StatusCode::NOT_IMPLEMENTED, "tollgate_error", false),
            // The backend or the gateway may be back in a moment: let the SDK retry.
            tonic::Code::Unavailable => (StatusCode::BAD_GATEWAY, "tollgate_backend_error", true),
            tonic::Code::DeadlineExceeded => {
                (StatusCode::GATEWAY_TIMEOUT, "tollgate_backend_error", true)
            }
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "tollgate_error", true),
        };
        Self {
            status: code,
            openai_kind,
            retry,
        }
    }

    /// The Anthropic error `type`.
    pub(crate) fn anthropic_kind(&self) -> &'static str {
        anthropic_kind(self.status)
    }
}

/// Anthropic's error `type` for an HTTP status.
pub(crate) fn anthropic_kind(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        _ => "api_error",
    }
}
