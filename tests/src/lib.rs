//! Harness for cross-process tests: starts the real `tollgate-authority` binary on a free
//! port in its own data directory and stops it (SIGTERM or SIGKILL) on demand or on drop.
//!
//! Binaries are looked up in the cargo target directory next to the running test executable
//! (or in `TOLLGATE_BIN_DIR`); `scripts/test` builds them before the tests run.

#![forbid(unsafe_code)]

pub mod fake_models;
pub mod flood;
pub mod lan;
pub mod llama;
pub mod model_gateway;
pub mod relay;
pub mod remote;
pub mod run_fixture;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tollgate_proto::v1::authority_client::AuthorityClient;
use tonic::transport::Channel;

/// The repository's root, canonical: where `profiles/`, `examples/` and `clients/` are.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the repository root")
}

/// A command's stderr, which must be one line (the CLI's errors are), trimmed.
pub fn stderr_line(output: &std::process::Output) -> String {
    let text = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(
        text.trim_end().lines().count(),
        1,
        "errors are one line: {text:?}"
    );
    text.trim().to_owned()
}

/// Whether this process may run the root-only tests. Not root fails the test with a clear
/// message (CI runs as root), unless `TOLLGATE_SKIP_ROOT_TESTS` is set, which skips them.
pub fn require_root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("TOLLGATE_SKIP_ROOT_TESTS").is_some(),
        "this test needs root (CI runs as root); set TOLLGATE_SKIP_ROOT_TESTS=1 to skip it"
    );
    false
}

/// Opens the supervisor's audit log under `data_dir` (created if missing), as the daemon
/// would, for tests and benchmarks that drive a `RunManager` in-process.
pub fn supervisor_audit(data_dir: &Path) -> tollgate_audit::AuditLog {
    std::fs::create_dir_all(data_dir).expect("create the data directory");
    let mut config =
        tollgate_audit::component_config(data_dir, "supervisor").expect("audit config");
    let redactor =
        tollgate_router::SecretRedactor::with_defaults().expect("the built-in detectors compile");
    config.redactor = Some(std::sync::Arc::new(move |text: &str| redactor.redact(text)));
    tollgate_audit::AuditLog::open(config).expect("open the audit log")
}

/// The pids hierarchy's directory of cgroup `parent` (the v1 controller, or unified v2).
pub fn pids_cgroup_dir(parent: &str) -> PathBuf {
    let v1 = Path::new("/sys/fs/cgroup/pids");
    if v1.is_dir() {
        v1.join(parent)
    } else {
        Path::new("/sys/fs/cgroup").join(parent)
    }
}

/// Whether the sandbox cgroup `name` under `parent` is a warm one: prepared ahead of need,
/// holding only an idle shim, and so still without limits (every run's cgroup has a pids
/// limit, applied before its agent exists).
pub fn is_warm(parent: &str, name: &str) -> bool {
    std::fs::read_to_string(pids_cgroup_dir(parent).join(name).join("pids.max"))
        .is_ok_and(|max| max.trim() == "max")
}

/// What is left of runs: cgroups under `parent` other than (at most one) warm sandbox, and
/// run directories.
pub fn leftovers(data_dir: &Path, parent: &str) -> Vec<String> {
    let dirs: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
        .unwrap()
        .flatten()
        .flat_map(|h| {
            std::fs::read_dir(h.path().join(parent))
                .into_iter()
                .flatten()
                .flatten()
        })
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    let mut names: Vec<String> = dirs
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    names.sort();
    names.dedup();
    let warm: Vec<&String> = names.iter().filter(|n| is_warm(parent, n)).collect();
    let mut left: Vec<String> = dirs
        .iter()
        .filter(|p| {
            !p.file_name()
                .is_some_and(|n| warm.iter().any(|w| n == w.as_str()))
        })
        .map(|p| p.display().to_string())
        .collect();
    if warm.len() > 1 {
        left.push(format!(
            "{} warm sandboxes (at most 1 expected)",
            warm.len()
        ));
    }
    left.extend(
        std::fs::read_dir(data_dir.join("runs"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path().display().to_string()),
    );
    left
}

/// Creates `dir` (and parents) and makes it 0700, as a daemon's data directory must be (a
/// test may have created it, and runs beneath it, with the umask's looser mode).
pub fn private_dir(dir: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::create_dir_all(dir).expect("create the data directory");
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .expect("make the data directory private");
}

/// Path of a workspace binary built by cargo.
pub fn bin_path(name: &str) -> PathBuf {
    let dir = match std::env::var_os("TOLLGATE_BIN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            // target/<profile>/deps/<test-binary> -> target/<profile>
            let exe = std::env::current_exe().expect("current_exe");
            let mut dir = exe.parent().expect("exe dir").to_path_buf();
            if dir.ends_with("deps") {
                dir.pop();
            }
            dir
        }
    };
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build --workspace --bins` first (scripts/test does)",
        path.display()
    );
    path
}

/// Polls for `path` to exist with non-empty contents (the daemons' readiness files).
pub fn wait_for_file(path: &Path, child: &mut Child, timeout: Duration) -> Result<String, String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if !text.trim().is_empty() {
                return Ok(text.trim().to_owned());
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "process exited with {status} before writing {}",
                path.display()
            ));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{} did not appear within {timeout:?}",
                path.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A CA and certificates made with `tollgate pki` in `<dir>/pki`: the authority's,
/// supervisor `workstation`'s and operator `alice`'s.
pub struct Pki {
    /// Where the files are.
    pub dir: PathBuf,
}

impl Pki {
    /// Makes them (panics if `tollgate pki` fails).
    pub fn make(dir: &Path) -> Self {
        let dir = dir.join("pki");
        let d = dir.to_str().expect("a UTF-8 path");
        for args in [
            vec!["pki", "init", "--dir", d],
            vec!["pki", "issue", "authority", "--dir", d],
            vec!["pki", "issue", "supervisor", "workstation", "--dir", d],
            vec!["pki", "issue", "operator", "alice", "--dir", d],
        ] {
            let output = Command::new(bin_path("tollgate"))
                .args(&args)
                .output()
                .expect("run tollgate pki");
            assert!(output.status.success(), "{args:?}: {output:?}");
        }
        Self { dir }
    }

    /// The path of one of its files (`ca.pem`, `operator-alice.key`...), as a string.
    pub fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// The flags that make supervisor `workstation` serve mutual TLS with these files and
    /// reach its authority over TLS with its certificate.
    pub fn supervisor_flags(&self) -> Vec<String> {
        vec![
            "--authority-ca".into(),
            self.path("ca.pem"),
            "--tls-cert".into(),
            self.path("supervisor-workstation.pem"),
            "--tls-key".into(),
            self.path("supervisor-workstation.key"),
            "--tls-client-ca".into(),
            self.path("ca.pem"),
        ]
    }

    /// A mutual-TLS connection to `addr` presenting `holder`'s certificate
    /// (`operator-alice`, `supervisor-workstation`...). Panics if it cannot connect.
    pub async fn channel(&self, addr: &str, holder: &str) -> Channel {
        let read = |name: String| std::fs::read(self.dir.join(name)).expect("a PKI file");
        tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
            .expect("an address")
            .tls_config(
                tonic::transport::ClientTlsConfig::new()
                    .ca_certificate(tonic::transport::Certificate::from_pem(read(
                        "ca.pem".into(),
                    )))
                    .identity(tonic::transport::Identity::from_pem(
                        read(format!("{holder}.pem")),
                        read(format!("{holder}.key")),
                    )),
            )
            .expect("TLS settings")
            .connect()
            .await
            .expect("mutual TLS")
    }

    /// The flags that make an authority serve mutual TLS with these files.
    pub fn authority_flags(&self) -> Vec<String> {
        vec![
            "--tls-cert".into(),
            self.path("authority.pem"),
            "--tls-key".into(),
            self.path("authority.key"),
            "--tls-client-ca".into(),
            self.path("ca.pem"),
        ]
    }
}

/// The cgroup parent of the supervisor of test `test` in this test process (its own, so
/// tests running at once never sweep each other's runs).
fn cgroup_parent_of(test: &str) -> String {
    format!("tollgate-test-{}-{test}", std::process::id())
}

/// `program` run through the command `prefix` (none: directly).
fn command_on(prefix: &[String], program: PathBuf) -> Command {
    match prefix.split_first() {
        Some((first, rest)) => {
            let mut command = Command::new(first);
            command.args(rest).arg(program);
            command
        }
        None => Command::new(program),
    }
}

/// A running `tollgate-authority`.
pub struct AuthorityProcess {
    child: Child,
    data_dir: PathBuf,
    addr: String,
}

impl AuthorityProcess {
    /// The daemon's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Starts the daemon on `127.0.0.1:0` with `data_dir`, waiting until it is ready.
    /// Its stderr goes to `<data_dir>/../authority.stderr`.
    pub fn start(data_dir: &Path) -> Self {
        Self::start_with(data_dir, &[]).unwrap_or_else(|(status, stderr)| {
            panic!("authority failed to start ({status}): {stderr}")
        })
    }

    /// Starts with extra flags; on failure returns the exit status and stderr.
    pub fn start_with(data_dir: &Path, extra: &[&str]) -> Result<Self, (String, String)> {
        Self::start_on(&[], data_dir, "127.0.0.1:0", extra)
    }

    /// Starts it through the command `prefix` (e.g. a [`lan::Lan`] host's), listening on
    /// `listen`, with extra flags; on failure returns the exit status and stderr.
    pub fn start_on(
        prefix: &[String],
        data_dir: &Path,
        listen: &str,
        extra: &[&str],
    ) -> Result<Self, (String, String)> {
        let log = data_dir.with_extension("stderr");
        // After a SIGKILL the old readiness file is still there; never mistake it for ours.
        let _ = std::fs::remove_file(data_dir.join("authority.addr"));
        let mut child = command_on(prefix, bin_path("tollgate-authority"))
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listen", listen])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log).expect("create log"))
            .spawn()
            .expect("spawn tollgate-authority");
        match wait_for_file(
            &data_dir.join("authority.addr"),
            &mut child,
            Duration::from_secs(30),
        ) {
            Ok(addr) => Ok(Self {
                child,
                data_dir: data_dir.to_owned(),
                addr,
            }),
            Err(why) => {
                let _ = child.kill();
                let status = child.wait().map(|s| s.to_string()).unwrap_or(why);
                Err((status, std::fs::read_to_string(&log).unwrap_or_default()))
            }
        }
    }

    /// Starts it serving mutual TLS with `pki`'s authority certificate.
    pub fn start_tls(data_dir: &Path, pki: &Pki) -> Self {
        let flags = pki.authority_flags();
        Self::start_with(
            data_dir,
            &flags.iter().map(String::as_str).collect::<Vec<_>>(),
        )
        .unwrap_or_else(|(status, stderr)| {
            panic!("authority with TLS failed to start ({status}): {stderr}")
        })
    }

    /// `host:port` it listens on.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// `http://host:port`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The bootstrap admin token.
    pub fn admin_token(&self) -> String {
        std::fs::read_to_string(self.data_dir.join("admin.token"))
            .expect("admin.token")
            .trim()
            .to_owned()
    }

    /// A connected gRPC client.
    pub async fn client(&self) -> AuthorityClient<Channel> {
        AuthorityClient::connect(self.url()).await.expect("connect")
    }

    /// Adds operator `name` with `ceiling` (not an admin), with the admin token; returns its
    /// token. Panics if the authority refuses.
    pub async fn add_operator(&self, name: &str, ceiling: tollgate_proto::v1::Ceiling) -> String {
        self.client()
            .await
            .add_operator(authed(
                &self.admin_token(),
                tollgate_proto::v1::AddOperatorRequest {
                    name: name.into(),
                    ceiling: Some(ceiling),
                    admin: false,
                },
            ))
            .await
            .expect("operator added")
            .into_inner()
            .token
    }

    /// Enrols supervisor `id` for delegation (`AddSupervisor` with the admin token) and
    /// returns its delegation token, for `DelegateReceipt` (or a supervisor's
    /// `--delegation-token-file`). Panics if the authority refuses.
    pub async fn add_supervisor(&self, id: &str) -> String {
        self.client()
            .await
            .add_supervisor(authed(
                &self.admin_token(),
                tollgate_proto::v1::AddSupervisorRequest {
                    supervisor_id: id.to_owned(),
                },
            ))
            .await
            .unwrap_or_else(|status| panic!("AddSupervisor {id:?}: {status}"))
            .into_inner()
            .token
    }

    /// [`Self::add_supervisor`], with the token written to `path` (mode 0600), as a
    /// supervisor's `--delegation-token-file` wants it.
    pub async fn add_supervisor_token_file(&self, id: &str, path: &Path) {
        use std::os::unix::fs::OpenOptionsExt as _;
        let token = self.add_supervisor(id).await;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
        std::io::Write::write_all(&mut file, format!("{token}\n").as_bytes())
            .expect("write the delegation token");
    }

    /// Sends `signal` and waits for the process to exit.
    pub fn stop(mut self, signal: Signal) -> ExitStatus {
        let _ = kill(Pid::from_raw(self.child.id() as i32), signal);
        self.child.wait().expect("wait")
    }
}

impl Drop for AuthorityProcess {
    fn drop(&mut self) {
        // Never leave a daemon behind, whatever the test did.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Wraps a message with `authorization: Bearer <token>`.
pub fn authed<T>(token: &str, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("header"),
    );
    request
}

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

    /// Starts it as supervisor `id` through the command `prefix` (e.g. a [`lan::Lan`]
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

/// The services a daemon's reflection lists, over `grpc.reflection.v1` and `v1alpha`
/// (sorted).
pub async fn reflected_services(channel: Channel) -> (Vec<String>, Vec<String>) {
    use tokio_stream::StreamExt as _;
    use tonic_reflection::pb::{v1, v1alpha};
    let mut client = v1::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let reply = client
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .expect("reflection v1")
        .into_inner()
        .next()
        .await
        .expect("a v1 reply")
        .expect("v1 reply");
    let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        reply.message_response
    else {
        panic!("unexpected v1 reflection reply");
    };
    let mut v1_names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    v1_names.sort();
    let mut client = v1alpha::server_reflection_client::ServerReflectionClient::new(channel);
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let reply = client
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .expect("reflection v1alpha")
        .into_inner()
        .next()
        .await
        .expect("a v1alpha reply")
        .expect("v1alpha reply");
    let Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        reply.message_response
    else {
        panic!("unexpected v1alpha reflection reply");
    };
    let mut v1alpha_names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    v1alpha_names.sort();
    (v1_names, v1alpha_names)
}

/// Scrapes the `/metrics` of the daemon whose metrics address is in `addr_file`, checks it is
/// OpenMetrics text, and parses it with the reference parser (Python `prometheus_client`):
/// one `name [(label, value), …] value` line a sample.
pub fn scrape_metrics(addr_file: &Path) -> String {
    use std::io::{Read as _, Write as _};
    let addr = std::fs::read_to_string(addr_file).expect("metrics.addr");
    let mut stream = std::net::TcpStream::connect(addr.trim()).expect("metrics endpoint");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: metrics\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("application/openmetrics-text"), "{head}");
    let python = std::env::var("TOLLGATE_PYTHON").unwrap_or_else(|_| "python3".into());
    let mut parse = Command::new(python)
        .args([
            "-c",
            "import sys\n\
             from prometheus_client.openmetrics.parser import text_string_to_metric_families\n\
             for family in text_string_to_metric_families(sys.stdin.read()):\n\
             \x20   for s in family.samples:\n\
             \x20       print(s.name, sorted(s.labels.items()), s.value)\n",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python for the OpenMetrics parser");
    parse
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let parsed = parse.wait_with_output().unwrap();
    assert!(parsed.status.success(), "{parsed:?}\n{body}");
    String::from_utf8_lossy(&parsed.stdout).into_owned()
}

/// The value of the first sample line of `samples` (from [`scrape_metrics`]) starting with
/// `line_start`.
pub fn sample(samples: &str, line_start: &str) -> f64 {
    samples
        .lines()
        .find(|line| line.starts_with(line_start))
        .unwrap_or_else(|| panic!("no {line_start:?} in\n{samples}"))
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// A scripted model server speaking the three APIs coding agents use (tests/tests/coding_agents.rs).
pub mod scripted_models;
