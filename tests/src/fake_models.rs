//! Model backends for tests: a real HTTP server on `127.0.0.1:0` or a Unix socket that speaks
//! the OpenAI Chat Completions or the Anthropic Messages wire format (whole replies and
//! server-sent event streams, with usage or, when scripted, without), the local servers'
//! extras (`GET /health`, answering 503 while "loading" when scripted; `GET /v1/models`;
//! Ollama's `GET /api/tags`; vLLM's or llama.cpp's tokenizer endpoints), and records every
//! request it receives (method, path, headers, body).

use std::convert::Infallible;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::service::service_fn;
use serde_json::{json, Value};

/// One request as the backend received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The request method (`GET`, `POST`).
    pub method: String,
    /// The request path.
    pub path: String,
    /// Every header, `name: value`.
    pub headers: Vec<String>,
    /// The body.
    pub body: String,
}

impl Recorded {
    /// Reads `request` whole (method, path, headers, body as text; a body that fails to
    /// arrive is recorded empty): one reading for every fake backend.
    pub async fn read(request: hyper::Request<hyper::body::Incoming>) -> Recorded {
        let method = request.method().as_str().to_owned();
        let path = request.uri().path().to_owned();
        let headers = request
            .headers()
            .iter()
            .map(|(k, v)| format!("{k}: {}", String::from_utf8_lossy(v.as_bytes())))
            .collect();
        let body = request
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        Recorded {
            method,
            path,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    }

    /// The value of header `name`, if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        let prefix = format!("{name}: ");
        self.headers
            .iter()
            .find_map(|h| h.strip_prefix(prefix.as_str()))
    }

    /// The body as JSON (`null` when it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_default()
    }
}

/// A running fake backend. Dropping it stops it listening.
pub struct FakeBackend {
    /// Where it listens, as a route's `endpoint`: `http://127.0.0.1:PORT` or `unix:/PATH`.
    pub endpoint: String,
    /// What it has received.
    pub requests: Arc<Mutex<Vec<Recorded>>>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for FakeBackend {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// The tokenizer endpoints a fake backend serves, in a real server's format. The fake
/// counts one token per whitespace-separated word, plus the template's and the special
/// tokens described on each variant, so tests can tell its counts from an estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tokenizer {
    /// vLLM: `POST /tokenize` → `{"count", "max_model_len", "tokens"}`. With `messages`:
    /// words + 3 per message, + 2 when `add_generation_prompt`. With `prompt`: words, + 1
    /// unless `add_special_tokens` is false.
    Vllm,
    /// llama.cpp: `POST /apply-template` → `{"prompt"}` (ChatML: `<|im_start|>ROLE\nTEXT<|im_end|>\n`
    /// per message, then `<|im_start|>assistant\n`); `POST /tokenize` → `{"tokens"}`: the
    /// words of `content`, + 1 when `add_special`; objects with `piece` when `with_pieces`.
    Llamacpp,
}

/// Which format a fake backend speaks, and what it answers.
#[derive(Debug, Clone, Default)]
pub struct Script {
    /// The reply text (split into two deltas when streamed).
    pub text: String,
    /// Prompt tokens to report.
    pub prompt_tokens: u64,
    /// Completion tokens to report.
    pub completion_tokens: u64,
    /// Replies carry no usage (no usage chunk, no `usage` field; Anthropic events without
    /// counts), as a server that does not count, or a stream cut short, would.
    pub omit_usage: bool,
    /// The models `GET /v1/models` (`data[].id`) and `GET /api/tags` (`models[].name`) list.
    pub models: Vec<String>,
    /// How many `GET /health` requests are answered 503 (loading) before it answers 200.
    pub health_503s: u32,
    /// The tokenizer endpoints it serves (none: they answer 404).
    pub tokenizer: Option<Tokenizer>,
    /// Tool calls the reply makes (after `text`, if any); not empty: the reply ends in
    /// them (see "Scripted tool calls" below).
    pub tool_calls: Vec<ScriptedCall>,
    /// Reasoning the reply begins with, Anthropic replies only: (text, signature).
    pub thinking: Option<(String, String)>,
}

/// A backend's script and what it has used up.
struct State {
    script: Script,
    health_503s_left: AtomicU32,
    recorded: Arc<Mutex<Vec<Recorded>>>,
}

fn openai_stream(script: &Script) -> String {
    let (a, b) = script.text.split_at(script.text.len() / 2);
    let chunk = |delta: String, finish: &str| {
        format!("data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}],\"usage\":null}}\n\n")
    };
    let mut events = vec![
        chunk("{\"role\":\"assistant\",\"content\":\"\"}".into(), "null"),
        chunk(json!({"content": a}).to_string(), "null"),
        chunk(json!({"content": b}).to_string(), "null"),
        chunk("{}".into(), "\"stop\""),
    ];
    if !script.omit_usage {
        events.push(format!(
            "data: {{\"id\":\"c\",\"choices\":[],\"usage\":{{\"prompt_tokens\":{},\"completion_tokens\":{}}}}}\n\n",
            script.prompt_tokens, script.completion_tokens
        ));
    }
    events.push("data: [DONE]\n\n".into());
    events.concat()
}

fn anthropic_stream(script: &Script) -> String {
    let (a, b) = script.text.split_at(script.text.len() / 2);
    let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let (start_usage, delta_usage) = if script.omit_usage {
        (json!({}), json!({}))
    } else {
        (
            json!({"input_tokens": script.prompt_tokens, "output_tokens": 1}),
            json!({"output_tokens": script.completion_tokens}),
        )
    };
    [
        event("message_start", json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "usage": start_usage}})),
        event("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})),
        event("ping", json!({"type": "ping"})),
        event("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": a}})),
        event("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": b}})),
        event("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
        event("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": delta_usage})),
        event("message_stop", json!({"type": "message_stop"})),
    ]
    .concat()
}

fn words(text: &str) -> u64 {
    text.split_whitespace().count() as u64
}

fn ok(body: Value) -> (u16, &'static str, String) {
    (200, "application/json", body.to_string())
}

fn not_found() -> (u16, &'static str, String) {
    (
        404,
        "application/json",
        json!({"error": {"type": "not_found_error", "message": "no such path"}}).to_string(),
    )
}

/// vLLM's `/tokenize`.
fn vllm_tokenize(body: &Value) -> Value {
    let count = if let Some(messages) = body.get("messages").and_then(Value::as_array) {
        let template: u64 = messages
            .iter()
            .map(|m| words(m["content"].as_str().unwrap_or_default()) + 3)
            .sum();
        let generation = if body["add_generation_prompt"].as_bool() == Some(true) {
            2
        } else {
            0
        };
        template + generation
    } else {
        let special = u64::from(body["add_special_tokens"].as_bool() != Some(false));
        words(body["prompt"].as_str().unwrap_or_default()) + special
    };
    json!({"count": count, "max_model_len": 4096, "tokens": (0..count).collect::<Vec<_>>()})
}

/// llama.cpp's `/apply-template`.
fn llamacpp_template(body: &Value) -> Value {
    let mut prompt = String::new();
    for m in body["messages"].as_array().into_iter().flatten() {
        prompt.push_str(&format!(
            "<|im_start|>{}\n{}<|im_end|>\n",
            m["role"].as_str().unwrap_or_default(),
            m["content"].as_str().unwrap_or_default()
        ));
    }
    prompt.push_str("<|im_start|>assistant\n");
    json!({ "prompt": prompt })
}

/// llama.cpp's `/tokenize`.
fn llamacpp_tokenize(body: &Value) -> Value {
    let content = body["content"].as_str().unwrap_or_default();
    let special = u64::from(body["add_special"].as_bool() == Some(true));
    let count = words(content) + special;
    let tokens: Vec<Value> = if body["with_pieces"].as_bool() == Some(true) {
        (0..count)
            .map(|id| json!({"id": id, "piece": "w"}))
            .collect()
    } else {
        (0..count).map(|id| json!(id)).collect()
    };
    json!({ "tokens": tokens })
}

fn reply(method: &str, path: &str, body: &Value, state: &State) -> (u16, &'static str, String) {
    let script = &state.script;
    let stream = body.get("stream").and_then(Value::as_bool) == Some(true);
    let usage = |openai: bool| {
        if script.omit_usage {
            Value::Null
        } else if openai {
            json!({"prompt_tokens": script.prompt_tokens, "completion_tokens": script.completion_tokens})
        } else {
            json!({"input_tokens": script.prompt_tokens, "output_tokens": script.completion_tokens})
        }
    };
    match (method, path) {
        ("GET", "/health") => {
            let loading = state
                .health_503s_left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if loading {
                (
                    503,
                    "application/json",
                    json!({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}).to_string(),
                )
            } else {
                ok(json!({"status": "ok"}))
            }
        }
        ("GET", "/v1/models") => ok(json!({
            "object": "list",
            "data": script.models.iter().map(|m| json!({"id": m, "object": "model", "created": 1_700_000_000, "owned_by": "fake"})).collect::<Vec<_>>(),
        })),
        ("GET", "/api/tags") => ok(json!({
            "models": script.models.iter().map(|m| json!({"name": m, "model": m, "size": 1, "digest": "0", "details": {}})).collect::<Vec<_>>(),
        })),
        ("POST", "/tokenize") => match script.tokenizer {
            Some(Tokenizer::Vllm) => ok(vllm_tokenize(body)),
            Some(Tokenizer::Llamacpp) => ok(llamacpp_tokenize(body)),
            None => not_found(),
        },
        ("POST", "/apply-template") => match script.tokenizer {
            Some(Tokenizer::Llamacpp) => ok(llamacpp_template(body)),
            _ => not_found(),
        },
        ("POST", "/v1/chat/completions" | "/v1/messages") if tools_scripted(script) => {
            tool_reply(path, stream, script)
        }
        ("POST", "/v1/chat/completions") if stream => {
            (200, "text/event-stream", openai_stream(script))
        }
        ("POST", "/v1/chat/completions") => {
            let mut reply = json!({"id": "c", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": script.text}, "finish_reason": "stop"}]});
            if !script.omit_usage {
                reply["usage"] = usage(true);
            }
            ok(reply)
        }
        ("POST", "/v1/messages") if stream => (200, "text/event-stream", anthropic_stream(script)),
        ("POST", "/v1/messages") => {
            let mut reply = json!({"id": "msg_1", "type": "message", "role": "assistant", "content": [{"type": "text", "text": script.text}], "stop_reason": "end_turn"});
            if !script.omit_usage {
                reply["usage"] = usage(false);
            }
            ok(reply)
        }
        _ => not_found(),
    }
}

// ---- Scripted tool calls -----------------------------------------------------------------
//
// Replies that end in tool calls (OpenAI `tool_calls`, streamed as `delta.tool_calls` pieces;
// Anthropic `tool_use` blocks, streamed as `input_json_delta` pieces), optionally after text
// and, for Anthropic, after a signed thinking block.

/// One tool call a scripted reply makes.
#[derive(Debug, Clone, Default)]
pub struct ScriptedCall {
    /// Its id (`call_…`, `toolu_…`).
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// Its arguments, a JSON object in JSON text (streamed in two pieces).
    pub arguments: String,
}

fn tools_scripted(script: &Script) -> bool {
    !script.tool_calls.is_empty() || script.thinking.is_some()
}

fn tool_reply(path: &str, stream: bool, script: &Script) -> (u16, &'static str, String) {
    let anthropic = path == "/v1/messages";
    let finish = if script.tool_calls.is_empty() {
        if anthropic {
            "end_turn"
        } else {
            "stop"
        }
    } else if anthropic {
        "tool_use"
    } else {
        "tool_calls"
    };
    match (anthropic, stream) {
        (false, true) => (200, "text/event-stream", openai_tool_stream(script, finish)),
        (true, true) => (
            200,
            "text/event-stream",
            anthropic_tool_stream(script, finish),
        ),
        (false, false) => {
            let calls: Vec<Value> = script
                .tool_calls
                .iter()
                .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
                .collect();
            let content = if script.text.is_empty() {
                Value::Null
            } else {
                json!(script.text)
            };
            ok(json!({
                "id": "c", "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content, "tool_calls": calls}, "finish_reason": finish}],
                "usage": {"prompt_tokens": script.prompt_tokens, "completion_tokens": script.completion_tokens},
            }))
        }
        (true, false) => {
            let mut content = Vec::new();
            if let Some((thinking, signature)) = &script.thinking {
                content.push(
                    json!({"type": "thinking", "thinking": thinking, "signature": signature}),
                );
            }
            if !script.text.is_empty() {
                content.push(json!({"type": "text", "text": script.text}));
            }
            for c in &script.tool_calls {
                let input: Value = serde_json::from_str(&c.arguments).unwrap_or_default();
                content
                    .push(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input}));
            }
            ok(json!({
                "id": "msg_1", "type": "message", "role": "assistant", "content": content,
                "stop_reason": finish,
                "usage": {"input_tokens": script.prompt_tokens, "output_tokens": script.completion_tokens},
            }))
        }
    }
}

fn openai_tool_stream(script: &Script, finish: &str) -> String {
    let chunk = |delta: Value, finish: Value| {
        let body = json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        format!("data: {body}\n\n")
    };
    let mut events = vec![chunk(
        json!({"role": "assistant", "content": null}),
        Value::Null,
    )];
    if !script.text.is_empty() {
        events.push(chunk(json!({"content": script.text}), Value::Null));
    }
    for (i, c) in script.tool_calls.iter().enumerate() {
        let (a, b) = c.arguments.split_at(c.arguments.len() / 2);
        events.push(chunk(
            json!({"tool_calls": [{"index": i, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": ""}}]}),
            Value::Null,
        ));
        for piece in [a, b] {
            events.push(chunk(
                json!({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}),
                Value::Null,
            ));
        }
    }
    events.push(chunk(json!({}), json!(finish)));
    events.push(format!(
        "data: {}\n\n",
        json!({"id": "c", "choices": [], "usage": {"prompt_tokens": script.prompt_tokens, "completion_tokens": script.completion_tokens}})
    ));
    events.push("data: [DONE]\n\n".into());
    events.concat()
}

fn anthropic_tool_stream(script: &Script, finish: &str) -> String {
    let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let mut events = vec![event(
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "usage": {"input_tokens": script.prompt_tokens, "output_tokens": 1}}}),
    )];
    let mut index = 0;
    if let Some((thinking, signature)) = &script.thinking {
        events.push(event("content_block_start", json!({"type": "content_block_start", "index": index, "content_block": {"type": "thinking", "thinking": ""}})));
        events.push(event("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "thinking_delta", "thinking": thinking}})));
        events.push(event("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "signature_delta", "signature": signature}})));
        events.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    }
    if !script.text.is_empty() {
        events.push(event("content_block_start", json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}})));
        events.push(event("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": script.text}})));
        events.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    }
    for c in &script.tool_calls {
        let (a, b) = c.arguments.split_at(c.arguments.len() / 2);
        events.push(event("content_block_start", json!({"type": "content_block_start", "index": index, "content_block": {"type": "tool_use", "id": c.id, "name": c.name, "input": {}}})));
        for piece in [a, b] {
            events.push(event("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": piece}})));
        }
        events.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    }
    events.push(event("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": finish}, "usage": {"output_tokens": script.completion_tokens}})));
    events.push(event("message_stop", json!({"type": "message_stop"})));
    events.concat()
}

/// Serves one connection: records each request and answers it from the script.
fn serve_connection<S>(stream: S, state: Arc<State>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let state = state.clone();
            async move {
                let recorded = Recorded::read(request).await;
                let json = recorded.json();
                let (method, path) = (recorded.method.clone(), recorded.path.clone());
                state.recorded.lock().unwrap().push(recorded);
                let (status, content_type, reply) = reply(&method, &path, &json, &state);
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

impl FakeBackend {
    fn state(script: Script) -> Arc<State> {
        Arc::new(State {
            health_503s_left: AtomicU32::new(script.health_503s),
            script,
            recorded: Arc::default(),
        })
    }

    /// Starts a backend on `127.0.0.1:0` answering with `script`, on the current tokio
    /// runtime.
    pub async fn start(script: Script) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Self::state(script);
        let requests = state.recorded.clone();
        let server = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                serve_connection(stream, state.clone());
            }
        });
        Self {
            endpoint: format!("http://{addr}"),
            requests,
            server,
        }
    }

    /// Starts a backend listening on the Unix socket `path` (which must not exist)
    /// answering with `script`, on the current tokio runtime.
    pub async fn start_unix(script: Script, path: &Path) -> Self {
        let listener = tokio::net::UnixListener::bind(path).unwrap();
        let state = Self::state(script);
        let requests = state.recorded.clone();
        let server = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                serve_connection(stream, state.clone());
            }
        });
        Self {
            endpoint: format!("unix:{}", path.display()),
            requests,
            server,
        }
    }

    /// What it has received so far.
    pub fn received(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }

    /// The chat requests it has received (`/v1/chat/completions`, `/v1/messages`), without
    /// the probes and tokenizer requests.
    pub fn chat_requests(&self) -> Vec<Recorded> {
        self.received()
            .into_iter()
            .filter(|r| r.path == "/v1/chat/completions" || r.path == "/v1/messages")
            .collect()
    }

    /// The paths of what it has received, in order.
    pub fn paths(&self) -> Vec<String> {
        self.received().into_iter().map(|r| r.path).collect()
    }
}
