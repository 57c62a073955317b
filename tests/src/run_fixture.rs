//! A run manager on real sandboxes for tests (root): its own cgroup parent, data directory and
//! host-id band, a signer its key set trusts, and the runs' output captured per run.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tollgate_proto::v1 as pb;
use tollgate_receipt::{timestamp_from_unix, unix_now, KeySet, ReceiptSigner, SignedReceipt};
use tollgate_supervisor::cgroup::sweep;
use tollgate_supervisor::error::StartError;
use tollgate_supervisor::runs::{OutputSink, OutputStream, RunManager, RunSettings};

use crate::{bin_path, supervisor_audit};

/// Output captured per run: stdout under the run id, stderr under `RUN:stderr`.
pub type Captured = Arc<Mutex<HashMap<String, String>>>;

/// A run manager on real sandboxes; dropped, it shuts down and sweeps its cgroup parent.
pub struct RunFixture {
    /// The run manager (the supervisor's core, without its gRPC front).
    pub manager: Arc<RunManager>,
    /// Signs receipts the manager trusts.
    pub signer: ReceiptSigner,
    /// The fixture's own cgroup parent.
    pub parent: String,
    /// The supervisor data directory.
    pub data: PathBuf,
    /// Every run's output so far.
    pub output: Captured,
    _tmp: tempfile::TempDir,
}

/// Run settings for a test: its data directory, cgroup parent and 16 host ids from `base`.
pub fn settings(data: &Path, parent: &str, base: u32) -> RunSettings {
    RunSettings {
        egress: Default::default(),
        data_dir: data.to_owned(),
        supervisor_id: "workstation".into(),
        shim: bin_path("tollgate-shim"),
        cgroup_parent: parent.into(),
        host_ids: base..base + 16,
        clock_skew: Duration::from_secs(0),
        warm_sandboxes: 1,
        live_restore: None,
        rootfs_dir: data.join("rootfs"),
    }
}

impl RunFixture {
    /// Everything `run_id` has written so far.
    pub fn output_of(&self, run_id: &str) -> String {
        self.output
            .lock()
            .unwrap()
            .get(run_id)
            .cloned()
            .unwrap_or_default()
    }

    /// A fixture named `test` (its cgroup parent) with host ids from `base`.
    pub fn new(test: &str, base: u32) -> Self {
        Self::with(test, base, |_, _| {})
    }

    /// A fixture whose settings `adjust` changes first (given the temporary directory).
    pub fn with(test: &str, base: u32, adjust: impl FnOnce(&mut RunSettings, &Path)) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("supervisor");
        let parent = format!("tollgate-test-{}-{test}", std::process::id());
        let signer = ReceiptSigner::generate();
        let mut keys = KeySet::new();
        keys.insert(signer.public_key());
        let mut settings = settings(&data, &parent, base);
        adjust(&mut settings, tmp.path());
        let (manager, _) = RunManager::open(settings, keys, supervisor_audit(&data)).unwrap();
        Self {
            manager,
            signer,
            parent,
            data,
            output: Arc::default(),
            _tmp: tmp,
        }
    }

    /// An output sink capturing into [`RunFixture::output`].
    pub fn sink(&self) -> OutputSink {
        let output = self.output.clone();
        Arc::new(move |run_id: &str, stream: OutputStream, bytes: &[u8]| {
            // Stderr apart, under "RUN:stderr", for failure messages.
            let key = match stream {
                OutputStream::Stdout => run_id.to_owned(),
                OutputStream::Stderr => format!("{run_id}:stderr"),
            };
            output
                .lock()
                .unwrap()
                .entry(key)
                .or_default()
                .push_str(&String::from_utf8_lossy(bytes));
        })
    }

    /// A receipt running `sh -c script` for `ttl` seconds, with small limits.
    pub fn receipt(&self, script: &str, ttl: i64) -> pb::Receipt {
        let now = unix_now();
        pb::Receipt {
            receipt_id: uuid::Uuid::now_v7().to_string(),
            owner: "admin".into(),
            subject: "test".into(),
            audience: vec!["workstation".into()],
            issued_at: Some(timestamp_from_unix(now)),
            not_before: Some(timestamp_from_unix(now)),
            expires_at: Some(timestamp_from_unix(now + ttl)),
            agent: Some(pb::AgentSpec {
                argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
                ..Default::default()
            }),
            limits: Some(pb::Limits {
                memory_bytes: 128 << 20,
                pids: 64,
                cpu_millicores: 1000,
                output_bytes: 1 << 20,
                tmpfs_bytes: 8 << 20,
                tool_calls: 10,
                tokens: 10,
                files: 0,
                ..Default::default()
            }),
            exec: vec!["/bin/sh".into(), "/usr/bin/sleep".into()],
            ..Default::default()
        }
    }

    /// Signs `receipt` with the fixture's key.
    pub fn sign(&self, mut receipt: pb::Receipt) -> SignedReceipt {
        self.signer.sign(&mut receipt)
    }

    /// Serves one local model route, `local` (preset vllm, model `qwen`), from a fake backend
    /// answering with `script`: the runtime and backend returned must stay alive meanwhile.
    pub fn serve_local_route(
        &self,
        script: crate::fake_models::Script,
    ) -> (tokio::runtime::Runtime, crate::fake_models::FakeBackend) {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let backend = runtime.block_on(crate::fake_models::FakeBackend::start(
            crate::fake_models::Script {
                models: vec!["qwen".into()],
                ..script
            },
        ));
        let routes = tollgate_router::config::Routes::parse(
            &format!(
                "[[route]]\nname = \"local\"\nkind = \"local\"\npreset = \"vllm\"\nendpoint = \"{}\"\nmodel = \"qwen\"\n",
                backend.endpoint
            ),
            "routes.toml",
        )
        .unwrap();
        self.manager
            .set_model_routes(Arc::new(tollgate_router_backends::ModelRoutes {
                backends: tollgate_router_backends::Backends::new(&routes).unwrap(),
                routes,
                classifier: tollgate_router::Classifier::new(&Default::default()).unwrap(),
            }));
        (runtime, backend)
    }

    /// Serves one local model route, `local`, speaking `api` to `endpoint` for `model`, as the
    /// supervisor's routes file would. The runtime returned must stay alive meanwhile.
    pub fn route_local(&self, api: &str, model: &str, endpoint: &str) -> tokio::runtime::Runtime {
        let routes_file = self.data.parent().unwrap().join("routes.toml");
        std::fs::write(
            &routes_file,
            format!(
                "[[route]]\nname = \"local\"\nkind = \"local\"\napi = \"{api}\"\nendpoint = \"{endpoint}\"\nmodel = \"{model}\"\n"
            ),
        )
        .unwrap();
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let routes = runtime
            .block_on(tollgate_router_backends::ModelRoutes::load(
                &routes_file,
                Duration::from_secs(10),
            ))
            .unwrap_or_else(|e| panic!("the supervisor's routes file does not load: {e}"));
        self.manager.set_model_routes(Arc::new(routes));
        runtime
    }

    /// Starts a signed receipt, capturing its output.
    pub fn start(&self, signed: &SignedReceipt) -> Result<String, StartError> {
        self.manager.start(signed, None, self.sink())
    }

    /// Starts a signed receipt that pins no command with `argv`, capturing its output.
    pub fn start_command(
        &self,
        signed: &SignedReceipt,
        argv: Vec<String>,
    ) -> Result<String, StartError> {
        self.manager.start(signed, Some(argv), self.sink())
    }

    /// Nothing of `run_id` is left: no cgroup (the one its report names), no directory, no
    /// live entry.
    pub fn assert_gone(&self, run_id: &str) {
        assert!(!self.manager.live_ids().contains(&run_id.to_owned()));
        assert!(
            !self.data.join("runs").join(run_id).exists(),
            "run directory left"
        );
        let record = self.manager.get(run_id).unwrap().expect("run recorded");
        let cgroup = record
            .report
            .and_then(|report| report.cgroup)
            .expect("the report names the run's cgroup");
        assert!(cgroup.starts_with(&format!("{}/", self.parent)), "{cgroup}");
        let left: Vec<_> = std::fs::read_dir("/sys/fs/cgroup")
            .unwrap()
            .flatten()
            .map(|h| h.path().join(&cgroup))
            .filter(|p| p.exists())
            .collect();
        assert!(left.is_empty(), "cgroups left: {left:?}");
    }
}

impl Drop for RunFixture {
    fn drop(&mut self) {
        self.manager.shutdown();
        let _ = sweep(&self.parent, true);
    }
}

/// Where scripts/test keeps a prepared agent directory: `$var` if set, else
/// `target/<name>` of this workspace. Panics naming scripts/test when it is missing.
fn prepared(var: &str, name: &str, inside: &str) -> PathBuf {
    let dir = std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../target")
            .join(name)
    });
    assert!(
        dir.join(inside).exists(),
        "{} is missing: scripts/test prepares it (or set {var})",
        dir.join(inside).display()
    );
    // Grants name real, normalised paths: no `..`, no link on the way.
    dir.canonicalize().unwrap()
}

/// The receipt an authority would sign for `request` (owner `admin`, valid for ten minutes
/// from now): every grant of the request, as minted, for the fixture to sign.
pub fn receipt_of(request: pb::MintReceiptRequest) -> pb::Receipt {
    let now = unix_now();
    pb::Receipt {
        receipt_id: uuid::Uuid::now_v7().to_string(),
        owner: "admin".into(),
        subject: request.subject,
        audience: request.audience,
        issued_at: Some(timestamp_from_unix(now)),
        not_before: Some(timestamp_from_unix(now)),
        expires_at: Some(timestamp_from_unix(now + 600)),
        agent: request.agent,
        limits: request.limits,
        fs: request.fs,
        exec: request.exec,
        routes: request.routes,
        workspace_keep_seconds: request.workspace_keep_seconds,
        gateway_exec: request.gateway_exec,
        egress: request.egress,
        approval_timeout_seconds: request.approval_timeout_seconds,
        workspace_exec: request.workspace_exec,
        home: request.home,
        rootfs: request.rootfs,
        ..Default::default()
    }
}

/// Where scripts/install-agents put the coding agents: `$TOLLGATE_AGENTS_DIR`, else its
/// defaults (`/usr/local/lib/tollgate-agents` as root).
pub fn agents_dir() -> PathBuf {
    let dir = std::env::var_os("TOLLGATE_AGENTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            if nix::unistd::geteuid().is_root() {
                PathBuf::from("/usr/local/lib/tollgate-agents")
            } else {
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tollgate-agents")
            }
        });
    dir.canonicalize().unwrap_or(dir)
}

/// A directory of the agent's own, as a user's project or home is: owned by an unprivileged
/// user (4321), 0700, so the sandbox shows it id-mapped (the agent is its owner).
pub fn own_dir(path: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::create_dir_all(path).unwrap();
    let status = std::process::Command::new("chown")
        .args(["-R", "4321:4321"])
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700)).unwrap();
}

/// The agents' virtualenv scripts/test makes from the host's `/usr/bin/python3` with the
/// official `openai` SDK (compiled extensions included).
pub fn agent_venv() -> PathBuf {
    prepared("TOLLGATE_AGENT_VENV", "agent-venv", "bin/python")
}

/// The `node_modules` tree scripts/test installs (the `semver` package and its `.bin`).
pub fn agent_node() -> PathBuf {
    prepared(
        "TOLLGATE_AGENT_NODE",
        "agent-node",
        "node_modules/.bin/semver",
    )
}

/// Where [`with_venv_agent`] mounts the virtualenv in the sandbox.
pub const VENV_IN_SANDBOX: &str = "/agent/venv";

/// Makes `receipt` run `script` with the virtualenv's own Python, in place: the venv is a
/// read-only grant mounted at [`VENV_IN_SANDBOX`], executable because its interpreter is in
/// `exec`. `env` is added to the agent's environment.
pub fn with_venv_agent(receipt: &mut pb::Receipt, script: &str, env: &[(&str, &str)]) {
    let python = format!("{VENV_IN_SANDBOX}/bin/python");
    receipt.fs.push(pb::FsGrant {
        path: agent_venv().display().to_string(),
        access: pb::FsAccess::Read as i32,
        mount: VENV_IN_SANDBOX.into(),
        exec: false,
        ask: false,
        ask_reads: false,
    });
    receipt.exec.push(python.clone());
    receipt.agent = Some(pb::AgentSpec {
        argv: vec![python, "-c".into(), script.into()],
        env: env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Default::default()
    });
}
