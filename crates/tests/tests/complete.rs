//! `Gateway.Complete` against real HTTP backends speaking the real wire formats (OpenAI
//! Chat Completions with SSE for a local route, Anthropic Messages with SSE for a cloud
//! route), served on loopback by the test and recording everything they receive: a prompt
//! with a secret is served locally and never reaches the cloud; LOW text goes to the cloud
//! when granted; an ungranted route is refused; the token budget stops a run's calls; the
//! cloud key goes to the cloud backend only, in its header; nothing of the text is audited.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};

use tokio_stream::StreamExt as _;
use tollgate_audit::{AuditConfig, AuditLog};
use tollgate_proto::v1 as pb;
use tollgate_supervisor::complete::{ModelRoutes, RunModels};
use tollgate_supervisor::gateway::{self, RunGateway};
use tollgate_supervisor::snapshot::SnapshotStore;
use tollgate_tests::fake_models::{FakeBackend, Script};

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
    _handle: gateway::GatewayHandle,
    _dir: tempfile::TempDir,
}

async fn setup(grants: &[(&str, pb::Sensitivity)], tokens: u64) -> Setup {
    let local = FakeBackend::start(Script {
        text: "local answer".into(),
        prompt_tokens: 30,
        completion_tokens: 20,
    })
    .await;
    let cloud = FakeBackend::start(Script {
        text: "cloud answer".into(),
        prompt_tokens: 11,
        completion_tokens: 4,
    })
    .await;
    // Cloud routes may use plain http to a loopback address (a local proxy, or this test).
    let routes = format!(
        r#"
        [[route]]
        name = "local"
        kind = "local"
        preset = "vllm"
        endpoint = "http://{}"
        model = "qwen"

        [[route]]
        name = "claude"
        kind = "cloud"
        api = "anthropic"
        endpoint = "http://{}"
        model = "claude-sonnet"
        key_secret = "env:{CLOUD_KEY_ENV}"
        "#,
        local.addr, cloud.addr
    );
    std::env::set_var(CLOUD_KEY_ENV, cloud_key());
    let routes = tollgate_router::config::Routes::parse(&routes, "routes.toml").unwrap();
    let shared = Arc::new(ModelRoutes {
        backends: tollgate_supervisor::models::Backends::new(&routes).unwrap(),
        routes,
        classifier: tollgate_router::Classifier::new(&Default::default()).unwrap(),
    });
    let dir = tempfile::Builder::new()
        .prefix("tg-complete")
        .tempdir_in("/tmp")
        .unwrap();
    let audit_dir = dir.path().join("audit");
    let audit = AuditLog::open(AuditConfig::new(
        &audit_dir,
        "supervisor",
        ed25519_dalek::SigningKey::from_bytes(&[7; 32]),
        "complete-test",
    ))
    .unwrap();
    let run = Arc::new(RunGateway {
        run_id: RUN_ID.into(),
        host_id: nix::unistd::geteuid().as_raw(),
        receipt: pb::Receipt {
            receipt_id: RUN_ID.into(),
            routes: grants
                .iter()
                .map(|(name, s)| pb::RouteGrant {
                    name: (*name).into(),
                    max_sensitivity: *s as i32,
                })
                .collect(),
            ..Default::default()
        },
        expires_at: tollgate_receipt::unix_now() + 3600,
        grants: vec![],
        max_calls: 100,
        closing: Arc::new(AtomicBool::new(false)),
        is_revoked: Arc::new(|_: &str| false),
        audit: audit.clone(),
        calls: AtomicU64::new(0),
        last_call: Mutex::new(None),
        snapshots: SnapshotStore::new(dir.path()),
        exec: None,
        models: Some(Arc::new(RunModels::new(shared, tokens))),
    });
    let handle = gateway::serve(&tokio::runtime::Handle::current(), dir.path(), run).unwrap();
    let channel =
        tonic::transport::Endpoint::from_shared(format!("unix:{}", handle.socket.display()))
            .unwrap()
            .connect()
            .await
            .unwrap();
    Setup {
        local,
        cloud,
        audit_dir,
        audit,
        client: pb::gateway_client::GatewayClient::new(channel),
        _handle: handle,
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
            },
            pb::ChatMessage {
                role: "user".into(),
                content: text.into(),
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
    let local = s.local.received();
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
    assert_eq!(s.local.received().len(), 2, "the backend was not asked");
    // The lowered cap is what the backend was sent.
    let second: serde_json::Value = serde_json::from_str(&s.local.received()[1].body).unwrap();
    assert_eq!(
        second["max_tokens"].as_u64(),
        Some(u64::from(started.max_tokens))
    );
}
