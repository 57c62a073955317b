//! Run cgroups on the real host (root): limits applied and read back, every member killed,
//! removal, and the crash sweep. Each test uses its own parent cgroup and removes it, even
//! when it fails.

use std::io::Write as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tollgate_supervisor::cgroup::{sweep, CgroupLimits, CgroupMode, KillMethod, RunCgroup};

fn require_root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("TOLLGATE_SKIP_ROOT_TESTS").is_some(),
        "cgroup tests need root (CI runs as root); set TOLLGATE_SKIP_ROOT_TESTS=1 to skip them"
    );
    false
}

/// Removes the test's parent cgroup (and anything in it) when dropped.
struct Parent(String);

impl Parent {
    fn new(test: &str) -> Self {
        Self(format!("tollgate-test-{}-{test}", std::process::id()))
    }
    fn run(&self, name: &str) -> String {
        format!("{}/{name}", self.0)
    }
}

impl Drop for Parent {
    fn drop(&mut self) {
        if let Err(e) = sweep(&self.0, true) {
            eprintln!("cleanup of {} failed: {e}", self.0);
        }
    }
}

const LIMITS: CgroupLimits = CgroupLimits {
    memory_bytes: 64 << 20,
    pids: 100,
    cpu_millicores: 500,
};

/// Starts `script` under sh, held at a `read` until it has been placed in `cgroup`.
fn spawn_in(cgroup: &RunCgroup, script: &str) -> Child {
    let mut child = Command::new("/bin/sh")
        .args(["-c", &format!("read go; {script}")])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    cgroup.add_process(child.id()).unwrap();
    child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    child
}

fn wait_for_pids(cgroup: &RunCgroup, at_least: usize) {
    let start = Instant::now();
    while cgroup.pids().unwrap().len() < at_least {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "processes did not start"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn limits_are_applied_and_every_member_is_killed() {
    if !require_root() {
        return;
    }
    kill_and_remove(KillMethod::CgroupKill, "kill");
}

#[test]
fn the_v1_freezer_kill_also_empties_the_cgroup() {
    if !require_root() || CgroupMode::detect() == CgroupMode::Unified {
        // Pure v2 hosts have no freezer controller to test (and need none).
        return;
    }
    kill_and_remove(KillMethod::Freezer, "freezer");
}

fn kill_and_remove(method: KillMethod, test: &str) {
    let parent = Parent::new(test);
    let cgroup = RunCgroup::create(&parent.run("a"), LIMITS).unwrap();
    if method == KillMethod::CgroupKill && cgroup.kill_method() != KillMethod::CgroupKill {
        // A pure v1 host, or a kernel before 5.14: only the freezer exists.
        return;
    }
    for file in cgroup.procs_files() {
        assert!(file.exists(), "{}", file.display());
    }
    let mut child = spawn_in(&cgroup, "for i in $(seq 50); do sleep 1000 & done; wait");
    wait_for_pids(&cgroup, 51);
    let members = cgroup.pids().unwrap();
    cgroup.kill_with(method, Duration::from_secs(5)).unwrap();
    assert!(cgroup.pids().unwrap().is_empty());
    let _ = child.wait();
    for pid in members {
        // Reaped or zombie-then-reaped by init: either way not running.
        let alive = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|stat| !stat.contains(") Z "))
            .unwrap_or(false);
        assert!(!alive, "pid {pid} survived the kill");
    }
    cgroup.remove().unwrap();
    for file in cgroup.procs_files() {
        assert!(
            !file.parent().unwrap().exists(),
            "{} left behind",
            file.display()
        );
    }
}

#[test]
fn pids_limit_stops_a_fork_bomb() {
    if !require_root() {
        return;
    }
    let parent = Parent::new("pids");
    let limits = CgroupLimits { pids: 8, ..LIMITS };
    let cgroup = RunCgroup::create(&parent.run("a"), limits).unwrap();
    let mut child = spawn_in(
        &cgroup,
        "i=0; while [ $i -lt 40 ]; do sleep 1000 & i=$((i+1)); done; wait",
    );
    wait_for_pids(&cgroup, 6);
    // Give the loop time to try all 40 forks; the cgroup must never exceed its limit.
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(300) {
        assert!(cgroup.pids().unwrap().len() <= 8, "{:?}", cgroup.pids());
        std::thread::sleep(Duration::from_millis(10));
    }
    cgroup.kill_all(Duration::from_secs(5)).unwrap();
    let _ = child.wait();
    cgroup.remove().unwrap();
}

#[test]
fn memory_limit_kills_a_memory_bomb() {
    if !require_root() {
        return;
    }
    let parent = Parent::new("memory");
    let limits = CgroupLimits {
        memory_bytes: 16 << 20,
        ..LIMITS
    };
    let cgroup = RunCgroup::create(&parent.run("a"), limits).unwrap();
    // 256 MiB of touched memory, in a cgroup allowed 16 MiB.
    let mut child = spawn_in(
        &cgroup,
        "exec python3 -c 'b = bytearray(256 * 1024 * 1024); print(len(b))'",
    );
    let status = child.wait().unwrap();
    assert!(
        !status.success(),
        "the memory bomb must not complete: {status}"
    );
    assert!(
        cgroup.oom_killed(),
        "the kernel's OOM killer should have acted"
    );
    let peak = cgroup.peak_memory().expect("peak memory");
    assert!(peak <= 16 << 20, "peak {peak} above the limit");
    cgroup.remove().unwrap();
}

#[test]
fn sweep_kills_and_removes_what_a_crash_left() {
    if !require_root() {
        return;
    }
    let parent = Parent::new("sweep");
    let a = RunCgroup::create(&parent.run("a"), LIMITS).unwrap();
    let b = RunCgroup::create(&parent.run("b"), LIMITS).unwrap();
    let mut first = spawn_in(&a, "sleep 1000 & sleep 1000 & wait");
    let mut second = spawn_in(&b, "sleep 1000");
    wait_for_pids(&a, 3);
    wait_for_pids(&b, 1);
    // Forget the handles, as a crashed supervisor would.
    drop((a, b));
    let swept = sweep(&parent.0, true).unwrap();
    assert_eq!(swept, ["a", "b"]);
    assert!(!first.wait().unwrap().success());
    assert!(!second.wait().unwrap().success());
    let left = std::fs::read_dir("/sys/fs/cgroup")
        .unwrap()
        .flatten()
        .any(|hierarchy| hierarchy.path().join(&parent.0).exists());
    assert!(!left, "parent cgroup left behind");
}
