//! The supervisor's start-up probe of its local model routes (`Backends::probe`,
//! `Backends::probe_local`), against real HTTP servers on loopback and on a Unix socket: a
//! dead port is an error naming the route and the URL; llama.cpp answering 503 while it
//! loads is waited for; a model the server does not list is an error naming it; cloud
//! routes are never contacted.

use std::time::{Duration, Instant};

use tollgate_router::config::Routes;
use tollgate_router_backends::Backends;
use tollgate_tests::fake_models::{FakeBackend, Script};

/// Deadline short enough for tests, long enough for a few 500 ms retries.
const TIMEOUT: Duration = Duration::from_secs(2);

fn configure(text: &str) -> (Routes, Backends) {
    let routes = Routes::parse(text, "routes.toml").unwrap();
    let backends = Backends::new(&routes).unwrap();
    (routes, backends)
}

fn local(preset: Option<&str>, endpoint: &str, model: &str) -> String {
    let kind = match preset {
        Some(preset) => format!("preset = \"{preset}\""),
        None => "api = \"openai\"".into(),
    };
    format!(
        "[[route]]\nname = \"local\"\nkind = \"local\"\n{kind}\nendpoint = \"{endpoint}\"\nmodel = \"{model}\"\n"
    )
}

fn listing(models: &[&str]) -> Script {
    Script {
        models: models.iter().map(|m| (*m).to_owned()).collect(),
        ..Default::default()
    }
}

/// A loopback port nothing listens on.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[tokio::test]
async fn a_dead_port_is_an_error_naming_the_route_and_the_url() {
    let port = closed_port();
    let (routes, backends) = configure(&local(
        Some("vllm"),
        &format!("http://127.0.0.1:{port}"),
        "qwen",
    ));
    let started = Instant::now();
    let error = backends
        .probe(routes.get("local").unwrap(), TIMEOUT)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with(&format!(
            "route local: GET http://127.0.0.1:{port}/health: connection refused"
        )),
        "{error}"
    );
    assert!(error.contains("--route-probe-timeout"), "{error}");
    assert!(!error.contains('\n'), "one line: {error}");
    // It kept trying until the deadline, and not much longer.
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(1400) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
}

#[tokio::test]
async fn a_missing_unix_socket_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("llama.sock");
    let (routes, backends) = configure(&local(
        Some("llamacpp"),
        &format!("unix:{}", socket.display()),
        "m",
    ));
    let error = backends
        .probe(routes.get("local").unwrap(), Duration::from_secs(1))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with(&format!(
            "route local: GET /health on unix:{}: no such socket",
            socket.display()
        )),
        "{error}"
    );
}

#[tokio::test]
async fn llamacpp_loading_is_waited_for() {
    let server = FakeBackend::start(Script {
        health_503s: 2,
        ..listing(&["m"])
    })
    .await;
    let (routes, backends) = configure(&local(Some("llamacpp"), &server.endpoint, "m"));
    let started = Instant::now();
    backends
        .probe(routes.get("local").unwrap(), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(
        server.paths(),
        ["/health", "/health", "/health", "/v1/models"],
        "503, 503, 200, then the model list"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(1000),
        "two pauses"
    );
    assert!(server.received().iter().all(|r| r.method == "GET"));
}

#[tokio::test]
async fn llamacpp_on_a_unix_socket_passes() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeBackend::start_unix(
        Script {
            health_503s: 1,
            ..listing(&["m"])
        },
        &dir.path().join("llama.sock"),
    )
    .await;
    let (routes, backends) = configure(&local(Some("llamacpp"), &server.endpoint, "m"));
    backends
        .probe(routes.get("local").unwrap(), TIMEOUT)
        .await
        .unwrap();
    assert_eq!(server.paths(), ["/health", "/health", "/v1/models"]);
    assert_eq!(server.received()[0].header("host"), Some("localhost"));
}

#[tokio::test]
async fn a_server_that_never_finishes_loading_fails_at_the_deadline() {
    let server = FakeBackend::start(Script {
        health_503s: 1_000,
        ..listing(&["m"])
    })
    .await;
    let (routes, backends) = configure(&local(Some("llamacpp"), &server.endpoint, "m"));
    let error = backends
        .probe(routes.get("local").unwrap(), TIMEOUT)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with(&format!(
            "route local: GET {}/health: the server answered 503",
            server.endpoint
        )),
        "{error}"
    );
    assert!(error.contains("still failing after 2 s"), "{error}");
}

#[tokio::test]
async fn a_model_the_server_does_not_list_is_an_error_naming_it() {
    let server = FakeBackend::start(listing(&["a", "b"])).await;
    let (routes, backends) = configure(&local(Some("vllm"), &server.endpoint, "x"));
    let started = Instant::now();
    let error = backends
        .probe(routes.get("local").unwrap(), Duration::from_secs(10))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error
            .starts_with("route local: model \"x\" is not among the models the server lists: a, b"),
        "{error}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "not retried: waiting would not help"
    );
    assert_eq!(server.paths(), ["/health", "/v1/models"]);
}

#[tokio::test]
async fn ollama_lists_its_models_in_api_tags_with_their_tags() {
    let server = FakeBackend::start(listing(&["gemma3:latest", "qwen3:8b"])).await;
    for (model, listed) in [("gemma3", true), ("qwen3:8b", true), ("qwen3", false)] {
        let (routes, backends) = configure(&local(Some("ollama"), &server.endpoint, model));
        let probed = backends.probe(routes.get("local").unwrap(), TIMEOUT).await;
        assert_eq!(probed.is_ok(), listed, "{model}: {probed:?}");
        if let Err(e) = probed {
            assert!(
                e.to_string()
                    .contains("is not among the models the server lists: gemma3:latest, qwen3:8b"),
                "{e}"
            );
        }
    }
    assert!(server.paths().iter().all(|p| p == "/api/tags"));
}

#[tokio::test]
async fn lmstudio_and_plain_openai_servers_are_asked_for_their_models_only() {
    let server = FakeBackend::start(listing(&["m"])).await;
    for preset in [Some("lmstudio"), None] {
        let (routes, backends) = configure(&local(preset, &server.endpoint, "m"));
        backends
            .probe(routes.get("local").unwrap(), TIMEOUT)
            .await
            .unwrap();
    }
    assert_eq!(server.paths(), ["/v1/models", "/v1/models"]);
}

#[tokio::test]
async fn only_local_routes_are_probed_and_a_local_key_is_sent() {
    let llama = FakeBackend::start(listing(&["m"])).await;
    let cloud = FakeBackend::start(listing(&["claude"])).await;
    std::env::set_var("TOLLGATE_PROBE_TEST_KEY", "sk-probe-test");
    std::env::set_var("TOLLGATE_PROBE_LOCAL_KEY", "local-vllm-key");
    let text = format!(
        "{}key_secret = \"env:TOLLGATE_PROBE_LOCAL_KEY\"\n\n\
         [[route]]\nname = \"claude\"\nkind = \"cloud\"\napi = \"anthropic\"\nendpoint = \"{}\"\nmodel = \"claude\"\nkey_secret = \"env:TOLLGATE_PROBE_TEST_KEY\"\n",
        local(Some("vllm"), &llama.endpoint, "m"),
        cloud.endpoint
    );
    let (routes, backends) = configure(&text);
    backends.probe_local(&routes, TIMEOUT).await.unwrap();
    assert!(
        cloud.received().is_empty(),
        "no traffic, no key use at start"
    );
    let seen = llama.received();
    assert_eq!(seen.len(), 2);
    assert!(seen
        .iter()
        .all(|r| r.header("authorization") == Some("Bearer local-vllm-key")));

    // A dead local route among them stops the lot.
    let text = format!(
        "{text}\n[[route]]\nname = \"dead\"\nkind = \"local\"\npreset = \"lmstudio\"\nendpoint = \"http://127.0.0.1:{}\"\nmodel = \"m\"\n",
        closed_port()
    );
    let (routes, backends) = configure(&text);
    let error = backends
        .probe_local(&routes, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(
        error.to_string().starts_with("route dead: GET http://"),
        "{error}"
    );
    assert!(cloud.received().is_empty());
}

#[test]
fn the_supervisor_will_not_start_with_a_dead_local_route() {
    if !tollgate_tests::require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = closed_port();
    let routes = dir.path().join("routes.toml");
    std::fs::write(
        &routes,
        local(Some("vllm"), &format!("http://127.0.0.1:{port}"), "qwen"),
    )
    .unwrap();
    let started = Instant::now();
    // The probe runs before anything else is read or written: the key file and the data
    // directory need not exist.
    let output = std::process::Command::new(tollgate_tests::bin_path("tollgate-supervisor"))
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args([
            "--id",
            "workstation",
            "--trust-keys",
            "/nonexistent/keys.json",
        ])
        .args(["--shim", "/bin/true", "--route-probe-timeout", "1"])
        .arg("--routes")
        .arg(&routes)
        .env("RUST_LOG", "warn")
        .env_remove("TOLLGATE_AUDIT_KEY")
        .env_remove("TOLLGATE_AUDIT_KEY_FILE")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(78), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.starts_with(&format!(
            "tollgate-supervisor: error: routes: route local: GET http://127.0.0.1:{port}/health: connection refused"
        )),
        "{stderr}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(!dir.path().join("data").exists(), "nothing was started");
}
