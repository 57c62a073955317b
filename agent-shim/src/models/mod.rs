//! `tollgate-shim models`: the sandbox's own model endpoint on `127.0.0.1`, so today's agents
//! and the official OpenAI and Anthropic SDKs work unmodified inside a sandbox
//! (`OPENAI_BASE_URL`, `ANTHROPIC_BASE_URL`).
//!
//! Pid 1 starts it before the agent, confined exactly as the agent is. It serves
//! `GET /v1/models` (and `/v1/models/{id}`), `POST /v1/chat/completions` (OpenAI Chat
//! Completions), `POST /v1/responses` (the OpenAI Responses API), `POST /v1/messages` and
//! `POST /v1/messages/count_tokens` (Anthropic Messages), each also without the `/v1`
//! prefix for the OpenAI paths, streamed or not, and turns each call into the gateway's
//! canonical `Complete` (messages with their parts: text, images, tool calls and results,
//! reasoning; tools and tool choice; response format; reasoning effort or budget). The
//! request's `model` is sent as the route: a route, a name a route claims, or anything else,
//! which goes where `auto` would. Replies name the model that served the call.
//!
//! Request headers are ignored — an API key the agent sends goes nowhere; only
//! `anthropic-version` on `GET /v1/models` picks the Anthropic list shape. Tools that would run
//! outside the gateway (hosted and server tools) are dropped and named in the
//! `x-tollgate-dropped-tools` response header. A request this endpoint refuses itself is
//! recorded with the gateway (`RecordRefusedCall`) before it is answered; every answer uses
//! the API's own error shape, with `x-should-retry: false` where a retry cannot help.

mod chat;
mod common;
mod messages;
mod reply;
mod responses;
#[cfg(test)]
mod tests;

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited, StreamBody};
use hyper::body::Frame;
use hyper::header::HeaderValue;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::StreamExt as _;
use tollgate_proto::v1 as pb;
use tollgate_shim_protocol::plan::MODELS_PORT;

use common::{Call, Invalid, Reply};
use reply::{anthropic_kind, Context, Encoder, GatewayError};

/// Largest request body read.
const MAX_REQUEST: usize = 8 << 20;

/// How long recording a refused request may hold up its answer.
const RECORD_TIMEOUT: Duration = Duration::from_secs(2);

/// The response header naming the tools dropped from a request.
const DROPPED_HEADER: &str = "x-tollgate-dropped-tools";

type Body = http_body_util::Either<
    Full<Bytes>,
    StreamBody<tokio_stream::wrappers::ReceiverStream<Result<Frame<Bytes>, Infallible>>>,
>;
type Gateway = pb::gateway_client::GatewayClient<tonic::transport::Channel>;

/// Which API a request speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    /// OpenAI Chat Completions.
    Chat,
    /// Anthropic Messages.
    Messages,
    /// The OpenAI Responses API.
    Responses,
}

impl Api {
    /// Its name in the audit log (RecordRefusedCallRequest.api).
    fn name(self) -> &'static str {
        match self {
            Api::Chat => "openai-chat",
            Api::Messages => "anthropic-messages",
            Api::Responses => "openai-responses",
        }
    }
}

/// Runs `tollgate-shim models [--port N]`; returns the exit status.
pub fn main(args: &[String]) -> i32 {
    let port = match args {
        [] => MODELS_PORT,
        [flag, port] if flag == "--port" => match port.parse() {
            Ok(port) => port,
            Err(_) => return usage(),
        },
        _ => return usage(),
    };
    // Warnings and errors by default; RUST_LOG=debug names dropped tools and refusals.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    let target = crate::helper::gateway_target();
    let runtime = match crate::helper::runtime("models") {
        Ok(runtime) => runtime,
        Err(status) => return status,
    };
    runtime.block_on(async move {
        let channel = match tonic::transport::Endpoint::from_shared(target.clone()) {
            Ok(endpoint) => endpoint.connect_lazy(),
            Err(e) => {
                eprintln!("tollgate-shim models: bad gateway address {target}: {e}");
                return 64;
            }
        };
        let gateway = pb::gateway_client::GatewayClient::new(channel);
        let listener = match tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
            Ok(listener) => listener,
            Err(e) => {
                eprintln!("tollgate-shim models: cannot listen on 127.0.0.1:{port}: {e}");
                return 69;
            }
        };
        serve(listener, gateway).await
    })
}

fn usage() -> i32 {
    eprintln!("usage: tollgate-shim models [--port N] (started by the sandbox's pid 1)");
    2
}

/// Serves the endpoint on `listener`, calling `gateway`, until the process ends.
async fn serve(listener: tokio::net::TcpListener, gateway: Gateway) -> i32 {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        accepted(&stream);
        let gateway = gateway.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let gateway = gateway.clone();
                async move { Ok::<_, Infallible>(handle(gateway, request).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Readies an accepted connection: a streamed reply is many small writes, and with Nagle's
/// algorithm each would wait for the agent's delayed ACK (~40 ms) before going out.
fn accepted(stream: &tokio::net::TcpStream) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::warn!(error = %e, "cannot set TCP_NODELAY on a model connection");
    }
}

fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    let mut response = Response::new(http_body_util::Either::Left(Full::new(Bytes::from(
        value.to_string(),
    ))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// An error in the API's shape. `x-should-retry: false` on every 4xx and wherever `retry` is
/// false: every call is charged and audited, and a retry of these cannot help.
fn error_response(
    api: Api,
    status: StatusCode,
    kind: &str,
    message: &str,
    retry: bool,
) -> Response<Body> {
    let body = match api {
        Api::Chat | Api::Responses => {
            json!({"error": {"message": message, "type": kind, "param": null, "code": kind}})
        }
        Api::Messages => {
            json!({"type": "error", "error": {"type": anthropic_kind(status), "message": message}})
        }
    };
    let mut response = json_response(status, &body);
    if status.is_client_error() || !retry {
        response
            .headers_mut()
            .insert("x-should-retry", HeaderValue::from_static("false"));
    }
    response
}

/// The HTTP answer to a gateway refusal.
fn gateway_refused(api: Api, status: &tonic::Status) -> Response<Body> {
    let error = GatewayError::of(status);
    error_response(
        api,
        error.status,
        error.openai_kind,
        status.message(),
        error.retry,
    )
}

/// A request the endpoint refuses itself.
struct Refusal {
    status: StatusCode,
    kind: &'static str,
    reason: String,
}

impl Refusal {
    fn bad_request(invalid: &Invalid) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            reason: invalid.to_string(),
        }
    }
}

/// Where a request goes.
enum Target {
    /// The model list, or one model.
    Models(Option<String>),
    /// A call (of the API `target` returns beside it).
    Call,
    /// Anthropic's token count.
    CountTokens,
    /// Nothing here.
    Unknown,
}

/// The target of `method path`, and the API whose shapes answer it.
fn target(method: &Method, path: &str, anthropic: bool) -> (Target, Api) {
    let listed = if anthropic { Api::Messages } else { Api::Chat };
    match (method, path) {
        (&Method::GET, "/v1/models" | "/models") => (Target::Models(None), listed),
        (&Method::GET, _) if path.starts_with("/v1/models/") || path.starts_with("/models/") => {
            let id = path.split_once("models/").map_or("", |(_, id)| id);
            (Target::Models(Some(id.to_owned())), listed)
        }
        (&Method::POST, "/v1/chat/completions" | "/chat/completions") => (Target::Call, Api::Chat),
        (&Method::POST, "/v1/responses" | "/responses") => (Target::Call, Api::Responses),
        (&Method::POST, "/v1/messages") => (Target::Call, Api::Messages),
        (&Method::POST, "/v1/messages/count_tokens") => (Target::CountTokens, Api::Messages),
        // Answer in the shape the agent will read.
        _ if anthropic || path.contains("/messages") => (Target::Unknown, Api::Messages),
        _ if path.contains("/responses") => (Target::Unknown, Api::Responses),
        _ => (Target::Unknown, Api::Chat),
    }
}

async fn handle(mut gateway: Gateway, request: Request<hyper::body::Incoming>) -> Response<Body> {
    let (method, path) = (request.method().clone(), request.uri().path().to_owned());
    let anthropic = request.headers().contains_key("anthropic-version");
    // What is recorded of the request: its method and path, cut short (the audit log gets it).
    let line = format!("{method} {}", clip(&path));
    let (target, api) = target(&method, &path, anthropic);
    match target {
        Target::Models(id) => models(&mut gateway, api, id).await,
        Target::Unknown => {
            let refusal = Refusal {
                status: StatusCode::NOT_FOUND,
                kind: "not_found_error",
                reason: format!(
                    "{line} is not served here: this endpoint serves GET /v1/models, POST \
                     /v1/chat/completions, POST /v1/responses, POST /v1/messages and POST \
                     /v1/messages/count_tokens"
                ),
            };
            refuse(&mut gateway, None, api, &line, "", refusal).await
        }
        Target::Call | Target::CountTokens => {
            let body = match Limited::new(request.into_body(), MAX_REQUEST)
                .collect()
                .await
            {
                Ok(body) => body.to_bytes(),
                Err(_) => {
                    let refusal = Refusal {
                        status: StatusCode::PAYLOAD_TOO_LARGE,
                        kind: "invalid_request_error",
                        reason: "the request body is larger than 8 MiB: send less (shorter \
                                 history, smaller images)"
                            .into(),
                    };
                    return refuse(&mut gateway, Some(api), api, &line, "", refusal).await;
                }
            };
            let value = match serde_json::from_slice::<Value>(&body) {
                Ok(value @ Value::Object(_)) => value,
                Ok(_) => {
                    let invalid = Invalid::new("the body must be a JSON object");
                    let refusal = Refusal::bad_request(&invalid);
                    return refuse(&mut gateway, Some(api), api, &line, "", refusal).await;
                }
                Err(e) => {
                    let invalid = Invalid::new(format!("the body is not JSON: {e}"));
                    let refusal = Refusal::bad_request(&invalid);
                    return refuse(&mut gateway, Some(api), api, &line, "", refusal).await;
                }
            };
            let parsed = match api {
                Api::Chat => chat::parse(&value),
                Api::Messages => messages::parse(&value),
                Api::Responses => responses::parse(&value),
            };
            let call = match parsed {
                Ok(call) => call,
                Err(invalid) => {
                    let model = clip(&common::string_of(&value, "model")).to_owned();
                    let refusal = Refusal::bad_request(&invalid);
                    return refuse(&mut gateway, Some(api), api, &line, &model, refusal).await;
                }
            };
            let dropped = dropped_header(api, &call.dropped);
            let mut response = match target {
                Target::CountTokens => count_tokens(&mut gateway, call).await,
                _ => complete(gateway, api, call).await,
            };
            if let Some(dropped) = dropped {
                response.headers_mut().insert(DROPPED_HEADER, dropped);
            }
            response
        }
    }
}

/// At most the first 200 bytes of `text` (on a character boundary): the path and model name
/// recorded of a refused request are the agent's text, of any length.
fn clip(text: &str) -> &str {
    let mut end = text.len().min(200);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The `x-tollgate-dropped-tools` header for the tools dropped from a request (logged too).
fn dropped_header(api: Api, dropped: &[String]) -> Option<HeaderValue> {
    if dropped.is_empty() {
        return None;
    }
    // Names as the agent sent them, kept to characters a header carries.
    let names: Vec<String> = dropped
        .iter()
        .map(|name| {
            name.chars()
                .filter(|c| c.is_ascii_alphanumeric() || "_-.:".contains(*c))
                .collect()
        })
        .collect();
    let names = names.join(", ");
    tracing::debug!(api = api.name(), dropped = %names, "tools that would run outside the gateway dropped");
    HeaderValue::from_str(&names).ok()
}

/// Records a request the endpoint refuses with the gateway (so the audit log and
/// `tollgate calls` show it), then answers it. A recording that fails or takes longer than
/// two seconds is only logged: the agent gets its answer either way. `api` is `None` for an
/// unknown path; `shape` is the API whose error shape answers.
async fn refuse(
    gateway: &mut Gateway,
    api: Option<Api>,
    shape: Api,
    line: &str,
    model: &str,
    refusal: Refusal,
) -> Response<Body> {
    let api_name = api.map_or("unknown", Api::name);
    let record = pb::RecordRefusedCallRequest {
        api: api_name.into(),
        request: line.into(),
        status: u32::from(refusal.status.as_u16()),
        reason: refusal.reason.clone(),
        model: model.into(),
    };
    match tokio::time::timeout(RECORD_TIMEOUT, gateway.record_refused_call(record)).await {
        Ok(Ok(_)) => {}
        Ok(Err(status)) => tracing::warn!(
            code = ?status.code(),
            error = status.message(),
            "the gateway did not record a refused model request"
        ),
        Err(_) => {
            tracing::warn!("recording a refused model request took over 2 s; answered without it")
        }
    }
    tracing::debug!(api = api_name, request = line, status = refusal.status.as_u16(), reason = %refusal.reason, "model request refused");
    error_response(shape, refusal.status, refusal.kind, &refusal.reason, false)
}

/// The model names the run may use (`Gateway.ListModels`), in the API's list shape, or one
/// of them. Any other name is served where `auto` would go, so it is answered too.
async fn models(gateway: &mut Gateway, api: Api, id: Option<String>) -> Response<Body> {
    let list = match gateway.list_models(pb::ListModelsRequest {}).await {
        Ok(response) => response.into_inner(),
        Err(status) => return gateway_refused(api, &status),
    };
    let mut names: Vec<&pb::ModelName> = Vec::new();
    for model in &list.models {
        if !names.iter().any(|known| known.name == model.name) {
            names.push(model);
        }
    }
    let entry = |name: &str, owner: &str| match api {
        Api::Messages => {
            json!({"type": "model", "id": name, "display_name": name, "created_at": "1970-01-01T00:00:00Z"})
        }
        _ => {
            json!({"id": name, "object": "model", "created": 0, "owned_by": if owner.is_empty() { "tollgate" } else { owner }})
        }
    };
    let body = match id {
        Some(id) => {
            let route = names
                .iter()
                .find(|m| m.name == id)
                .map_or("", |m| m.route.as_str());
            entry(&id, route)
        }
        None => {
            let data: Vec<Value> = names.iter().map(|m| entry(&m.name, &m.route)).collect();
            match api {
                Api::Messages => json!({
                    "data": data,
                    "has_more": false,
                    "first_id": names.first().map(|m| &m.name),
                    "last_id": names.last().map(|m| &m.name),
                }),
                _ => json!({"object": "list", "data": data}),
            }
        }
    };
    json_response(StatusCode::OK, &body)
}

/// Anthropic's count_tokens: what the call would be charged (`Gateway.CountTokens`).
async fn count_tokens(gateway: &mut Gateway, call: Call) -> Response<Body> {
    match gateway.count_tokens(call.request).await {
        Ok(response) => {
            let tokens = response.into_inner().prompt.map_or(0, |c| c.tokens);
            json_response(StatusCode::OK, &json!({"input_tokens": tokens}))
        }
        Err(status) => gateway_refused(Api::Messages, &status),
    }
}

async fn complete(mut gateway: Gateway, api: Api, call: Call) -> Response<Body> {
    let Call {
        request,
        include_usage,
        custom_tools,
        ..
    } = call;
    let stream = request.stream;
    let mut events = match gateway.complete(request).await {
        Ok(response) => response.into_inner(),
        Err(status) => return gateway_refused(api, &status),
    };
    // The first event says where the call went (or why it failed at once): a refusal is an
    // HTTP error, never a stream that fails.
    let started = match events.next().await {
        Some(Ok(pb::CompleteEvent {
            event: Some(pb::complete_event::Event::Started(started)),
        })) => started,
        Some(Err(status)) => return gateway_refused(api, &status),
        _ => {
            return error_response(
                api,
                StatusCode::BAD_GATEWAY,
                "tollgate_error",
                "the gateway ended the call without starting it",
                true,
            )
        }
    };
    let context = Context {
        started,
        created: common::unix_now(),
        include_usage,
        custom_tools,
    };
    if stream {
        let encoder: Box<dyn Encoder> = match api {
            Api::Chat => Box::new(chat::ChatStream::new(context)),
            Api::Messages => Box::new(messages::MessagesStream::new(context)),
            Api::Responses => Box::new(responses::ResponsesStream::new(context)),
        };
        return streamed_reply(encoder, events);
    }
    let mut reply = Reply::default();
    while let Some(event) = events.next().await {
        match event {
            Ok(pb::CompleteEvent {
                event: Some(pb::complete_event::Event::Delta(delta)),
            }) => reply.push(&delta),
            Ok(pb::CompleteEvent {
                event: Some(pb::complete_event::Event::Done(done)),
            }) => reply.done = done,
            Ok(_) => {}
            Err(status) => return gateway_refused(api, &status),
        }
    }
    let body = match api {
        Api::Chat => chat::reply(&context, &reply),
        Api::Messages => messages::reply(&context, &reply),
        Api::Responses => responses::reply(&context, &reply),
    };
    json_response(StatusCode::OK, &body)
}

/// The reply to a streaming call: server-sent events relayed from the gateway's as they come.
fn streamed_reply(
    mut encoder: Box<dyn Encoder>,
    mut events: tonic::Streaming<pb::CompleteEvent>,
) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(32);
    tokio::spawn(async move {
        let send = |text: String| {
            let tx = tx.clone();
            async move { text.is_empty() || tx.send(Ok(Frame::data(Bytes::from(text)))).await.is_ok() }
        };
        if !send(encoder.start()).await {
            return;
        }
        while let Some(item) = events.next().await {
            let text = match item {
                Ok(pb::CompleteEvent {
                    event: Some(pb::complete_event::Event::Delta(delta)),
                }) => encoder.delta(&delta),
                Ok(pb::CompleteEvent {
                    event: Some(pb::complete_event::Event::Done(done)),
                }) => {
                    send(encoder.done(&done)).await;
                    return;
                }
                Ok(_) => continue,
                Err(status) => {
                    send(encoder.error(&status)).await;
                    return;
                }
            };
            if !send(text).await {
                return;
            }
        }
        let ended = tonic::Status::unavailable("the gateway ended the call before it was done");
        send(encoder.error(&ended)).await;
    });
    let mut response = Response::new(http_body_util::Either::Right(StreamBody::new(
        tokio_stream::wrappers::ReceiverStream::new(rx),
    )));
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    response.headers_mut().insert(
        hyper::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache"),
    );
    response
}
