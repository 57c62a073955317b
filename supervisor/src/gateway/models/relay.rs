//! A backend's reply relayed to the agent as it arrives: text, tool calls and reasoning as
//! canonical deltas, with what the supervisor must know of it afterwards (its length for an
//! estimate, its tool calls for the audit, the signatures it issued for the next call).

use tokio::sync::mpsc;
use tollgate_proto::v1 as pb;
use tollgate_router::config::Route;
use tollgate_router::wire::{ChatRequest, StreamItem};
use tollgate_router_backends::{BackendError, Backends, CALL_TIMEOUT};
use tonic::Status;

use super::signatures::Signatures;

/// How long a client may leave the stream unread before the call is dropped.
const CLIENT_IDLE: std::time::Duration = std::time::Duration::from_secs(120);
/// Most bytes of reply text kept to count a completion the server did not count.
const KEEP_TEXT: usize = 1 << 20;

/// What came back from a backend, as it was relayed to the agent.
pub(super) struct Streamed {
    /// How the call ended.
    pub(super) result: Result<(), BackendError>,
    /// Bytes of completion relayed: text, tool call arguments, readable reasoning.
    pub(super) text_len: usize,
    /// The reply's text (up to 1 MiB), kept only to count a completion the server did not.
    pub(super) text: String,
    /// Why the reply ended (`tool_calls` when it ends in tool calls).
    pub(super) finish: String,
    /// The server's own counts, when it gave them.
    pub(super) prompt: Option<u64>,
    pub(super) completion: Option<u64>,
    /// Tool calls the reply made.
    pub(super) tool_calls: u32,
    /// Reasoning signatures the reply carried, (origin, signature): remembered once the
    /// call is over, so the next call may send them back.
    pub(super) signatures: Vec<(String, String)>,
}

impl Streamed {
    fn new() -> Self {
        Self {
            result: Ok(()),
            text_len: 0,
            text: String::new(),
            finish: String::new(),
            prompt: None,
            completion: None,
            tool_calls: 0,
            signatures: Vec::new(),
        }
    }

    /// Takes note of one delta before it is relayed.
    fn note(&mut self, delta: &pb::CompleteDelta) {
        self.text_len += delta.text.len();
        if self.text.len() < KEEP_TEXT {
            self.text.push_str(&delta.text);
        }
        if let Some(call) = &delta.tool_call {
            // A call's first piece names it.
            if !call.id.is_empty() || !call.name.is_empty() {
                self.tool_calls += 1;
            }
            self.text_len += call.arguments.len() + call.name.len();
        }
        if let Some(thinking) = &delta.thinking {
            self.text_len += thinking.text.len();
            if !thinking.signature.is_empty() {
                self.signatures
                    .push((thinking.origin.clone(), thinking.signature.clone()));
            }
        }
    }

    /// Remembers the signatures this reply issued, so they may go back to this backend: to
    /// `route`, and no other.
    pub(super) fn remember_signatures(
        &self,
        route: &str,
        signatures: &std::sync::Mutex<Signatures>,
    ) {
        if self.signatures.is_empty() {
            return;
        }
        let mut known = signatures.lock().unwrap_or_else(|p| p.into_inner());
        for (origin, signature) in &self.signatures {
            known.remember(route, origin, signature);
        }
    }
}

/// Sends `chat` to `route` and relays its reply to `out` as it arrives. A client that stops
/// reading does not hold the call: after [`CLIENT_IDLE`] the backend's reply is dropped.
pub(super) async fn relay_reply(
    backends: &Backends,
    route: &Route,
    chat: &ChatRequest,
    out: &mpsc::Sender<Result<pb::CompleteEvent, Status>>,
) -> Streamed {
    let (items_tx, mut items_rx) = mpsc::channel::<StreamItem>(64);
    let backend = async {
        let result = tokio::time::timeout(CALL_TIMEOUT, backends.call(route, chat, &items_tx))
            .await
            .unwrap_or_else(|_| {
                Err(BackendError::Reply {
                    route: route.name.clone(),
                    detail: format!(
                        "the call took longer than {} s and was given up",
                        CALL_TIMEOUT.as_secs()
                    ),
                })
            });
        drop(items_tx);
        result
    };
    let forward = async {
        let mut streamed = Streamed::new();
        while let Some(item) = items_rx.recv().await {
            match item {
                StreamItem::Delta(delta) => {
                    streamed.note(&delta);
                    let event = pb::CompleteEvent {
                        event: Some(pb::complete_event::Event::Delta(delta)),
                    };
                    let sent = tokio::time::timeout(CLIENT_IDLE, out.send(Ok(event))).await;
                    if !matches!(sent, Ok(Ok(()))) {
                        break;
                    }
                }
                StreamItem::Finish(reason) => streamed.finish = reason,
                StreamItem::Usage { prompt, completion } => {
                    streamed.prompt = prompt.or(streamed.prompt);
                    streamed.completion = completion.or(streamed.completion);
                }
                StreamItem::Done => {}
            }
        }
        streamed
    };
    let (result, mut streamed) = tokio::join!(backend, forward);
    streamed.result = result;
    streamed
}
