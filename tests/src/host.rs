//! The host and the build: the repository and its binaries, root, the cgroups and run
//! directories runs leave, daemons' data directories and readiness files, and how a daemon
//! is launched (its cgroup parent, a command prefix). A leaf of the harness.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

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

/// The file that weighs cgroup `parent` against its siblings for the CPU: the v1 `cpu`
/// controller's `cpu.shares`, or v2's `cpu.weight` on a unified host.
pub fn cpu_weight_file(parent: &str) -> PathBuf {
    ["/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"]
        .into_iter()
        .map(Path::new)
        .find(|v1| v1.join("cpu.shares").exists())
        .map(|v1| v1.join(parent).join("cpu.shares"))
        .unwrap_or_else(|| Path::new("/sys/fs/cgroup").join(parent).join("cpu.weight"))
}

/// Whether the sandbox cgroup `name` under `parent` (`shard-NN/sandbox-…`) is a warm one:
/// prepared ahead of need, holding only an idle shim and its pid 1 (no agent: every process a
/// `tollgate-shim`), or, while the first is still being prepared, nothing yet and no limits.
/// (A warm sandbox holds the limits of the run that took the one before it, so its limits do
/// not tell.)
pub fn is_warm(parent: &str, name: &str) -> bool {
    let dir = pids_cgroup_dir(parent).join(name);
    let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) else {
        return false;
    };
    if procs.trim().is_empty() {
        return std::fs::read_to_string(dir.join("pids.max")).is_ok_and(|max| max.trim() == "max");
    }
    procs.lines().all(|pid| {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|comm| comm.trim() == "tollgate-shim")
    })
}

/// What is left of runs: sandbox cgroups under `parent` (in its shards) other than (at most
/// one) warm sandbox, and run directories. A live supervisor's shards are not left-overs; a
/// stopped one's parent is checked by the tests that stop it.
pub fn leftovers(data_dir: &Path, parent: &str) -> Vec<String> {
    let names = tollgate_supervisor::cgroup::sandbox_cgroups(parent);
    let warm: Vec<&String> = names.iter().filter(|n| is_warm(parent, n)).collect();
    let mut left: Vec<String> = names
        .iter()
        .filter(|name| !warm.contains(name))
        .map(|name| format!("cgroup {parent}/{name}"))
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

/// The cgroup parent of the supervisor of test `test` in this test process (its own, so
/// tests running at once never sweep each other's runs).
pub(crate) fn cgroup_parent_of(test: &str) -> String {
    format!("tollgate-test-{}-{test}", std::process::id())
}

/// `program` run through the command `prefix` (none: directly).
pub(crate) fn command_on(prefix: &[String], program: PathBuf) -> Command {
    match prefix.split_first() {
        Some((first, rest)) => {
            let mut command = Command::new(first);
            command.args(rest).arg(program);
            command
        }
        None => Command::new(program),
    }
}
