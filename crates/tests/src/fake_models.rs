//! Model backends for tests: a real HTTP server on `127.0.0.1:0` that speaks the OpenAI Chat
//! Completions or the Anthropic Messages wire format (whole replies and server-sent event
//! streams, with usage) and records every request it receives (method, path, headers, body).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::service::service_fn;

/// One request as the backend received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The request path.
    pub path: String,
    /// Every header, `name: value`.
    pub headers: Vec<String>,
    /// The body.
    pub body: String,
}

impl Recorded {
    /// The value of header `name`, if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        let prefix = format!("{name}: ");
        self.headers
            .iter()
            .find_map(|h| h.strip_prefix(prefix.as_str()))
    }
}

/// A running fake backend.
pub struct FakeBackend {
    /// Where it listens.
    pub addr: SocketAddr,
    /// What it has received.
    pub requests: Arc<Mutex<Vec<Recorded>>>,
    _server: tokio::task::JoinHandle<()>,
}

/// Which format a fake backend speaks, and what it answers.
#[derive(Debug, Clone)]
pub struct Script {
    /// The reply text (split into two deltas when streamed).
    pub text: String,
    /// Prompt tokens to report.
    pub prompt_tokens: u64,
    /// Completion tokens to report.
    pub completion_tokens: u64,
}

fn openai_stream(script: &Script) -> String {
    let (a, b) = script.text.split_at(script.text.len() / 2);
    let chunk = |delta: String, finish: &str| {
        format!("data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}],\"usage\":null}}\n\n")
    };
    [
        chunk("{\"role\":\"assistant\",\"content\":\"\"}".into(), "null"),
        chunk(serde_json::json!({"content": a}).to_string(), "null"),
        chunk(serde_json::json!({"content": b}).to_string(), "null"),
        chunk("{}".into(), "\"stop\""),
        format!(
            "data: {{\"id\":\"c\",\"choices\":[],\"usage\":{{\"prompt_tokens\":{},\"completion_tokens\":{}}}}}\n\n",
            script.prompt_tokens, script.completion_tokens
        ),
        "data: [DONE]\n\n".into(),
    ]
    .concat()
}

fn anthropic_stream(script: &Script) -> String {
    let (a, b) = script.text.split_at(script.text.len() / 2);
    let event = |name: &str, data: serde_json::Value| format!("event: {name}\ndata: {data}\n\n");
    [
        event("message_start", serde_json::json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "usage": {"input_tokens": script.prompt_tokens, "output_tokens": 1}}})),
        event("content_block_start", serde_json::json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})),
        event("ping", serde_json::json!({"type": "ping"})),
        event("content_block_delta", serde_json::json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": a}})),
        event("content_block_delta", serde_json::json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": b}})),
        event("content_block_stop", serde_json::json!({"type": "content_block_stop", "index": 0})),
        event("message_delta", serde_json::json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": script.completion_tokens}})),
        event("message_stop", serde_json::json!({"type": "message_stop"})),
    ]
    .concat()
}

fn reply(path: &str, body: &serde_json::Value, script: &Script) -> (u16, &'static str, String) {
    let stream = body.get("stream").and_then(serde_json::Value::as_bool) == Some(true);
    match (path, stream) {
        ("/v1/chat/completions", true) => (200, "text/event-stream", openai_stream(script)),
        ("/v1/chat/completions", false) => (
            200,
            "application/json",
            serde_json::json!({"id": "c", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": script.text}, "finish_reason": "stop"}], "usage": {"prompt_tokens": script.prompt_tokens, "completion_tokens": script.completion_tokens}}).to_string(),
        ),
        ("/v1/messages", true) => (200, "text/event-stream", anthropic_stream(script)),
        ("/v1/messages", false) => (
            200,
            "application/json",
            serde_json::json!({"id": "msg_1", "type": "message", "role": "assistant", "content": [{"type": "text", "text": script.text}], "stop_reason": "end_turn", "usage": {"input_tokens": script.prompt_tokens, "output_tokens": script.completion_tokens}}).to_string(),
        ),
        _ => (
            404,
            "application/json",
            serde_json::json!({"error": {"type": "not_found_error", "message": "no such path"}}).to_string(),
        ),
    }
}

impl FakeBackend {
    /// Starts a backend answering with `script` on the current tokio runtime.
    pub async fn start(script: Script) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests: Arc<Mutex<Vec<Recorded>>> = Arc::default();
        let recorded = requests.clone();
        let server = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (recorded, script) = (recorded.clone(), script.clone());
                tokio::spawn(async move {
                    let service =
                        service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                            let (recorded, script) = (recorded.clone(), script.clone());
                            async move {
                                let path = request.uri().path().to_owned();
                                let headers = request
                                    .headers()
                                    .iter()
                                    .map(|(k, v)| {
                                        format!("{k}: {}", String::from_utf8_lossy(v.as_bytes()))
                                    })
                                    .collect();
                                let body = request
                                    .into_body()
                                    .collect()
                                    .await
                                    .map(|b| b.to_bytes())
                                    .unwrap_or_default();
                                let text = String::from_utf8_lossy(&body).into_owned();
                                let json: serde_json::Value =
                                    serde_json::from_str(&text).unwrap_or_default();
                                recorded.lock().unwrap().push(Recorded {
                                    path: path.clone(),
                                    headers,
                                    body: text,
                                });
                                let (status, content_type, reply) = reply(&path, &json, &script);
                                Ok::<_, Infallible>(
                                    hyper::Response::builder()
                                        .status(status)
                                        .header("content-type", content_type)
                                        .body(Full::new(Bytes::from(reply)))
                                        .unwrap(),
                                )
                            }
                        });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            requests,
            _server: server,
        }
    }

    /// What it has received so far.
    pub fn received(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }
}
