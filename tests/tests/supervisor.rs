//! The real supervisor daemon with the real authority (root): `tollgate run` streams output
//! and passes the exit code on; revocation at the authority reaches a live run; refusals;
//! SIGTERM and SIGKILL leave nothing behind.

use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tollgate_proto::v1 as pb;
use tollgate_tests::{
    authed, bin_path, leftovers, require_root, AuthorityProcess, SupervisorProcess,
};
use tonic::Code;

fn spec(script: &str, ttl: u64) -> pb::MintReceiptRequest {
    pb::MintReceiptRequest {
        subject: "agent".into(),
        ttl_seconds: ttl,
        audience: vec!["workstation".into()],
        agent: Some(pb::AgentSpec {
            argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
            ..Default::default()
        }),
        exec: vec![
            "/bin/sh".into(),
            "/usr/bin/sleep".into(),
            "/usr/bin/cat".into(),
        ],
        ..Default::default()
    }
}

async fn mint(authority: &AuthorityProcess, request: pb::MintReceiptRequest) -> (String, String) {
    let minted = authority
        .client()
        .await
        .mint_receipt(authed(&authority.admin_token(), request))
        .await
        .unwrap()
        .into_inner();
    (minted.text, minted.receipt.unwrap().receipt_id)
}

async fn wait_state(supervisor: &SupervisorProcess, run_id: &str, want: pb::RunState) -> pb::Run {
    let mut client = supervisor.client().await;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let run = client
            .get_run(authed(
                &supervisor.token(),
                pb::GetRunRequest {
                    run_id: run_id.into(),
                },
            ))
            .await
            .unwrap()
            .into_inner();
        if run.state == want as i32 {
            return run;
        }
        assert!(
            Instant::now() < deadline,
            "run stuck in state {}",
            run.state
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tollgate_run_streams_output_and_exits_with_the_agents_code() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let supervisor = SupervisorProcess::start(
        &dir.path().join("supervisor"),
        authority.addr(),
        "cli",
        202_000,
    );
    let (text, run_id) = mint(&authority, spec("echo out; echo err >&2; exit 9", 60)).await;
    let receipt = dir.path().join("r.tgr");
    std::fs::write(&receipt, &text).unwrap();
    let tollgate = |args: &[&str]| {
        Command::new(bin_path("tollgate"))
            .args(["--supervisor", supervisor.addr()])
            .arg("--token-file")
            .arg(supervisor.token_file())
            .args(args)
            .output()
            .unwrap()
    };
    let output = tollgate(&["run", "--receipt", receipt.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(9), "{output:?}");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "out\n");
    assert_eq!(String::from_utf8_lossy(&output.stderr), "err\n");

    // The same receipt again: refused, 125, one line naming why.
    let again = tollgate(&["run", "--receipt", receipt.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(125));
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(
        stderr.contains("already been used") && stderr.lines().count() == 1,
        "{stderr}"
    );

    // `receipt show` asks the supervisor too: a spent receipt is never shown as startable.
    let shown = tollgate(&[
        "--authority",
        authority.addr(),
        "receipt",
        "show",
        receipt.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&shown.stdout);
    assert!(
        stdout.contains(&format!("SPENT: it started run {run_id} (exited)")),
        "{shown:?}"
    );
    let (fresh, _) = mint(&authority, spec("exit 0", 60)).await;
    let fresh_file = dir.path().join("fresh.tgr");
    std::fs::write(&fresh_file, &fresh).unwrap();
    let shown = tollgate(&[
        "--authority",
        authority.addr(),
        "receipt",
        "show",
        fresh_file.to_str().unwrap(),
        "--json",
    ]);
    let json: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(json["valid"], true, "{json}");
    assert_eq!(json["use_checked"], true, "{json}");
    assert!(json["spent"].is_null(), "{json}");

    // `watch` of an ended run shows its end at once, with the agent's exit code.
    let watched = tollgate(&["watch", &run_id, "--json"]);
    assert_eq!(watched.status.code(), Some(9), "{watched:?}");
    let last: serde_json::Value = serde_json::from_str(
        String::from_utf8_lossy(&watched.stdout)
            .lines()
            .last()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(last["event"], "ended");
    assert_eq!(last["run"]["report"]["exit_code"], 9);
    // A live run: its output as it comes, then its end.
    let (live_text, live_id) = mint(&authority, spec("echo first; sleep 1; echo second", 60)).await;
    supervisor
        .client()
        .await
        .start_run(authed(
            &supervisor.token(),
            pb::StartRunRequest {
                receipt: live_text,
                argv: vec![],
                ..Default::default()
            },
        ))
        .await
        .unwrap();
    let followed = tollgate(&["watch", &live_id]);
    assert!(followed.status.success(), "{followed:?}");
    assert_eq!(String::from_utf8_lossy(&followed.stdout), "first\nsecond\n");

    let inspected = tollgate(&["inspect", &run_id, "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&inspected.stdout).unwrap();
    assert_eq!(json["state"], "exited");
    assert_eq!(json["report"]["exit_code"], 9);
    assert!(json["report"]["cleanup_errors"]
        .as_array()
        .unwrap()
        .is_empty());
    assert!(leftovers(supervisor.data_dir(), &supervisor.cgroup_parent).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_receipts_start_nothing() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let supervisor = SupervisorProcess::start(
        &dir.path().join("supervisor"),
        authority.addr(),
        "refused",
        202_100,
    );
    let token = supervisor.token();
    let mut client = supervisor.client().await;
    let start = |receipt: String| pb::StartRunRequest {
        receipt,
        ..Default::default()
    };

    let status = client
        .start_run(start("tgr1.garbage".into()))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
    let status = client
        .start_run(authed(&token, start("tgr1.garbage".into())))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");

    let mut wrong = spec("exit 0", 60);
    wrong.audience = vec!["laptop".into()];
    let (text, _) = mint(&authority, wrong).await;
    let status = client
        .start_run(authed(&token, start(text)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert!(
        status.message().contains("wrong_audience"),
        "{}",
        status.message()
    );

    let (text, id) = mint(&authority, spec("exit 0", 60)).await;
    let seq = authority
        .client()
        .await
        .revoke_receipt(authed(
            &authority.admin_token(),
            pb::RevokeReceiptRequest {
                receipt_id: id,
                reason: "no".into(),
            },
        ))
        .await
        .unwrap()
        .into_inner()
        .revocation
        .unwrap()
        .seq;
    // Wait until the supervisor has received it through the revocation stream (without
    // spending the receipt on a probe).
    let deadline = Instant::now() + Duration::from_secs(10);
    while client
        .get_supervisor_info(pb::GetSupervisorInfoRequest {})
        .await
        .unwrap()
        .into_inner()
        .last_revocation_seq
        < seq
    {
        assert!(Instant::now() < deadline, "revocation never arrived");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let status = client
        .start_run(authed(&token, start(text)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert!(status.message().contains("revoked"), "{}", status.message());
    let runs = client
        .list_runs(authed(&token, pb::ListRunsRequest::default()))
        .await
        .unwrap()
        .into_inner();
    assert!(runs.runs.is_empty(), "{runs:?}");
    assert!(leftovers(supervisor.data_dir(), &supervisor.cgroup_parent).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocation_stop_shutdown_and_crash_leave_nothing() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let supervisor = SupervisorProcess::start(
        &dir.path().join("supervisor"),
        authority.addr(),
        "teardown",
        202_200,
    );
    let long = "sleep 3131 & sleep 3131 & wait";
    let start = |text: String| pb::StartRunRequest {
        receipt: text,
        argv: vec![],
        ..Default::default()
    };
    let mut client = supervisor.client().await;
    let token = supervisor.token();

    // Revoked at the authority while running.
    let (text, id) = mint(&authority, spec(long, 120)).await;
    client.start_run(authed(&token, start(text))).await.unwrap();
    authority
        .client()
        .await
        .revoke_receipt(authed(
            &authority.admin_token(),
            pb::RevokeReceiptRequest {
                receipt_id: id.clone(),
                reason: "token leaked".into(),
            },
        ))
        .await
        .unwrap();
    let revoked = wait_state(&supervisor, &id, pb::RunState::Revoked).await;
    // The reason given at revocation is the run's (ps, inspect, audit).
    assert_eq!(
        revoked.report.unwrap().reason,
        "the receipt was revoked: token leaked"
    );

    // Stopped by an operator.
    let (text, id) = mint(&authority, spec(long, 120)).await;
    client.start_run(authed(&token, start(text))).await.unwrap();
    let stopped = client
        .stop_run(authed(
            &token,
            pb::StopRunRequest {
                run_id: id.clone(),
                reason: "enough".into(),
            },
        ))
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap();
    assert_eq!(stopped.state, pb::RunState::Stopped as i32);
    assert_eq!(stopped.report.unwrap().reason, "enough");
    assert!(leftovers(supervisor.data_dir(), &supervisor.cgroup_parent).is_empty());

    // SIGKILL of the supervisor: the sandbox dies with it; the restart marks the run lost
    // and sweeps its cgroup and directory.
    let (text, crashed) = mint(&authority, spec(long, 120)).await;
    client.start_run(authed(&token, start(text))).await.unwrap();
    wait_state(&supervisor, &crashed, pb::RunState::Running).await;
    // `tollgate ps`'s listing: the live runs only; without `live_only`, every run.
    for live_only in [true, false] {
        let listed: Vec<String> = client
            .list_runs(authed(&token, pb::ListRunsRequest { live_only }))
            .await
            .unwrap()
            .into_inner()
            .runs
            .into_iter()
            .map(|run| run.run_id)
            .collect();
        match live_only {
            true => assert_eq!(listed, std::slice::from_ref(&crashed)),
            false => assert!(
                listed.len() == 3 && listed[0] == crashed && listed.contains(&id),
                "{listed:?}"
            ),
        }
    }
    drop(client);
    let supervisor = supervisor.restart(Signal::SIGKILL);
    let sleepers = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("cmdline")).ok())
        .filter(|cmd| cmd.starts_with("sleep\u{0}3131"))
        .count();
    assert_eq!(sleepers, 0, "sandbox processes outlived the supervisor");
    let run = wait_state(&supervisor, &crashed, pb::RunState::Lost).await;
    assert!(run.report.unwrap().reason.contains("swept at restart"));
    assert!(leftovers(supervisor.data_dir(), &supervisor.cgroup_parent).is_empty());

    // SIGTERM with a live run: torn down as supervisor_shutdown before the daemon exits.
    let mut client = supervisor.client().await;
    let token = supervisor.token();
    let (text, last) = mint(&authority, spec(long, 120)).await;
    client.start_run(authed(&token, start(text))).await.unwrap();
    drop(client);
    let (data_dir, parent) = (
        supervisor.data_dir().to_owned(),
        supervisor.cgroup_parent.clone(),
    );
    let supervisor = supervisor.restart(Signal::SIGTERM);
    let run = wait_state(&supervisor, &last, pb::RunState::SupervisorShutdown).await;
    assert!(run.report.unwrap().cleanup_errors.is_empty());
    assert!(leftovers(&data_dir, &parent).is_empty());
}

/// Runs a second `tollgate-supervisor` beside `first`, on its own data directory, with these
/// extra flags; its exit status and stderr (it must not start).
fn second_supervisor(dir: &std::path::Path, authority: &str, flags: &[&str]) -> (i32, String) {
    let data = dir.join("second");
    tollgate_tests::private_dir(&data);
    let mut child = Command::new(bin_path("tollgate-supervisor"))
        .arg("--data-dir")
        .arg(&data)
        .args(["--id", "second", "--listen", "127.0.0.1:0"])
        .args(["--authority", authority, "--clock-skew", "0"])
        .args(flags)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // One that wrongly starts would serve forever: it gets 20 s to refuse.
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the second supervisor started beside the first");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = child.wait_with_output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Two supervisors on one host never share a cgroup parent (a supervisor sweeps its own at
/// start) or host ids (its sandboxes' uids): the second is refused in one line naming the
/// first, and the first's live run is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_supervisor_is_refused_the_first_ones_cgroup_parent_and_host_ids() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let first = SupervisorProcess::start(
        &dir.path().join("supervisor"),
        authority.addr(),
        "claimed",
        202_300,
    );
    let mut client = first.client().await;
    let (text, id) = mint(&authority, spec("sleep 3232", 120)).await;
    client
        .start_run(authed(
            &first.token(),
            pb::StartRunRequest {
                receipt: text,
                argv: vec![],
                ..Default::default()
            },
        ))
        .await
        .unwrap();
    wait_state(&first, &id, pb::RunState::Running).await;

    let (code, stderr) = second_supervisor(
        dir.path(),
        authority.addr(),
        &[
            "--cgroup-parent",
            &first.cgroup_parent,
            "--host-id-base",
            "202400",
            "--host-id-count",
            "64",
        ],
    );
    assert_eq!(code, 75, "{stderr}");
    assert!(
        stderr.contains(&format!("cgroup parent {} is in use", first.cgroup_parent))
            && stderr.contains(&first.data_dir().display().to_string()),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");

    let other_parent = format!("{}-other", first.cgroup_parent);
    let (code, stderr) = second_supervisor(
        dir.path(),
        authority.addr(),
        &[
            "--cgroup-parent",
            &other_parent,
            "--host-id-base",
            "202330",
            "--host-id-count",
            "64",
        ],
    );
    assert_eq!(code, 75, "{stderr}");
    assert!(
        stderr.contains("host ids 202330..202394 overlap 202300..202364"),
        "{stderr}"
    );
    let _ = tollgate_supervisor::cgroup::sweep(&other_parent, true);

    // Untouched: still running, and stoppable as usual.
    let run = wait_state(&first, &id, pb::RunState::Running).await;
    assert_eq!(run.run_id, id);
    let stopped = client
        .stop_run(authed(
            &first.token(),
            pb::StopRunRequest {
                run_id: id.clone(),
                reason: "done".into(),
            },
        ))
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap();
    assert_eq!(stopped.state, pb::RunState::Stopped as i32);
    assert!(leftovers(first.data_dir(), &first.cgroup_parent).is_empty());
}

/// After `keys rotate`, a receipt signed by the new key starts at once on a supervisor that
/// follows the authority (here named by its `authority.addr` readiness file) (the key-set change is announced on its revocation stream, and an
/// unknown key makes it fetch the key set before refusing); one minted before the rotation
/// still starts too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receipt_of_a_rotated_in_key_starts_within_a_second() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    // Given the authority's readiness file, as every client may be.
    let readiness = dir.path().join("authority/authority.addr");
    let supervisor = SupervisorProcess::start(
        &dir.path().join("supervisor"),
        &readiness.display().to_string(),
        "rotation",
        202_500,
    );
    let mut client = supervisor.client().await;
    let start = |text: String| {
        authed(
            &supervisor.token(),
            pb::StartRunRequest {
                receipt: text,
                argv: vec![],
                ..Default::default()
            },
        )
    };
    let (before, before_id) = mint(&authority, spec("exit 0", 120)).await;
    let rotated = authority
        .client()
        .await
        .rotate_key(authed(&authority.admin_token(), pb::RotateKeyRequest {}))
        .await
        .unwrap()
        .into_inner();
    let rotated_at = Instant::now();
    let (after, after_id) = mint(&authority, spec("exit 0", 120)).await;
    let started = client.start_run(start(after)).await;
    let took = rotated_at.elapsed();
    assert!(started.is_ok(), "refused after rotation: {started:?}");
    assert!(took < Duration::from_secs(1), "took {took:?}");
    let active = rotated.active.unwrap().key_id;
    let verified = tollgate_receipt::from_text(&mint(&authority, spec("exit 0", 60)).await.0)
        .unwrap()
        .key_id;
    assert_eq!(verified, active, "new receipts are signed by the new key");
    wait_state(&supervisor, &after_id, pb::RunState::Exited).await;
    client.start_run(start(before)).await.unwrap();
    wait_state(&supervisor, &before_id, pb::RunState::Exited).await;
}

/// Supervisor commands take the supervisor's token from `TOLLGATE_SUPERVISOR_TOKEN_FILE`
/// (beside an authority token in `--token-file`), and a missing or wrong token is refused in
/// one line that names the supervisor and where its token is, not the authority's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn supervisor_commands_find_and_name_the_supervisors_token() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let supervisor = SupervisorProcess::start(
        &dir.path().join("supervisor"),
        authority.addr(),
        "tokens",
        202_800,
    );
    let authority_token = dir.path().join("authority.token");
    std::fs::write(&authority_token, authority.admin_token()).unwrap();
    let made_up = dir.path().join("made-up.token");
    std::fs::write(&made_up, "tgt_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA").unwrap();
    let ps = |env: Option<&std::path::Path>, token_file: Option<&std::path::Path>| {
        let mut command = Command::new(bin_path("tollgate"));
        command
            .env_remove("TOLLGATE_TOKEN")
            .env_remove("TOLLGATE_TOKEN_FILE")
            .env_remove("TOLLGATE_AUTHORITY_TOKEN_FILE")
            .env_remove("TOLLGATE_SUPERVISOR_TOKEN_FILE")
            .args(["--supervisor", supervisor.addr(), "ps"]);
        if let Some(file) = env {
            command.env("TOLLGATE_SUPERVISOR_TOKEN_FILE", file);
        }
        if let Some(file) = token_file {
            command.arg("--token-file").arg(file);
        }
        command.output().unwrap()
    };
    let one_line = |output: &std::process::Output| {
        let stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        stderr
    };

    let none = ps(None, None);
    assert_eq!(none.status.code(), Some(77));
    let stderr = one_line(&none);
    assert!(
        stderr.contains("no supervisor token") && stderr.contains("TOLLGATE_SUPERVISOR_TOKEN_FILE"),
        "{stderr}"
    );

    let wrong = ps(None, Some(&made_up));
    assert_eq!(wrong.status.code(), Some(77));
    let stderr = one_line(&wrong);
    assert!(
        stderr.contains("unknown token for this supervisor")
            && stderr.contains("<supervisor data dir>/admin.token")
            && stderr.contains("operator token its authority issued"),
        "{stderr}"
    );
    // The authority's admin is an operator the supervisor asks its authority about: it sees
    // every run.
    let authority_admin = ps(None, Some(&authority_token));
    assert!(authority_admin.status.success(), "{authority_admin:?}");

    // Both tokens set once: the supervisor's variable wins for supervisor commands.
    let both = ps(Some(&supervisor.token_file()), Some(&authority_token));
    assert!(both.status.success(), "{both:?}");

    // Tools find it by reflection, v1 or v1alpha, listing only what it serves.
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", supervisor.addr()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let (v1, v1alpha) = tollgate_tests::reflected_services(channel).await;
    for names in [v1, v1alpha] {
        assert_eq!(
            names,
            [
                "grpc.health.v1.Health",
                "grpc.reflection.v1.ServerReflection",
                "grpc.reflection.v1alpha.ServerReflection",
                "tollgate.v1.Supervisor",
            ]
        );
    }
}

/// SIGHUP reloads the routes file (probing its local routes again) for runs starting from
/// then on; a live run is untouched and the daemon goes on; a file that does not load leaves
/// the routes in use as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_routes_and_leaves_a_live_run_alone() {
    use tollgate_tests::fake_models::{FakeBackend, Script};
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = FakeBackend::start(Script {
        models: vec!["m".into(), "n".into()],
        ..Default::default()
    })
    .await;
    let route = |name: &str, model: &str| {
        format!(
            "[[route]]\nname = \"{name}\"\nkind = \"local\"\npreset = \"vllm\"\nendpoint = \"{}\"\nmodel = \"{model}\"\n",
            server.endpoint
        )
    };
    let routes = dir.path().join("routes.toml");
    std::fs::write(&routes, route("first", "m")).unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let mut supervisor = SupervisorProcess::start_with_flags(
        &dir.path().join("supervisor"),
        authority.addr(),
        "sighup",
        202_900,
        vec!["--routes".into(), routes.display().to_string()],
    );
    let (text, id) = mint(&authority, spec("sleep 3333", 120)).await;
    supervisor.start_run(text).await;
    wait_state(&supervisor, &id, pb::RunState::Running).await;
    let hangup = |supervisor: &SupervisorProcess| {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(supervisor.pid() as i32),
            Signal::SIGHUP,
        )
        .unwrap();
    };
    let wait_log = |supervisor: &SupervisorProcess, needle: &str| {
        let deadline = Instant::now() + Duration::from_secs(15);
        while !supervisor.log().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "no {needle:?}: {}",
                supervisor.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };

    std::fs::write(&routes, route("first", "m") + "\n" + &route("second", "n")).unwrap();
    hangup(&supervisor);
    wait_log(&supervisor, "model routes reloaded");
    assert!(
        supervisor.log().contains("routes=2"),
        "{}",
        supervisor.log()
    );

    // A file that does not load (a model its server does not list): the old routes stay.
    std::fs::write(&routes, route("third", "absent")).unwrap();
    hangup(&supervisor);
    wait_log(&supervisor, "model routes not reloaded");

    assert!(supervisor.is_running(), "a SIGHUP stopped the supervisor");
    let run = wait_state(&supervisor, &id, pb::RunState::Running).await;
    assert_eq!(run.run_id, id);
    supervisor
        .client()
        .await
        .stop_run(authed(
            &supervisor.token(),
            pb::StopRunRequest {
                run_id: id.clone(),
                reason: "done".into(),
            },
        ))
        .await
        .unwrap();
}

/// `--metrics-listen` serves the supervisor's metrics, which the reference OpenMetrics parser
/// reads: starts, teardowns and live runs as they happened, and the revocation stream up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_scraped_and_parsed() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let supervisor = SupervisorProcess::start_with_flags(
        &dir.path().join("supervisor"),
        authority.addr(),
        "metrics",
        203_100,
        vec!["--metrics-listen".into(), "127.0.0.1:0".into()],
    );
    let mut client = supervisor.client().await;
    let (text, id) = mint(&authority, spec("exit 0", 60)).await;
    client
        .start_run(authed(
            &supervisor.token(),
            pb::StartRunRequest {
                receipt: text,
                argv: vec![],
                ..Default::default()
            },
        ))
        .await
        .unwrap();
    wait_state(&supervisor, &id, pb::RunState::Exited).await;

    let samples = tollgate_tests::scrape_metrics(&supervisor.data_dir().join("metrics.addr"));
    let value = |line_start: &str| tollgate_tests::sample(&samples, line_start);
    assert!(value("tollgate_supervisor_run_starts_total [('result', 'started')]") >= 1.0);
    assert!(value("tollgate_supervisor_run_teardowns_total [('state', 'exited')]") >= 1.0);
    assert!(value("tollgate_supervisor_run_start_seconds_count []") >= 1.0);
    assert_eq!(value("tollgate_supervisor_live_runs []"), 0.0);
    // Every started run's sandbox came from one of the two places.
    let taken = value("tollgate_supervisor_sandboxes_taken_total [('source', 'prepared_ahead')]")
        + value("tollgate_supervisor_sandboxes_taken_total [('source', 'prepared_at_start')]");
    assert!(
        taken >= value("tollgate_supervisor_run_starts_total [('result', 'started')]"),
        "{samples}"
    );
    assert_eq!(value("tollgate_supervisor_revocation_stream_up []"), 1.0);
    assert!(value("tollgate_supervisor_key_set_updated_timestamp_seconds []") > 0.0);
    // The run's admission and teardown entries, at least, were appended durably.
    assert!(value("tollgate_supervisor_audit_append_seconds_count []") >= 2.0);
}

/// `--config FILE` sets what no flag gives (here: everything but --listen, which wins over the
/// file's unusable address), its log_level applies anew on SIGHUP; an unknown key is refused
/// in one line, exit 78.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_file_mirrors_the_flags_and_flags_win() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let data = dir.path().join("supervisor");
    let parent = format!("tollgate-test-{}-config", std::process::id());
    let config = dir.path().join("supervisor.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\nid = \"workstation\"\nauthority = {:?}\nlisten = \"256.0.0.1:1\"\n\
             cgroup_parent = {parent:?}\nhost_id_base = 203200\nhost_id_count = 16\n\
             clock_skew = 0\nmetrics_listen = \"127.0.0.1:0\"\nlog_format = \"json\"\n\
             log_level = \"warn\"\n",
            data.display().to_string(),
            authority.addr(),
        ),
    )
    .unwrap();
    tollgate_tests::private_dir(&data);
    let log = dir.path().join("supervisor.stderr");
    let mut child = Command::new(bin_path("tollgate-supervisor"))
        .arg("--config")
        .arg(&config)
        .args(["--listen", "127.0.0.1:0"])
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let ready = tollgate_tests::wait_for_file(
        &data.join("supervisor.addr"),
        &mut child,
        Duration::from_secs(30),
    );
    // log_level = "warn": no info line; after the file says "info" and a SIGHUP, there are.
    let quiet = std::fs::read_to_string(&log).unwrap();
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, text.replace("\"warn\"", "\"info\"")).unwrap();
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, Signal::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(15);
    while !std::fs::read_to_string(&log)
        .unwrap()
        .contains("log level set")
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let stderr = std::fs::read_to_string(&log).unwrap();
    // Looked at while it runs: a clean stop removes its readiness files.
    let metrics_written = data.join("metrics.addr").exists();
    let _ = nix::sys::signal::kill(pid, Signal::SIGTERM);
    let _ = child.wait();
    let _ = tollgate_supervisor::cgroup::sweep(&parent, true);
    let _ = std::fs::remove_file(tollgate_supervisor::daemon::host::registration_path(
        std::path::Path::new(tollgate_supervisor::daemon::host::DEFAULT_RUN_DIR),
        &data,
    ));
    let addr = ready.unwrap_or_else(|why| panic!("{why}: {stderr}"));
    assert!(
        addr.starts_with("127.0.0.1:"),
        "the flag's --listen won: {addr}"
    );
    assert!(metrics_written, "metrics_listen from the file");
    assert!(
        !quiet.contains("supervisor listening"),
        "log_level warn: {quiet}"
    );
    assert!(
        stderr.contains("log level set"),
        "SIGHUP log_level: {stderr}"
    );
    for line in stderr.lines() {
        let _: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("log_format from the file: not JSON ({e}): {line}"));
    }

    std::fs::write(&config, "data_dir = \"/x\"\ncolour = \"red\"\n").unwrap();
    let refused = Command::new(bin_path("tollgate-supervisor"))
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(78), "{refused:?}");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.trim().lines().count() == 1 && stderr.contains("unknown field `colour`"),
        "{stderr}"
    );
}

/// How many processes run `sleep <marker>` (a sandbox's, found from the host).
fn sleepers(marker: &str) -> usize {
    let wanted = format!("sleep\u{0}{marker}\u{0}");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("cmdline")).ok())
        .filter(|cmd| cmd == &wanted)
        .count()
}

/// Live restore: a clean stop with `--live-restore` leaves running sandboxes running. While
/// no supervisor runs, an agent's gateway call waits and a sandbox whose receipt expires is
/// ended by its own pid 1, on time; the next supervisor re-adopts the other (the call is
/// answered, its output and exit code reach the new supervisor) and records the expired one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_restore_re_adopts_a_running_sandbox_and_a_detached_one_expires_on_time() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let supervisor = SupervisorProcess::start_with_flags(
        &dir.path().join("supervisor"),
        authority.addr(),
        "restore",
        203_000,
        vec![
            "--live-restore".into(),
            "--live-restore-window".into(),
            "120".into(),
        ],
    );
    let project = dir.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("readme.txt"), "granted bytes").unwrap();
    let project = project.display().to_string();
    let start = |text: String| pb::StartRunRequest {
        receipt: text,
        argv: vec![],
        ..Default::default()
    };
    let mut client = supervisor.client().await;
    let token = supervisor.token();

    // Re-adopted: waits for a file the test writes while no supervisor runs, then calls the
    // gateway (the call waits for the next supervisor) and exits 7.
    // Then waits for a second restart, prints, and exits 7.
    let script = format!(
        "echo before; while [ ! -e /work/go ]; do sleep 0.05; done; \
         tollgate-shim tool read {project}/readme.txt > /work/called; echo \" rc=$?\" >> /work/called; \
         while [ ! -e /work/go2 ]; do sleep 0.05; done; echo second; exit 7"
    );
    let mut request = spec(&script, 120);
    request.fs.push(pb::FsGrant {
        path: project.clone(),
        access: pb::FsAccess::Read as i32,
        mount: String::new(),
        exec: false,
        ask: false,
        ask_reads: false,
    });
    let (text, kept) = mint(&authority, request).await;
    client.start_run(authed(&token, start(text))).await.unwrap();
    wait_state(&supervisor, &kept, pb::RunState::Running).await;

    // Ends while detached: pid 1 keeps its exit for the next supervisor.
    let (text, finished) = mint(
        &authority,
        spec(
            "while [ ! -e /work/go ]; do sleep 0.05; done; echo bye; exit 3",
            120,
        ),
    )
    .await;
    client.start_run(authed(&token, start(text))).await.unwrap();
    wait_state(&supervisor, &finished, pb::RunState::Running).await;

    // Left detached past its receipt's expiry.
    let ttl = 5;
    let minted = Instant::now();
    let (text, expiring) = mint(&authority, spec("sleep 3141", ttl)).await;
    client.start_run(authed(&token, start(text))).await.unwrap();
    wait_state(&supervisor, &expiring, pb::RunState::Running).await;
    drop(client);

    let runs = supervisor.data_dir().join("runs");
    let supervisor = supervisor.restart_after(Signal::SIGTERM, || {
        assert_eq!(sleepers("3141"), 1, "the stop ended a detached sandbox");
        for run in [&kept, &finished] {
            std::fs::write(runs.join(run).join("work/go"), "").unwrap();
        }
        // pid 1 ends the expiring sandbox at its receipt's expiry (whole seconds: up to one
        // early), not before, and soon after.
        let expiry = minted + Duration::from_secs(ttl);
        while sleepers("3141") == 1 {
            assert!(
                Instant::now() < expiry + Duration::from_secs(3),
                "a detached sandbox outlived its receipt"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let ended = Instant::now();
        assert!(
            ended + Duration::from_millis(1100) >= expiry,
            "ended {:?} before the receipt's expiry",
            expiry - ended
        );
    });

    // The run that ended while detached: its exit and its output, kept by pid 1.
    let run = supervisor
        .wait_ended(&finished, Duration::from_secs(30))
        .await;
    assert_eq!(run.state, pb::RunState::Exited as i32, "{run:?}");
    assert_eq!(run.report.unwrap().exit_code, Some(3));
    let output = supervisor.output(&finished).await;
    assert!(output.contains("bye"), "{output}");
    // The call made while no supervisor ran was answered by this one.
    let called = runs.join(&kept).join("work/called");
    let deadline = Instant::now() + Duration::from_secs(15);
    while std::fs::read_to_string(&called).map_or(true, |text| !text.contains("rc=")) {
        assert!(
            Instant::now() < deadline,
            "the waiting gateway call got no answer"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        std::fs::read_to_string(&called).unwrap(),
        "granted bytes rc=0\n"
    );
    // A re-adopted run is left running again at the next clean stop, and re-adopted again.
    let supervisor = supervisor.restart_after(Signal::SIGTERM, || {
        std::fs::write(runs.join(&kept).join("work/go2"), "").unwrap();
    });
    let run = supervisor.wait_ended(&kept, Duration::from_secs(30)).await;
    assert_eq!(run.state, pb::RunState::Exited as i32, "{run:?}");
    assert_eq!(run.report.unwrap().exit_code, Some(7));
    let output = supervisor.output(&kept).await;
    assert!(output.contains("second"), "{output}");
    let expired = wait_state(&supervisor, &expiring, pb::RunState::Expired).await;
    assert!(
        expired
            .report
            .unwrap()
            .reason
            .contains("its sandbox ended itself"),
        "{}",
        supervisor.log()
    );
    assert!(leftovers(supervisor.data_dir(), &supervisor.cgroup_parent).is_empty());
    // The audit log has both sides: each detach at the stop, each re-adoption at the start.
    let mut audit = String::new();
    for file in std::fs::read_dir(supervisor.data_dir().join("audit")).unwrap() {
        audit.push_str(&std::fs::read_to_string(file.unwrap().path()).unwrap_or_default());
    }
    assert_eq!(audit.matches("\"run_detached\"").count(), 4, "{audit}");
    assert_eq!(audit.matches("\"run_reattached\"").count(), 3, "{audit}");

    // A crash detaches nothing, live restore or not: the sandbox ends with the supervisor.
    let (text, crashed) = mint(&authority, spec("sleep 3142", 120)).await;
    let mut client = supervisor.client().await;
    client
        .start_run(authed(&supervisor.token(), start(text)))
        .await
        .unwrap();
    wait_state(&supervisor, &crashed, pb::RunState::Running).await;
    drop(client);
    let supervisor = supervisor.restart_after(Signal::SIGKILL, || {
        let deadline = Instant::now() + Duration::from_secs(5);
        while sleepers("3142") > 0 {
            assert!(Instant::now() < deadline, "a sandbox outlived a crash");
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    wait_state(&supervisor, &crashed, pb::RunState::Lost).await;
}

/// A supervisor that is refused — its data directory in use, or a setting that does not
/// load — leaves the live one's files alone: `supervisor.addr` (what every client reads)
/// stays, and the live supervisor goes on answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_start_leaves_the_live_supervisors_address_file_alone() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let live = SupervisorProcess::start(
        &dir.path().join("supervisor"),
        authority.addr(),
        "refused-start",
        203_400,
    );
    let addr_file = live.data_dir().join("supervisor.addr");
    let written = std::fs::read_to_string(&addr_file).unwrap();
    let missing_keys = dir.path().join("no-such-keys.json").display().to_string();
    let refusals: [(&[&str], i32); 2] = [
        // The same data directory: refused for the lock.
        (&["--authority", authority.addr()], 75),
        // A key file that does not load: refused as a setting.
        (&["--trust-keys", &missing_keys], 78),
    ];
    for (flags, code) in refusals {
        let refused = Command::new(bin_path("tollgate-supervisor"))
            .arg("--data-dir")
            .arg(live.data_dir())
            .args(["--id", "workstation", "--listen", "127.0.0.1:0"])
            .args(["--cgroup-parent", "tollgate-test-refused-start-second"])
            .args(["--host-id-base", "203500", "--host-id-count", "16"])
            .args(flags)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(code), "{flags:?}: {stderr}");
        assert_eq!(
            std::fs::read_to_string(&addr_file).ok().as_deref(),
            Some(written.as_str()),
            "{flags:?} ({stderr}) touched the live supervisor's address file"
        );
    }
    let _ = tollgate_supervisor::cgroup::sweep("tollgate-test-refused-start-second", true);
    // Still answering at the address clients read.
    let info = live
        .client()
        .await
        .get_supervisor_info(pb::GetSupervisorInfoRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.supervisor_id, "workstation");
}

/// `--delegation-token-file` (or its environment variable) beside `authority` in the config
/// file: the flag needs an authority, and the file gives it — no flag has to repeat a key
/// the file already sets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delegation_token_flag_takes_the_authority_from_the_config_file() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let data = dir.path().join("supervisor");
    let token_file = dir.path().join("delegation.token");
    authority
        .add_supervisor_token_file("workstation", &token_file)
        .await;
    let parent = format!("tollgate-test-{}-delegation-config", std::process::id());
    let config = dir.path().join("supervisor.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\nid = \"workstation\"\nauthority = {:?}\nlisten = \"127.0.0.1:0\"\n\
             cgroup_parent = {parent:?}\nhost_id_base = 203600\nhost_id_count = 16\n\
             clock_skew = 0\n",
            data.display().to_string(),
            authority.addr(),
        ),
    )
    .unwrap();
    tollgate_tests::private_dir(&data);
    for by_environment in [false, true] {
        let log = dir.path().join("supervisor.stderr");
        let mut command = Command::new(bin_path("tollgate-supervisor"));
        command.arg("--config").arg(&config);
        if by_environment {
            command.env("TOLLGATE_DELEGATION_TOKEN_FILE", &token_file);
        } else {
            command.arg("--delegation-token-file").arg(&token_file);
        }
        let mut child = command
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let ready = tollgate_tests::wait_for_file(
            &data.join("supervisor.addr"),
            &mut child,
            Duration::from_secs(30),
        );
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            Signal::SIGTERM,
        );
        let _ = child.wait();
        let _ = tollgate_supervisor::cgroup::sweep(&parent, true);
        let _ = std::fs::remove_file(tollgate_supervisor::daemon::host::registration_path(
            std::path::Path::new(tollgate_supervisor::daemon::host::DEFAULT_RUN_DIR),
            &data,
        ));
        let stderr = std::fs::read_to_string(&log).unwrap();
        ready.unwrap_or_else(|why| panic!("environment {by_environment}: {why}: {stderr}"));
    }
}

/// Runs `tollgate` against `supervisor` with its admin token.
fn tollgate_at(supervisor: &SupervisorProcess) -> Command {
    let mut command = Command::new(bin_path("tollgate"));
    command
        .args(["--supervisor", supervisor.addr()])
        .arg("--token-file")
        .arg(supervisor.token_file());
    command
}

/// Waits (20 s at most) for `child` to exit; its output.
fn exited(mut child: std::process::Child) -> std::process::Output {
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!("tollgate did not exit: {output:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// `tollgate attach` whose stdin ends detaches that attach only: the agent's input stays
/// open for the run and every other attach. `attach --read-only` shows the output and sends
/// nothing, whatever its stdin holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attach_whose_stdin_ends_leaves_the_agents_input_open() {
    use std::io::Write as _;
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let supervisor = SupervisorProcess::start(
        &dir.path().join("supervisor"),
        authority.addr(),
        "attach-eof",
        203_700,
    );
    let script = "while IFS= read -r line; do echo \"got $line\"; done; echo eof; exit 4";
    let (text, run_id) = mint(&authority, spec(script, 120)).await;
    let mut client = supervisor.client().await;
    client
        .start_run(authed(
            &supervisor.token(),
            pb::StartRunRequest {
                receipt: text,
                argv: vec![],
                stdin: true,
                ..Default::default()
            },
        ))
        .await
        .unwrap();
    wait_state(&supervisor, &run_id, pb::RunState::Running).await;

    let detached = exited(
        tollgate_at(&supervisor)
            .args(["attach", &run_id])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    assert_eq!(detached.status.code(), Some(0), "{detached:?}");
    wait_state(&supervisor, &run_id, pb::RunState::Running).await;

    // Read-only: what it reads from stdin goes nowhere.
    let mut watcher = tollgate_at(&supervisor)
        .args(["attach", "--read-only", &run_id])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = watcher.stdin.take().unwrap();
    stdin.write_all(b"nope\n").unwrap();
    drop(stdin);

    // Another client's input still reaches the agent; its end of input ends the agent's.
    let (sender, receiver) = tokio::sync::mpsc::channel(4);
    sender
        .send(pb::AttachRequest {
            run_id: run_id.clone(),
            input: b"hello\n".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap();
    sender
        .send(pb::AttachRequest {
            close_input: true,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut events = client
        .attach(authed(
            &supervisor.token(),
            tokio_stream::wrappers::ReceiverStream::new(receiver),
        ))
        .await
        .unwrap()
        .into_inner();
    let mut printed = String::new();
    while let Some(event) = tokio::time::timeout(Duration::from_secs(20), events.message())
        .await
        .expect("the run's output")
        .unwrap()
    {
        match event.event {
            Some(pb::run_event::Event::Output(chunk)) => {
                printed.push_str(&String::from_utf8_lossy(&chunk.data));
            }
            Some(pb::run_event::Event::Ended(_)) => break,
            None => {}
        }
    }
    drop(sender);
    assert_eq!(printed, "got hello\neof\n");
    let watched = exited(watcher);
    assert_eq!(watched.status.code(), Some(4), "{watched:?}");
    assert_eq!(String::from_utf8_lossy(&watched.stdout), "got hello\neof\n");
    assert!(leftovers(supervisor.data_dir(), &supervisor.cgroup_parent).is_empty());
}

/// `tollgate run` whose supervisor restarts with live restore under it: one line naming the
/// restart and `tollgate watch RUN` (not a TLS hint), exit 69; the run goes on, and `watch`
/// follows it to its end on the new supervisor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tollgate_run_across_a_live_restore_restart_points_at_watch() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let supervisor = SupervisorProcess::start_with_flags(
        &dir.path().join("supervisor"),
        authority.addr(),
        "run-restart",
        203_800,
        vec!["--live-restore".into()],
    );
    let script = "echo before; : > /work/started; while [ ! -e /work/go ]; do sleep 0.05; done; \
                  echo after; exit 5";
    let (text, run_id) = mint(&authority, spec(script, 120)).await;
    let receipt = dir.path().join("r.tgr");
    std::fs::write(&receipt, &text).unwrap();
    let running = tollgate_at(&supervisor)
        .args(["run", "--receipt"])
        .arg(&receipt)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // `tollgate run` starts it; the agent marks its workspace once it runs.
    let started = supervisor
        .data_dir()
        .join("runs")
        .join(&run_id)
        .join("work/started");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !started.exists() {
        assert!(Instant::now() < deadline, "the run never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let supervisor = supervisor.restart(Signal::SIGTERM);
    let cut = exited(running);
    let stderr = String::from_utf8_lossy(&cut.stderr);
    assert_eq!(cut.status.code(), Some(69), "{cut:?}");
    assert!(
        stderr.contains("restarted")
            && stderr.contains(&format!("tollgate watch {run_id}"))
            && !stderr.contains("TLS")
            && stderr.trim().lines().count() == 1,
        "{stderr}"
    );
    std::fs::write(
        supervisor
            .data_dir()
            .join("runs")
            .join(&run_id)
            .join("work/go"),
        "",
    )
    .unwrap();
    let watched = tollgate_at(&supervisor)
        .args(["watch", &run_id])
        .output()
        .unwrap();
    assert_eq!(watched.status.code(), Some(5), "{watched:?}");
    assert!(
        String::from_utf8_lossy(&watched.stdout).contains("after"),
        "{watched:?}"
    );
    assert!(leftovers(supervisor.data_dir(), &supervisor.cgroup_parent).is_empty());
}
