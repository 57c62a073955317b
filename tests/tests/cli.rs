//! The `tollgate` CLI against the real authority: mint from a spec, show/verify, revoke,
//! operators, keys, and one-line errors with distinct exit codes.

use std::path::Path;
use std::process::{Command, Output};

use tollgate_tests::{bin_path, stderr_line, AuthorityProcess};

fn tollgate(authority: &AuthorityProcess, token: Option<&Path>, args: &[&str]) -> Output {
    let mut command = Command::new(bin_path("tollgate"));
    command
        .env_remove("TOLLGATE_TOKEN")
        .env_remove("TOLLGATE_TOKEN_FILE")
        .env_remove("TOLLGATE_AUTHORITY_TOKEN_FILE")
        .env_remove("TOLLGATE_SUPERVISOR_TOKEN_FILE")
        .args(["--authority", authority.addr()]);
    if let Some(token) = token {
        command.arg("--token-file").arg(token);
    }
    command.args(args).output().expect("run tollgate")
}

const SPEC: &str = r#"
subject = "summarizer"
ttl = "10m"
audience = ["workstation"]
[agent]
argv = ["/usr/bin/python3", "/work/agent.py"]
[limits]
memory = "256MiB"
cpu = 0.5
[[fs]]
path = "/srv/project"
access = "read"
mount = "/project"
[exec]
allow = ["/usr/bin/python3"]
[[routes]]
name = "local"
max_sensitivity = "high"
"#;

/// `mint --out` into a directory that does not exist (or a file that cannot be made) is
/// refused before the authority is asked: nothing is minted. A spec with a wrong type names
/// its line and key.
#[test]
fn mint_checks_its_output_first_and_spec_errors_name_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let token = authority.data_dir().join("admin.token");
    let spec = dir.path().join("run.toml");
    std::fs::write(&spec, SPEC).unwrap();
    let bad = dir.path().join("missing/x.tgr");
    let minted = tollgate(
        &authority,
        Some(&token),
        &[
            "mint",
            "--spec",
            spec.to_str().unwrap(),
            "--out",
            bad.to_str().unwrap(),
        ],
    );
    assert_eq!(minted.status.code(), Some(73), "{minted:?}");
    assert!(stderr_line(&minted).contains(bad.to_str().unwrap()));
    let listed = tollgate(&authority, Some(&token), &["receipts", "--all", "--json"]);
    assert!(listed.status.success(), "{listed:?}");
    assert_eq!(
        String::from_utf8_lossy(&listed.stdout).trim(),
        "",
        "nothing was minted"
    );
    std::fs::write(
        &spec,
        SPEC.replace(r#"allow = ["/usr/bin/python3"]"#, r#"allow = "x""#),
    )
    .unwrap();
    let minted = tollgate(
        &authority,
        Some(&token),
        &["mint", "--spec", spec.to_str().unwrap()],
    );
    assert_eq!(
        stderr_line(&minted),
        format!(
            "tollgate: error: {}:15: exec.allow: invalid type: string \"x\", expected a sequence",
            spec.display()
        )
    );
}

#[test]
fn mint_show_revoke_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let token = authority.data_dir().join("admin.token");
    let spec = dir.path().join("run.toml");
    std::fs::write(&spec, SPEC).unwrap();
    let out = dir.path().join("receipt.tgr");

    let minted = tollgate(
        &authority,
        Some(&token),
        &[
            "mint",
            "--spec",
            spec.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert!(
        minted.status.success(),
        "{}",
        String::from_utf8_lossy(&minted.stderr)
    );
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.starts_with("tgr1."));
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        std::fs::metadata(&out).unwrap().permissions().mode() & 0o777,
        0o600
    );

    let shown = tollgate(
        &authority,
        None,
        &[
            "receipt",
            "show",
            out.to_str().unwrap(),
            "--json",
            "--audience",
            "workstation",
        ],
    );
    assert!(
        shown.status.success(),
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(json["valid"], true);
    assert_eq!(json["receipt"]["subject"], "summarizer");
    assert_eq!(json["receipt"]["limits"]["memory_bytes"], 256 << 20);
    assert_eq!(json["receipt"]["limits"]["cpu_millicores"], 500);
    assert_eq!(json["receipt"]["fs"][0]["mount"], "/project");
    let receipt_id = json["receipt"]["receipt_id"].as_str().unwrap().to_owned();

    let human = tollgate(
        &authority,
        None,
        &["receipt", "show", out.to_str().unwrap()],
    );
    let human_text = String::from_utf8_lossy(&human.stdout);
    assert!(human_text.starts_with("status     valid"), "{human_text}");
    assert!(
        human_text.contains("read  /srv/project -> /project"),
        "{human_text}"
    );

    let wrong = tollgate(
        &authority,
        None,
        &[
            "receipt",
            "show",
            out.to_str().unwrap(),
            "--json",
            "--audience",
            "laptop",
        ],
    );
    assert_eq!(wrong.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_slice(&wrong.stdout).unwrap();
    assert_eq!(json["failure"], "wrong_audience");

    let revoked = tollgate(
        &authority,
        Some(&token),
        &["revoke", &receipt_id, "--reason", "done"],
    );
    assert!(revoked.status.success());
    assert!(String::from_utf8_lossy(&revoked.stdout).contains("revoked"));
    let after = tollgate(
        &authority,
        None,
        &["receipt", "show", out.to_str().unwrap(), "--json"],
    );
    assert_eq!(after.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_slice(&after.stdout).unwrap();
    assert_eq!(json["failure"], "revoked");

    let listed = tollgate(&authority, Some(&token), &["receipts", "--json"]);
    let line: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(line["state"], "revoked");

    // Tampered text: one line, exit 1.
    let tampered = dir.path().join("tampered.tgr");
    let mut bytes = text.trim().as_bytes().to_vec();
    let middle = bytes.len() / 2;
    bytes[middle] = if bytes[middle] == b'A' { b'B' } else { b'A' };
    std::fs::write(&tampered, bytes).unwrap();
    let bad = tollgate(
        &authority,
        None,
        &["receipt", "show", tampered.to_str().unwrap()],
    );
    assert_eq!(bad.status.code(), Some(1));
    assert!(stderr_line(&bad).starts_with("tollgate: error: receipt is not valid"));
}

#[test]
fn operators_keys_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let admin = authority.data_dir().join("admin.token");
    let ceiling = dir.path().join("ceiling.toml");
    std::fs::write(
        &ceiling,
        "max_ttl = '5m'\naudience = ['workstation']\nexec = ['/usr/bin/']\n[[fs]]\npath = '/srv'\naccess = 'read'\n[[routes]]\nname = 'local'\nmax_sensitivity = 'high'\n",
    )
    .unwrap();
    let carol_token = dir.path().join("carol.token");
    let added = tollgate(
        &authority,
        Some(&admin),
        &[
            "operator",
            "add",
            "carol",
            "--ceiling",
            ceiling.to_str().unwrap(),
            "--token-out",
            carol_token.to_str().unwrap(),
        ],
    );
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    let listed = tollgate(&authority, Some(&admin), &["operator", "list", "--json"]);
    let names: Vec<String> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["name"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(names, ["admin", "carol"]);

    // Above carol's ceiling (ttl 10m > 5m): PERMISSION_DENIED named, exit 77.
    let spec = dir.path().join("run.toml");
    std::fs::write(&spec, SPEC).unwrap();
    let denied = tollgate(
        &authority,
        Some(&carol_token),
        &["mint", "--spec", spec.to_str().unwrap()],
    );
    assert_eq!(denied.status.code(), Some(77));
    let line = stderr_line(&denied);
    assert!(
        line.contains("permission denied") && line.contains("ttl_seconds = 600"),
        "{line}"
    );

    // --dry-run: every violation at once, nothing minted.
    let wide = dir.path().join("wide.toml");
    std::fs::write(
        &wide,
        "subject = 'x'\nttl = '10m'\naudience = ['workstation']\n[agent]\nargv = ['/usr/local/bin/tool']\n[[fs]]\npath = '/etc'\naccess = 'read'\n[exec]\nallow = ['/usr/local/bin/tool']\n",
    )
    .unwrap();
    let dry = tollgate(
        &authority,
        Some(&carol_token),
        &[
            "mint",
            "--spec",
            wide.to_str().unwrap(),
            "--dry-run",
            "--json",
        ],
    );
    assert_eq!(dry.status.code(), Some(77), "{dry:?}");
    let checked: serde_json::Value = serde_json::from_slice(&dry.stdout).unwrap();
    let violations: Vec<&str> = checked["violations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        violations,
        [
            "ttl_seconds = 600 (ceiling 300)",
            "fs[0] = /etc (read)",
            "exec[0] = /usr/local/bin/tool"
        ],
        "{checked}"
    );
    let fitting = dir.path().join("fitting.toml");
    std::fs::write(
        &fitting,
        "subject = 'x'\nttl = '1m'\naudience = ['workstation']\n[agent]\nargv = ['/usr/bin/true']\n[exec]\nallow = ['/usr/bin/true']\n",
    )
    .unwrap();
    let dry = tollgate(
        &authority,
        Some(&carol_token),
        &["mint", "--spec", fitting.to_str().unwrap(), "--dry-run"],
    );
    assert!(dry.status.success(), "{dry:?}");
    assert!(String::from_utf8_lossy(&dry.stdout).contains("within your ceiling"));
    let receipts = tollgate(&authority, Some(&carol_token), &["receipts", "--json"]);
    assert!(receipts.stdout.is_empty(), "a dry run minted: {receipts:?}");

    // No token, bad token, bad spec, unreachable authority.
    let no_token = tollgate(
        &authority,
        None,
        &["mint", "--spec", spec.to_str().unwrap()],
    );
    assert_eq!(no_token.status.code(), Some(77));
    assert!(stderr_line(&no_token).contains("--token-file"));
    let junk = dir.path().join("junk.token");
    std::fs::write(&junk, "tgt_junk\n").unwrap();
    let bad_token = tollgate(
        &authority,
        Some(&junk),
        &["mint", "--spec", spec.to_str().unwrap()],
    );
    assert_eq!(bad_token.status.code(), Some(77));
    assert!(stderr_line(&bad_token).contains("unauthenticated"));
    let bad_spec = dir.path().join("bad.toml");
    std::fs::write(
        &bad_spec,
        "subject = 'x'\nttl = 'forever'\naudience = ['w']\n",
    )
    .unwrap();
    let invalid = tollgate(
        &authority,
        Some(&admin),
        &["mint", "--spec", bad_spec.to_str().unwrap()],
    );
    assert_eq!(invalid.status.code(), Some(66));
    assert!(stderr_line(&invalid).contains("ttl:"));
    let unreachable = Command::new(bin_path("tollgate"))
        .args(["--authority", "127.0.0.1:1", "keys"])
        .output()
        .unwrap();
    assert_eq!(unreachable.status.code(), Some(69));
    assert!(stderr_line(&unreachable).contains("cannot reach the authority"));

    // Keys: list, rotate, list again.
    let before: serde_json::Value =
        serde_json::from_slice(&tollgate(&authority, None, &["keys", "--json"]).stdout).unwrap();
    assert_eq!(before["keys"].as_array().unwrap().len(), 1);
    let minted = tollgate(
        &authority,
        Some(&admin),
        &["mint", "--spec", spec.to_str().unwrap()],
    );
    assert!(minted.status.success());
    let rotated = tollgate(&authority, Some(&admin), &["keys", "rotate"]);
    assert!(
        rotated.status.success(),
        "{}",
        String::from_utf8_lossy(&rotated.stderr)
    );
    let after: serde_json::Value =
        serde_json::from_slice(&tollgate(&authority, None, &["keys", "--json"]).stdout).unwrap();
    assert_eq!(
        after["keys"].as_array().unwrap().len(),
        2,
        "the retired key still verifies its receipts"
    );
    let not_admin = tollgate(&authority, Some(&carol_token), &["keys", "rotate"]);
    assert_eq!(not_admin.status.code(), Some(77));
}

#[test]
fn quickstart_runs_end_to_end() {
    let output = Command::new(bin_path("tollgate"))
        .arg("quickstart")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("refused: bad signature"), "{stdout}");
    assert!(stdout.contains("has been revoked"), "{stdout}");
    assert!(stdout.contains("temporary directory removed"), "{stdout}");
    if nix::unistd::geteuid().is_root() {
        for line in [
            "agent: running as uid 1000 on host tollgate",
            "agent: my project says: hello from the host",
            "agent: wrote /work/summary.txt",
            "agent: refused: reading /etc/shadow",
            "agent: refused: writing /project (the grant is read-only)",
            "agent: refused: /root is not in the sandbox",
            "agent: wrote agent-notes.txt through the gateway (checked, audited, snapshotted)",
            "agent: refused by the gateway: /etc/hostname is outside every grant",
            "gateway call fs.write ",
            "gateway call fs.read /etc/hostname: deny (no fs grant covers /etc/hostname",
            "no process, cgroup or directory of the run is left",
            "tollgate-supervisor exited (exit status: 0)",
            "The audit trail",
            "authority/audit: intact",
            "supervisor/audit: intact",
            "for operator admin (subject quickstart-agent",
            "admitted by the supervisor",
            "sandbox running (cgroup ",
            "torn down: exited",
            "teardown recorded",
        ] {
            assert!(stdout.contains(line), "missing {line:?} in:\n{stdout}");
        }
        assert!(!stdout.contains("unexpected"), "{stdout}");
    }
}

#[test]
fn secrets_written_over_existing_files_become_private() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let admin = authority.data_dir().join("admin.token");
    let spec = dir.path().join("run.toml");
    std::fs::write(&spec, SPEC).unwrap();
    let out = dir.path().join("receipt.tgr");
    let token_out = dir.path().join("op.token");
    let ceiling = dir.path().join("ceiling.toml");
    std::fs::write(&ceiling, "max_ttl = '5m'\n").unwrap();
    for file in [&out, &token_out] {
        std::fs::write(file, "old").unwrap();
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    assert!(tollgate(
        &authority,
        Some(&admin),
        &[
            "mint",
            "--spec",
            spec.to_str().unwrap(),
            "--out",
            out.to_str().unwrap()
        ]
    )
    .status
    .success());
    assert!(tollgate(
        &authority,
        Some(&admin),
        &[
            "operator",
            "add",
            "erin",
            "--ceiling",
            ceiling.to_str().unwrap(),
            "--token-out",
            token_out.to_str().unwrap()
        ]
    )
    .status
    .success());
    for file in [&out, &token_out] {
        let mode = std::fs::metadata(file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", file.display());
    }
}

#[test]
fn classify_names_detectors_and_spans_never_the_text() {
    let secret = "ghp_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8";
    let output = Command::new(bin_path("tollgate"))
        .args(["classify", &format!("deploy with token {secret} today")])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(stdout.starts_with("sensitivity: high"), "{stdout}");
    assert!(
        stdout.contains("GitHub token (github_token, high) at bytes 18..58"),
        "{stdout}"
    );
    assert!(
        !stdout.contains(secret),
        "the matched text is never printed"
    );

    let mut child = Command::new(bin_path("tollgate"))
        .args(["classify", "--json", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"call me at +44 20 7946 0958, nothing else")
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["sensitivity"], "high", "{json}");
    assert_eq!(json["reasons"][0]["detector"], "phone", "{json}");

    let plain = Command::new(bin_path("tollgate"))
        .args(["classify", "the build passed on the second try"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&plain.stdout), "sensitivity: low\n");
}

#[test]
fn completions_cover_every_shell_and_command() {
    for shell in ["bash", "zsh", "fish"] {
        let output = Command::new(bin_path("tollgate"))
            .args(["completions", shell])
            .output()
            .unwrap();
        let script = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{shell}: {output:?}");
        for command in ["mint", "watch", "restore", "audit", "classify"] {
            assert!(script.contains(command), "{shell} misses {command}");
        }
    }
    let bad = Command::new(bin_path("tollgate"))
        .args(["completions", "cmd.exe"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
}

/// Output cut short by its reader (`tollgate completions bash | head`) ends the CLI quietly,
/// as any Unix filter: no panic, no error line, SIGPIPE's own status.
#[test]
fn a_closed_pipe_ends_the_cli_quietly() {
    use std::io::Read as _;
    use std::os::unix::process::ExitStatusExt as _;
    let mut child = Command::new(bin_path("tollgate"))
        .args(["completions", "bash"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The script is larger than a pipe's buffer, so the CLI is still writing when its reader
    // goes away.
    let mut start = [0u8; 16];
    child.stdout.take().unwrap().read_exact(&mut start).unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.is_empty(), "{stderr}");
    assert!(
        output.status.success() || output.status.signal() == Some(13),
        "{:?}",
        output.status
    );
}

/// `tollgate doctor` on this host: every check named with a verdict, ready as root; a data
/// directory others can enter, or no shim to probe with, fails with the fix, exit 1.
#[test]
fn doctor_checks_this_host_and_names_each_fix() {
    use std::os::unix::fs::PermissionsExt as _;
    if !tollgate_tests::require_root() {
        return;
    }
    let doctor = |args: &[&str]| {
        Command::new(bin_path("tollgate"))
            .args(["doctor", "--json"])
            .args(args)
            .output()
            .unwrap()
    };
    let output = doctor(&[]);
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let names: Vec<&str> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["check"].as_str().unwrap())
        .collect();
    for name in [
        "root",
        "user namespaces",
        "landlock",
        "seccomp",
        "cgroups",
        "memfd_noexec",
        "host ids",
        "authority",
    ] {
        assert!(names.contains(&name), "{name} not checked: {report}");
    }
    assert_eq!(report["ready"], true, "{report}");
    assert!(output.status.success(), "{output:?}");
    // The pure cgroup v2 lane (scripts/cgroup-v2-lane) says which layout doctor must see.
    if std::env::var("TOLLGATE_EXPECT_CGROUP_MODE").as_deref() == Ok("unified") {
        let cgroups = report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["check"] == "cgroups")
            .unwrap();
        assert_eq!(cgroups["verdict"], "ok", "{cgroups}");
        assert!(
            cgroups["seen"]
                .as_str()
                .unwrap()
                .starts_with("unified (v2)"),
            "{cgroups}"
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    let output = doctor(&[
        "--data-dir",
        open.to_str().unwrap(),
        "--shim",
        "/nonexistent/tollgate-shim",
    ]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["ready"], false);
    let check = |name: &str| {
        report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["check"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(check("data dir")["verdict"], "fail");
    assert!(check("data dir")["fix"]
        .as_str()
        .unwrap()
        .starts_with("chmod 700"));
    assert_eq!(check("landlock")["verdict"], "fail");
}

/// `tollgate doctor` looks for live supervisors where they register: `--run-dir` or
/// `TOLLGATE_RUN_DIR`, as the supervisor does. A range a live supervisor holds fails (that
/// supervisor would be refused); the one the supervisor of `--data-dir` holds is its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_sees_a_live_supervisors_host_ids_in_its_run_dir() {
    if !tollgate_tests::require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let run_dir = dir.path().join("run");
    let supervisor = tollgate_tests::SupervisorProcess::start_with_flags(
        &dir.path().join("supervisor"),
        authority.addr(),
        "doctor-run-dir",
        203_900,
        vec!["--run-dir".into(), run_dir.display().to_string()],
    );
    let doctor = |by_environment: bool, args: &[&str]| {
        let mut command = Command::new(bin_path("tollgate"));
        command
            .env_remove("TOLLGATE_RUN_DIR")
            .args(["doctor", "--json", "--host-id-base", "203900"])
            .args(["--host-id-count", "64"])
            .args(args);
        if by_environment {
            command.env("TOLLGATE_RUN_DIR", &run_dir);
        } else {
            command.arg("--run-dir").arg(&run_dir);
        }
        let output = command.output().unwrap();
        let report: serde_json::Value =
            serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}: {output:?}"));
        let check = report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["check"] == "host ids")
            .unwrap()
            .clone();
        (output, check)
    };
    for by_environment in [false, true] {
        let (output, check) = doctor(by_environment, &[]);
        assert_eq!(
            check["verdict"], "fail",
            "environment {by_environment}: {check}"
        );
        let seen = check["seen"].as_str().unwrap();
        assert!(
            seen.contains("supervisor workstation") && seen.contains("203900..203964"),
            "{check}"
        );
        assert_eq!(output.status.code(), Some(1), "{output:?}");
    }
    let data_dir = supervisor.data_dir().display().to_string();
    let (_, check) = doctor(false, &["--data-dir", &data_dir]);
    assert_eq!(check["verdict"], "ok", "{check}");
    assert!(
        check["seen"]
            .as_str()
            .unwrap()
            .contains("held by the supervisor of --data-dir itself: supervisor workstation"),
        "{check}"
    );
}

/// `tollgate classify --explain-policy` lists every detector with its level and what it finds;
/// a routes file's `[policy.levels]` changes a level (here: emails medium), and an unknown
/// detector there is refused, naming it.
#[test]
fn classify_follows_the_routes_files_policy() {
    let explained = Command::new(bin_path("tollgate"))
        .args(["classify", "--explain-policy", "--json"])
        .output()
        .unwrap();
    assert!(explained.status.success(), "{explained:?}");
    let policy: serde_json::Value = serde_json::from_slice(&explained.stdout).unwrap();
    let level = |id: &str| {
        policy["detectors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["detector"] == id)
            .map(|d| d["level"].as_str().unwrap().to_owned())
    };
    assert_eq!(level("email").as_deref(), Some("high"));
    assert_eq!(level("internal_hostname").as_deref(), Some("medium"));

    let dir = tempfile::tempdir().unwrap();
    let routes = dir.path().join("routes.toml");
    std::fs::write(&routes, "[policy.levels]\nemail = \"medium\"\n").unwrap();
    let classified = Command::new(bin_path("tollgate"))
        .args(["classify", "--json", "--routes"])
        .arg(&routes)
        .arg("write to jane.doe@acme-corp.io")
        .output()
        .unwrap();
    let found: serde_json::Value = serde_json::from_slice(&classified.stdout).unwrap();
    assert_eq!(found["sensitivity"], "medium", "{found}");
    assert_eq!(found["reasons"][0]["what"], "email address", "{found}");

    std::fs::write(&routes, "[policy.levels]\nemails = \"medium\"\n").unwrap();
    let refused = Command::new(bin_path("tollgate"))
        .args(["classify", "--routes"])
        .arg(&routes)
        .arg("x")
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("\"emails\""));
}
