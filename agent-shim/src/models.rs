//! `tollgate-shim models`: the sandbox's own model endpoint on `127.0.0.1`, so the official
//! OpenAI and Anthropic SDKs work unmodified inside a sandbox (`OPENAI_BASE_URL`,
//! `ANTHROPIC_BASE_URL`).
//!
//! Pid 1 starts it before the agent, confined exactly as the agent is. It serves
//! `GET /v1/models`, `POST /v1/chat/completions` (OpenAI, streamed or not) and
//! `POST /v1/messages` (Anthropic, streamed or not) and turns each call into the gateway's
//! `Complete`: the route is the request's `model` (`auto` or empty: the router chooses among
//! granted routes; another name must be a granted route). Request headers are ignored — an
//! API key the agent sends goes nowhere; only `anthropic-version` on `GET /v1/models` picks
//! the Anthropic list shape — and only the messages, the completion cap, streaming,
//! temperature and stop sequences are passed on. Errors come back as the APIs' error shapes
//! with `x-should-retry: false` (every call is charged and audited).

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited, StreamBody};
use hyper::body::Frame;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::StreamExt as _;
use tollgate_proto::v1 as pb;
use tollgate_shim_protocol::plan::MODELS_PORT;

/// Largest request body read.
const MAX_REQUEST: usize = 8 << 20;

type Body = http_body_util::Either<
    Full<Bytes>,
    StreamBody<tokio_stream::wrappers::ReceiverStream<Result<Frame<Bytes>, Infallible>>>,
>;
type Gateway = pb::gateway_client::GatewayClient<tonic::transport::Channel>;

/// Which API a request speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    OpenAi,
    Anthropic,
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
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
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
    })
}

fn usage() -> i32 {
    eprintln!("usage: tollgate-shim models [--port N] (started by the sandbox's pid 1)");
    2
}

fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    let mut response = Response::new(http_body_util::Either::Left(Full::new(Bytes::from(
        value.to_string(),
    ))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    if !status.is_success() {
        // Every call is charged and audited: the SDKs must not retry on their own.
        response.headers_mut().insert(
            "x-should-retry",
            hyper::header::HeaderValue::from_static("false"),
        );
    }
    response
}

fn error_response(api: Api, status: StatusCode, kind: &str, message: &str) -> Response<Body> {
    let body = match api {
        Api::OpenAi => {
            json!({"error": {"message": message, "type": kind, "param": null, "code": kind}})
        }
        Api::Anthropic => json!({"type": "error", "error": {"type": kind, "message": message}}),
    };
    json_response(status, &body)
}

/// The HTTP answer to a gateway refusal.
fn refused(api: Api, status: &tonic::Status) -> Response<Body> {
    let (code, kind) = match status.code() {
        tonic::Code::PermissionDenied => (StatusCode::FORBIDDEN, "tollgate_refused"),
        tonic::Code::ResourceExhausted if status.message().contains("the backend answered") => (
            StatusCode::TOO_MANY_REQUESTS,
            "tollgate_backend_rate_limited",
        ),
        tonic::Code::ResourceExhausted => (StatusCode::TOO_MANY_REQUESTS, "tollgate_budget"),
        tonic::Code::InvalidArgument => (StatusCode::BAD_REQUEST, "invalid_request_error"),
        tonic::Code::Unavailable | tonic::Code::FailedPrecondition => {
            (StatusCode::BAD_GATEWAY, "tollgate_backend_error")
        }
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "tollgate_error"),
    };
    error_response(api, code, kind, status.message())
}

async fn handle(mut gateway: Gateway, request: Request<hyper::body::Incoming>) -> Response<Body> {
    // The path decides the shape of a call; only the model list, which both SDKs fetch from
    // /v1/models, is told apart by the Anthropic SDK's version header.
    let (method, path) = (request.method().clone(), request.uri().path().to_owned());
    let anthropic_list =
        method == Method::GET && request.headers().contains_key("anthropic-version");
    let api = if path == "/v1/messages" || anthropic_list {
        Api::Anthropic
    } else {
        Api::OpenAi
    };
    match (method, path.as_str()) {
        (Method::GET, "/v1/models" | "/models") => models(&mut gateway, api).await,
        (Method::POST, "/v1/chat/completions" | "/chat/completions" | "/v1/messages") => {
            let body = match Limited::new(request.into_body(), MAX_REQUEST)
                .collect()
                .await
            {
                Ok(body) => body.to_bytes(),
                Err(_) => {
                    return error_response(
                        api,
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "invalid_request_error",
                        "the request body is larger than 8 MiB",
                    )
                }
            };
            let parsed = serde_json::from_slice::<Value>(&body)
                .map_err(|e| format!("the body is not JSON: {e}"))
                .and_then(|value| parse_call(api, &value));
            match parsed {
                Ok((call, include_usage)) => complete(gateway, api, call, include_usage).await,
                Err(message) => error_response(
                    api,
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    &message,
                ),
            }
        }
        _ => error_response(
            api,
            StatusCode::NOT_FOUND,
            "not_found_error",
            "this endpoint serves GET /v1/models, POST /v1/chat/completions and POST /v1/messages",
        ),
    }
}

/// `auto` and the receipt's granted routes, in the API's list shape.
async fn models(gateway: &mut Gateway, api: Api) -> Response<Body> {
    let receipt = match gateway.get_run_receipt(pb::GetRunReceiptRequest {}).await {
        Ok(response) => response.into_inner().receipt.unwrap_or_default(),
        Err(status) => return refused(api, &status),
    };
    let names: Vec<String> = std::iter::once("auto".to_owned())
        .chain(receipt.routes.iter().map(|r| r.name.clone()))
        .collect();
    let body = match api {
        Api::OpenAi => json!({
            "object": "list",
            "data": names.iter().map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "tollgate"})).collect::<Vec<_>>(),
        }),
        Api::Anthropic => json!({
            "data": names.iter().map(|id| json!({"type": "model", "id": id, "display_name": id, "created_at": "1970-01-01T00:00:00Z"})).collect::<Vec<_>>(),
            "has_more": false,
            "first_id": names.first(),
            "last_id": names.last(),
        }),
    };
    json_response(StatusCode::OK, &body)
}

/// Text of a message's `content`: a string, or text parts.
fn text_of(content: &Value) -> Result<String, String> {
    match content {
        Value::String(text) => Ok(text.clone()),
        Value::Array(parts) => parts
            .iter()
            .map(|part| match part.get("type").and_then(Value::as_str) {
                Some("text") => Ok(part
                    .get("text")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned()),
                other => Err(format!(
                    "content of type {} is not supported (text only)",
                    other.unwrap_or("unknown")
                )),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|texts| texts.join("")),
        Value::Null => Ok(String::new()),
        _ => Err("content must be a string or a list of text parts".into()),
    }
}

/// The gateway call a request asks for, and whether an OpenAI stream wants its usage chunk.
fn parse_call(api: Api, body: &Value) -> Result<(pb::CompleteRequest, bool), String> {
    if body.get("tools").is_some_and(|t| !t.is_null()) {
        return Err("tools are not supported by this endpoint".into());
    }
    if body.get("n").and_then(Value::as_u64).is_some_and(|n| n > 1) {
        return Err("n > 1 is not supported".into());
    }
    let mut messages = Vec::new();
    if api == Api::Anthropic {
        if let Some(system) = body.get("system").filter(|s| !s.is_null()) {
            messages.push(pb::ChatMessage {
                role: "system".into(),
                content: text_of(system)?,
                parts: Vec::new(),
            });
        }
    }
    for message in body
        .get("messages")
        .and_then(Value::as_array)
        .ok_or("messages must be a list")?
    {
        messages.push(pb::ChatMessage {
            role: message
                .get("role")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            content: text_of(message.get("content").unwrap_or(&Value::Null))?,
            parts: Vec::new(),
        });
    }
    let max_tokens = body
        .get("max_tokens")
        .or_else(|| body.get("max_completion_tokens"))
        .and_then(Value::as_u64)
        .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX));
    let stop = match body.get(if api == Api::Anthropic {
        "stop_sequences"
    } else {
        "stop"
    }) {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    };
    let include_usage = body
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok((
        pb::CompleteRequest {
            route: body
                .get("model")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            messages,
            max_tokens,
            stream: body.get("stream").and_then(Value::as_bool).unwrap_or(false),
            local_only: false,
            temperature: body
                .get("temperature")
                .and_then(Value::as_f64)
                .map(|t| t as f32),
            stop,
            ..Default::default()
        },
        include_usage,
    ))
}

/// OpenAI `finish_reason` → Anthropic `stop_reason`.
fn stop_reason(finish: &str) -> &str {
    match finish {
        "length" => "max_tokens",
        "" | "stop" => "end_turn",
        other => other,
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn complete(
    mut gateway: Gateway,
    api: Api,
    call: pb::CompleteRequest,
    include_usage: bool,
) -> Response<Body> {
    let stream = call.stream;
    let mut events = match gateway.complete(call).await {
        Ok(response) => response.into_inner(),
        Err(status) => return refused(api, &status),
    };
    // The first event says where the call went (or why it failed at once).
    let started = match events.next().await {
        Some(Ok(pb::CompleteEvent {
            event: Some(pb::complete_event::Event::Started(started)),
        })) => started,
        Some(Err(status)) => return refused(api, &status),
        _ => {
            return error_response(
                api,
                StatusCode::BAD_GATEWAY,
                "tollgate_error",
                "the gateway ended the call without starting it",
            )
        }
    };
    if !stream {
        return whole_reply(api, &started, events).await;
    }
    let format = StreamFormat {
        api,
        id: started.call_id.clone(),
        model: started.route.clone(),
        created: unix_now(),
        include_usage,
    };
    streamed_reply(format, events)
}

/// The reply to a call that did not ask to stream: the whole completion in one JSON body.
async fn whole_reply(
    api: Api,
    started: &pb::CompleteStarted,
    mut events: tonic::Streaming<pb::CompleteEvent>,
) -> Response<Body> {
    let (mut text, mut done) = (String::new(), pb::CompleteDone::default());
    while let Some(event) = events.next().await {
        match event {
            Ok(pb::CompleteEvent {
                event: Some(pb::complete_event::Event::Delta(delta)),
            }) => text.push_str(&delta.text),
            Ok(pb::CompleteEvent {
                event: Some(pb::complete_event::Event::Done(d)),
            }) => done = d,
            Ok(_) => {}
            Err(status) => return refused(api, &status),
        }
    }
    let (prompt, completion) = (
        done.prompt.map_or(0, |c| c.tokens),
        done.completion.map_or(0, |c| c.tokens),
    );
    let body = match api {
        Api::OpenAi => json!({
            "id": format!("chatcmpl-{}", started.call_id),
            "object": "chat.completion",
            "created": unix_now(),
            "model": started.route,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": if done.finish_reason.is_empty() { "stop" } else { done.finish_reason.as_str() }}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        }),
        Api::Anthropic => json!({
            "id": format!("msg_{}", started.call_id),
            "type": "message",
            "role": "assistant",
            "model": started.route,
            "content": [{"type": "text", "text": text}],
            "stop_reason": stop_reason(&done.finish_reason),
            "stop_sequence": null,
            "usage": {"input_tokens": prompt, "output_tokens": completion},
        }),
    };
    json_response(StatusCode::OK, &body)
}

/// The server-sent events of one streamed reply, in the caller's API's format.
struct StreamFormat {
    api: Api,
    id: String,
    model: String,
    created: u64,
    include_usage: bool,
}

impl StreamFormat {
    /// An OpenAI chunk carrying `delta`.
    fn chunk(&self, delta: Value, finish: Value) -> String {
        let (id, created, model) = (&self.id, self.created, &self.model);
        format!(
            "data: {}\n\n",
            json!({"id": format!("chatcmpl-{id}"), "object": "chat.completion.chunk", "created": created, "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    }

    /// A named Anthropic event.
    fn event(name: &str, data: Value) -> String {
        format!("event: {name}\ndata: {data}\n\n")
    }

    /// What opens the stream, before any text.
    fn opening(&self) -> String {
        let (id, model) = (&self.id, &self.model);
        match self.api {
            Api::OpenAi => self.chunk(json!({"role": "assistant", "content": ""}), Value::Null),
            Api::Anthropic => [
                Self::event("message_start", json!({"type": "message_start", "message": {"id": format!("msg_{id}"), "type": "message", "role": "assistant", "model": model, "content": [], "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 0, "output_tokens": 0}}})),
                Self::event("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})),
            ]
            .concat(),
        }
    }

    /// A piece of the completion.
    fn delta(&self, delta: &pb::CompleteDelta) -> String {
        match self.api {
            Api::OpenAi => self.chunk(json!({"content": delta.text}), Value::Null),
            Api::Anthropic => Self::event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": delta.text}}),
            ),
        }
    }

    /// The end of the stream: why it finished and the counts.
    fn done(&self, done: &pb::CompleteDone) -> String {
        let (id, created, model) = (&self.id, self.created, &self.model);
        let (prompt, completion) = (
            done.prompt.map_or(0, |c| c.tokens),
            done.completion.map_or(0, |c| c.tokens),
        );
        let finish = if done.finish_reason.is_empty() {
            "stop".to_owned()
        } else {
            done.finish_reason.clone()
        };
        match self.api {
            Api::OpenAi => {
                let mut text = self.chunk(json!({}), json!(finish));
                if self.include_usage {
                    text.push_str(&format!(
                        "data: {}\n\n",
                        json!({"id": format!("chatcmpl-{id}"), "object": "chat.completion.chunk", "created": created, "model": model, "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}})
                    ));
                }
                text.push_str("data: [DONE]\n\n");
                text
            }
            Api::Anthropic => [
                Self::event("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
                Self::event("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": stop_reason(&finish), "stop_sequence": null}, "usage": {"input_tokens": prompt, "output_tokens": completion}})),
                Self::event("message_stop", json!({"type": "message_stop"})),
            ]
            .concat(),
        }
    }

    /// The call failed after it started.
    fn error(&self, status: &tonic::Status) -> String {
        match self.api {
            Api::OpenAi => format!(
                "data: {}\n\n",
                json!({"error": {"message": status.message(), "type": "tollgate_backend_error"}})
            ),
            Api::Anthropic => Self::event(
                "error",
                json!({"type": "error", "error": {"type": "api_error", "message": status.message()}}),
            ),
        }
    }
}

/// The reply to a streaming call: server-sent events relayed from the gateway's as they come.
fn streamed_reply(
    format: StreamFormat,
    mut events: tonic::Streaming<pb::CompleteEvent>,
) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(32);
    tokio::spawn(async move {
        let send = |text: String| {
            let tx = tx.clone();
            async move { tx.send(Ok(Frame::data(Bytes::from(text)))).await.is_ok() }
        };
        if !send(format.opening()).await {
            return;
        }
        while let Some(item) = events.next().await {
            let text = match item {
                Ok(pb::CompleteEvent {
                    event: Some(pb::complete_event::Event::Delta(delta)),
                }) => format.delta(&delta),
                Ok(pb::CompleteEvent {
                    event: Some(pb::complete_event::Event::Done(done)),
                }) => format.done(&done),
                Ok(_) => continue,
                Err(status) => format.error(&status),
            };
            if !send(text).await {
                return;
            }
        }
    });
    let mut response = Response::new(http_body_util::Either::Right(StreamBody::new(
        tokio_stream::wrappers::ReceiverStream::new(rx),
    )));
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/event-stream"),
    );
    response.headers_mut().insert(
        hyper::header::CACHE_CONTROL,
        hyper::header::HeaderValue::from_static("no-cache"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_become_gateway_calls_and_keep_nothing_else() {
        let body = json!({
            "model": "claude",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}
            ],
            "max_completion_tokens": 32,
            "stream": true,
            "stream_options": {"include_usage": true},
            "stop": "END",
            "user": "someone",
        });
        let (call, usage) = parse_call(Api::OpenAi, &body).unwrap();
        assert!(usage);
        assert_eq!(call.route, "claude");
        assert_eq!(call.messages[1].content, "hi there");
        assert_eq!((call.max_tokens, call.stream), (32, true));
        assert_eq!(call.stop, vec!["END".to_owned()]);
        let anthropic = json!({"model": "auto", "system": "be brief", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]});
        let (call, _) = parse_call(Api::Anthropic, &anthropic).unwrap();
        assert_eq!(call.messages[0].role, "system");
        assert_eq!(call.messages.len(), 2);
        let image = json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]});
        assert!(parse_call(Api::OpenAi, &image)
            .unwrap_err()
            .contains("text only"));
        assert!(parse_call(Api::OpenAi, &json!({"messages": [], "tools": [{}]})).is_err());
    }
}
