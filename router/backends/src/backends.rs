//! Calls to model backends: the I/O of a supervisor's model routes.
//!
//! Every request is built from scratch by the router's wire module (nothing the agent sent
//! is passed through: no header, no unknown field), carries the route's key only in the
//! header its API wants, and goes to the route's endpoint: loopback or HTTPS through one
//! pooled client (rustls with the Web PKI roots, no system TLS library), or a Unix socket
//! with one connection per call. Replies are decoded as they arrive; a backend's error is
//! reduced to its status and error type before anyone sees it (error messages may echo keys).
//!
//! Two more things use the same transport. At start, [`Backends::probe_local`] checks that
//! every local route's server answers and lists the route's model (plan §3.2), so a
//! misconfigured route stops the supervisor instead of failing every call. During calls,
//! [`Backends::count_prompt`] and [`Backends::count_completion`] ask a vLLM or llama.cpp
//! server's tokenizer endpoint for honest token counts (plan §2.3, §3.7).

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tollgate_daemon::Secret;
use tollgate_router::config::{Api, Endpoint, KeySource, Preset, Route, RouteKind, Routes};
use tollgate_router::sse::SseParser;
use tollgate_router::wire::{self, ChatRequest, StreamDecoder, StreamItem, WireError};

/// Anthropic API version the supervisor speaks (pinned: the agent's SDK's is never used).
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
/// Largest whole (not streamed) reply or error body read.
const MAX_BODY: usize = 8 << 20;
/// Longest silence in a streamed reply before the call is given up.
const IDLE: Duration = Duration::from_secs(120);
/// Longest a whole model call may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(600);
/// Longest wait for a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the start-up probe waits for local routes' servers by default
/// (`--route-probe-timeout`): llama.cpp answers 503 while it loads its model.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause between two tries of a start-up probe.
const PROBE_INTERVAL: Duration = Duration::from_millis(500);
/// Longest wait for one token count (both requests, for llama.cpp); past it, the caller
/// estimates instead.
pub const TOKENIZER_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest tokenizer or probe reply read.
const MAX_SMALL_BODY: usize = 1 << 20;

/// Why a backend call failed.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The backend could not be reached.
    #[error("route {route}: cannot reach {endpoint}: {detail}")]
    Unreachable {
        /// The route.
        route: String,
        /// Its endpoint.
        endpoint: String,
        /// The transport's error.
        detail: String,
    },
    /// The backend answered with an error status.
    #[error("route {route}: the backend answered {status} ({kind})")]
    Status {
        /// The route.
        route: String,
        /// The HTTP status.
        status: u16,
        /// Its error type, when the body names one (never its message).
        kind: String,
    },
    /// The call cannot be sent in the route's format (nothing was sent).
    #[error("route {route}: {source}")]
    Unsendable {
        /// The route.
        route: String,
        /// What the call holds that the format cannot carry.
        source: WireError,
    },
    /// The reply could not be read.
    #[error("route {route}: {detail}")]
    Reply {
        /// The route.
        route: String,
        /// What was wrong.
        detail: String,
    },
}

impl BackendError {
    /// The HTTP status, when the backend answered with one.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// Why the routes' keys could not be loaded.
#[derive(Debug, thiserror::Error)]
#[error("route {route}: key {source_name}: {detail}")]
pub struct KeyError {
    /// The route.
    pub route: String,
    /// Where the key was to come from (`env:NAME`, `file:PATH`).
    pub source_name: String,
    /// Why it could not be read.
    pub detail: String,
}

/// Why a local route failed its start-up probe: the route, then what was asked and what
/// went wrong (`route local: GET http://127.0.0.1:8000/health: connection refused ...`).
#[derive(Debug, thiserror::Error)]
#[error("route {route}: {detail}")]
pub struct ProbeError {
    /// The route.
    pub route: String,
    /// What failed (the request and its outcome, or the model missing from the list), and
    /// what to do about it.
    pub detail: String,
}

/// Why a tokenizer endpoint gave no count (the caller then estimates).
#[derive(Debug, thiserror::Error)]
#[error("route {route}: tokenizer: {detail}")]
pub struct TokenizerError {
    /// The route.
    pub route: String,
    /// What failed.
    pub detail: String,
}

/// Whether the server of `route` has a tokenizer endpoint the supervisor counts with
/// (presets `vllm` and `llamacpp`).
pub fn has_tokenizer(route: &Route) -> bool {
    matches!(route.preset, Some(Preset::Vllm | Preset::Llamacpp))
}

/// Why a request got no response: it could not be built (a key that is not a valid header
/// value), or the backend could not be reached.
enum SendError {
    Request(String),
    Transport(String),
}

/// One outcome of one probe try.
enum ProbeTry {
    /// Worth trying again (the server is not up yet, or still loading).
    Retry(String),
    /// Trying again will not help.
    Fatal(String),
}

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// The backends of a supervisor's routes, with their keys loaded.
pub struct Backends {
    client: HttpsClient,
    keys: HashMap<String, Secret>,
}

impl std::fmt::Debug for Backends {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backends")
            .field("routes_with_keys", &self.keys.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// Reads a route's key: an environment variable of the supervisor, or a file only root can
/// read (see `tollgate_daemon::files::read_secret_file`); an empty key is refused.
pub fn load_key(source: &KeySource) -> Result<Secret, String> {
    match source {
        KeySource::Env(name) => {
            let value = std::env::var(name)
                .map_err(|_| format!("environment variable {name} is not set (or not UTF-8)"))?;
            let trimmed = value.trim_end();
            if trimmed.is_empty() {
                return Err(format!("{source} is empty"));
            }
            Ok(Secret::new(trimmed.to_owned()))
        }
        KeySource::File(path) => {
            tollgate_daemon::files::read_secret_file(path).map_err(|e| e.to_string())
        }
    }
}

impl Backends {
    /// Loads every route's key (from the supervisor's environment or a root-only file) and
    /// sets up the client.
    pub fn new(routes: &Routes) -> Result<Self, KeyError> {
        let mut keys = HashMap::new();
        for route in &routes.routes {
            if let Some(source) = &route.key {
                let secret = load_key(source).map_err(|detail| KeyError {
                    route: route.name.clone(),
                    source_name: source.to_string(),
                    detail,
                })?;
                keys.insert(route.name.clone(), secret);
            }
        }
        let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| KeyError {
            route: "-".into(),
            source_name: "tls".into(),
            detail: e.to_string(),
        })?
        .with_root_certificates(rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        })
        .with_no_client_auth();
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        // A streamed call's small writes must not wait for the upstream's delayed ACK (Nagle).
        http.set_nodelay(true);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build(connector);
        Ok(Self { client, keys })
    }

    /// The key of `route`, for scrubbing it out of anything shown to an agent.
    pub fn key_of(&self, route: &str) -> Option<&str> {
        self.keys.get(route).map(Secret::expose)
    }

    /// Sends `request` to `route` and feeds what it answers into `items` (deltas, finish,
    /// usage, done), as it arrives. Returns when the reply has ended or `items` is closed.
    pub async fn call(
        &self,
        route: &Route,
        request: &ChatRequest,
        items: &mpsc::Sender<StreamItem>,
    ) -> Result<(), BackendError> {
        let (path, body) =
            wire::request(route.api, request).map_err(|source| BackendError::Unsendable {
                route: route.name.clone(),
                source,
            })?;
        let accept = if request.call.stream {
            "text/event-stream"
        } else {
            "application/json"
        };
        let response = self
            .send(route, hyper::Method::POST, path, Some(body), accept)
            .await
            .map_err(|e| match e {
                SendError::Request(detail) => self.reply_error(route, detail),
                SendError::Transport(detail) => BackendError::Unreachable {
                    route: route.name.clone(),
                    endpoint: route.endpoint.to_string(),
                    detail,
                },
            })?;
        let status = response.status();
        let mut body = response.into_body();
        if !status.is_success() {
            let bytes = read_capped(&mut body, 64 << 10).await.unwrap_or_default();
            let kind = serde_json::from_slice::<Value>(&bytes)
                .ok()
                .and_then(|v| {
                    v.pointer("/error/type")
                        .or_else(|| v.pointer("/error/code"))
                        .and_then(|t| t.as_str().map(str::to_owned))
                })
                // A type is an identifier; anything else may be prose (and echo a key).
                .filter(|t| {
                    (1..=64).contains(&t.len())
                        && t.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
                })
                .unwrap_or_else(|| "no error type".into());
            return Err(BackendError::Status {
                route: route.name.clone(),
                status: status.as_u16(),
                kind,
            });
        }
        if !request.call.stream {
            let bytes = read_capped(&mut body, MAX_BODY)
                .await
                .map_err(|detail| self.reply_error(route, detail))?;
            let reply = wire::parse_reply(route.api, &bytes)
                .map_err(|e| self.reply_error(route, e.to_string()))?;
            let sent = reply.deltas.into_iter().map(StreamItem::Delta).chain([
                StreamItem::Finish(reply.finish_reason),
                StreamItem::Usage {
                    prompt: reply.prompt_tokens,
                    completion: reply.completion_tokens,
                },
                StreamItem::Done,
            ]);
            for item in sent {
                if items.send(item).await.is_err() {
                    break;
                }
            }
            return Ok(());
        }
        let mut parser = SseParser::new();
        let mut decoder = StreamDecoder::new(route.api);
        loop {
            // A backend that stops sending holds a call slot: not for longer than IDLE.
            let frame = match tokio::time::timeout(IDLE, body.frame()).await {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(_) => {
                    return Err(self.reply_error(
                        route,
                        format!("the backend sent nothing for {} s", IDLE.as_secs()),
                    ))
                }
            };
            let frame = frame.map_err(|e| self.reply_error(route, e.to_string()))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            let events = parser
                .push(&data)
                .map_err(|e| self.reply_error(route, e.to_string()))?;
            for event in events {
                let decoded = decoder
                    .event(&event)
                    .map_err(|e| self.reply_error(route, e.to_string()))?;
                for item in decoded {
                    let done = item == StreamItem::Done;
                    if items.send(item).await.is_err() {
                        // The caller is gone: dropping the body closes the connection and
                        // the server stops generating.
                        return Ok(());
                    }
                    if done {
                        return Ok(());
                    }
                }
            }
        }
        // The body ended without the format's end marker: what came is what there is.
        // The body ended without the format's end marker: cut short.
        Err(self.reply_error(route, "the reply stream ended early".into()))
    }

    fn reply_error(&self, route: &Route, detail: String) -> BackendError {
        BackendError::Reply {
            route: route.name.clone(),
            detail,
        }
    }

    /// Sends one request to `route` (its key in the header its API wants) and returns the
    /// response, whose body is still to be read.
    async fn send(
        &self,
        route: &Route,
        method: hyper::Method,
        path: &str,
        body: Option<Vec<u8>>,
        accept: &'static str,
    ) -> Result<hyper::Response<hyper::body::Incoming>, SendError> {
        let mut builder = hyper::Request::builder()
            .method(method)
            .uri(match &route.endpoint {
                Endpoint::Http { .. } => format!("{}{path}", route.endpoint),
                Endpoint::Unix(_) => path.to_owned(),
            })
            .header(hyper::header::ACCEPT, accept);
        if body.is_some() {
            builder = builder.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        if let Endpoint::Unix(_) = route.endpoint {
            builder = builder.header(hyper::header::HOST, "localhost");
        }
        if route.api == Api::Anthropic {
            builder = builder.header("anthropic-version", ANTHROPIC_VERSION);
        }
        if let Some(key) = self.keys.get(&route.name) {
            builder = match route.api {
                Api::Anthropic => builder.header("x-api-key", key.expose()),
                Api::Openai | Api::OpenaiResponses => builder.header(
                    hyper::header::AUTHORIZATION,
                    format!("Bearer {}", key.expose()),
                ),
            };
        }
        let request = builder
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            // Never the error's text: it could quote the key's header value.
            .map_err(|_| {
                SendError::Request(
                    "the request could not be built (is the route's key a valid header value?)"
                        .into(),
                )
            })?;
        match &route.endpoint {
            Endpoint::Http { .. } => self
                .client
                .request(request)
                .await
                .map_err(|e| SendError::Transport(transport_detail(&e))),
            Endpoint::Unix(path) => {
                let transport = |e: &(dyn std::error::Error + 'static)| {
                    SendError::Transport(transport_detail(e))
                };
                let stream = tokio::net::UnixStream::connect(path)
                    .await
                    .map_err(|e| transport(&e))?;
                let (mut sender, connection) =
                    hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                        .await
                        .map_err(|e| transport(&e))?;
                tokio::spawn(connection);
                sender
                    .send_request(request)
                    .await
                    .map_err(|e| transport(&e))
            }
        }
    }

    /// `GET path` on `route`: the status and the body (at most 1 MiB).
    async fn get(&self, route: &Route, path: &str) -> Result<(u16, Bytes), SendError> {
        self.exchange(route, hyper::Method::GET, path, None).await
    }

    /// `POST path` with a JSON body on `route`: the status and the body (at most 1 MiB).
    async fn post_json(
        &self,
        route: &Route,
        path: &str,
        body: &Value,
    ) -> Result<(u16, Bytes), SendError> {
        let body = body.to_string().into_bytes();
        self.exchange(route, hyper::Method::POST, path, Some(body))
            .await
    }

    async fn exchange(
        &self,
        route: &Route,
        method: hyper::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Bytes), SendError> {
        let response = self
            .send(route, method, path, body, "application/json")
            .await?;
        let status = response.status().as_u16();
        let mut body = response.into_body();
        let bytes = read_capped(&mut body, MAX_SMALL_BODY)
            .await
            .map_err(SendError::Transport)?;
        Ok((status, Bytes::from(bytes)))
    }

    /// Probes every local route (cloud routes are not contacted: no traffic, no key use at
    /// start), all within one `timeout` from now; the first failure is returned.
    pub async fn probe_local(&self, routes: &Routes, timeout: Duration) -> Result<(), ProbeError> {
        let deadline = Instant::now() + timeout;
        for route in routes.routes.iter().filter(|r| r.kind == RouteKind::Local) {
            self.probe_until(route, deadline, timeout).await?;
        }
        Ok(())
    }

    /// Checks that `route`'s server answers and lists the route's model, trying every
    /// 500 ms for up to `timeout` while it is unreachable or answers 5xx (llama.cpp answers
    /// 503 while it loads). Per preset: ollama `GET /api/tags`; vllm and llamacpp
    /// `GET /health`, then `GET /v1/models`; lmstudio and no preset `GET /v1/models`.
    pub async fn probe(&self, route: &Route, timeout: Duration) -> Result<(), ProbeError> {
        self.probe_until(route, Instant::now() + timeout, timeout)
            .await
    }

    async fn probe_until(
        &self,
        route: &Route,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<(), ProbeError> {
        let failed = |detail: String| ProbeError {
            route: route.name.clone(),
            detail,
        };
        loop {
            match self.probe_once(route, deadline).await {
                Ok(()) => return Ok(()),
                Err(ProbeTry::Fatal(detail)) => return Err(failed(detail)),
                Err(ProbeTry::Retry(detail)) => {
                    if Instant::now() + PROBE_INTERVAL >= deadline {
                        return Err(failed(format!(
                            "{detail} (still failing after {} s: start the server, or allow it longer with --route-probe-timeout)",
                            timeout.as_secs_f32().ceil()
                        )));
                    }
                    tracing::debug!(route = %route.name, %detail, "route probe: trying again");
                }
            }
            tokio::time::sleep(PROBE_INTERVAL).await;
        }
    }

    /// One try of `route`'s probe.
    async fn probe_once(&self, route: &Route, deadline: Instant) -> Result<(), ProbeTry> {
        let listed = match route.preset {
            Some(Preset::Ollama) => {
                let tags = self.probe_get(route, "/api/tags", deadline).await?;
                names(&tags, "/models", "name")
            }
            Some(Preset::Vllm | Preset::Llamacpp) => {
                self.probe_get(route, "/health", deadline).await?;
                let models = self.probe_get(route, "/v1/models", deadline).await?;
                names(&models, "/data", "id")
            }
            Some(Preset::Lmstudio) | None => {
                let models = self.probe_get(route, "/v1/models", deadline).await?;
                names(&models, "/data", "id")
            }
        };
        let model = route.model.as_str();
        let latest = format!("{model}:latest");
        let found = listed
            .iter()
            .any(|name| name == model || (route.preset == Some(Preset::Ollama) && *name == latest));
        if found {
            return Ok(());
        }
        let shown = if listed.is_empty() {
            "none".to_owned()
        } else if listed.len() > 20 {
            format!("{}, ... ({} in all)", listed[..20].join(", "), listed.len())
        } else {
            listed.join(", ")
        };
        Err(ProbeTry::Fatal(format!(
            "model {model:?} is not among the models the server lists: {shown} (set the route's model to one of them, or load it on the server)"
        )))
    }

    /// `GET path` for a probe, bounded by `deadline`: the body as JSON (`null` when empty).
    async fn probe_get(
        &self,
        route: &Route,
        path: &str,
        deadline: Instant,
    ) -> Result<Value, ProbeTry> {
        let target = target(route, path);
        let answer = tokio::time::timeout_at(deadline, self.get(route, path)).await;
        let (status, body) = match answer {
            Err(_) => return Err(ProbeTry::Retry(format!("GET {target}: no answer"))),
            Ok(Err(SendError::Transport(detail))) => {
                return Err(ProbeTry::Retry(format!("GET {target}: {detail}")))
            }
            Ok(Err(SendError::Request(detail))) => {
                return Err(ProbeTry::Fatal(format!("GET {target}: {detail}")))
            }
            Ok(Ok(answer)) => answer,
        };
        if status >= 500 {
            return Err(ProbeTry::Retry(format!(
                "GET {target}: the server answered {status}"
            )));
        }
        if !(200..300).contains(&status) {
            return Err(ProbeTry::Fatal(format!(
                "GET {target}: the server answered {status} (is the route's preset, endpoint or key right?)"
            )));
        }
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&body).map_err(|e| {
            ProbeTry::Fatal(format!(
                "GET {target}: the reply is not JSON ({e}); is the route's preset right?"
            ))
        })
    }

    /// Counts the prompt tokens of `request` as `route`'s server would see them before its
    /// reply (chat template, tool definitions and tool calls included: the messages and
    /// tools go as the call would send them), with its tokenizer endpoint: vLLM
    /// `POST /tokenize` (`count`), llama.cpp `POST /apply-template` then `POST /tokenize`
    /// (`tokens`). At most [`TOKENIZER_TIMEOUT`]; an error when the preset has no tokenizer
    /// or it fails.
    pub async fn count_prompt(
        &self,
        route: &Route,
        request: &ChatRequest,
    ) -> Result<u64, TokenizerError> {
        let body = wire::openai_chat::body(request).map_err(|e| TokenizerError {
            route: route.name.clone(),
            detail: e.to_string(),
        })?;
        let chat = body.get("messages").cloned().unwrap_or(Value::Null);
        let tools = body.get("tools").cloned();
        self.bounded(route, async {
            match route.preset {
                Some(Preset::Vllm) => {
                    let reply = self
                        .tokenize(
                            route,
                            "/tokenize",
                            with_tools(
                                json!({"model": route.model, "messages": chat, "add_generation_prompt": true}),
                                &tools,
                            ),
                        )
                        .await?;
                    vllm_count(&reply)
                }
                Some(Preset::Llamacpp) => {
                    let templated = self
                        .tokenize(
                            route,
                            "/apply-template",
                            with_tools(json!({"messages": chat}), &tools),
                        )
                        .await?;
                    let prompt = templated
                        .get("prompt")
                        .and_then(Value::as_str)
                        .ok_or("POST /apply-template: the reply has no \"prompt\" string")?;
                    let reply = self
                        .tokenize(
                            route,
                            "/tokenize",
                            json!({"content": prompt, "add_special": true, "parse_special": true, "with_pieces": false}),
                        )
                        .await?;
                    llamacpp_count(&reply)
                }
                _ => Err("its server has no tokenizer endpoint".into()),
            }
        })
        .await
    }

    /// Counts the tokens of a completion's `text` with `route`'s tokenizer endpoint (no
    /// special tokens added). At most [`TOKENIZER_TIMEOUT`]; an error when the preset has no
    /// tokenizer or it fails.
    pub async fn count_completion(&self, route: &Route, text: &str) -> Result<u64, TokenizerError> {
        self.bounded(route, async {
            match route.preset {
                Some(Preset::Vllm) => {
                    let reply = self
                        .tokenize(
                            route,
                            "/tokenize",
                            json!({"model": route.model, "prompt": text, "add_special_tokens": false}),
                        )
                        .await?;
                    vllm_count(&reply)
                }
                Some(Preset::Llamacpp) => {
                    let reply = self
                        .tokenize(
                            route,
                            "/tokenize",
                            json!({"content": text, "add_special": false, "with_pieces": false}),
                        )
                        .await?;
                    llamacpp_count(&reply)
                }
                _ => Err("its server has no tokenizer endpoint".into()),
            }
        })
        .await
    }

    /// Runs a count within [`TOKENIZER_TIMEOUT`].
    async fn bounded(
        &self,
        route: &Route,
        count: impl std::future::Future<Output = Result<u64, String>>,
    ) -> Result<u64, TokenizerError> {
        let failed = |detail: String| TokenizerError {
            route: route.name.clone(),
            detail,
        };
        match tokio::time::timeout(TOKENIZER_TIMEOUT, count).await {
            Ok(Ok(tokens)) => Ok(tokens),
            Ok(Err(detail)) => Err(failed(detail)),
            Err(_) => Err(failed(format!(
                "no count within {} s",
                TOKENIZER_TIMEOUT.as_secs()
            ))),
        }
    }

    /// One tokenizer request: the reply's JSON, or what went wrong (never the text sent).
    async fn tokenize(&self, route: &Route, path: &str, body: Value) -> Result<Value, String> {
        let (status, reply) = self
            .post_json(route, path, &body)
            .await
            .map_err(|e| match e {
                SendError::Request(detail) | SendError::Transport(detail) => {
                    format!("POST {path}: {detail}")
                }
            })?;
        if !(200..300).contains(&status) {
            return Err(format!("POST {path}: the server answered {status}"));
        }
        serde_json::from_slice(&reply)
            .map_err(|e| format!("POST {path}: the reply is not JSON: {e}"))
    }
}

/// A tokenizer request `body` with the call's tool definitions, when it has any (the chat
/// template renders them into the prompt).
fn with_tools(mut body: Value, tools: &Option<Value>) -> Value {
    if let Some(tools) = tools {
        body["tools"] = tools.clone();
    }
    body
}

/// Where a request to `path` on `route` goes, for messages: `http://127.0.0.1:8000/health`,
/// or `/health on unix:/run/llama.sock`.
fn target(route: &Route, path: &str) -> String {
    match &route.endpoint {
        Endpoint::Http { .. } => format!("{}{path}", route.endpoint),
        Endpoint::Unix(_) => format!("{path} on {}", route.endpoint),
    }
}

/// The string field `field` of each object in the array at `pointer` (`models[].name`,
/// `data[].id`).
fn names(reply: &Value, pointer: &str, field: &str) -> Vec<String> {
    reply
        .pointer(pointer)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.get(field).and_then(Value::as_str))
        .map(str::to_owned)
        .collect()
}

/// vLLM's `/tokenize` reply: `count` (or the length of `tokens`).
fn vllm_count(reply: &Value) -> Result<u64, String> {
    reply
        .get("count")
        .and_then(Value::as_u64)
        .or_else(|| {
            reply
                .get("tokens")
                .and_then(Value::as_array)
                .map(|t| t.len() as u64)
        })
        .ok_or_else(|| "POST /tokenize: the reply has no \"count\"".into())
}

/// llama.cpp's `/tokenize` reply: the length of `tokens`.
fn llamacpp_count(reply: &Value) -> Result<u64, String> {
    reply
        .get("tokens")
        .and_then(Value::as_array)
        .map(|t| t.len() as u64)
        .ok_or_else(|| "POST /tokenize: the reply has no \"tokens\" list".into())
}

/// A transport error in few words: the I/O error underneath when there is one
/// (`connection refused`), else the whole chain (hyper's top-level message says little).
fn transport_detail(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = cause {
        if let Some(io) = current.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind;
            return match io.kind() {
                ErrorKind::ConnectionRefused => "connection refused".into(),
                ErrorKind::NotFound => "no such socket".into(),
                ErrorKind::PermissionDenied => "permission denied".into(),
                ErrorKind::TimedOut => "connection timed out".into(),
                ErrorKind::ConnectionReset => "connection reset".into(),
                _ => io.to_string(),
            };
        }
        cause = current.source();
    }
    tollgate_daemon::error_chain(error)
}

/// Reads a body up to `cap` bytes.
async fn read_capped<B>(body: &mut B, cap: usize) -> Result<Vec<u8>, String>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| e.to_string())?;
        if let Ok(data) = frame.into_data() {
            if bytes.len() + data.len() > cap {
                return Err(format!("the reply is larger than {cap} bytes"));
            }
            bytes.extend_from_slice(&data);
        }
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_come_from_where_the_file_says_and_never_print() {
        let name = "TOLLGATE_ROUTER_TEST_KEY";
        assert!(load_key(&KeySource::Env(name.into()))
            .unwrap_err()
            .contains("not set"));
        let dir = std::env::temp_dir().join(format!("tollgate-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("key");
        std::fs::write(&file, "sk-test-value\n").unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let loose = load_key(&KeySource::File(file.clone()));
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let strict = load_key(&KeySource::File(file.clone()));
        std::fs::remove_dir_all(&dir).unwrap();
        if nix::unistd::geteuid().is_root() {
            assert!(loose.unwrap_err().contains("mode 0600"));
            let secret = strict.unwrap();
            assert_eq!(secret.expose(), "sk-test-value");
            assert_eq!(format!("{secret:?}"), "[secret]");
        } else {
            assert!(strict.unwrap_err().contains("owned by root"));
        }
    }
}
