//! `Gateway.Complete` against real HTTP backends speaking the real wire formats (OpenAI
//! Chat Completions with SSE for a local route, Anthropic Messages with SSE for a cloud
//! route), served on loopback by the test and recording everything they receive: a prompt
//! with a secret is served locally and never reaches the cloud; LOW text goes to the cloud
//! when granted; an ungranted route is refused; the token budget stops a run's calls; the
//! cloud key goes to the cloud backend only, in its header; nothing of the text is audited.
//! Counts are honest: the server's usage when it gives one, else the tokenizer of a vLLM or
//! llama.cpp route (over TCP or a Unix socket), else an estimate flagged as one.

use std::sync::Arc;

use tokio_stream::StreamExt as _;
use tollgate_audit::AuditLog;
use tollgate_proto::v1 as pb;
use tollgate_supervisor::gateway::{self, RunGateway};
use tollgate_tests::fake_models::{FakeBackend, Script, Tokenizer};
use tollgate_tests::model_gateway::{self, grant, ModelRun};

const RUN_ID: &str = "01900000-0000-7000-8000-00000000c0de";
const CLOUD_KEY_ENV: &str = "TOLLGATE_TEST_CLOUD_KEY";

// Made at run time so no scanner mistakes the source for a leak.
fn github_token() -> String {
    format!("{}{}", "ghp_", "q7Lm2Xv9Rt4Kp8Ws3Yb6Nc1Zd5Hf0Ja2Ue7Io9")
}

fn cloud_key() -> String {
    format!("{}{}", "sk-ant-api03-", "Zq8vN3kL0pR7tY2wX5cB9mJ4hG6fD1sA")
}

struct Setup {
    local: FakeBackend,
    cloud: FakeBackend,
    audit_dir: std::path::PathBuf,
    audit: AuditLog,
    client: pb::gateway_client::GatewayClient<tonic::transport::Channel>,
    /// The supervisor's approval board (for routes that ask).
    board: Arc<tollgate_supervisor::approvals::ApprovalBoard>,
    /// The run's gateway (to end it as a teardown would).
    run: Arc<RunGateway>,
    _handle: gateway::GatewayHandle,
    _dir: tempfile::TempDir,
}

/// The local route's server: its preset, what it answers, and whether it listens on a
/// Unix socket.
struct Local {
    preset: &'static str,
    script: Script,
    unix: bool,
}

async fn setup(grants: &[(&str, pb::Sensitivity)], tokens: u64) -> Setup {
    setup_with(
        grants,
        tokens,
        Local {
            preset: "vllm",
            script: Script {
                text: "local answer".into(),
                prompt_tokens: 30,
                completion_tokens: 20,
                ..Default::default()
            },
            unix: false,
        },
    )
    .await
}

async fn setup_with(grants: &[(&str, pb::Sensitivity)], tokens: u64, spec: Local) -> Setup {
    let dir = tempfile::Builder::new()
        .prefix("tg-complete")
        .tempdir_in("/tmp")
        .unwrap();
    let local = if spec.unix {
        FakeBackend::start_unix(spec.script, &dir.path().join("local.sock")).await
    } else {
        FakeBackend::start(spec.script).await
    };
    let cloud = FakeBackend::start(Script {
        text: "cloud answer".into(),
        prompt_tokens: 11,
        completion_tokens: 4,
        ..Default::default()
    })
    .await;
    // Cloud routes may use plain http to a loopback address (a local proxy, or this test).
    let routes = format!(
        r#"
        [[route]]
        name = "local"
        kind = "local"
        preset = "{}"
        endpoint = "{}"
        model = "qwen"

        [[route]]
        name = "claude"
        kind = "cloud"
        api = "anthropic"
        endpoint = "{}"
        model = "claude-sonnet"
        key_secret = "env:{CLOUD_KEY_ENV}"
        "#,
        spec.preset, local.endpoint, cloud.endpoint
    );
    std::env::set_var(CLOUD_KEY_ENV, cloud_key());
    let board = Arc::new(tollgate_supervisor::approvals::ApprovalBoard::default());
    let served = model_gateway::serve(
        dir.path(),
        ModelRun {
            run_id: RUN_ID,
            routes: &routes,
            // "name?" grants the route with ask = true.
            grants: grants.iter().map(|(name, s)| grant(name, *s)).collect(),
            tokens,
            audit_key: (7, "complete-test"),
            approvals: board.clone(),
        },
    )
    .await;
    Setup {
        local,
        cloud,
        audit_dir: served.audit_dir,
        audit: served.audit,
        client: served.client,
        board,
        run: served.run,
        _handle: served.handle,
        _dir: dir,
    }
}

fn request(route: &str, text: &str, stream: bool) -> pb::CompleteRequest {
    pb::CompleteRequest {
        route: route.into(),
        messages: vec![
            pb::ChatMessage {
                role: "system".into(),
                content: "be brief".into(),
                ..Default::default()
            },
            pb::ChatMessage {
                role: "user".into(),
                content: text.into(),
                ..Default::default()
            },
        ],
        max_tokens: 64,
        stream,
        ..Default::default()
    }
}

/// The call's events: started, the text, done.
async fn call(
    setup: &mut Setup,
    request: pb::CompleteRequest,
) -> Result<(pb::CompleteStarted, String, pb::CompleteDone), tonic::Status> {
    let mut stream = setup.client.complete(request).await?.into_inner();
    let (mut started, mut text, mut done) = (None, String::new(), None);
    while let Some(event) = stream.next().await {
        match event?.event {
            Some(pb::complete_event::Event::Started(s)) => started = Some(s),
            Some(pb::complete_event::Event::Delta(d)) => text.push_str(&d.text),
            Some(pb::complete_event::Event::Done(d)) => done = Some(d),
            None => {}
        }
    }
    Ok((started.expect("started"), text, done.expect("done")))
}

fn audit_text(setup: &Setup) -> String {
    setup.audit.flush().unwrap();
    std::fs::read_to_string(setup.audit_dir.join("log-000001.jsonl")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_stays_local_and_low_text_may_go_to_the_cloud() {
    use pb::Sensitivity::{High, Low};
    let mut s = setup(&[("local", High), ("claude", Low)], 10_000).await;
    let secret = format!("deploy with {} please, canary-sentence-42", github_token());

    let (started, text, done) = call(&mut s, request("auto", &secret, true)).await.unwrap();
    assert_eq!(started.route, "local");
    assert_eq!(started.sensitivity, High as i32);
    assert_eq!(text, "local answer");
    assert_eq!(done.finish_reason, "stop");
    assert_eq!(done.prompt.unwrap().tokens, 30);
    assert!(!done.estimated, "server counts");
    assert!(s.cloud.received().is_empty(), "the cloud saw nothing");
    let local = s.local.chat_requests();
    assert_eq!(local.len(), 1);
    assert!(
        local[0].body.contains("\"include_usage\":true"),
        "{}",
        local[0].body
    );
    assert!(
        local[0].header("authorization").is_none(),
        "no key for the local route"
    );

    let (started, text, done) = call(&mut s, request("auto", "summarise the weather", true))
        .await
        .unwrap();
    assert_eq!(
        (started.route.as_str(), text.as_str()),
        ("claude", "cloud answer")
    );
    assert_eq!(
        (done.prompt.unwrap().tokens, done.completion.unwrap().tokens),
        (11, 4)
    );
    let cloud = s.cloud.received();
    assert_eq!(cloud.len(), 1);
    assert_eq!(cloud[0].path, "/v1/messages");
    assert_eq!(cloud[0].header("x-api-key"), Some(cloud_key().as_str()));
    assert_eq!(cloud[0].header("anthropic-version"), Some("2023-06-01"));
    assert!(!cloud[0].body.contains("ghp_"));

    // Not streamed: one delta with the whole text.
    let (_, text, _) = call(&mut s, request("local", "hi", false)).await.unwrap();
    assert_eq!(text, "local answer");

    let log = audit_text(&s);
    assert!(
        log.contains("\"route_decision\"") && log.contains("github_token@1:"),
        "{log}"
    );
    for never in [
        github_token(),
        "canary-sentence-42".into(),
        cloud_key(),
        "summarise the weather".into(),
    ] {
        assert!(!log.contains(&never), "{never} is in the audit log");
    }
    // `tollgate calls` lists the model calls: route, decision, tokens.
    s.audit.flush().unwrap();
    let listed = std::process::Command::new(tollgate_tests::bin_path("tollgate"))
        .args(["calls", RUN_ID, s.audit_dir.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    assert!(listed.status.success(), "{listed:?}");
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let routes: Vec<&str> = rows
        .iter()
        .filter(|row| row["tool"] == "model.complete")
        .map(|row| row["route"].as_str().unwrap())
        .collect();
    assert_eq!(routes, ["local", "claude", "local"], "{rows:?}");
    assert!(
        rows.iter()
            .filter(|row| row["tool"] == "model.complete")
            .all(|row| row["decision"] == "allow" && row["prompt_tokens"].is_string()),
        "{rows:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_name_the_route_the_sensitivity_and_the_reasons() {
    use pb::Sensitivity::Low;
    let mut s = setup(&[("claude", Low)], 10_000).await;
    let ungranted = call(&mut s, request("local", "hi", true))
        .await
        .unwrap_err();
    assert_eq!(ungranted.code(), tonic::Code::PermissionDenied);
    assert!(
        ungranted.message().contains(&format!("receipt {RUN_ID}")),
        "{ungranted:?}"
    );
    assert!(
        ungranted.message().contains("local: not granted"),
        "{ungranted:?}"
    );
    assert!(ungranted.metadata().get("tollgate-call-id").is_some());

    let secret = format!("token {}", github_token());
    let refused = call(&mut s, request("auto", &secret, true))
        .await
        .unwrap_err();
    assert!(
        refused
            .message()
            .contains("sensitivity high: github_token in message 1")
            && refused.message().contains("claude: carries up to low text"),
        "{refused:?}"
    );
    assert!(!refused.message().contains("ghp_"));
    assert_eq!(
        refused.metadata().get("tollgate-sensitivity").unwrap(),
        "high"
    );
    assert!(s.local.received().is_empty() && s.cloud.received().is_empty());
    // Stop sequences leave with the messages: judged with them, and bounded.
    let mut hidden = request("auto", "hello", true);
    hidden.stop = vec![format!("then {}", github_token())];
    let refused = call(&mut s, hidden).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    let mut many = request("auto", "hello", true);
    many.stop = vec!["a".into(); 5];
    let refused = call(&mut s, many).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(s.cloud.received().is_empty());
    assert!(audit_text(&s).contains("\"decision\":\"deny\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_budget_stops_a_runs_calls() {
    use pb::Sensitivity::High;
    // Each local call reports 30 + 20 tokens.
    let mut s = setup(&[("local", High)], 110).await;
    let (_, _, done) = call(&mut s, request("local", "one", true)).await.unwrap();
    assert_eq!(done.tokens_left, 60);
    let (started, _, done) = call(&mut s, request("local", "two", true)).await.unwrap();
    // 60 left, a prompt estimate of 15: the cap is lowered from 64 to 45.
    assert_eq!(started.max_tokens, 45);
    assert_eq!(done.tokens_left, 10);
    // 10 left: the prompt estimate alone does not fit.
    let spent = call(&mut s, request("local", "three", true))
        .await
        .unwrap_err();
    assert_eq!(spent.code(), tonic::Code::ResourceExhausted, "{spent:?}");
    assert!(
        spent.message().contains("token budget is spent"),
        "{spent:?}"
    );
    assert_eq!(
        s.local.chat_requests().len(),
        2,
        "the backend was not asked"
    );
    // The lowered cap is what the backend was sent.
    let second = s.local.chat_requests()[1].json();
    assert_eq!(
        second["max_tokens"].as_u64(),
        Some(u64::from(started.max_tokens))
    );
}

fn count(c: Option<pb::TokenCount>) -> (u64, pb::TokenSource) {
    let c = c.expect("a count");
    (c.tokens, pb::TokenSource::try_from(c.source).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_without_usage_is_counted_by_its_tokenizer() {
    use pb::Sensitivity::High;
    use pb::TokenSource::Tokenizer as TOKENIZER;
    let local = Local {
        preset: "vllm",
        script: Script {
            text: "local answer".into(),
            omit_usage: true,
            tokenizer: Some(Tokenizer::Vllm),
            ..Default::default()
        },
        unix: false,
    };
    let mut s = setup_with(&[("local", High)], 10_000, local).await;
    for stream in [true, false] {
        let (_, text, done) = call(&mut s, request("local", "say hi", stream))
            .await
            .unwrap();
        assert_eq!(text, "local answer");
        // The fake's template: (2 words + 3) + (2 words + 3) + 2 for the reply's start. An
        // estimate would say 16.
        assert_eq!(count(done.prompt), (12, TOKENIZER), "stream {stream}");
        // "local answer", no special tokens (an estimate would say 3).
        assert_eq!(count(done.completion), (2, TOKENIZER), "stream {stream}");
        assert!(!done.estimated, "both counts come from the tokenizer");
    }
    let received = s.local.received();
    let paths: Vec<&str> = received.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/tokenize",
            "/v1/chat/completions",
            "/tokenize",
            "/tokenize",
            "/v1/chat/completions",
            "/tokenize"
        ],
        "the prompt is counted before the call, the completion after"
    );
    let prompt = received[0].json();
    assert_eq!(prompt["model"], "qwen");
    assert_eq!(prompt["add_generation_prompt"], true);
    assert_eq!(
        prompt["messages"],
        serde_json::json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "say hi"}])
    );
    let completion = received[2].json();
    assert_eq!(
        completion,
        serde_json::json!({"model": "qwen", "prompt": "local answer", "add_special_tokens": false})
    );
    // The budget is charged the tokenizer's counts: 2 calls of 12 + 2.
    let (_, _, done) = call(&mut s, request("local", "say hi", true))
        .await
        .unwrap();
    assert_eq!(done.tokens_left, 10_000 - 3 * 14);
    let log = audit_text(&s);
    assert!(log.contains("\"prompt_source\":\"tokenizer\""), "{log}");
    assert!(log.contains("\"completion_source\":\"tokenizer\""), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llamacpp_on_a_unix_socket_is_counted_by_its_tokenizer() {
    use pb::Sensitivity::High;
    use pb::TokenSource::Tokenizer as TOKENIZER;
    let local = Local {
        preset: "llamacpp",
        script: Script {
            text: "local answer".into(),
            omit_usage: true,
            tokenizer: Some(Tokenizer::Llamacpp),
            ..Default::default()
        },
        unix: true,
    };
    let mut s = setup_with(&[("local", High)], 10_000, local).await;
    assert!(s.local.endpoint.starts_with("unix:/"));
    let (_, text, done) = call(&mut s, request("local", "say hi", true))
        .await
        .unwrap();
    assert_eq!(text, "local answer");
    // ChatML: "<|im_start|>system", "be", "brief<|im_end|>", "<|im_start|>user", "say",
    // "hi<|im_end|>", "<|im_start|>assistant", and the BOS token.
    assert_eq!(count(done.prompt), (8, TOKENIZER));
    assert_eq!(count(done.completion), (2, TOKENIZER));
    assert!(!done.estimated);
    let received = s.local.received();
    let paths: Vec<&str> = received.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/apply-template",
            "/tokenize",
            "/v1/chat/completions",
            "/tokenize"
        ]
    );
    assert_eq!(
        received[0].json()["messages"][1],
        serde_json::json!({"role": "user", "content": "say hi"})
    );
    let prompt = received[1].json();
    assert!(prompt["content"]
        .as_str()
        .unwrap()
        .starts_with("<|im_start|>system\nbe brief"));
    assert_eq!(
        (
            &prompt["add_special"],
            &prompt["parse_special"],
            &prompt["with_pieces"]
        ),
        (
            &serde_json::json!(true),
            &serde_json::json!(true),
            &serde_json::json!(false)
        )
    );
    let completion = received[3].json();
    assert_eq!(completion["content"], "local answer");
    assert_eq!(completion["add_special"], false);
    assert_eq!(received[0].header("host"), Some("localhost"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ollama_without_usage_is_an_estimate_and_says_so() {
    use pb::Sensitivity::High;
    use pb::TokenSource::Estimate as ESTIMATE;
    let local = Local {
        preset: "ollama",
        script: Script {
            text: "local answer".into(),
            omit_usage: true,
            ..Default::default()
        },
        unix: false,
    };
    let mut s = setup_with(&[("local", High)], 10_000, local).await;
    let (_, text, done) = call(&mut s, request("local", "say hi", true))
        .await
        .unwrap();
    assert_eq!(text, "local answer");
    // ceil(8/3) + ceil(6/3) + 4 per message + 3; ceil(12/4).
    assert_eq!(count(done.prompt), (16, ESTIMATE));
    assert_eq!(
        count(done.completion),
        (64, ESTIMATE),
        "an uncounted completion is charged its cap"
    );
    assert!(done.estimated);
    assert_eq!(
        s.local.paths(),
        ["/v1/chat/completions"],
        "Ollama has no tokenizer endpoint: none is asked"
    );
    let log = audit_text(&s);
    assert!(log.contains("\"estimated\":true"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_tokenizer_falls_back_to_an_estimate_and_never_fails_the_call() {
    use pb::Sensitivity::High;
    use pb::TokenSource::Estimate as ESTIMATE;
    // A vLLM route whose server has no /tokenize (404) and reports no usage.
    let local = Local {
        preset: "vllm",
        script: Script {
            text: "local answer".into(),
            omit_usage: true,
            ..Default::default()
        },
        unix: false,
    };
    let mut s = setup_with(&[("local", High)], 10_000, local).await;
    let (_, text, done) = call(&mut s, request("local", "say hi", false))
        .await
        .unwrap();
    assert_eq!(text, "local answer");
    assert_eq!(count(done.prompt), (16, ESTIMATE));
    assert_eq!(
        count(done.completion),
        (64, ESTIMATE),
        "an uncounted completion is charged its cap"
    );
    assert!(done.estimated);
    assert_eq!(
        s.local.paths(),
        ["/tokenize", "/v1/chat/completions", "/tokenize"],
        "the tokenizer was asked, and failed"
    );
}

/// A route granted with `ask = true`: each call waits for an operator, who is shown the
/// route, the size and the classifier's judgement of what would leave — never the text —
/// and nothing reaches the backend unless approved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_that_asks_waits_for_an_operator_who_sees_the_judgement_not_the_text() {
    let mut setup = setup(&[("claude?", pb::Sensitivity::High)], 10_000).await;
    let secret = github_token();
    let text = format!("summarise this: {secret}");
    let board = setup.board.clone();
    let (_, mut changes) = board.watch(|_| true);
    for approve in [true, false] {
        let mut client = setup.client.clone();
        let request = request("claude", &text, false);
        let call = tokio::spawn(async move { client.complete(request).await });
        let pending = loop {
            match tokio::time::timeout(std::time::Duration::from_secs(20), changes.recv())
                .await
                .expect("the call reaches the board")
                .expect("board open")
                .event
            {
                Some(pb::approval_event::Event::Pending(pending)) => break pending,
                _ => continue,
            }
        };
        assert_eq!(pending.tool, "model.complete");
        assert_eq!(pending.path, "claude");
        assert_eq!(pending.sensitivity, "high", "{pending:?}");
        assert!(!pending.reasons.is_empty(), "{pending:?}");
        assert!(!format!("{pending:?}").contains(&secret), "never the text");
        let verdict = if approve {
            tollgate_supervisor::approvals::Verdict::Approved {
                by: "alice".into(),
                remember: false,
                reason: String::new(),
            }
        } else {
            tollgate_supervisor::approvals::Verdict::Denied {
                by: "alice".into(),
                reason: "not to the cloud".into(),
            }
        };
        board
            .decide(&pending.run_id, &pending.call_id, verdict)
            .unwrap();
        let answered = call.await.unwrap();
        if approve {
            let mut stream = answered.expect("approved").into_inner();
            let mut answer = String::new();
            while let Some(event) = stream.next().await {
                if let Some(pb::complete_event::Event::Delta(d)) = event.unwrap().event {
                    answer.push_str(&d.text);
                }
            }
            assert_eq!(answer, "cloud answer");
        } else {
            let refused = answered.unwrap_err();
            assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
            assert!(
                refused.message().contains("not to the cloud"),
                "{refused:?}"
            );
        }
    }
    assert_eq!(
        setup.cloud.chat_requests().len(),
        1,
        "only the approved call left"
    );
    let audit = audit_text(&setup);
    assert!(audit.contains("\"approved_by\":\"alice\""), "{audit}");
    assert!(!audit.contains(&secret));
    let _ = &mut setup;
}

/// `tollgate calls RUN_ID --json`, one row per line.
fn listed_calls(setup: &Setup) -> Vec<serde_json::Value> {
    setup.audit.flush().unwrap();
    let listed = std::process::Command::new(tollgate_tests::bin_path("tollgate"))
        .args(["calls", RUN_ID, setup.audit_dir.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    assert!(listed.status.success(), "{listed:?}");
    String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// A run whose every model request was refused (by the sandbox's endpoint before it became
/// a call, or by `Complete`) still lists each refusal in `tollgate calls`: before
/// `RecordRefusedCall`, the endpoint's refusals were nowhere, and `tollgate calls` said
/// "no gateway calls". Reports are bounded: 64 a second one by one, the rest counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refused_model_request_is_in_tollgate_calls() {
    use pb::Sensitivity::Low;
    let mut s = setup(&[("claude", Low)], 10_000).await;
    let recorded = s
        .client
        .record_refused_call(pb::RecordRefusedCallRequest {
            api: "anthropic-messages".into(),
            request: "POST /v1/messages/batches?beta=true".into(),
            status: 404,
            reason: "this endpoint does not serve\nmessage batches".into(),
            model: "claude-sonnet-4-5".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!recorded.call_id.is_empty());
    // A secret in the report is not recorded.
    s.client
        .record_refused_call(pb::RecordRefusedCallRequest {
            api: "openai-chat".into(),
            request: "POST /v1/chat/completions".into(),
            status: 400,
            reason: format!("bad JSON near {}", github_token()),
            model: "gpt-4o".into(),
        })
        .await
        .unwrap();
    let ungranted = call(&mut s, request("local", "hi", true))
        .await
        .unwrap_err();
    assert_eq!(ungranted.code(), tonic::Code::PermissionDenied);
    let mut bad = request("auto", "hi", true);
    bad.messages[0].role = "wizard".into();
    let bad = call(&mut s, bad).await.unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument, "{bad:?}");
    // A loop of refusals: 64 recorded in a second (2 already), the rest counted.
    let mut counted = 0;
    for _ in 0..70 {
        let answer = s
            .client
            .record_refused_call(pb::RecordRefusedCallRequest {
                api: "openai-responses".into(),
                request: "POST /v1/responses".into(),
                status: 400,
                reason: "x".into(),
                model: "gpt-5".into(),
            })
            .await
            .unwrap()
            .into_inner();
        counted += usize::from(answer.call_id.is_empty());
    }
    // All 70 came within the second: 62 recorded, 8 counted (a slow machine may open a
    // second window, recording more).
    assert!(counted <= 8, "{counted}");
    s.run.models.flush_refused();

    let rows = listed_calls(&s);
    let requests: Vec<&serde_json::Value> = rows
        .iter()
        .filter(|row| row["tool"] == "model.request")
        .collect();
    assert_eq!(
        requests[0]["request"], "POST /v1/messages/batches",
        "{rows:?}"
    );
    assert_eq!(requests[0]["status"], "404");
    assert_eq!(requests[0]["route"], "claude-sonnet-4-5");
    assert_eq!(requests[0]["decision"], "deny");
    assert!(requests[0]["reason"]
        .as_str()
        .unwrap()
        .contains("does not serve"));
    assert!(requests[1]["reason"]
        .as_str()
        .unwrap()
        .starts_with("<withheld"));
    let summarised: usize = requests
        .iter()
        .filter_map(|row| row["reason"].as_str()?.split_once(" more requests refused"))
        .map(|(n, _)| n.parse::<usize>().unwrap())
        .sum();
    assert_eq!(summarised, counted, "{rows:?}");
    assert_eq!(requests.len(), 72 - counted + usize::from(counted > 0));
    assert!(
        rows.iter()
            .filter(|row| row["tool"] == "model.complete")
            .all(|row| row["decision"] == "deny"),
        "{rows:?}"
    );
    assert_eq!(
        rows.iter()
            .filter(|row| row["tool"] == "model.complete")
            .count(),
        2,
        "both refused Complete calls are listed: {rows:?}"
    );
    assert!(!audit_text(&s).contains(&github_token()));
}

/// A `CompleteRequest` as it travels, built without decoding or holding its messages: field
/// 2 (`messages`) carrying one message's raw bytes.
#[derive(Clone, PartialEq, prost::Message)]
struct RawCompleteRequest {
    #[prost(bytes = "vec", tag = "2")]
    message: Vec<u8>,
}

/// Peak and current resident memory of this process (VmHWM, VmRSS), in bytes.
fn memory() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |name: &str| -> u64 {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            * 1024
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// 4 Mi empty content parts are 8 MiB on the wire and ~445 MiB once prost has decoded them:
/// the gateway walks the raw bytes and refuses the call before decoding, naming the limit,
/// for Complete and CountTokens alike, and this process's memory stays near where it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_of_millions_of_empty_parts_is_refused_before_it_is_decoded() {
    let setup = setup(&[("local", pb::Sensitivity::High)], 10_000).await;
    // One ChatMessage: field 3 (`parts`), empty, 4 Mi times.
    let message = [0x1a_u8, 0x00].repeat(4 << 20);
    let (_, before) = memory();
    let channel =
        tonic::transport::Endpoint::from_shared(format!("unix:{}", setup._handle.socket.display()))
            .unwrap()
            .connect()
            .await
            .unwrap();
    let mut refusals = Vec::new();
    for method in ["Complete", "CountTokens"] {
        let mut grpc = tonic::client::Grpc::new(channel.clone());
        grpc.ready().await.unwrap();
        let path =
            http::uri::PathAndQuery::try_from(format!("/tollgate.v1.Gateway/{method}")).unwrap();
        let request = tonic::Request::new(RawCompleteRequest {
            message: message.clone(),
        });
        let status = if method == "Complete" {
            let codec = tonic_prost::ProstCodec::<RawCompleteRequest, pb::CompleteEvent>::default();
            grpc.server_streaming(request, path, codec)
                .await
                .unwrap_err()
        } else {
            let codec =
                tonic_prost::ProstCodec::<RawCompleteRequest, pb::CountTokensResponse>::default();
            grpc.unary(request, path, codec).await.unwrap_err()
        };
        refusals.push((method, status));
    }
    let (peak, _) = memory();
    // The request's bytes are held a few times over (the test's copies, the body, the
    // frame), never its decoded parts.
    let grown = peak.saturating_sub(before);
    assert!(grown < 96 << 20, "peak memory grew by {} MiB", grown >> 20);
    for (method, status) in refusals {
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{method}: {status:?}"
        );
        assert!(
            status
                .message()
                .contains("parts has more than 16384 items; at most 16384 are accepted"),
            "{method}: {}",
            status.message()
        );
    }
    // Both refusals are audited, small.
    let audit = audit_text(&setup);
    assert!(audit.contains("model.complete") && audit.contains("model.count_tokens"));
}
