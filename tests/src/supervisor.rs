//! A real `tollgate-supervisor` daemon (root) with its own cgroup parent and host-id range,
//! and [`daemons`]: an authority and a supervisor following it.

use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tonic::transport::Channel;

use crate::authority::AuthorityProcess;
use crate::client::authed;
use crate::host::{bin_path, cgroup_parent_of, command_on, private_dir, wait_for_file};

/// A running `tollgate-supervisor` (root), with its own cgroup parent and host-id range;
/// dropping it kills the daemon and sweeps its cgroups.
pub struct SupervisorProcess {
    child: Child,
    data_dir: PathBuf,
    addr: String,
    /// The cgroup parent its runs live under.
    pub cgroup_parent: String,
    authority: String,
    host_id_base: u32,
    host_ids: u32,
    extra: Vec<String>,
}

impl SupervisorProcess {
    /// Starts it following `authority` (host:port), id `workstation`.
    pub fn start(data_dir: &Path, authority: &str, test: &str, host_id_base: u32) -> Self {
        let cgroup_parent = cgroup_parent_of(test);
        Self::spawn(
            data_dir,
            authority,
            cgroup_parent,
            (host_id_base, 64),
            Vec::new(),
        )
    }

    /// Starts it enrolled at `authority` for delegation: its token, written to
    /// [`Self::delegation_token_file`], given with `--delegation-token-file`.
    pub async fn start_delegating(
        data_dir: &Path,
        authority: &AuthorityProcess,
        test: &str,
        host_id_base: u32,
    ) -> Self {
        let token_file = Self::token_file_of(data_dir);
        authority
            .add_supervisor_token_file("workstation", &token_file)
            .await;
        let cgroup_parent = cgroup_parent_of(test);
        let extra = vec![
            "--delegation-token-file".to_owned(),
            token_file.display().to_string(),
        ];
        Self::spawn(
            data_dir,
            authority.addr(),
            cgroup_parent,
            (host_id_base, 64),
            extra,
        )
    }

    fn token_file_of(data_dir: &Path) -> PathBuf {
        data_dir.with_extension("delegation-token")
    }

    /// Its delegation token file (for one started with [`Self::start_delegating`]).
    pub fn delegation_token_file(&self) -> PathBuf {
        Self::token_file_of(&self.data_dir)
    }

    /// Starts it with these extra flags (e.g. `--routes FILE`).
    pub fn start_with_flags(
        data_dir: &Path,
        authority: &str,
        test: &str,
        host_id_base: u32,
        flags: Vec<String>,
    ) -> Self {
        let cgroup_parent = cgroup_parent_of(test);
        Self::spawn(
            data_dir,
            authority,
            cgroup_parent,
            (host_id_base, 64),
            flags,
        )
    }

    /// What the daemon has written to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.data_dir.with_extension("stderr")).unwrap_or_default()
    }

    /// Whether the daemon is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Starts it with room for `host_ids` live runs at once.
    pub fn start_with_capacity(
        data_dir: &Path,
        authority: &str,
        test: &str,
        host_id_base: u32,
        host_ids: u32,
    ) -> Self {
        let cgroup_parent = cgroup_parent_of(test);
        Self::spawn(
            data_dir,
            authority,
            cgroup_parent,
            (host_id_base, host_ids),
            Vec::new(),
        )
    }

    /// Starts it as supervisor `id` through the command `prefix` (e.g. a [`crate::lan::Lan`]
    /// host's), listening on `listen`, following `authority`, with extra flags.
    #[allow(clippy::too_many_arguments)]
    pub fn start_on(
        prefix: &[String],
        id: &str,
        listen: &str,
        data_dir: &Path,
        authority: &str,
        test: &str,
        host_id_base: u32,
        flags: Vec<String>,
    ) -> Self {
        let cgroup_parent = cgroup_parent_of(test);
        Self::spawn_on(
            (prefix, id, listen),
            data_dir,
            authority,
            cgroup_parent,
            (host_id_base, 64),
            flags,
        )
    }

    fn spawn(
        data_dir: &Path,
        authority: &str,
        cgroup_parent: String,
        ids: (u32, u32),
        extra: Vec<String>,
    ) -> Self {
        Self::spawn_on(
            (&[], "workstation", "127.0.0.1:0"),
            data_dir,
            authority,
            cgroup_parent,
            ids,
            extra,
        )
    }

    fn spawn_on(
        (prefix, id, listen): (&[String], &str, &str),
        data_dir: &Path,
        authority: &str,
        cgroup_parent: String,
        (host_id_base, host_ids): (u32, u32),
        extra: Vec<String>,
    ) -> Self {
        let _ = std::fs::remove_file(data_dir.join("supervisor.addr"));
        private_dir(data_dir);
        let log = data_dir.with_extension("stderr");
        let mut child = command_on(prefix, bin_path("tollgate-supervisor"))
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--id", id, "--listen", listen, "--authority", authority])
            .args(["--cgroup-parent", &cgroup_parent])
            .args([
                "--host-id-base",
                &host_id_base.to_string(),
                "--host-id-count",
                &host_ids.to_string(),
            ])
            .args(["--clock-skew", "0"])
            .args(&extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log)
                    .expect("log"),
            )
            .spawn()
            .expect("spawn tollgate-supervisor");
        let addr = wait_for_file(
            &data_dir.join("supervisor.addr"),
            &mut child,
            Duration::from_secs(30),
        )
        .unwrap_or_else(|why| {
            panic!(
                "{why}: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        });
        Self {
            child,
            data_dir: data_dir.to_owned(),
            addr,
            cgroup_parent,
            authority: authority.to_owned(),
            host_id_base,
            host_ids,
            extra,
        }
    }

    /// Starts a new daemon on the same data directory and cgroup parent (after a stop).
    pub fn restart(self, signal: Signal) -> Self {
        self.restart_after(signal, || {})
    }

    /// [`Self::restart`], running `between` once the old daemon has exited and before the new
    /// one starts.
    pub fn restart_after(self, signal: Signal, between: impl FnOnce()) -> Self {
        let (data_dir, authority, parent, base, ids, extra) = (
            self.data_dir.clone(),
            self.authority.clone(),
            self.cgroup_parent.clone(),
            self.host_id_base,
            self.host_ids,
            self.extra.clone(),
        );
        let mut this = self;
        let _ = kill(Pid::from_raw(this.child.id() as i32), signal);
        let _ = this.child.wait();
        // Keep the cgroups: the new daemon must find and sweep them.
        this.cgroup_parent.clear();
        drop(this);
        between();
        // Nobody else sweeps the kept cgroups if the new daemon fails to start.
        let _sweep = SweepIfPanicking(parent.clone());
        Self::spawn(&data_dir, &authority, parent, (base, ids), extra)
    }

    /// Sends `signal` and waits for the daemon to exit, keeping this handle: what the stop
    /// left (cgroups, run directories, the audit log) can then be looked at before the drop
    /// sweeps.
    pub fn terminate(&mut self, signal: Signal) -> ExitStatus {
        let _ = kill(Pid::from_raw(self.child.id() as i32), signal);
        self.child.wait().expect("wait")
    }

    /// Sends `signal` and waits.
    pub fn stop(mut self, signal: Signal) -> ExitStatus {
        let _ = kill(Pid::from_raw(self.child.id() as i32), signal);
        self.child.wait().expect("wait")
    }

    /// `host:port`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The daemon's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its admin token file.
    pub fn token_file(&self) -> PathBuf {
        self.data_dir.join("admin.token")
    }

    /// Its admin token.
    pub fn token(&self) -> String {
        std::fs::read_to_string(self.token_file())
            .expect("supervisor admin.token")
            .trim()
            .to_owned()
    }

    /// Its data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// `StartRun` of receipt `text` as the holder of `token` (an operator's, say).
    pub async fn start_run_as(&self, token: &str, text: String) -> Result<String, tonic::Status> {
        self.client()
            .await
            .start_run(authed(
                token,
                tollgate_proto::v1::StartRunRequest {
                    receipt: text,
                    ..Default::default()
                },
            ))
            .await
            .map(|response| response.into_inner().run_id)
    }

    /// Follows run `run_id`'s calls waiting for approval (as the holder of `token`) and
    /// decides each of the first `count` with `decide` (approve?, remember?, reason), 60 s at
    /// most for each to arrive; the calls, in the order they came.
    pub async fn decide_pending(
        &self,
        token: &str,
        run_id: &str,
        count: usize,
        mut decide: impl FnMut(&tollgate_proto::v1::PendingCall) -> (bool, bool, &'static str),
    ) -> Vec<tollgate_proto::v1::PendingCall> {
        use tollgate_proto::v1 as pb;
        let mut client = self.client().await;
        let mut events = client
            .watch_approvals(authed(
                token,
                pb::WatchApprovalsRequest {
                    run_id: run_id.into(),
                },
            ))
            .await
            .expect("WatchApprovals")
            .into_inner();
        let mut asked = Vec::new();
        while asked.len() < count {
            let event = tokio::time::timeout(Duration::from_secs(60), events.message())
                .await
                .expect("the calls reach the approval board in time")
                .expect("event")
                .expect("stream open");
            let Some(pb::approval_event::Event::Pending(call)) = event.event else {
                continue;
            };
            let (approve, remember, reason) = decide(&call);
            client
                .decide_approval(authed(
                    token,
                    pb::DecideApprovalRequest {
                        run_id: run_id.into(),
                        call_id: call.call_id.clone(),
                        approve,
                        remember,
                        reason: reason.into(),
                    },
                ))
                .await
                .expect("DecideApproval");
            asked.push(call);
        }
        asked
    }

    /// Every entry of the audit log in `dir` (a daemon's `<data dir>/audit`), in order.
    pub fn audit_entries(dir: &Path) -> Vec<tollgate_audit::Entry> {
        tollgate_audit::AuditReader::open(dir)
            .expect("open the audit log")
            .collect::<Result<_, _>>()
            .expect("read the audit log")
    }

    /// Every entry of this supervisor's audit log, in order.
    pub fn audit(&self) -> Vec<tollgate_audit::Entry> {
        Self::audit_entries(&self.data_dir.join("audit"))
    }

    /// Starts the receipt `text` with its pinned agent (as the supervisor's admin); the run id.
    pub async fn start_run(&self, text: String) -> String {
        self.client()
            .await
            .start_run(authed(
                &self.token(),
                tollgate_proto::v1::StartRunRequest {
                    receipt: text,
                    argv: vec![],
                    ..Default::default()
                },
            ))
            .await
            .expect("StartRun")
            .into_inner()
            .run_id
    }

    /// Everything a run printed, from `WatchRun` (its replay, then live output until it
    /// ends; 30 s at most between events).
    pub async fn output(&self, run_id: &str) -> String {
        let mut stream = self
            .client()
            .await
            .watch_run(authed(
                &self.token(),
                tollgate_proto::v1::WatchRunRequest {
                    run_id: run_id.into(),
                },
            ))
            .await
            .expect("WatchRun")
            .into_inner();
        let mut text = String::new();
        while let Ok(Some(event)) = tokio::time::timeout(Duration::from_secs(30), stream.message())
            .await
            .unwrap_or(Ok(None))
        {
            match event.event {
                Some(tollgate_proto::v1::run_event::Event::Output(chunk)) => {
                    text.push_str(&String::from_utf8_lossy(&chunk.data));
                }
                Some(tollgate_proto::v1::run_event::Event::Ended(_)) => break,
                None => {}
            }
        }
        text
    }

    /// Follows the run's output until it has printed `line` (30 s at most).
    pub async fn until_printed(&self, token: &str, run_id: &str, line: &str) {
        let mut stream = self
            .client()
            .await
            .watch_run(authed(
                token,
                tollgate_proto::v1::WatchRunRequest {
                    run_id: run_id.into(),
                },
            ))
            .await
            .expect("WatchRun")
            .into_inner();
        let mut text = String::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let event = tokio::time::timeout_at(deadline, stream.message())
                .await
                .unwrap_or_else(|_| panic!("the run never printed {line:?}:\n{text}"))
                .expect("event");
            match event.and_then(|e| e.event) {
                Some(tollgate_proto::v1::run_event::Event::Output(chunk)) => {
                    text.push_str(&String::from_utf8_lossy(&chunk.data));
                    if text.lines().any(|l| l == line) {
                        return;
                    }
                }
                other => panic!("the run ended before printing {line:?}: {other:?}\n{text}"),
            }
        }
    }

    /// Polls the run until it has ended (its record has a report); panics after `limit`.
    pub async fn wait_ended(&self, run_id: &str, limit: Duration) -> tollgate_proto::v1::Run {
        let mut client = self.client().await;
        let deadline = Instant::now() + limit;
        loop {
            let run = client
                .get_run(authed(
                    &self.token(),
                    tollgate_proto::v1::GetRunRequest {
                        run_id: run_id.to_owned(),
                    },
                ))
                .await
                .expect("get_run")
                .into_inner();
            if run.report.is_some() {
                return run;
            }
            assert!(Instant::now() < deadline, "run {run_id} never ended");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A connected client.
    pub async fn client(&self) -> tollgate_proto::v1::supervisor_client::SupervisorClient<Channel> {
        tollgate_proto::v1::supervisor_client::SupervisorClient::connect(format!(
            "http://{}",
            self.addr
        ))
        .await
        .expect("connect supervisor")
    }
}

/// Sweeps a cgroup parent when dropped during a panic (a test failing between a daemon's
/// crash and its restart must still leave no cgroup behind).
struct SweepIfPanicking(String);

impl Drop for SweepIfPanicking {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = tollgate_supervisor::cgroup::sweep(&self.0, true);
        }
    }
}

impl Drop for SupervisorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !self.cgroup_parent.is_empty() {
            let _ = tollgate_supervisor::cgroup::sweep(&self.cgroup_parent, true);
        }
        // Killed, it could not remove its host registration itself.
        let _ = std::fs::remove_file(tollgate_supervisor::daemon::host::registration_path(
            Path::new(tollgate_supervisor::daemon::host::DEFAULT_RUN_DIR),
            &self.data_dir,
        ));
    }
}

/// A fresh directory with a real authority and a supervisor following it (`test` names the
/// supervisor's cgroup parent; its host ids start at `host_id_base`). The directory goes when
/// the returned guard is dropped: keep it for the daemons' lifetime.
pub fn daemons(
    test: &str,
    host_id_base: u32,
) -> (tempfile::TempDir, AuthorityProcess, SupervisorProcess) {
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let supervisor = SupervisorProcess::start(
        &dir.path().join("supervisor"),
        authority.addr(),
        test,
        host_id_base,
    );
    (dir, authority, supervisor)
}
