//! `tollgate quickstart`: a guided tour on throwaway daemons.
//!
//! Starts the real `tollgate-authority` and (as root) `tollgate-supervisor` on free ports in a
//! temporary directory; mints, verifies and tampers with a receipt; runs a small sample agent
//! in a sandbox (it reads its granted project, writes its workspace, and is refused what its
//! receipt does not grant); shows the teardown report; revokes; then stops both daemons
//! cleanly and removes the directory.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};
use tokio_stream::StreamExt as _;

use tollgate_proto::v1 as pb;
use tollgate_proto::v1::authority_client::AuthorityClient;
use tonic::transport::Channel;

use super::audit::{trace, Trust};
use super::receipts::{mint_with, verify_with};
use crate::client::{authed, connect, connect_supervisor, read_token};
use crate::error::CliError;
use crate::show;

/// The shipped example run spec (also the one docs/run-spec.md explains).
const SAMPLE_SPEC: &str = include_str!("../../../examples/run.toml");

/// The sample agent: what it may do, and what it may not.
const SAMPLE_AGENT: &str = r#"echo "agent: running as uid $(id -u) on host $(cat /proc/sys/kernel/hostname)"
echo "agent: my project says: $(cat /project/README.txt)"
echo "draft summary" > /work/summary.txt && echo "agent: wrote /work/summary.txt"
if cat /etc/shadow >/dev/null 2>&1; then echo "agent: read /etc/shadow (unexpected!)"; else echo "agent: refused: reading /etc/shadow"; fi
if { echo x > /project/README.txt; } 2>/dev/null; then echo "agent: wrote the project (unexpected!)"; else echo "agent: refused: writing /project (the grant is read-only)"; fi
if ls /root >/dev/null 2>&1; then echo "agent: saw /root (unexpected!)"; else echo "agent: refused: /root is not in the sandbox"; fi
printf 'notes from the agent\n' | tollgate-shim tool write "$NOTES/agent-notes.txt" --create && echo "agent: wrote agent-notes.txt through the gateway (checked, audited, snapshotted)"
if tollgate-shim tool read /etc/hostname >/dev/null 2>&1; then echo "agent: read /etc/hostname through the gateway (unexpected!)"; else echo "agent: refused by the gateway: /etc/hostname is outside every grant"; fi
exit 0"#;

/// Finds a sibling binary of this executable, else one on PATH.
pub(crate) fn find_binary(name: &str) -> Result<PathBuf, CliError> {
    let sibling = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(name)));
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join(name));
    sibling
        .into_iter()
        .chain(on_path)
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            CliError::Other(format!(
                "cannot find {name} next to tollgate or on PATH; build it with `cargo build --release --workspace --bins`"
            ))
        })
}

/// A daemon started for the tour; killed if the tour fails half-way.
struct Daemon {
    name: &'static str,
    child: Child,
    addr: String,
}

async fn start_daemon(
    name: &'static str,
    args: &[&std::ffi::OsStr],
    addr_file: &Path,
    log: &Path,
) -> Result<Daemon, CliError> {
    let binary = find_binary(name)?;
    let log_file = std::fs::File::create(log)
        .map_err(|e| CliError::Other(format!("cannot create {}: {e}", log.display())))?;
    let mut child = Command::new(&binary)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| CliError::Other(format!("cannot start {}: {e}", binary.display())))?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(addr) = std::fs::read_to_string(addr_file) {
            if !addr.trim().is_empty() {
                return Ok(Daemon {
                    name,
                    child,
                    addr: addr.trim().to_owned(),
                });
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            let tail = std::fs::read_to_string(log).unwrap_or_default();
            let last = tail.lines().last().unwrap_or("(no output)");
            return Err(CliError::Other(format!(
                "{name} exited ({status}) before it was ready: {last}"
            )));
        }
        if Instant::now() > deadline {
            return Err(CliError::Other(format!(
                "{name} did not become ready within 20 s; see {}",
                log.display()
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl Daemon {
    /// SIGTERM, then wait (10 s) for a clean exit.
    /// The daemon is stopped whatever happens to the line that says so.
    async fn stop(mut self) -> Result<(), CliError> {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        match tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await {
            Ok(Ok(status)) => out!("   {} exited ({status})", self.name)?,
            _ => {
                let _ = self.child.kill().await;
                out!("   {} did not stop within 10 s and was killed", self.name)?;
            }
        }
        Ok(())
    }
}

fn step(n: u32, text: &str) -> Result<(), CliError> {
    out!("\n── {n}. {text}")
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("   {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Runs the tour.
pub(crate) async fn run(keep: bool, run_dir: &Path) -> Result<(), CliError> {
    let dir = tempfile::Builder::new()
        .prefix("tollgate-quickstart-")
        .tempdir()
        .map_err(|e| CliError::Other(format!("cannot create a temporary directory: {e}")))?;
    let mut daemons = Vec::new();
    let result = tour(dir.path(), run_dir, &mut daemons).await;

    // Every daemon stops even when stdout fails: the first output error is kept for later.
    let mut shown = step(9, "Stop the daemons");
    // The supervisor first: it tears down any run still live.
    while let Some(daemon) = daemons.pop() {
        let stopped = daemon.stop().await;
        shown = shown.and(stopped);
    }
    // Both logs are closed now (each with a signed checkpoint): check them and tell the run.
    let result = match result.and_then(|run| shown.map(|()| run)) {
        Ok(Some(run_id)) => audit_trail(dir.path(), &run_id),
        Ok(None) => Ok(()),
        Err(e) => Err(e),
    };
    if keep {
        let kept = dir.keep();
        out!("   data kept at {}", kept.display())?;
    } else {
        drop(dir);
        out!("   temporary directory removed")?;
    }
    result?;
    out!(
        "\nNext: run your own daemons (see README.md), then\n\
         `tollgate mint --spec run.toml --out r.tgr` and `tollgate run --receipt r.tgr`."
    )?;
    Ok(())
}

/// Step 10: verify both daemons' audit logs and print the run's story from them.
fn audit_trail(dir: &Path, run_id: &str) -> Result<(), CliError> {
    step(
        10,
        "The audit trail: both logs verify, and they tell the run's story",
    )?;
    let logs = [
        dir.join("authority").join("audit"),
        dir.join("supervisor").join("audit"),
    ];
    out!(
        "   (what `tollgate trace {run_id} {} {}` prints)",
        logs[0].display(),
        logs[1].display()
    )?;
    trace(run_id, &logs, &Trust::default())
}

/// The tour up to the run; returns the run's id when the sandbox part ran (as root).
async fn tour(
    dir: &Path,
    run_dir: &Path,
    daemons: &mut Vec<Daemon>,
) -> Result<Option<String>, CliError> {
    step(
        0,
        "Check that this host can run a supervisor (what `tollgate doctor` does)",
    )?;
    let failed = super::doctor::check_host(&quickstart_host_ids_range(), run_dir)?;
    let root = nix::unistd::geteuid().is_root();
    if failed > 0 && root {
        return Err(CliError::Doctor(failed));
    }
    let (authority_addr, token, mut client) = start_authority(dir, daemons).await?;
    receipt_steps(&mut client, &token).await?;
    if !root {
        out!(
            "\n   The sandbox part of the tour needs root (the supervisor builds namespaces and\n   \
             cgroups): run `sudo tollgate quickstart` to see an agent run."
        )?;
        return Ok(None);
    }

    let (supervisor_dir, supervisor_addr) =
        start_supervisor(dir, run_dir, &authority_addr, daemons).await?;
    let (run_id, run) =
        run_sample_agent(dir, &mut client, &token, &supervisor_dir, &supervisor_addr).await?;
    teardown_report(run)?;
    Ok(Some(run_id))
}

/// Step 1: an authority on a free port; its address, the admin token and a client.
async fn start_authority(
    dir: &Path,
    daemons: &mut Vec<Daemon>,
) -> Result<(String, String, AuthorityClient<Channel>), CliError> {
    step(1, "Start an authority on a free port")?;
    let authority_dir = dir.join("authority");
    let authority = start_daemon(
        "tollgate-authority",
        &[
            "--data-dir".as_ref(),
            authority_dir.as_os_str(),
            "--listen".as_ref(),
            "127.0.0.1:0".as_ref(),
        ],
        &authority_dir.join("authority.addr"),
        &dir.join("authority.log"),
    )
    .await?;
    let authority_addr = authority.addr.clone();
    daemons.push(authority);
    out!(
        "   listening on {authority_addr}; data in {}",
        authority_dir.display()
    )?;
    out!("   first start created a signing key (keys/, 0600) and admin.token (0600)")?;
    let token = read_token(&authority_dir.join("admin.token"))?;
    let mut client = connect(&authority_addr, &Default::default()).await?;
    let keys = client
        .get_key_set(pb::GetKeySetRequest {})
        .await?
        .into_inner();
    for key in &keys.keys {
        out!(
            "   public key {} ({})",
            key.key_id,
            hex::encode(&key.public_key)
        )?;
    }

    Ok((authority_addr, token, client))
}

/// Steps 2 to 5: mint, verify, tamper, revoke.
async fn receipt_steps(client: &mut AuthorityClient<Channel>, token: &str) -> Result<(), CliError> {
    step(2, "Mint a receipt from a run spec (as the admin operator)")?;
    out!("{}", indent(SAMPLE_SPEC.trim_end()))?;
    let minted = mint_with(client, token, SAMPLE_SPEC, "sample spec").await?;
    out!(
        "\n   text form ({} chars): {}…",
        minted.text.len(),
        &minted.text[..48.min(minted.text.len())]
    )?;

    step(3, "Verify it as a supervisor with id \"workstation\" would")?;
    let (_, outcome) = verify_with(client, &minted.text, Some("workstation")).await?;
    let verified = outcome?;
    out!("   valid: Ed25519 signature over \"tollgate.receipt.v1\\n\" || receipt bytes")?;
    out!("{}", indent(&show::receipt_text(&verified)))?;

    step(4, "Tamper with one character: refused")?;
    let mut tampered = minted.text.clone();
    let middle = tampered.len() / 2;
    let replacement = if &tampered[middle..=middle] == "A" {
        "B"
    } else {
        "A"
    };
    tampered.replace_range(middle..=middle, replacement);
    match verify_with(client, &tampered, Some("workstation")).await?.1 {
        Ok(_) => return Err(CliError::Other("a tampered receipt verified".into())),
        Err(e) => say!("   refused: {e}")?,
    }

    step(5, "Revoke it: refused from now on")?;
    let receipt = minted.receipt.clone().unwrap_or_default();
    client
        .revoke_receipt(authed(
            token,
            pb::RevokeReceiptRequest {
                receipt_id: receipt.receipt_id.clone(),
                reason: "quickstart demo".into(),
            },
        )?)
        .await?;
    match verify_with(client, &minted.text, Some("workstation"))
        .await?
        .1
    {
        Ok(_) => return Err(CliError::Other("a revoked receipt verified".into())),
        Err(e) => say!("   refused: {e}")?,
    }

    Ok(())
}

/// Step 6: a supervisor (id "workstation") that trusts the authority; its data directory and
/// address.
async fn start_supervisor(
    dir: &Path,
    run_dir: &Path,
    authority_addr: &str,
    daemons: &mut Vec<Daemon>,
) -> Result<(PathBuf, String), CliError> {
    step(
        6,
        "Start a supervisor (id \"workstation\") that trusts this authority",
    )?;
    let supervisor_dir = dir.join("supervisor");
    let supervisor = start_daemon(
        "tollgate-supervisor",
        &[
            "--data-dir".as_ref(),
            supervisor_dir.as_os_str(),
            "--id".as_ref(),
            "workstation".as_ref(),
            "--listen".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--authority".as_ref(),
            authority_addr.as_ref(),
            "--cgroup-parent".as_ref(),
            format!("tollgate-quickstart-{}", std::process::id()).as_ref(),
            // Its own host ids, below the default range, so it runs beside a supervisor
            // already on this host (supervisors never share host ids).
            "--host-id-base".as_ref(),
            quickstart_host_ids().to_string().as_ref(),
            "--host-id-count".as_ref(),
            "64".as_ref(),
            // Where the host check looked: it registers where other supervisors do.
            "--run-dir".as_ref(),
            run_dir.as_os_str(),
        ],
        &supervisor_dir.join("supervisor.addr"),
        &dir.join("supervisor.log"),
    )
    .await?;
    let supervisor_addr = supervisor.addr.clone();
    daemons.push(supervisor);
    out!("   listening on {supervisor_addr}; it follows the authority's revocations")?;

    Ok((supervisor_dir, supervisor_addr))
}

/// Quickstart's 64 host ids.
fn quickstart_host_ids_range() -> std::ops::Range<u32> {
    quickstart_host_ids()..quickstart_host_ids() + 64
}

/// The first of quickstart's 64 host ids: a band of its own below the supervisor's default
/// range (2 000 000), chosen by process id so two quickstarts rarely meet.
fn quickstart_host_ids() -> u32 {
    1_000_000 + (std::process::id() % 15_000) * 64
}

/// Step 7: mints a receipt for the sample agent and runs it in a sandbox, showing its output;
/// the run's id and how it ended.
async fn run_sample_agent(
    dir: &Path,
    client: &mut AuthorityClient<Channel>,
    token: &str,
    supervisor_dir: &Path,
    supervisor_addr: &str,
) -> Result<(String, pb::Run), CliError> {
    step(
        7,
        "Mint a receipt for a small agent and run it in a sandbox",
    )?;
    let project = dir.join("project");
    std::fs::create_dir_all(&project)
        .and_then(|()| std::fs::write(project.join("README.txt"), "hello from the host\n"))
        .map_err(|e| CliError::Other(format!("cannot write the sample project: {e}")))?;
    // Written only through the gateway: not mounted in the sandbox.
    let notes = dir.join("notes");
    std::fs::create_dir_all(&notes)
        .map_err(|e| CliError::Other(format!("cannot create the notes directory: {e}")))?;
    let request = pb::MintReceiptRequest {
        subject: "quickstart-agent".into(),
        ttl_seconds: 120,
        audience: vec!["workstation".into()],
        agent: Some(pb::AgentSpec {
            argv: vec!["/bin/sh".into(), "-c".into(), SAMPLE_AGENT.into()],
            env: [("NOTES".to_owned(), notes.display().to_string())].into(),
            ..Default::default()
        }),
        fs: vec![
            pb::FsGrant {
                path: project.display().to_string(),
                access: pb::FsAccess::Read as i32,
                mount: "/project".into(),
                exec: false,
                ask: false,
                ask_reads: false,
            },
            pb::FsGrant {
                path: notes.display().to_string(),
                access: pb::FsAccess::Write as i32,
                mount: String::new(),
                exec: false,
                ask: false,
                ask_reads: false,
            },
        ],
        exec: ["/bin/sh", "/usr/bin/id", "/usr/bin/cat", "/usr/bin/ls"]
            .map(String::from)
            .to_vec(),
        ..Default::default()
    };
    let minted = client
        .mint_receipt(authed(token, request)?)
        .await?
        .into_inner();
    out!(
        "   grants: read {} at /project; write {} through the gateway only; exec sh, id, cat, ls;\n   nothing else",
        project.display(),
        notes.display()
    )?;
    let supervisor_token = read_token(&supervisor_dir.join("admin.token"))?;
    let mut runs = connect_supervisor(supervisor_addr, &Default::default()).await?;
    let run_id = runs
        .start_run(authed(
            &supervisor_token,
            pb::StartRunRequest {
                receipt: minted.text,
                ..Default::default()
            },
        )?)
        .await?
        .into_inner()
        .run_id;
    let mut events = runs
        .watch_run(authed(
            &supervisor_token,
            pb::WatchRunRequest {
                run_id: run_id.clone(),
            },
        )?)
        .await?
        .into_inner();
    let mut ended = None;
    while let Some(event) = events.next().await {
        match event?.event {
            Some(pb::run_event::Event::Output(chunk)) => {
                out!(
                    "{}",
                    indent(String::from_utf8_lossy(&chunk.data).trim_end())
                )?;
            }
            Some(pb::run_event::Event::Ended(run)) => ended = Some(run),
            None => {}
        }
    }
    let run = ended.ok_or_else(|| CliError::Other("the run's stream ended early".into()))?;

    Ok((run_id, run))
}

/// Step 8: the teardown report; an error if the teardown left anything behind.
fn teardown_report(run: pb::Run) -> Result<(), CliError> {
    step(8, "The teardown report")?;
    let report = run.report.unwrap_or_default();
    out!(
        "   state      {}",
        if run.state == pb::RunState::Exited as i32 {
            "exited"
        } else {
            "ended"
        }
    )?;
    say!("   reason     {}", report.reason)?;
    out!("   duration   {} ms", report.duration_ms)?;
    if let Some(peak) = report.peak_memory_bytes {
        out!("   peak mem   {}", show::size(peak))?;
    }
    if report.cleanup_errors.is_empty() {
        out!("   teardown   no process, cgroup or directory of the run is left")?;
    } else {
        return Err(CliError::Other(format!(
            "teardown left something behind: {}",
            report.cleanup_errors.join("; ")
        )));
    }
    Ok(())
}
