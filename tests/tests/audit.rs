//! The daemons' audit logs, end to end: every decision of the real authority and supervisor
//! lands in a log that `tollgate audit verify` accepts, `tollgate trace` tells a run's story
//! from them, an edit is caught, and no secret reaches a log file.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nix::sys::signal::Signal;
use tollgate_proto::v1 as pb;
use tollgate_router::{Classifier, ClassifierConfig, Sensitivity};
use tollgate_tests::{authed, bin_path, require_root, AuthorityProcess, SupervisorProcess};

fn tollgate(args: &[&str]) -> Output {
    Command::new(bin_path("tollgate"))
        .args(args)
        .env_remove("TOLLGATE_AUDIT_KEY")
        .env_remove("TOLLGATE_AUDIT_KEY_FILE")
        .output()
        .unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn request(subject: &str, paths: &[String]) -> pb::MintReceiptRequest {
    pb::MintReceiptRequest {
        subject: subject.into(),
        ttl_seconds: 600,
        audience: vec!["workstation".into()],
        exec: vec!["/bin/sh".into()],
        agent: Some(pb::AgentSpec {
            argv: vec!["/bin/sh".into(), "-c".into(), "echo audited".into()],
            ..Default::default()
        }),
        fs: paths
            .iter()
            .map(|path| pb::FsGrant {
                path: path.clone(),
                access: pb::FsAccess::Read as i32,
                mount: String::new(),
                exec: false,
                ask: false,
                ask_reads: false,
            })
            .collect(),
        ..Default::default()
    }
}

/// Every byte of every file in `dir`.
fn all_bytes(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_file())
        .map(|e| (e.path(), std::fs::read(e.path()).unwrap()))
        .collect()
}

/// Fails if any of the cases' secrets appears in any of the files.
fn assert_no_secret_in(files: &[(PathBuf, Vec<u8>)], cases: &[(String, Vec<String>)]) {
    for (_, secrets) in cases {
        for secret in secrets {
            for (file, bytes) in files {
                let found = bytes
                    .windows(secret.len())
                    .any(|window| window == secret.as_bytes());
                assert!(
                    !found,
                    "a corpus secret of {} bytes is in {}",
                    secret.len(),
                    file.display()
                );
            }
        }
    }
}

/// The secrets of the router's corpus: from every true case made only of high-sensitivity
/// detectors, the spans the classifier reports (the secret values themselves).
fn corpus_secrets() -> Vec<(String, Vec<String>)> {
    let corpus = include_str!("../../router/classify/corpus/cases.txt");
    let classifier = Classifier::new(&ClassifierConfig::default()).unwrap();
    let high: Vec<&str> = Classifier::builtin_detectors()
        .filter(|(_, sensitivity)| *sensitivity == Sensitivity::High)
        .map(|(id, _)| id)
        .collect();
    let mut cases = Vec::new();
    for line in corpus.lines() {
        let Some(rest) = line.strip_prefix("+ ") else {
            continue;
        };
        let Some((detectors, raw)) = rest.split_once(' ') else {
            continue;
        };
        if !detectors.split(',').all(|d| high.contains(&d)) {
            continue;
        }
        let unescaped = raw
            .replace("\\n", "\n")
            .replace("\\r", "\r")
            .replace("\\t", "\t")
            .replace("\\\\", "\\");
        let found = classifier.classify(&unescaped);
        let secrets: Vec<String> = found
            .reasons
            .iter()
            .filter(|r| r.sensitivity == Sensitivity::High)
            .map(|r| unescaped[r.span.clone()].to_owned())
            // Short values could occur by chance in hashes and ids.
            .filter(|s| s.len() >= 12)
            .collect();
        if !secrets.is_empty() {
            cases.push((unescaped, secrets));
        }
    }
    assert!(cases.len() >= 40, "only {} corpus secrets", cases.len());
    cases
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_corpus_secret_reaches_the_authoritys_log() {
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let token = authority.admin_token();
    let mut client = authority.client().await;
    let cases = corpus_secrets();
    let (mut minted, mut refused) = (0, 0);
    for (index, (secret_text, _)) in cases.iter().enumerate() {
        // As a granted path (minted: the path is in the entry's metadata) or, when it is no
        // normalised absolute path, refused (the path is in the refusal's reason).
        let path = format!("/srv/{}", secret_text.replace('\n', " "));
        let reply = client
            .mint_receipt(authed(&token, request(&format!("case-{index}"), &[path])))
            .await;
        match reply {
            Ok(_) => minted += 1,
            Err(_) => refused += 1,
        }
        // And in a revocation's reason.
        let receipt_id = client
            .mint_receipt(authed(&token, request("to-revoke", &[])))
            .await
            .unwrap()
            .into_inner()
            .receipt
            .unwrap()
            .receipt_id;
        client
            .revoke_receipt(authed(
                &token,
                pb::RevokeReceiptRequest {
                    receipt_id,
                    reason: format!("leaked: {secret_text}"),
                },
            ))
            .await
            .unwrap();
    }
    assert!(
        minted > 0 && refused > 0,
        "minted {minted}, refused {refused}"
    );
    let data = authority.data_dir().to_owned();
    drop(client);
    assert!(authority.stop(Signal::SIGTERM).success());

    let log = data.join("audit");
    let files = all_bytes(&log);
    assert_no_secret_in(&files, &cases);
    let verified = tollgate(&["audit", "verify", log.to_str().unwrap()]);
    assert!(verified.status.success(), "{}", text(&verified));
    // Redaction happened (and is visible as such), on refusals and revocations alike.
    let query = tollgate(&["audit", "query", log.to_str().unwrap()]);
    let listing = text(&query);
    assert!(listing.contains("[REDACTED:"), "{listing}");
    assert!(listing.contains("receipt_refused"), "{listing}");
    assert!(listing.contains("receipt_revoked"), "{listing}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_corpus_secret_in_a_gateway_call_reaches_any_log() {
    if !require_root() {
        return;
    }
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let cases = corpus_secrets();
    // Each secret in its own file, shown to the agent read-only at /secrets.
    let secrets = dir.path().join("secrets");
    std::fs::create_dir(&secrets).unwrap();
    std::fs::set_permissions(&secrets, std::fs::Permissions::from_mode(0o755)).unwrap();
    for (index, (secret_text, _)) in cases.iter().enumerate() {
        let file = secrets.join(format!("{index:03}"));
        std::fs::write(&file, secret_text).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let supervisor = SupervisorProcess::start(
        &dir.path().join("supervisor"),
        &authority.url(),
        "secrets",
        202_700,
    );
    // Every secret as a path (refused: no grant covers it, so the path is in the reason
    // too) and as an argument of a command the gateway runs in the sandbox.
    let script = "for f in /secrets/*; do s=$(/usr/bin/cat \"$f\"); \
                  tollgate-shim tool read \"/srv/$s\" >/dev/null 2>&1; \
                  tollgate-shim tool exec -- /bin/echo \"$s\" >/dev/null 2>&1; \
                  done; echo finished";
    let mut spec = request("gateway-secrets", &[]);
    spec.agent = Some(pb::AgentSpec {
        argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
        ..Default::default()
    });
    spec.exec = vec!["/bin/sh".into(), "/usr/bin/cat".into(), "/bin/echo".into()];
    spec.fs = vec![pb::FsGrant {
        path: secrets.display().to_string(),
        access: pb::FsAccess::Read as i32,
        mount: "/secrets".into(),
        exec: false,
        ask: false,
        ask_reads: false,
    }];
    let minted = authority
        .client()
        .await
        .mint_receipt(authed(&authority.admin_token(), spec))
        .await
        .unwrap()
        .into_inner();
    let run_id = minted.receipt.unwrap().receipt_id;
    let mut runs = supervisor.client().await;
    runs.start_run(authed(
        &supervisor.token(),
        pb::StartRunRequest {
            receipt: minted.text,
            argv: Vec::new(),
            ..Default::default()
        },
    ))
    .await
    .unwrap();
    let report = supervisor
        .wait_ended(&run_id, std::time::Duration::from_secs(60))
        .await
        .report
        .unwrap();
    assert_eq!(report.exit_code, Some(0), "{report:?}");
    let (supervisor_data, authority_data) = (
        supervisor.data_dir().to_owned(),
        authority.data_dir().to_owned(),
    );
    drop(runs);
    assert!(supervisor.stop(Signal::SIGTERM).success());
    assert!(authority.stop(Signal::SIGTERM).success());

    // Every log file: both audit logs and both daemons' own logs (stderr).
    let mut files = all_bytes(&supervisor_data.join("audit"));
    files.extend(all_bytes(&authority_data.join("audit")));
    for daemon in [&supervisor_data, &authority_data] {
        let stderr = daemon.with_extension("stderr");
        if let Ok(bytes) = std::fs::read(&stderr) {
            files.push((stderr, bytes));
        }
    }
    assert_no_secret_in(&files, &cases);
    // The calls were made and recorded, redacted.
    let log = supervisor_data.join("audit");
    let calls = tollgate(&["calls", &run_id, log.to_str().unwrap(), "--json"]);
    let listing = text(&calls);
    assert!(calls.status.success(), "{listing}");
    let count = |tool: &str, decision: &str| {
        listing
            .lines()
            .filter(|l| {
                l.contains(&format!("\"tool\":\"{tool}\""))
                    && l.contains(&format!("\"decision\":\"{decision}\""))
            })
            .count()
    };
    assert_eq!(count("fs.read", "deny"), cases.len(), "{listing}");
    assert_eq!(count("exec", "allow"), cases.len(), "{listing}");
    assert!(listing.contains("[REDACTED:"), "{listing}");
    let verified = tollgate(&["audit", "verify", log.to_str().unwrap()]);
    assert!(verified.status.success(), "{}", text(&verified));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_traced_from_mint_to_teardown_and_edits_are_caught() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let supervisor = SupervisorProcess::start(
        &dir.path().join("supervisor"),
        &authority.url(),
        "audit",
        202_600,
    );
    let token = authority.admin_token();
    let mut client = authority.client().await;
    let minted = client
        .mint_receipt(authed(&token, request("traced", &[])))
        .await
        .unwrap()
        .into_inner();
    let run_id = minted.receipt.unwrap().receipt_id;
    let mut runs = supervisor.client().await;
    let started = runs
        .start_run(authed(
            &supervisor.token(),
            pb::StartRunRequest {
                receipt: minted.text.clone(),
                argv: Vec::new(),
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(started.run_id, run_id);
    // The same receipt again: refused (single use), and audited as such.
    let again = runs
        .start_run(authed(
            &supervisor.token(),
            pb::StartRunRequest {
                receipt: minted.text,
                argv: Vec::new(),
                ..Default::default()
            },
        ))
        .await;
    assert!(again.is_err());
    // Wait for the run's end through the supervisor.
    supervisor
        .wait_ended(&run_id, std::time::Duration::from_secs(15))
        .await;
    let (authority_log, supervisor_log) = (
        authority.data_dir().join("audit"),
        supervisor.data_dir().join("audit"),
    );
    drop((client, runs));
    assert!(supervisor.stop(Signal::SIGTERM).success());
    assert!(authority.stop(Signal::SIGTERM).success());
    let logs = [
        authority_log.to_str().unwrap(),
        supervisor_log.to_str().unwrap(),
    ];

    let verified = tollgate(&["audit", "verify", logs[0], logs[1]]);
    assert!(verified.status.success(), "{}", text(&verified));

    let traced = tollgate(&["trace", &run_id, logs[0], logs[1]]);
    let story = text(&traced);
    assert!(traced.status.success(), "{story}");
    let order = [
        "receipt minted by tollgate-authority for operator admin",
        "start refused (already_used)",
        "torn down: exited",
    ];
    let admitted = story.find("admitted by the supervisor").expect("admitted");
    let created = story
        .find("sandbox running (cgroup ")
        .expect("sandbox created");
    let positions: Vec<usize> = order
        .iter()
        .map(|step| {
            story
                .find(step)
                .unwrap_or_else(|| panic!("{step:?} missing:\n{story}"))
        })
        .collect();
    assert!(positions[0] < admitted && admitted < created, "{story}");
    assert!(created < positions[2], "{story}");
    assert!(positions[1] > admitted, "{story}");
    assert!(story.contains("teardown recorded"), "{story}");
    // Times are dates a reader can read, not Unix seconds.
    let minted = story
        .lines()
        .find(|line| line.contains("receipt minted by"))
        .unwrap();
    assert!(
        minted.contains("expires 20") && minted.contains('T'),
        "{minted}"
    );
    assert!(!minted.contains("unix"), "{minted}");

    let export = tollgate(&["audit", "export", logs[0], logs[1]]);
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&export.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("NDJSON"))
        .collect();
    assert!(lines
        .iter()
        .any(|e| e["kind"] == "run_admitted" && e["run_id"] == run_id.as_str()));
    assert!(lines
        .iter()
        .all(|e| e["hash"].as_str().is_some_and(|h| h.len() == 64)));

    // One changed byte in the supervisor's log: verify names the entry, trace warns.
    let file = supervisor_log.join("log-000001.jsonl");
    let mut bytes = std::fs::read(&file).unwrap();
    let at = String::from_utf8_lossy(&bytes)
        .find("\"exit_code\":0")
        .unwrap()
        + 12;
    bytes[at] = b'7';
    std::fs::write(&file, bytes).unwrap();
    let broken = tollgate(&["audit", "verify", logs[0], logs[1]]);
    let report = text(&broken);
    assert_eq!(broken.status.code(), Some(1), "{report}");
    assert!(report.contains("authority/audit: intact"), "{report}");
    assert!(report.contains("log-000001.jsonl:"), "{report}");
    assert!(report.contains("hash mismatch"), "{report}");
    let traced = tollgate(&["trace", &run_id, logs[0], logs[1]]);
    assert_eq!(traced.status.code(), Some(1));
    assert!(text(&traced).contains("BROKEN"));
}

#[test]
fn a_keyed_log_needs_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("audit.key");
    std::fs::write(&key, "11".repeat(32)).unwrap();
    let authority = AuthorityProcess::start_with(
        &dir.path().join("authority"),
        &["--audit-key-file", key.to_str().unwrap()],
    )
    .unwrap();
    let log = authority.data_dir().join("audit");
    assert!(authority.stop(Signal::SIGTERM).success());
    let log = log.to_str().unwrap();
    let without = tollgate(&["audit", "verify", log]);
    assert_eq!(without.status.code(), Some(1), "{}", text(&without));
    assert!(text(&without).contains("pass the audit key"));
    let with = tollgate(&["audit", "verify", "--key-file", key.to_str().unwrap(), log]);
    assert!(with.status.success(), "{}", text(&with));
    assert!(text(&with).contains("HMAC-SHA-256"));
}
