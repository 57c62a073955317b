//! The Python client (`clients/python`, package `tollgate`) against the real daemons: its own
//! test program (typed wrapper, independent receipt verification, refusals as
//! `TollgateError`), and, as root, the example orchestrator running three scoped agents in
//! parallel on a real supervisor.
//!
//! Needs `TOLLGATE_PYTHON` to be a Python with the package installed (`scripts/test` installs
//! it into `target/pyenv`: `pip install ./clients/python`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tollgate_tests::repo_root;
use tollgate_tests::{require_root, AuthorityProcess, Pki, SupervisorProcess};

fn python() -> String {
    std::env::var("TOLLGATE_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn client_dir() -> PathBuf {
    repo_root().join("clients/python")
}

/// Fails with the way out when the interpreter lacks the installed package.
fn require_client() {
    let probe = Command::new(python())
        .args([
            "-c",
            "import tollgate, tollgate.v1.supervisor_pb2_grpc, cryptography",
        ])
        .output()
        .expect("run python");
    assert!(
        probe.status.success(),
        "{} cannot import the tollgate client ({}): run `{0} -m pip install ./clients/python` \
         or set TOLLGATE_PYTHON to a venv's python (scripts/test does both)",
        python(),
        String::from_utf8_lossy(&probe.stderr).trim()
    );
}

/// What a Python program printed.
struct Ran {
    success: bool,
    stdout: String,
    stderr: String,
}

/// Runs a Python program with `args`, killed after `limit`; its output goes through files in
/// `dir` so a chatty program never blocks on a pipe.
fn run_python(
    dir: &Path,
    name: &str,
    script: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    limit: Duration,
) -> Ran {
    let (out_path, err_path) = (
        dir.join(format!("{name}.stdout")),
        dir.join(format!("{name}.stderr")),
    );
    let mut child = Command::new(python())
        .arg(script)
        .args(args)
        .envs(env.iter().copied())
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("run python");
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let ran = Ran {
        success: status.is_some_and(|s| s.success()),
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
    };
    assert!(
        status.is_some(),
        "{name} still running after {limit:?}:\n{}{}",
        ran.stdout,
        ran.stderr
    );
    ran
}

/// Asserts the test program passed, and that each of `names` ran and passed.
fn assert_tests_passed(ran: &Ran, names: &[&str]) {
    let report = format!("{}{}", ran.stdout, ran.stderr);
    assert!(ran.success, "the Python client's tests failed:\n{report}");
    assert!(
        ran.stdout
            .lines()
            .any(|l| l.ends_with(" passed, 0 failed") && !l.starts_with("0 ")),
        "no passing summary:\n{report}"
    );
    for name in names {
        let prefix = format!("ok {name} (");
        assert!(
            ran.stdout.lines().any(|l| l.starts_with(&prefix)),
            "test {name} did not pass:\n{report}"
        );
    }
}

fn test_program() -> PathBuf {
    client_dir().join("tests/test_client.py")
}

#[test]
fn python_client_mints_verifies_and_reports_refusals_against_the_authority() {
    require_client();
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let token_file = authority.data_dir().join("admin.token");
    let addr_file = authority.data_dir().join("authority.addr");
    let ran = run_python(
        dir.path(),
        "test_client",
        &test_program(),
        &[
            // The readiness file, as the CLI also accepts.
            "--authority",
            addr_file.to_str().unwrap(),
            "--authority-token-file",
            token_file.to_str().unwrap(),
        ],
        &[],
        Duration::from_secs(120),
    );
    assert_tests_passed(
        &ran,
        &[
            // Offline: the verifier on receipts signed by the test itself.
            "text_form_is_strict",
            "window_audience_and_revocation",
            "tampering_and_wrong_keys_are_refused",
            "structure_checks",
            "ed25519_is_strict",
            // Against the daemon.
            "key_set_follows_the_key_id_rule_and_is_public",
            "mint_returns_decoded_fields_that_verify",
            "daemon_receipt_tampered_fails_verify_receipt",
            "mint_refused_permission_denied",
            "mint_refused_invalid_argument",
            "calls_without_a_valid_token_are_unauthenticated",
            "revoke_is_idempotent_and_recorded",
        ],
    );
    assert!(
        !ran.stdout.contains("supervisor_info"),
        "supervisor tests ran without a supervisor:\n{}",
        ran.stdout
    );
}

/// The same program against an authority serving mutual TLS, the client given the CA and
/// operator alice's certificate (`ca_file`, `cert_file`, `key_file`); without the
/// certificate it is refused as unavailable.
#[test]
fn python_client_speaks_mutual_tls() {
    require_client();
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::make(dir.path());
    let authority = AuthorityProcess::start_tls(&dir.path().join("authority"), &pki);
    let token_file = authority.data_dir().join("admin.token");
    let (ca, cert, key) = (
        pki.path("ca.pem"),
        pki.path("operator-alice.pem"),
        pki.path("operator-alice.key"),
    );
    let ran = run_python(
        dir.path(),
        "test_client_tls",
        &test_program(),
        &[
            "--authority",
            authority.addr(),
            "--authority-token-file",
            token_file.to_str().unwrap(),
            "--ca",
            &ca,
            "--cert",
            &cert,
            "--key",
            &key,
        ],
        &[],
        Duration::from_secs(120),
    );
    assert_tests_passed(
        &ran,
        &[
            "key_set_follows_the_key_id_rule_and_is_public",
            "mint_returns_decoded_fields_that_verify",
            "calls_without_a_valid_token_are_unauthenticated",
        ],
    );
    let script = dir.path().join("no_cert.py");
    std::fs::write(
        &script,
        "import sys, tollgate\n\
         a = tollgate.Authority(sys.argv[1], ca_file=sys.argv[2], timeout=10)\n\
         try:\n    a.key_set()\nexcept tollgate.TollgateError as e:\n    print(e.code.name)\n",
    )
    .unwrap();
    let refused = run_python(
        dir.path(),
        "no_cert",
        &script,
        &[authority.addr(), &ca],
        &[],
        Duration::from_secs(60),
    );
    assert_eq!(refused.stdout.trim(), "UNAVAILABLE", "{}", refused.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_runs_three_scoped_agents_in_parallel_on_the_supervisor() {
    if !require_root() {
        return;
    }
    require_client();
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    // Enrolled for delegation, so the client's tree test can start a child.
    let supervisor = SupervisorProcess::start_delegating(
        &dir.path().join("supervisor"),
        &authority,
        "pyclient",
        205_000,
    )
    .await;
    let authority_token = authority.data_dir().join("admin.token");
    let supervisor_token = supervisor.token_file();

    // The package's own tests, now with the supervisor part.
    let ran = run_python(
        dir.path(),
        "test_client",
        &test_program(),
        &[
            "--authority",
            authority.addr(),
            "--authority-token-file",
            authority_token.to_str().unwrap(),
            "--supervisor",
            supervisor.addr(),
            "--supervisor-token-file",
            supervisor_token.to_str().unwrap(),
        ],
        &[],
        Duration::from_secs(150),
    );
    assert_tests_passed(
        &ran,
        &[
            "daemon_receipt_tampered_fails_verify_receipt",
            "mint_refused_permission_denied",
            "mint_refused_invalid_argument",
            "supervisor_info_trusts_the_authoritys_key",
            "start_watch_get_list",
            "unpinned_receipt_takes_argv_within_exec",
            "stop_tears_down_a_live_run",
            "approvals_are_watched_and_decided_and_live_runs_amended",
            "tree_shows_a_delegated_child_that_ends_with_its_parent",
            "refused_receipts_raise_tollgate_error",
            "revoked_receipt_is_refused_once_the_supervisor_knows",
            "unknown_runs_are_not_found",
        ],
    );

    // The example orchestrator, addresses and tokens from the environment this time.
    let data = dir.path().join("orchestrator-data");
    let ran = run_python(
        dir.path(),
        "orchestrator",
        &client_dir().join("examples/orchestrator.py"),
        &[
            "--json",
            "--pause",
            "3",
            "--data-dir",
            data.to_str().unwrap(),
        ],
        &[
            ("TOLLGATE_AUTHORITY", authority.addr()),
            (
                "TOLLGATE_AUTHORITY_TOKEN_FILE",
                authority_token.to_str().unwrap(),
            ),
            ("TOLLGATE_SUPERVISOR", supervisor.addr()),
            (
                "TOLLGATE_SUPERVISOR_TOKEN_FILE",
                supervisor_token.to_str().unwrap(),
            ),
        ],
        Duration::from_secs(120),
    );
    let report = format!("{}{}", ran.stdout, ran.stderr);
    assert!(ran.success, "the orchestrator failed:\n{report}");
    let summary: serde_json::Value = serde_json::from_str(
        ran.stdout
            .lines()
            .last()
            .expect("the orchestrator printed nothing"),
    )
    .unwrap_or_else(|e| panic!("last line is not JSON ({e}):\n{report}"));
    assert_eq!(summary["ok"], true, "{report}");
    let agents = summary["agents"].as_array().expect("agents");
    assert_eq!(agents.len(), 3, "{report}");
    let mut run_ids = Vec::new();
    for agent in agents {
        let name = agent["name"].as_str().unwrap();
        assert_eq!(agent["state"], "exited", "{name}: {report}");
        assert_eq!(agent["exit_code"], 0, "{name}: {report}");
        let lines: Vec<&str> = agent["lines"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|l| l.as_str())
            .collect();
        // Scoped: its own grant works, a sibling's file and a sibling's tool are refused.
        assert!(
            lines.contains(&"read of a sibling's file: refused"),
            "{name}: {report}"
        );
        assert!(
            lines.contains(&"exec of a sibling's tool: refused"),
            "{name}: {report}"
        );
        assert_eq!(lines.last(), Some(&"done"), "{name}: {report}");
        // Streamed with the agent's name in front.
        let prefix = format!("[{name:<9}] ");
        assert!(
            ran.stdout.lines().any(|l| l == format!("{prefix}done")),
            "no line `{prefix}done`:\n{report}"
        );
        run_ids.push(agent["run_id"].as_str().unwrap().to_owned());
    }
    let work: Vec<&str> = agents
        .iter()
        .map(|a| a["lines"][1].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        work,
        [
            "words in notes.txt: 10",
            "sorted: alice bob carol mallory ",
            "warnings in log.txt: 2",
        ],
        "{report}"
    );
    // In parallel: all three were live at once for a while (each works 3 s), and the whole
    // took less than the three runs end to end.
    let overlap = summary["overlap_s"].as_f64().unwrap();
    let wall = summary["wall_s"].as_f64().unwrap();
    assert!(
        overlap > 1.0,
        "the runs did not overlap ({overlap} s): {report}"
    );
    assert!(wall < 9.0, "three 3 s runs took {wall} s: {report}");
    // The supervisor's records agree.
    let runs = Command::new(python())
        .args([
            "-c",
            "import sys, tollgate; s = tollgate.Supervisor(sys.argv[1], token_file=sys.argv[2]); \
             [print(r.run_id, r.state.value, r.exit_code) for r in s.list()]",
            supervisor.addr(),
            supervisor_token.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&runs.stdout);
    for id in &run_ids {
        assert!(
            listed.lines().any(|l| l == format!("{id} exited 0")),
            "{id} not listed as exited 0:\n{listed}"
        );
    }
}
