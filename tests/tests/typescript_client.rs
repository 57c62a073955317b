//! The TypeScript client (`clients/typescript`, `@tollgate/client` over @grpc/grpc-js) against
//! the real daemons: its own tests (`node --test` on the compiled `dist/test/client.test.js`)
//! against the authority, and as root against a supervisor too, then the example orchestrator
//! running three agents in parallel. `scripts/test` runs `npm ci` and `npm run build` first.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tollgate_proto::v1 as pb;
use tollgate_tests::{authed, require_root, AuthorityProcess, Pki, SupervisorProcess};

/// Longest a node process may run before the test kills it and fails.
const NODE_TIMEOUT: Duration = Duration::from_secs(120);

/// The environment the client's tests and example read; cleared so that a developer's own
/// settings never point them at other daemons.
const CLIENT_ENV: [&str; 7] = [
    "TOLLGATE_AUTHORITY",
    "TOLLGATE_AUTHORITY_TOKEN_FILE",
    "TOLLGATE_TOKEN_FILE",
    "TOLLGATE_TOKEN",
    "TOLLGATE_SUPERVISOR",
    "TOLLGATE_SUPERVISOR_TOKEN_FILE",
    "TOLLGATE_AUDIENCE",
];

fn node() -> String {
    std::env::var("TOLLGATE_NODE").unwrap_or_else(|_| "node".into())
}

fn package_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../clients/typescript")
}

/// Fails with what to run when node or the built package is missing.
fn prerequisites() -> PathBuf {
    let version = Command::new(node()).arg("--version").output();
    let version = match version {
        Ok(output) if output.status.success() => {
            String::from_utf8_lossy(&output.stdout).trim().to_owned()
        }
        _ => panic!(
            "`{}` is not runnable: install Node.js 20 or later (or set TOLLGATE_NODE), then run \
             scripts/test (it runs `npm ci` and `npm run build` in clients/typescript)",
            node()
        ),
    };
    let major: u32 = version
        .trim_start_matches('v')
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    assert!(
        major >= 20,
        "{} is Node.js {version}; the TypeScript client needs 20 or later",
        node()
    );
    let package = package_dir();
    for needed in [
        "node_modules/@grpc/grpc-js/package.json",
        "node_modules/@grpc/proto-loader/package.json",
        "proto/tollgate/v1/supervisor.proto",
        "dist/src/index.js",
        "dist/test/client.test.js",
        "dist/examples/orchestrator.js",
    ] {
        assert!(
            package.join(needed).is_file(),
            "clients/typescript/{needed} is missing: run scripts/test, or \
             `cd clients/typescript && npm ci && npm run build`"
        );
    }
    package
}

/// What a node process did.
struct Outcome {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// Runs node in the package directory with `args` and `env` (and none of the client's other
/// variables), killing it after NODE_TIMEOUT.
fn run_node(package: &Path, scratch: &Path, args: &[&str], env: &[(&str, String)]) -> Outcome {
    let out_path = scratch.join("node.stdout");
    let err_path = scratch.join("node.stderr");
    let mut command = Command::new(node());
    command
        .current_dir(package)
        .args(args)
        .stdin(Stdio::null())
        .stdout(File::create(&out_path).expect("create stdout file"))
        .stderr(File::create(&err_path).expect("create stderr file"));
    for name in CLIENT_ENV {
        command.env_remove(name);
    }
    command.envs(env.iter().map(|(k, v)| (k, v)));
    let mut child = command.spawn().expect("spawn node");
    let deadline = Instant::now() + NODE_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for node") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "node {args:?} ran past {NODE_TIMEOUT:?}:\n{}{}",
                std::fs::read_to_string(&out_path).unwrap_or_default(),
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Outcome {
        status,
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
    }
}

/// `node --test` on the compiled client tests, with TAP output.
fn node_test(package: &Path, scratch: &Path, env: &[(&str, String)]) -> Outcome {
    run_node(
        package,
        scratch,
        &["--test", "--test-reporter=tap", "dist/test/client.test.js"],
        env,
    )
}

/// Whether the TAP output reports the test `name` as passed (not skipped).
fn passed(tap: &str, name: &str) -> bool {
    let suffix = format!(" - {name}");
    tap.lines()
        .map(str::trim)
        .any(|line| line.starts_with("ok ") && line.ends_with(&suffix))
}

/// Whether the TAP output reports the suite or test `name` as skipped.
fn skipped(tap: &str, name: &str) -> bool {
    let marker = format!(" - {name} # SKIP");
    tap.lines()
        .map(str::trim)
        .any(|line| line.starts_with("ok ") && line.contains(&marker))
}

const AUTHORITY_TESTS: [&str; 4] = [
    "mint returns a signed receipt that verifies with the key set",
    "refusals reject with TollgateError and the gRPC code",
    "revoke is recorded and idempotent",
    "an unreachable daemon rejects with UNAVAILABLE",
];

const SUPERVISOR_TESTS: [&str; 4] = [
    "start and watch a run to completion",
    "tree shows a delegated child that ends with its parent",
    "approvals are watched and decided, and live runs amended",
    "stop ends a live run; refused receipts reject with PERMISSION_DENIED",
];

fn authority_env(authority: &AuthorityProcess) -> Vec<(&'static str, String)> {
    vec![
        ("TOLLGATE_AUTHORITY", authority.addr().to_owned()),
        (
            "TOLLGATE_AUTHORITY_TOKEN_FILE",
            authority
                .data_dir()
                .join("admin.token")
                .display()
                .to_string(),
        ),
    ]
}

#[test]
fn typescript_client_tests_pass_against_the_authority() {
    let package = prerequisites();
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let outcome = node_test(&package, dir.path(), &authority_env(&authority));
    assert!(outcome.status.success(), "node --test failed: {outcome}");
    for name in AUTHORITY_TESTS {
        assert!(
            passed(&outcome.stdout, name),
            "{name:?} did not pass: {outcome}"
        );
    }
    // Without a supervisor address the run tests are skipped, not failed or passed.
    assert!(skipped(&outcome.stdout, "supervisor"), "{outcome}");
    assert!(!outcome.stdout.contains("not ok"), "{outcome}");
}

/// The same tests against an authority serving mutual TLS, the client given the CA and
/// operator alice's certificate (`caFile`, `certFile`, `keyFile`).
#[test]
fn typescript_client_speaks_mutual_tls() {
    let package = prerequisites();
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::make(dir.path());
    let authority = AuthorityProcess::start_tls(&dir.path().join("authority"), &pki);
    let mut env = authority_env(&authority);
    env.push(("TOLLGATE_CA", pki.path("ca.pem")));
    env.push(("TOLLGATE_CERT", pki.path("operator-alice.pem")));
    env.push(("TOLLGATE_KEY", pki.path("operator-alice.key")));
    let outcome = node_test(&package, dir.path(), &env);
    assert!(outcome.status.success(), "node --test failed: {outcome}");
    for name in AUTHORITY_TESTS {
        assert!(
            passed(&outcome.stdout, name),
            "{name:?} did not pass over TLS: {outcome}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_client_runs_agents_on_the_real_supervisor() {
    if !require_root() {
        return;
    }
    let package = prerequisites();
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    // Enrolled for delegation, so the client's tree test can start a child.
    let supervisor = SupervisorProcess::start_delegating(
        &dir.path().join("supervisor"),
        &authority,
        "typescript",
        207_000,
    )
    .await;
    let mut env = authority_env(&authority);
    env.push(("TOLLGATE_SUPERVISOR", supervisor.addr().to_owned()));
    env.push((
        "TOLLGATE_SUPERVISOR_TOKEN_FILE",
        supervisor.token_file().display().to_string(),
    ));
    env.push(("TOLLGATE_AUDIENCE", "workstation".into()));

    // The client's own tests, the run tests included.
    let outcome = node_test(&package, dir.path(), &env);
    assert!(outcome.status.success(), "node --test failed: {outcome}");
    for name in AUTHORITY_TESTS.iter().chain(&SUPERVISOR_TESTS) {
        assert!(
            passed(&outcome.stdout, name),
            "{name:?} did not pass: {outcome}"
        );
    }
    assert!(!outcome.stdout.contains("# SKIP"), "{outcome}");

    // The example orchestrator, addresses and tokens as flags (the tests used the environment).
    let authority_token = authority.data_dir().join("admin.token");
    let supervisor_token = supervisor.token_file();
    let outcome = run_node(
        &package,
        dir.path(),
        &[
            "dist/examples/orchestrator.js",
            "--authority",
            authority.addr(),
            "--authority-token-file",
            authority_token.to_str().unwrap(),
            "--supervisor",
            supervisor.addr(),
            "--supervisor-token-file",
            supervisor_token.to_str().unwrap(),
            "--audience",
            "workstation",
        ],
        &[],
    );
    assert!(outcome.status.success(), "orchestrator failed: {outcome}");
    for line in [
        "[planner] plan: split the work in two",
        "[planner] plan: done",
        "[coder] code: part 1",
        "[coder] code: part 2",
        "[coder] code: part 3",
        "[reviewer] review: 2 findings",
        "[planner] ended: state=EXITED exit_code=0 ",
        "[coder] ended: state=EXITED exit_code=0 ",
        "[reviewer] ended: state=EXITED exit_code=3 ",
    ] {
        assert!(
            outcome.stdout.lines().any(|l| l.starts_with(line)),
            "no line {line:?} in the orchestrator's output: {outcome}"
        );
    }
    assert!(
        outcome
            .stderr
            .lines()
            .any(|l| l == "[coder:stderr] code: no tests yet"),
        "{outcome}"
    );
    // Each agent's own lines arrive in order.
    let coder: Vec<&str> = outcome
        .stdout
        .lines()
        .filter(|l| l.starts_with("[coder] code: part "))
        .collect();
    assert_eq!(
        coder,
        [
            "[coder] code: part 1",
            "[coder] code: part 2",
            "[coder] code: part 3"
        ]
    );

    // The supervisor agrees: the three runs the orchestrator started exited with their codes,
    // and nothing the client started is still live.
    let runs = supervisor
        .client()
        .await
        .list_runs(authed(&supervisor.token(), pb::ListRunsRequest::default()))
        .await
        .unwrap()
        .into_inner()
        .runs;
    for (subject, code) in [("planner", 0), ("coder", 0), ("reviewer", 3)] {
        let run = runs
            .iter()
            .find(|r| r.subject == subject)
            .unwrap_or_else(|| panic!("no run of {subject}: {runs:?}"));
        assert_eq!(run.state, pb::RunState::Exited as i32, "{run:?}");
        assert_eq!(
            run.report.as_ref().and_then(|r| r.exit_code),
            Some(code),
            "{run:?}"
        );
    }
    let live: Vec<_> = runs
        .iter()
        .filter(|r| {
            r.state == pb::RunState::Starting as i32 || r.state == pb::RunState::Running as i32
        })
        .collect();
    assert!(live.is_empty(), "runs left live: {live:?}");
}
