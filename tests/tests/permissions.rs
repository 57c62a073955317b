//! What another local user can read of the daemons' state: the real supervisor and authority
//! create their data directories 0700 and the supervisor's database (with its `-wal` and
//! `-shm`, where every receipt is) 0600, and refuse a data directory others can enter, naming
//! the `chmod` that fixes it.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Stdio};

use tollgate_tests::{bin_path, require_root, AuthorityProcess};

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

#[test]
fn fresh_data_dirs_are_private_and_looser_ones_are_refused() {
    if !require_root() {
        return;
    }
    // The parent is 0755 like /var/lib, so only the data directories' own modes protect them.
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let authority_dir = tmp.path().join("authority");
    let authority = AuthorityProcess::start(&authority_dir);
    assert_eq!(mode(&authority_dir), 0o700, "authority data dir");

    // A fresh directory: not created by the test helper, by the daemon itself.
    let data = tmp.path().join("fresh").join("supervisor");
    let supervisor = spawn_supervisor(&data, authority.addr());
    let ready = wait_ready(supervisor, &data);
    assert_eq!(mode(&data), 0o700, "supervisor data dir");
    for name in ["supervisor.db", "supervisor.db-wal", "supervisor.db-shm"] {
        assert_eq!(mode(&data.join(name)), 0o600, "{name}");
    }
    assert_eq!(mode(&data.join("admin.token")), 0o600);
    assert_eq!(mode(&data.join("audit")), 0o700);
    stop(ready);

    // The same directory made readable by others: refused at start, one line with the fix.
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    let output = spawn_supervisor(&data, authority.addr())
        .wait_with_output()
        .unwrap();
    assert_eq!(output.status.code(), Some(73), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    let fix = format!("chmod 700 {}", data.display());
    assert!(
        last.contains("mode 755") && last.contains(&fix),
        "want the chmod in the last line: {stderr}"
    );
    assert!(!data.join("supervisor.addr").exists(), "it never served");

    // And the authority likewise.
    drop(authority);
    std::fs::set_permissions(&authority_dir, std::fs::Permissions::from_mode(0o750)).unwrap();
    let (status, stderr) = AuthorityProcess::start_with(&authority_dir, &[])
        .err()
        .expect("a group-readable authority data dir must be refused");
    assert!(status.contains("73"), "exit status {status}: {stderr}");
    let fix = format!("chmod 700 {}", authority_dir.display());
    assert!(
        stderr.lines().last().unwrap_or_default().contains(&fix),
        "{stderr}"
    );
}

/// The supervisor binary on `data` exactly as given (the test helper would make it private).
fn spawn_supervisor(data: &Path, authority: &str) -> std::process::Child {
    Command::new(bin_path("tollgate-supervisor"))
        .arg("--data-dir")
        .arg(data)
        .args(["--id", "workstation", "--listen", "127.0.0.1:0"])
        .args(["--authority", authority])
        .args(["--cgroup-parent", &cgroup_parent()])
        .args(["--host-id-base", "232000", "--host-id-count", "4"])
        .args(["--warm-sandboxes", "0"])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tollgate-supervisor")
}

struct Ready(std::process::Child);

fn wait_ready(mut child: std::process::Child, data: &Path) -> Ready {
    if let Err(why) = tollgate_tests::wait_for_file(
        &data.join("supervisor.addr"),
        &mut child,
        std::time::Duration::from_secs(30),
    ) {
        let _ = child.kill();
        let output = child.wait_with_output().unwrap();
        panic!("{why}: {}", String::from_utf8_lossy(&output.stderr));
    }
    Ready(child)
}

/// SIGTERM: a clean shutdown (the drop then sweeps whatever it left).
fn stop(mut ready: Ready) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(ready.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = ready.0.wait();
}

fn cgroup_parent() -> String {
    format!("tollgate-test-{}-permissions", std::process::id())
}

impl Drop for Ready {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = tollgate_supervisor::cgroup::sweep(&cgroup_parent(), true);
    }
}
