//! Tool calling through `Gateway.Complete`, against real HTTP backends speaking the real wire
//! formats (an OpenAI-compatible local route, an Anthropic cloud route): tool definitions and
//! calls go out and come back as canonical deltas, streamed and not, and a conversation
//! moves between the two APIs with its calls, ids and results intact. Everything that leaves
//! is classified (tool definitions, arguments, results; images rated high), reasoning
//! signatures go back only to the backend that issued them, `CountTokens` routes and counts
//! like `Complete`, and `ListModels` names what a run may ask for.

use std::sync::Arc;

use tokio_stream::StreamExt as _;
use tollgate_audit::AuditLog;
use tollgate_proto::v1 as pb;
use tollgate_proto::v1::content_part::Part;
use tollgate_supervisor::gateway;
use tollgate_tests::fake_models::{FakeBackend, Script, ScriptedCall};
use tollgate_tests::model_gateway::{self, grant, ModelRun};

const RUN_ID: &str = "01900000-0000-7000-8000-0000000070c1";
const CLOUD_KEY_ENV: &str = "TOLLGATE_TEST_TOOLS_CLOUD_KEY";

// Made at run time so no scanner mistakes the source for a leak.
fn aws_key() -> String {
    format!("{}{}", "AKIA", "Q7LM2XV3RT4KP6WS")
}

struct Setup {
    local: FakeBackend,
    cloud: FakeBackend,
    audit_dir: std::path::PathBuf,
    audit: AuditLog,
    client: pb::gateway_client::GatewayClient<tonic::transport::Channel>,
    _handle: gateway::GatewayHandle,
    _dir: tempfile::TempDir,
}

fn call_to(id: &str, arguments: &str) -> ScriptedCall {
    ScriptedCall {
        id: id.into(),
        name: "run".into(),
        arguments: arguments.into(),
    }
}

/// A local route (OpenAI-compatible, claims `gpt-*`) granted up to high, an Anthropic cloud
/// route (claims `claude-*`) granted up to `cloud`; both answer with tool calls.
async fn setup(cloud_grant: pb::Sensitivity, cloud_script: Script) -> Setup {
    setup_with(cloud_grant, cloud_script, false).await
}

/// As [`setup`]; `redact`: the cloud route redacts what it sends.
async fn setup_with(cloud_grant: pb::Sensitivity, cloud_script: Script, redact: bool) -> Setup {
    let dir = tempfile::Builder::new()
        .prefix("tg-tools")
        .tempdir_in("/tmp")
        .unwrap();
    let local = FakeBackend::start(Script {
        text: "let me look".into(),
        prompt_tokens: 30,
        completion_tokens: 20,
        tool_calls: vec![call_to("call_Xk3f9Qa2", r#"{"cmd":"ls -la"}"#)],
        ..Default::default()
    })
    .await;
    let cloud = FakeBackend::start(cloud_script).await;
    let routes = format!(
        r#"
        [[route]]
        name = "local"
        kind = "local"
        preset = "vllm"
        endpoint = "{}"
        model = "qwen"
        models = ["gpt-*", "o3"]

        [[route]]
        name = "claude"
        kind = "cloud"
        api = "anthropic"
        endpoint = "{}"
        model = "claude-sonnet"
        models = ["claude-*"]
        key_secret = "env:{CLOUD_KEY_ENV}"
        redact = {redact}
        "#,
        local.endpoint, cloud.endpoint
    );
    std::env::set_var(CLOUD_KEY_ENV, "test-key");
    let served = model_gateway::serve(
        dir.path(),
        ModelRun {
            run_id: RUN_ID,
            routes: &routes,
            grants: vec![
                grant("local", pb::Sensitivity::High),
                grant("claude", cloud_grant),
            ],
            tokens: 100_000,
            audit_key: (9, "tools-test"),
            approvals: Arc::default(),
        },
    )
    .await;
    Setup {
        local,
        cloud,
        audit_dir: served.audit_dir,
        audit: served.audit,
        client: served.client,
        _handle: served.handle,
        _dir: dir,
    }
}

fn part(part: Part) -> pb::ContentPart {
    pb::ContentPart {
        part: Some(part),
        cache: false,
    }
}

fn run_tool() -> pb::ToolDefinition {
    pb::ToolDefinition {
        name: "run".into(),
        description: "Runs a shell command in the workspace".into(),
        parameters_json:
            r#"{"type":"object","properties":{"cmd":{"type":"string"}},"required":["cmd"]}"#.into(),
        ..Default::default()
    }
}

fn user(text: &str) -> pb::ChatMessage {
    pb::ChatMessage {
        role: "user".into(),
        content: text.into(),
        ..Default::default()
    }
}

fn request(route: &str, messages: Vec<pb::ChatMessage>, stream: bool) -> pb::CompleteRequest {
    pb::CompleteRequest {
        route: route.into(),
        messages,
        max_tokens: 64,
        stream,
        tools: vec![run_tool()],
        ..Default::default()
    }
}

/// What one call returned: where it went, its text, its tool calls assembled from their
/// pieces (id, name, arguments), its reasoning signatures, and how it ended.
#[derive(Debug, Default)]
struct Reply {
    started: pb::CompleteStarted,
    text: String,
    calls: Vec<(String, String, String)>,
    signatures: Vec<(String, String)>,
    done: pb::CompleteDone,
}

async fn call(s: &mut Setup, request: pb::CompleteRequest) -> Result<Reply, tonic::Status> {
    let mut stream = s.client.complete(request).await?.into_inner();
    let mut reply = Reply::default();
    while let Some(event) = stream.next().await {
        match event?.event {
            Some(pb::complete_event::Event::Started(started)) => reply.started = started,
            Some(pb::complete_event::Event::Delta(d)) => {
                reply.text.push_str(&d.text);
                if let Some(c) = d.tool_call {
                    let at = c.index as usize;
                    if reply.calls.len() <= at {
                        reply.calls.resize(at + 1, Default::default());
                    }
                    let entry = &mut reply.calls[at];
                    if !c.id.is_empty() {
                        entry.0 = c.id;
                    }
                    if !c.name.is_empty() {
                        entry.1 = c.name;
                    }
                    entry.2.push_str(&c.arguments);
                }
                if let Some(t) = d.thinking {
                    if !t.signature.is_empty() {
                        reply.signatures.push((t.origin, t.signature));
                    }
                }
            }
            Some(pb::complete_event::Event::Done(done)) => reply.done = done,
            None => {}
        }
    }
    Ok(reply)
}

fn audit_text(s: &Setup) -> String {
    s.audit.flush().unwrap();
    std::fs::read_to_string(s.audit_dir.join("log-000001.jsonl")).unwrap()
}

/// The assistant's tool call and the tool's result, as an agent sends them back.
fn turn_with_result(call_id: &str, arguments: &str, result: &str) -> Vec<pb::ChatMessage> {
    vec![
        user("list the files"),
        pb::ChatMessage {
            role: "assistant".into(),
            content: String::new(),
            parts: vec![part(Part::ToolCall(pb::ToolCall {
                id: call_id.into(),
                name: "run".into(),
                arguments_json: arguments.into(),
            }))],
        },
        pb::ChatMessage {
            role: "tool".into(),
            content: String::new(),
            parts: vec![part(Part::ToolResult(pb::ToolResult {
                call_id: call_id.into(),
                content: vec![part(Part::Text(result.into()))],
                is_error: false,
            }))],
        },
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_go_out_and_come_back_on_both_apis_streamed_and_not() {
    let cloud_script = Script {
        prompt_tokens: 11,
        completion_tokens: 4,
        tool_calls: vec![call_to("toolu_01AbCdEf", r#"{"cmd":"cargo test"}"#)],
        ..Default::default()
    };
    let mut s = setup(pb::Sensitivity::Low, cloud_script).await;
    for stream in [true, false] {
        // OpenAI-compatible local route.
        let reply = call(
            &mut s,
            request("local", vec![user("list the files")], stream),
        )
        .await
        .unwrap();
        assert_eq!(reply.text, "let me look", "stream {stream}");
        assert_eq!(
            reply.calls,
            [(
                "call_Xk3f9Qa2".into(),
                "run".into(),
                r#"{"cmd":"ls -la"}"#.into()
            )],
            "stream {stream}"
        );
        assert_eq!(reply.done.finish_reason, "tool_calls");
        let sent = s.local.chat_requests().last().unwrap().json();
        assert_eq!(sent["tools"][0]["function"]["name"], "run", "{sent}");
        // Anthropic cloud route: `tool_use` becomes "tool_calls".
        let reply = call(
            &mut s,
            request("claude", vec![user("run the tests")], stream),
        )
        .await
        .unwrap();
        assert_eq!(
            reply.calls,
            [(
                "toolu_01AbCdEf".into(),
                "run".into(),
                r#"{"cmd":"cargo test"}"#.into()
            )],
            "stream {stream}"
        );
        assert_eq!(reply.done.finish_reason, "tool_calls");
        assert_eq!(reply.started.model, "claude-sonnet");
        let sent = s.cloud.chat_requests().last().unwrap().json();
        assert_eq!(sent["tools"][0]["name"], "run", "{sent}");
        assert_eq!(sent["tools"][0]["input_schema"]["type"], "object", "{sent}");
    }
    // Across APIs: the local (OpenAI) route's call and its result, sent on to the Anthropic
    // route, keep the call's id and pair the result with it.
    let messages = turn_with_result("call_Xk3f9Qa2", r#"{"cmd":"ls -la"}"#, "Cargo.toml\nsrc");
    call(&mut s, request("claude", messages.clone(), true))
        .await
        .unwrap();
    let sent = s.cloud.chat_requests().last().unwrap().json();
    let turns = sent["messages"].as_array().unwrap();
    let tool_use = &turns[1]["content"][0];
    assert_eq!(tool_use["type"], "tool_use", "{sent}");
    assert_eq!(tool_use["id"], "call_Xk3f9Qa2");
    assert_eq!(tool_use["input"]["cmd"], "ls -la");
    let result = &turns[2]["content"][0];
    assert_eq!(
        (&turns[2]["role"], &result["type"]),
        (&"user".into(), &"tool_result".into()),
        "{sent}"
    );
    assert_eq!(result["tool_use_id"], "call_Xk3f9Qa2");
    // And back: the OpenAI route gets an assistant `tool_calls` and a `tool` message.
    call(&mut s, request("local", messages, false))
        .await
        .unwrap();
    let sent = s.local.chat_requests().last().unwrap().json();
    let turns = sent["messages"].as_array().unwrap();
    assert_eq!(turns[1]["tool_calls"][0]["id"], "call_Xk3f9Qa2", "{sent}");
    assert_eq!(turns[2]["role"], "tool");
    assert_eq!(turns[2]["tool_call_id"], "call_Xk3f9Qa2");
    // The audit counts the tools and calls, never their names, arguments or results.
    let log = audit_text(&s);
    assert!(
        log.contains("\"tools\":1") && log.contains("\"tool_calls\":1"),
        "{log}"
    );
    for never in ["ls -la", "cargo test", "Cargo.toml", "Runs a shell command"] {
        assert!(!log.contains(never), "{never} is in the audit log");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_definitions_arguments_and_results_are_classified() {
    let mut s = setup(pb::Sensitivity::Low, Script::default()).await;
    let secret_args = format!(r#"{{"cmd":"aws s3 ls --key {}"}}"#, aws_key());
    let in_arguments = turn_with_result("call_1", &secret_args, "ok");
    let in_result = turn_with_result(
        "call_1",
        r#"{"cmd":"env"}"#,
        &format!("AWS_KEY={}", aws_key()),
    );
    let mut in_definition = request("claude", vec![user("hi")], true);
    in_definition.tools[0].description = format!("uses the key {}", aws_key());
    // The same shapes without a secret go out (ids are classified like any text; telling
    // the APIs' long random ids from secrets is the classifier's own work).
    let harmless = turn_with_result("toolu_01AbCdEf", r#"{"cmd":"ls"}"#, "a.txt");
    call(&mut s, request("claude", harmless, true))
        .await
        .unwrap();

    for (what, refused) in [
        ("arguments", request("claude", in_arguments.clone(), true)),
        ("result", request("claude", in_result, true)),
        ("definition", in_definition),
    ] {
        let refused = call(&mut s, refused).await.unwrap_err();
        assert_eq!(
            refused.code(),
            tonic::Code::PermissionDenied,
            "{what}: {refused:?}"
        );
        assert!(
            refused.message().contains("aws_access_key"),
            "{what}: {refused:?}"
        );
    }
    assert_eq!(
        s.cloud.chat_requests().len(),
        1,
        "only the harmless call went out"
    );
    // A name no route claims, or "auto": the secret goes to the local route.
    for name in ["auto", "some-model-nobody-claims"] {
        let reply = call(&mut s, request(name, in_arguments.clone(), true))
            .await
            .unwrap();
        assert_eq!(reply.started.route, "local", "{name}");
    }
    // A name a route claims prefers it: harmless text asking for claude-* goes to the cloud.
    let reply = call(&mut s, request("claude-opus-4", vec![user("hi")], true))
        .await
        .unwrap();
    assert_eq!(reply.started.route, "claude");
    let log = audit_text(&s);
    assert!(!log.contains(&aws_key()), "the key is not in the audit log");
    for cloud in s.cloud.received() {
        assert!(!cloud.body.contains(&aws_key()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_is_rated_high() {
    let mut s = setup(pb::Sensitivity::Low, Script::default()).await;
    let mut with_image = request("claude", vec![user("what is this?")], true);
    with_image.messages[0]
        .parts
        .push(part(Part::Image(pb::ImagePart {
            media_type: "image/png".into(),
            data: vec![0x89, b'P', b'N', b'G'],
            url: String::new(),
        })));
    let refused = call(&mut s, with_image.clone()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    assert!(refused.message().contains("image"), "{refused:?}");
    assert_eq!(
        refused.metadata().get("tollgate-sensitivity").unwrap(),
        "high"
    );
    with_image.route = "auto".into();
    let reply = call(&mut s, with_image).await.unwrap();
    assert_eq!(reply.started.route, "local");
    assert_eq!(reply.started.sensitivity, pb::Sensitivity::High as i32);
    assert!(s.cloud.chat_requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_signatures_go_back_only_to_the_backend_that_issued_them() {
    let cloud_script = Script {
        text: "done".into(),
        prompt_tokens: 11,
        completion_tokens: 4,
        thinking: Some((
            "thinking it over".into(),
            "c2lnbmVkLWJ5LWFudGhyb3BpYw==".into(),
        )),
        ..Default::default()
    };
    let mut s = setup(pb::Sensitivity::High, cloud_script).await;
    let thinking = |signature: &str| pb::ChatMessage {
        role: "assistant".into(),
        content: "done".into(),
        parts: vec![part(Part::Thinking(pb::ThinkingPart {
            text: "thinking it over".into(),
            signature: signature.into(),
            origin: "anthropic".into(),
            ..Default::default()
        }))],
    };
    // An agent-made signature carrying an AWS key never reaches the backend.
    let forged = vec![
        user("hi"),
        thinking(&format!("forged-{}", aws_key())),
        user("go on"),
    ];
    let reply = call(&mut s, request("claude", forged, true)).await.unwrap();
    assert_eq!(
        reply.signatures,
        [("anthropic".into(), "c2lnbmVkLWJ5LWFudGhyb3BpYw==".into())]
    );
    let sent = s.cloud.chat_requests().last().unwrap().body.clone();
    assert!(
        !sent.contains("forged-") && !sent.contains(&aws_key()),
        "{sent}"
    );
    assert!(audit_text(&s).contains("\"dropped_thinking\":1"));
    // The signature the backend issued goes back to it.
    let issued = vec![
        user("hi"),
        thinking("c2lnbmVkLWJ5LWFudGhyb3BpYw=="),
        user("go on"),
    ];
    call(&mut s, request("claude", issued, false))
        .await
        .unwrap();
    let sent = s.cloud.chat_requests().last().unwrap().json();
    assert_eq!(
        sent["messages"][1]["content"][0]["type"], "thinking",
        "{sent}"
    );
    assert_eq!(
        sent["messages"][1]["content"][0]["signature"],
        "c2lnbmVkLWJ5LWFudGhyb3BpYw=="
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_tokens_routes_like_complete_and_charges_nothing() {
    let mut s = setup(pb::Sensitivity::Low, Script::default()).await;
    let counted = s
        .client
        .count_tokens(request("claude", vec![user("hello there")], false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (counted.route.as_str(), counted.model.as_str()),
        ("claude", "claude-sonnet")
    );
    let prompt = counted.prompt.unwrap();
    assert!(prompt.tokens > 0);
    assert_eq!(prompt.source, pb::TokenSource::Estimate as i32);
    // Refused as Complete would be.
    let secret = request(
        "claude",
        turn_with_result("c", &format!(r#"{{"k":"{}"}}"#, aws_key()), "x"),
        false,
    );
    let refused = s.client.count_tokens(secret).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    assert!(s.cloud.chat_requests().is_empty(), "nothing was sent");
    let receipt = s
        .client
        .get_run_receipt(pb::GetRunReceiptRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(receipt.tokens_left, 100_000, "charged nothing");
    assert_eq!(receipt.tool_calls_left, 100, "not a tool call");
    let log = audit_text(&s);
    assert_eq!(log.matches("\"count_only\":true").count(), 2, "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_models_names_auto_the_routes_their_models_and_claims() {
    let mut s = setup(pb::Sensitivity::Low, Script::default()).await;
    let listed = s
        .client
        .list_models(pb::ListModelsRequest {})
        .await
        .unwrap()
        .into_inner();
    let names: Vec<(&str, &str, bool)> = listed
        .models
        .iter()
        .map(|m| (m.name.as_str(), m.route.as_str(), m.local))
        .collect();
    assert_eq!(
        names,
        [
            ("auto", "", false),
            ("local", "local", true),
            ("qwen", "local", true),
            ("o3", "local", true),
            ("claude", "claude", false),
            ("claude-sonnet", "claude", false),
        ]
    );
    let patterns: Vec<&str> = listed.patterns.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(patterns, ["gpt-*", "claude-*"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redacting_route_keeps_tool_arguments_valid_json() {
    let mut s = setup_with(pb::Sensitivity::Low, Script::default(), true).await;
    let secret_args = format!(r#"{{"cmd":"deploy","key":"{}"}}"#, aws_key());
    let messages = turn_with_result("call_1", &secret_args, &format!("used {}", aws_key()));
    let reply = call(&mut s, request("claude", messages, true))
        .await
        .unwrap();
    assert_eq!(reply.started.route, "claude");
    assert_eq!(reply.started.sent_sensitivity, pb::Sensitivity::Low as i32);
    assert!(reply.started.redacted_spans >= 2, "{:?}", reply.started);
    let sent = s.cloud.chat_requests().last().unwrap().clone();
    assert!(!sent.body.contains(&aws_key()), "{}", sent.body);
    let body = sent.json();
    // The arguments arrive as a JSON object, the secret replaced inside its string.
    let input = &body["messages"][1]["content"][0]["input"];
    assert_eq!(input["cmd"], "deploy", "{body}");
    assert!(
        input["key"].as_str().unwrap().starts_with("[REDACTED:"),
        "{body}"
    );
}
