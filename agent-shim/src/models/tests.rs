//! The endpoint served in-process against a scripted gateway (a real tonic server on
//! loopback), driven over real HTTP: what an agent sends reaches the gateway in canonical
//! form, and what the gateway streams back reaches the agent in its API's shape.

use std::sync::{Arc, Mutex};

use http_body_util::BodyExt as _;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tollgate_proto::v1 as pb;

type Reply<T> = Result<tonic::Response<T>, tonic::Status>;

/// What the scripted gateway was asked.
#[derive(Debug, Default)]
struct Seen {
    calls: Vec<pb::CompleteRequest>,
    refused: Vec<pb::RecordRefusedCallRequest>,
}

/// A gateway that answers every call with the same scripted reply: some text, then a tool
/// call whose arguments arrive in two pieces, then done ("tool_calls"). The route "refuse"
/// is refused as PERMISSION_DENIED, "down" as UNAVAILABLE.
#[derive(Clone, Default)]
struct Scripted(Arc<Mutex<Seen>>);

fn unimplemented<T>() -> Reply<T> {
    Err(tonic::Status::unimplemented("not scripted"))
}

#[tonic::async_trait]
impl pb::gateway_server::Gateway for Scripted {
    type CompleteStream = ReceiverStream<Result<pb::CompleteEvent, tonic::Status>>;

    async fn complete(
        &self,
        request: tonic::Request<pb::CompleteRequest>,
    ) -> Reply<Self::CompleteStream> {
        let request = request.into_inner();
        match request.route.as_str() {
            "refuse" => {
                return Err(tonic::Status::permission_denied(
                    "no granted route may carry this text",
                ))
            }
            "down" => return Err(tonic::Status::unavailable("the backend is unreachable")),
            _ => {}
        }
        let reasoning = request.reasoning.is_some();
        self.0.lock().unwrap().calls.push(request);
        use pb::complete_event::Event;
        let delta = |text: &str, call: Option<(&str, &str, &str)>| {
            Event::Delta(pb::CompleteDelta {
                text: text.into(),
                tool_call: call.map(|(id, name, arguments)| pb::ToolCallDelta {
                    index: 0,
                    id: id.into(),
                    name: name.into(),
                    arguments: arguments.into(),
                }),
                thinking: None,
            })
        };
        let thinking = |text: &str, signature: &str| {
            Event::Delta(pb::CompleteDelta {
                thinking: Some(pb::ThinkingDelta {
                    text: text.into(),
                    signature: signature.into(),
                    origin: "anthropic".into(),
                    ..Default::default()
                }),
                ..Default::default()
            })
        };
        let mut events = vec![Event::Started(pb::CompleteStarted {
            call_id: "0190-call".into(),
            route: "local".into(),
            model: "served-model".into(),
            ..Default::default()
        })];
        // Reasoning only when asked for, as a backend gives it: text, then its signature.
        if reasoning {
            events.extend([thinking("plan", ""), thinking("", "sig")]);
        }
        events.extend([
            delta("Let me look.", None),
            delta("", Some(("call_abc", "read_file", "{\"path\":"))),
            delta("", Some(("", "", "\"a.txt\"}"))),
            Event::Done(pb::CompleteDone {
                finish_reason: "tool_calls".into(),
                prompt: Some(pb::TokenCount {
                    tokens: 12,
                    source: 1,
                }),
                completion: Some(pb::TokenCount {
                    tokens: 5,
                    source: 1,
                }),
                ..Default::default()
            }),
        ]);
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        for event in events {
            tx.send(Ok(pb::CompleteEvent { event: Some(event) }))
                .await
                .unwrap();
        }
        Ok(tonic::Response::new(ReceiverStream::new(rx)))
    }

    async fn count_tokens(
        &self,
        request: tonic::Request<pb::CompleteRequest>,
    ) -> Reply<pb::CountTokensResponse> {
        self.0.lock().unwrap().calls.push(request.into_inner());
        Ok(tonic::Response::new(pb::CountTokensResponse {
            prompt: Some(pb::TokenCount {
                tokens: 42,
                source: 2,
            }),
            route: "local".into(),
            model: "served-model".into(),
        }))
    }

    async fn list_models(
        &self,
        _: tonic::Request<pb::ListModelsRequest>,
    ) -> Reply<pb::ListModelsResponse> {
        let name = |name: &str, route: &str| pb::ModelName {
            name: name.into(),
            route: route.into(),
            model: "served-model".into(),
            local: true,
        };
        Ok(tonic::Response::new(pb::ListModelsResponse {
            models: vec![
                name("auto", ""),
                name("local", "local"),
                name("served-model", "local"),
            ],
            patterns: vec![name("gpt-*", "local")],
        }))
    }

    async fn record_refused_call(
        &self,
        request: tonic::Request<pb::RecordRefusedCallRequest>,
    ) -> Reply<pb::RecordRefusedCallResponse> {
        self.0.lock().unwrap().refused.push(request.into_inner());
        Ok(tonic::Response::new(pb::RecordRefusedCallResponse {
            call_id: "0190-refused".into(),
        }))
    }

    type EgressStream = ReceiverStream<Result<pb::EgressFrame, tonic::Status>>;

    async fn egress(
        &self,
        _: tonic::Request<tonic::Streaming<pb::EgressFrame>>,
    ) -> Reply<Self::EgressStream> {
        unimplemented()
    }

    async fn list_pending_calls(
        &self,
        _: tonic::Request<pb::ListPendingCallsRequest>,
    ) -> Reply<pb::ListPendingCallsResponse> {
        unimplemented()
    }

    async fn get_run_receipt(
        &self,
        _: tonic::Request<pb::GetRunReceiptRequest>,
    ) -> Reply<pb::GetRunReceiptResponse> {
        unimplemented()
    }

    async fn delegate(
        &self,
        _: tonic::Request<pb::DelegateRequest>,
    ) -> Reply<pb::DelegateResponse> {
        unimplemented()
    }

    async fn start_child(
        &self,
        _: tonic::Request<pb::StartChildRequest>,
    ) -> Reply<pb::StartChildResponse> {
        unimplemented()
    }

    async fn list_children(
        &self,
        _: tonic::Request<pb::ListChildrenRequest>,
    ) -> Reply<pb::RunTree> {
        unimplemented()
    }

    type WatchChildStream = ReceiverStream<Result<pb::RunEvent, tonic::Status>>;

    async fn watch_child(
        &self,
        _: tonic::Request<pb::WatchChildRequest>,
    ) -> Reply<Self::WatchChildStream> {
        unimplemented()
    }

    async fn stop_child(
        &self,
        _: tonic::Request<pb::StopChildRequest>,
    ) -> Reply<pb::StopChildResponse> {
        unimplemented()
    }

    async fn call_tool(
        &self,
        _: tonic::Request<pb::CallToolRequest>,
    ) -> Reply<pb::CallToolResponse> {
        unimplemented()
    }
}

/// The endpoint, serving against a scripted gateway.
struct Endpoint {
    base: String,
    seen: Arc<Mutex<Seen>>,
    client: hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        http_body_util::Full<bytes::Bytes>,
    >,
}

/// An answer: status, headers, body.
struct Answer {
    status: u16,
    headers: hyper::HeaderMap,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// The `data:` payloads of a server-sent event stream (without OpenAI's `[DONE]`).
    fn events(&self) -> Vec<Value> {
        self.body
            .split("\n\n")
            .filter_map(|event| event.lines().find_map(|l| l.strip_prefix("data: ")))
            .filter(|data| *data != "[DONE]")
            .map(|data| serde_json::from_str(data).unwrap())
            .collect()
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

impl Endpoint {
    async fn start() -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let grpc_addr = grpc.local_addr().unwrap();
        let service = pb::gateway_server::GatewayServer::new(Scripted(seen.clone()));
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(TcpListenerStream::new(grpc)),
        );
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc_addr}"))
            .unwrap()
            .connect_lazy();
        let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", http.local_addr().unwrap());
        tokio::spawn(super::serve(
            http,
            pb::gateway_client::GatewayClient::new(channel),
        ));
        let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http();
        Self { base, seen, client }
    }

    async fn send(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Answer {
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("content-type", "application/json");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(http_body_util::Full::new(bytes::Bytes::from(
                body.to_owned(),
            )))
            .unwrap();
        let response = self.client.request(request).await.unwrap();
        let (parts, body) = response.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Answer {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body: String::from_utf8(body.to_vec()).unwrap(),
        }
    }

    async fn post(&self, path: &str, body: &Value) -> Answer {
        self.send("POST", path, &[], &body.to_string()).await
    }
}

#[tokio::test]
async fn chat_completions_carry_tools_both_ways_streamed() {
    let endpoint = Endpoint::start().await;
    let answer = endpoint
        .post(
            "/v1/chat/completions",
            &json!({
                "model": "gpt-4o",
                "stream": true,
                "stream_options": {"include_usage": true},
                "messages": [
                    {"role": "user", "content": "read a.txt"},
                    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
                    {"role": "tool", "tool_call_id": "call_0", "content": "no such file"},
                ],
                "tools": [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}, {"type": "web_search_preview"}],
                "tool_choice": "required",
            }),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(
        answer.header("x-tollgate-dropped-tools"),
        Some("web_search_preview")
    );
    assert!(answer.body.ends_with("data: [DONE]\n\n"));
    let chunks = answer.events();
    assert!(chunks.iter().all(|c| c["model"] == "served-model"));
    let calls: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0))
        .collect();
    assert_eq!(calls[0]["id"], "call_abc");
    assert_eq!(calls[0]["function"]["name"], "read_file");
    let arguments: String = calls
        .iter()
        .filter_map(|c| c["function"]["arguments"].as_str())
        .collect();
    assert_eq!(arguments, "{\"path\":\"a.txt\"}");
    assert!(chunks
        .iter()
        .any(|c| c["choices"][0]["finish_reason"] == "tool_calls"));
    assert_eq!(chunks.last().unwrap()["usage"]["total_tokens"], 17);
    let seen = endpoint.seen.lock().unwrap();
    let call = &seen.calls[0];
    assert_eq!((call.route.as_str(), call.tools.len()), ("gpt-4o", 1));
    assert_eq!(
        call.tool_choice.as_ref().unwrap().mode(),
        pb::tool_choice::Mode::Required
    );
    assert_eq!(call.messages[2].role, "tool");
}

#[tokio::test]
async fn anthropic_messages_and_count_tokens() {
    let endpoint = Endpoint::start().await;
    let request = json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 100,
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "read a.txt"}],
        "tools": [{"name": "read_file", "input_schema": {"type": "object"}}, {"type": "web_fetch_20250910", "name": "web_fetch"}],
    });
    let answer = endpoint.post("/v1/messages", &request).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let body = answer.json();
    assert_eq!(body["model"], "served-model");
    assert_eq!(
        body["content"][0],
        json!({"type": "text", "text": "Let me look."})
    );
    assert_eq!(
        body["content"][1],
        json!({"type": "tool_use", "id": "call_abc", "name": "read_file", "input": {"path": "a.txt"}})
    );
    assert_eq!(body["stop_reason"], "tool_use");
    assert_eq!(answer.header("x-tollgate-dropped-tools"), Some("web_fetch"));

    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let answer = endpoint.post("/v1/messages", &streamed).await;
    let events = answer.events();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds.first(), Some(&"message_start"));
    assert_eq!(kinds.last(), Some(&"message_stop"));
    assert!(events
        .iter()
        .any(|e| e["delta"]["partial_json"] == "\"a.txt\"}" && e["index"] == 1));

    let answer = endpoint.post("/v1/messages/count_tokens", &request).await;
    assert_eq!(
        (answer.status, answer.json()),
        (200, json!({"input_tokens": 42}))
    );
    let seen = endpoint.seen.lock().unwrap();
    assert!(seen.calls[0].messages[0].parts[0].cache);
}

#[tokio::test]
async fn responses_api_streams_what_codex_reads() {
    let endpoint = Endpoint::start().await;
    let answer = endpoint
        .post(
            "/v1/responses",
            &json!({
                "model": "gpt-5-codex",
                "instructions": "You are Codex.",
                "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "read a.txt"}]}],
                "tools": [{"type": "function", "name": "read_file", "parameters": {"type": "object"}}, {"type": "web_search"}],
                "store": false,
                "stream": true,
                "include": ["reasoning.encrypted_content"],
            }),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let events = answer.events();
    assert_eq!(events[0]["type"], "response.created");
    let done: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "response.output_item.done")
        .collect();
    assert_eq!(done[0]["item"]["content"][0]["text"], "Let me look.");
    assert_eq!(done[1]["item"]["type"], "function_call");
    assert_eq!(done[1]["item"]["call_id"], "call_abc");
    assert_eq!(done[1]["item"]["arguments"], "{\"path\":\"a.txt\"}");
    let completed = events.last().unwrap();
    assert_eq!(completed["type"], "response.completed");
    assert_eq!(completed["response"]["usage"]["input_tokens"], 12);

    let answer = endpoint
        .post("/responses", &json!({"model": "m", "input": "hi"}))
        .await;
    assert_eq!(answer.json()["output"][1]["name"], "read_file");
}

#[tokio::test]
async fn models_are_listed_in_each_apis_shape() {
    let endpoint = Endpoint::start().await;
    let openai = endpoint.send("GET", "/v1/models", &[], "").await.json();
    assert_eq!(openai["object"], "list");
    assert_eq!(
        openai["data"][1],
        json!({"id": "local", "object": "model", "created": 0, "owned_by": "local"})
    );
    let anthropic = endpoint
        .send(
            "GET",
            "/v1/models",
            &[("anthropic-version", "2023-06-01")],
            "",
        )
        .await
        .json();
    assert_eq!(anthropic["data"][0]["type"], "model");
    assert_eq!(
        (anthropic["first_id"].clone(), anthropic["has_more"].clone()),
        (json!("auto"), json!(false))
    );
    let one = endpoint
        .send("GET", "/v1/models/gpt-4o", &[], "")
        .await
        .json();
    assert_eq!(one["id"], "gpt-4o");
}

#[tokio::test]
async fn refusals_are_recorded_and_answered_in_the_apis_shape() {
    let endpoint = Endpoint::start().await;
    let unknown = endpoint
        .post("/v1/embeddings", &json!({"model": "x"}))
        .await;
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.header("x-should-retry"), Some("false"));
    assert!(unknown.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("/v1/responses"));
    let not_json = endpoint.send("POST", "/v1/messages", &[], "{nope").await;
    assert_eq!(not_json.status, 400);
    assert_eq!(not_json.json()["type"], "error");
    assert_eq!(not_json.json()["error"]["type"], "invalid_request_error");
    let stored = endpoint
        .post(
            "/v1/responses",
            &json!({"model": "gpt-5", "input": "hi", "previous_response_id": "resp_1"}),
        )
        .await;
    assert_eq!(
        (stored.status, stored.header("x-should-retry")),
        (400, Some("false"))
    );
    let big = format!(
        "{{\"model\": \"gpt-4o\", \"messages\": [], \"pad\": \"{}\"}}",
        "x".repeat(8 << 20)
    );
    let too_big = endpoint
        .send("POST", "/v1/chat/completions", &[], &big)
        .await;
    assert_eq!(
        (too_big.status, too_big.header("x-should-retry")),
        (413, Some("false"))
    );
    let remote_image = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x.example/a.png"}}]}]});
    assert_eq!(
        endpoint
            .post("/v1/chat/completions", &remote_image)
            .await
            .status,
        400
    );
    {
        let seen = endpoint.seen.lock().unwrap();
        let recorded: Vec<(&str, &str, u32, &str)> = seen
            .refused
            .iter()
            .map(|r| {
                (
                    r.api.as_str(),
                    r.request.as_str(),
                    r.status,
                    r.model.as_str(),
                )
            })
            .collect();
        assert_eq!(
            recorded,
            [
                ("unknown", "POST /v1/embeddings", 404, ""),
                ("anthropic-messages", "POST /v1/messages", 400, ""),
                ("openai-responses", "POST /v1/responses", 400, "gpt-5"),
                ("openai-chat", "POST /v1/chat/completions", 413, ""),
                ("openai-chat", "POST /v1/chat/completions", 400, "gpt-4o"),
            ]
        );
        assert!(seen.refused[2].reason.contains("previous_response_id"));
        assert!(seen.calls.is_empty());
    }
    // Gateway refusals: no retry where one cannot help, a retry allowed where it may.
    let refused = endpoint
        .post(
            "/v1/chat/completions",
            &json!({"model": "refuse", "messages": []}),
        )
        .await;
    assert_eq!(
        (refused.status, refused.header("x-should-retry")),
        (403, Some("false"))
    );
    assert_eq!(refused.json()["error"]["type"], "tollgate_refused");
    let down = endpoint
        .post(
            "/v1/messages",
            &json!({"model": "down", "max_tokens": 1, "messages": []}),
        )
        .await;
    assert_eq!((down.status, down.header("x-should-retry")), (502, None));
    assert_eq!(down.json()["error"]["type"], "api_error");
}

/// The official SDKs' parsers against the endpoint: `openai` and `anthropic` from the agents'
/// virtualenv that `scripts/test` makes ($TOLLGATE_AGENT_VENV), or any Python with both named
/// by $TOLLGATE_SDK_PYTHON. Without either it fails: the SDKs are what agents parse with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_sdks_parse_what_the_endpoint_sends() {
    let python = std::env::var("TOLLGATE_SDK_PYTHON").ok().or_else(|| {
        std::env::var("TOLLGATE_AGENT_VENV")
            .ok()
            .map(|venv| format!("{venv}/bin/python"))
    });
    let python = python
        .filter(|p| std::path::Path::new(p).exists())
        .expect("no Python with the openai and anthropic SDKs: run scripts/test (it makes $TOLLGATE_AGENT_VENV) or set TOLLGATE_SDK_PYTHON");
    let endpoint = Endpoint::start().await;
    let output = tokio::process::Command::new(python)
        .arg("-c")
        .arg(include_str!("sdk_check.py"))
        .env("TOLLGATE_TEST_ENDPOINT", &endpoint.base)
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(output.status.success(), "{stdout}{stderr}");
    eprintln!("{stdout}");
}

/// Accepted connections have TCP_NODELAY: a stream is many small writes, and with Nagle's
/// algorithm each would wait for the agent's delayed ACK (the issue measured ~44 ms steps).
#[tokio::test]
async fn accepted_connections_send_small_writes_at_once() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap());
    let (accepted, _client) = tokio::join!(listener.accept(), client);
    let (stream, _) = accepted.unwrap();
    assert!(!stream.nodelay().unwrap());
    super::accepted(&stream);
    assert!(stream.nodelay().unwrap());
}
