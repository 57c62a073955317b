//! Calls to model backends: the supervisor's side of its model routes.
//!
//! Every request is built from scratch by the router's wire module (nothing the agent sent
//! is passed through: no header, no unknown field), carries the route's key only in the
//! header its API wants, and goes to the route's endpoint: loopback or HTTPS through one
//! pooled client (rustls with the Web PKI roots, no system TLS library), or a Unix socket
//! with one connection per call. Replies are decoded as they arrive; a backend's error is
//! reduced to its status and error type before anyone sees it (error messages may echo keys).

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use tokio::sync::mpsc;
use tollgate_router::config::{Api, Endpoint, Route, Routes, Secret};
use tollgate_router::sse::SseParser;
use tollgate_router::wire::{self, ChatRequest, StreamItem};

/// Anthropic API version the supervisor speaks (pinned: the agent's SDK's is never used).
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
/// Largest whole (not streamed) reply or error body read.
const MAX_BODY: usize = 8 << 20;
/// Longest wait for a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

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

impl Backends {
    /// Loads every route's key (from the supervisor's environment or a root-only file) and
    /// sets up the client.
    pub fn new(routes: &Routes) -> Result<Self, KeyError> {
        let mut keys = HashMap::new();
        for route in &routes.routes {
            if let Some(source) = &route.key {
                let secret = source.load().map_err(|detail| KeyError {
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
        let (path, body) = wire::request(route.api, request);
        let mut builder = hyper::Request::post(match &route.endpoint {
            Endpoint::Http { .. } => format!("{}{path}", route.endpoint),
            Endpoint::Unix(_) => path.to_owned(),
        })
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header(
            hyper::header::ACCEPT,
            if request.stream {
                "text/event-stream"
            } else {
                "application/json"
            },
        );
        if let Endpoint::Unix(_) = route.endpoint {
            builder = builder.header(hyper::header::HOST, "localhost");
        }
        if route.api == Api::Anthropic {
            builder = builder.header("anthropic-version", ANTHROPIC_VERSION);
        }
        if let Some(key) = self.keys.get(&route.name) {
            builder = match route.api {
                Api::Anthropic => builder.header("x-api-key", key.expose()),
                Api::Openai => builder.header(
                    hyper::header::AUTHORIZATION,
                    format!("Bearer {}", key.expose()),
                ),
            };
        }
        let http_request = builder
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| self.reply_error(route, e.to_string()))?;
        let unreachable = |detail: String| BackendError::Unreachable {
            route: route.name.clone(),
            endpoint: route.endpoint.to_string(),
            detail,
        };
        let response = match &route.endpoint {
            Endpoint::Http { .. } => self
                .client
                .request(http_request)
                .await
                .map_err(|e| unreachable(error_chain(&e)))?
                .map(http_body_util::Either::Left),
            Endpoint::Unix(path) => {
                let stream = tokio::net::UnixStream::connect(path)
                    .await
                    .map_err(|e| unreachable(e.to_string()))?;
                let (mut sender, connection) =
                    hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                        .await
                        .map_err(|e| unreachable(e.to_string()))?;
                tokio::spawn(connection);
                sender
                    .send_request(http_request)
                    .await
                    .map_err(|e| unreachable(e.to_string()))?
                    .map(http_body_util::Either::Right)
            }
        };
        let status = response.status();
        let mut body = response.into_body();
        if !status.is_success() {
            let bytes = read_capped(&mut body, 64 << 10).await.unwrap_or_default();
            let kind = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| {
                    v.pointer("/error/type")
                        .or_else(|| v.pointer("/error/code"))
                        .and_then(|t| t.as_str().map(str::to_owned))
                })
                .unwrap_or_else(|| "no error type".into());
            return Err(BackendError::Status {
                route: route.name.clone(),
                status: status.as_u16(),
                kind,
            });
        }
        if !request.stream {
            let bytes = read_capped(&mut body, MAX_BODY)
                .await
                .map_err(|detail| self.reply_error(route, detail))?;
            let reply = wire::parse_reply(route.api, &bytes)
                .map_err(|e| self.reply_error(route, e.to_string()))?;
            let sent = [
                StreamItem::Delta(reply.text),
                StreamItem::Finish(reply.finish_reason),
                StreamItem::Usage {
                    prompt: reply.prompt_tokens,
                    completion: reply.completion_tokens,
                },
                StreamItem::Done,
            ];
            for item in sent {
                if items.send(item).await.is_err() {
                    break;
                }
            }
            return Ok(());
        }
        let mut parser = SseParser::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| self.reply_error(route, e.to_string()))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            let events = parser
                .push(&data)
                .map_err(|e| self.reply_error(route, e.to_string()))?;
            for event in events {
                let decoded = wire::stream_event(route.api, &event)
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
        let _ = items.send(StreamItem::Done).await;
        Ok(())
    }

    fn reply_error(&self, route: &Route, detail: String) -> BackendError {
        BackendError::Reply {
            route: route.name.clone(),
            detail,
        }
    }
}

/// A transport error with its causes (hyper's top-level message alone says little).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
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
