//! Run cgroups on the real host (root): limits applied and read back, every member killed,
//! removal, and the crash sweep. Each test uses its own parent cgroup and removes it, even
//! when it fails.

use std::io::Write as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tollgate_supervisor::cgroup::{
    delegate_to, is_shard, make_shards, raise_for_stop, restore_left, sandbox_cgroups,
    sandbox_path, sweep, sweep_keeping, CgroupLimits, CgroupMode, KillMethod, RunCgroup, SHARDS,
    SUPERVISOR_LEAF,
};

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

/// The run's directory in every hierarchy, from how a process joins it.
fn hierarchy_dirs(cgroup: &RunCgroup) -> Vec<std::path::PathBuf> {
    let join = cgroup.join();
    join.v1_tasks
        .iter()
        .filter_map(|tasks| tasks.parent().map(ToOwned::to_owned))
        .chain(join.v2_dir)
        .collect()
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

/// The lane that boots a pure v2 guest (scripts/cgroup-v2-lane) says which mode it expects,
/// so that a detection mistake cannot quietly test the wrong path.
#[test]
fn the_cgroup_mode_is_the_one_this_host_is_expected_to_have() {
    let detected = CgroupMode::detect();
    eprintln!("cgroup mode: {detected:?}");
    if let Ok(expected) = std::env::var("TOLLGATE_EXPECT_CGROUP_MODE") {
        assert_eq!(format!("{detected:?}").to_lowercase(), expected);
    }
}

fn kill_and_remove(method: KillMethod, test: &str) {
    let parent = Parent::new(test);
    let cgroup = match method {
        KillMethod::CgroupKill => RunCgroup::create(&parent.run("a"), LIMITS).unwrap(),
        // Runs on a host with a v2 tree never use the freezer: made as on pure v1.
        KillMethod::Freezer => RunCgroup::create_as_v1_only(&parent.run("a"), LIMITS).unwrap(),
    };
    if *cgroup.mode() == CgroupMode::Hybrid {
        // The v2 directory tracks membership and kills: no freezer directory is made.
        let freezer = std::path::Path::new("/sys/fs/cgroup/freezer").join(parent.run("a"));
        assert!(!freezer.exists(), "{} was made", freezer.display());
    }
    if *cgroup.mode() != CgroupMode::Legacy {
        // cgroup.kill came with 5.14; every kernel this runs on has it, on v2 and hybrid.
        assert_eq!(cgroup.kill_method(), KillMethod::CgroupKill);
    } else {
        assert_eq!(cgroup.kill_method(), KillMethod::Freezer);
    }
    if method == KillMethod::CgroupKill && cgroup.kill_method() != KillMethod::CgroupKill {
        // A pure v1 host, or a kernel before 5.14: only the freezer exists.
        return;
    }
    for dir in hierarchy_dirs(&cgroup) {
        assert!(dir.exists(), "{}", dir.display());
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
    for dir in hierarchy_dirs(&cgroup) {
        assert!(!dir.exists(), "{} left behind", dir.display());
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

/// Sandboxes go into shards under the parent, made all at once beforehand; a restart's sweep
/// kills and removes every sandbox not re-adopted and keeps a re-adopted one, and the shards;
/// a stop's sweep then leaves nothing at all, the shards and the parent included.
#[test]
fn sandboxes_live_in_shards_that_a_stop_removes_with_them() {
    if !require_root() {
        return;
    }
    let parent = Parent::new("shards");
    // Every hierarchy's root: on pure v2 the one tree, else each v1 controller and the v2
    // tree beside them.
    let roots: Vec<std::path::PathBuf> = if CgroupMode::detect() == CgroupMode::Unified {
        vec!["/sys/fs/cgroup".into()]
    } else {
        std::fs::read_dir("/sys/fs/cgroup")
            .unwrap()
            .flatten()
            .map(|h| h.path())
            .collect()
    };
    let under_parent = || -> std::collections::BTreeSet<String> {
        roots
            .iter()
            .flat_map(|root| {
                std::fs::read_dir(root.join(&parent.0))
                    .into_iter()
                    .flatten()
                    .flatten()
            })
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    };
    make_shards(&parent.0).unwrap();
    let shards = under_parent();
    assert_eq!(shards.len(), SHARDS as usize, "{shards:?}");
    assert!(shards.iter().all(|name| is_shard(name)), "{shards:?}");
    // Made again (a restart): nothing changes.
    make_shards(&parent.0).unwrap();
    assert_eq!(under_parent(), shards);
    // Only where runs' cgroups go: a hybrid host's runs have no freezer cgroup.
    if CgroupMode::detect() == CgroupMode::Hybrid {
        let freezer = std::path::Path::new("/sys/fs/cgroup/freezer").join(&parent.0);
        assert!(!freezer.exists(), "shards made in the freezer hierarchy");
    }

    let ids = ["sandbox-a", "sandbox-b", "sandbox-c"];
    let cgroups: Vec<RunCgroup> = ids
        .iter()
        .map(|id| RunCgroup::create(&sandbox_path(&parent.0, id), LIMITS).unwrap())
        .collect();
    let mut children: Vec<Child> = cgroups
        .iter()
        .map(|cgroup| spawn_in(cgroup, "sleep 1000"))
        .collect();
    for cgroup in &cgroups {
        wait_for_pids(cgroup, 1);
        let (shard, _) = cgroup
            .relative()
            .strip_prefix(&format!("{}/", parent.0))
            .and_then(|rest| rest.split_once('/'))
            .expect("a sandbox is one level below the parent");
        assert!(shards.contains(shard), "{}", cgroup.relative());
    }
    let in_shard = |id: &str| {
        sandbox_path(&parent.0, id)
            .strip_prefix(&format!("{}/", parent.0))
            .unwrap()
            .to_owned()
    };
    let mut all: Vec<String> = ids.iter().map(|id| in_shard(id)).collect();
    all.sort();
    assert_eq!(sandbox_cgroups(&parent.0), all);

    let keep: std::collections::BTreeSet<String> = ["sandbox-c".to_owned()].into();
    let mut swept = sweep_keeping(&parent.0, false, &keep).unwrap();
    swept.sort();
    let mut expected = vec![in_shard("sandbox-a"), in_shard("sandbox-b")];
    expected.sort();
    assert_eq!(swept, expected);
    for child in &mut children[..2] {
        assert!(!child.wait().unwrap().success());
    }
    assert_eq!(sandbox_cgroups(&parent.0), [in_shard("sandbox-c")]);
    assert_eq!(
        under_parent(),
        shards,
        "the shards stay for the runs to come"
    );

    assert_eq!(sweep(&parent.0, true).unwrap(), [in_shard("sandbox-c")]);
    assert!(!children[2].wait().unwrap().success());
    assert!(under_parent().is_empty());
    let left = roots.iter().any(|root| root.join(&parent.0).exists());
    assert!(!left, "parent cgroup left behind");
}

/// Removes a nested parent's levels deepest first (each level's runs with it).
struct NestedParent(Vec<String>);

impl Drop for NestedParent {
    fn drop(&mut self) {
        for level in self.0.iter().rev() {
            if let Err(e) = sweep(level, true) {
                eprintln!("cleanup of {level} failed: {e}");
            }
        }
    }
}

/// A parent several levels deep (`--cgroup-parent team/agents`): on v2 every level passes the
/// controllers down, so the run has its limit files and its limits hold.
#[test]
fn a_parent_nested_several_levels_deep_delegates_the_controllers() {
    if !require_root() {
        return;
    }
    let top = format!("tollgate-test-{}-nested", std::process::id());
    let levels = vec![
        top.clone(),
        format!("{top}/team"),
        format!("{top}/team/agents"),
    ];
    let _cleanup = NestedParent(levels.clone());
    let cgroup = RunCgroup::create(&format!("{}/a", levels[2]), LIMITS).unwrap();
    if *cgroup.mode() == CgroupMode::Unified {
        for level in &levels {
            let control =
                std::fs::read_to_string(format!("/sys/fs/cgroup/{level}/cgroup.subtree_control"))
                    .unwrap();
            for controller in ["memory", "pids", "cpu"] {
                assert!(control.contains(controller), "{level}: {control}");
            }
        }
    }
    let mut child = spawn_in(&cgroup, "sleep 1000");
    wait_for_pids(&cgroup, 1);
    cgroup.kill_all(Duration::from_secs(5)).unwrap();
    let _ = child.wait();
    cgroup.remove().unwrap();
}

/// Set in the child that runs inside its own cgroup namespace.
const IN_CONTAINER: &str = "TOLLGATE_TEST_IN_CGROUP_NAMESPACE";
/// The runs' parent inside that namespace.
const CONTAINER_PARENT: &str = "tollgate-runs";

/// A supervisor in a container: its own cgroup namespace, whose root (its own cgroup) holds
/// its processes and has no controllers enabled for children. The kernel refuses to delegate
/// from a cgroup with processes in it, so the runs' cgroups would have no limit files; the
/// supervisor moves its own cgroup's processes into a leaf first. Pure v2 only (the lane in
/// scripts/cgroup-v2-lane runs it): hybrid hosts keep their controllers on v1.
#[test]
fn a_supervisor_in_its_own_cgroup_namespace_moves_into_a_leaf_to_delegate() {
    if std::env::var_os(IN_CONTAINER).is_some() {
        return in_own_cgroup_namespace();
    }
    if !require_root() || CgroupMode::detect() != CgroupMode::Unified {
        return;
    }
    let pod = format!("tollgate-test-{}-pod", std::process::id());
    let pod_dir = std::path::PathBuf::from("/sys/fs/cgroup").join(&pod);
    // The root enables the controllers for the pod, as a container runtime does, and no more.
    delegate_to("").unwrap();
    std::fs::create_dir(&pod_dir).unwrap();
    let _cleanup = CgroupTree(pod_dir.clone());
    let script = format!(
        "echo $$ > {procs} && exec unshare --cgroup --mount --propagation private sh -c \
         'umount /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup && exec \"$0\" --exact \
         a_supervisor_in_its_own_cgroup_namespace_moves_into_a_leaf_to_delegate --nocapture' \"$0\"",
        procs = pod_dir.join("cgroup.procs").display(),
    );
    let output = Command::new("/bin/sh")
        .args([
            "-c",
            &script,
            std::env::current_exe().unwrap().to_str().unwrap(),
        ])
        .env(IN_CONTAINER, "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("1 passed"), "{text}");
    assert!(pod_dir.join(SUPERVISOR_LEAF).is_dir(), "{text}");
}

/// The half that runs in the container: start runs as the supervisor would.
fn in_own_cgroup_namespace() {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    assert_eq!(own.trim(), "0::/", "not at the root of a cgroup namespace");
    let cgroup = RunCgroup::create(&format!("{CONTAINER_PARENT}/a"), LIMITS).unwrap();
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    assert_eq!(own.trim(), format!("0::/{SUPERVISOR_LEAF}"));
    let limit =
        std::fs::read_to_string(format!("/sys/fs/cgroup/{CONTAINER_PARENT}/a/memory.max")).unwrap();
    assert_eq!(limit.trim(), (64u64 << 20).to_string());
    let mut child = spawn_in(&cgroup, "sleep 1000");
    wait_for_pids(&cgroup, 1);
    cgroup.kill_all(Duration::from_secs(5)).unwrap();
    let _ = child.wait();
    cgroup.remove().unwrap();
    assert!(sweep(CONTAINER_PARENT, true).unwrap().is_empty());
    // Later runs find the delegation in place and the supervisor where it moved.
    let again = RunCgroup::create(&format!("{CONTAINER_PARENT}/b"), LIMITS).unwrap();
    again.remove().unwrap();
    assert!(sweep(CONTAINER_PARENT, true).unwrap().is_empty());
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    assert_eq!(own.trim(), format!("0::/{SUPERVISOR_LEAF}"));
}

/// Kills everything in a cgroup and removes it with everything below it, deepest first.
struct CgroupTree(std::path::PathBuf);

impl Drop for CgroupTree {
    fn drop(&mut self) {
        fn remove(dir: &std::path::Path) {
            let _ = std::fs::write(dir.join("cgroup.kill"), "1");
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                if entry.path().is_dir() {
                    remove(&entry.path());
                }
            }
            let start = Instant::now();
            while std::fs::remove_dir(dir).is_err() && start.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        remove(&self.0);
    }
}

/// The start-up sweep removes every run cgroup under the parent but the supervisor's own leaf
/// (there when the parent is the supervisor's own delegated cgroup).
#[test]
fn the_sweep_leaves_the_supervisors_own_leaf_alone() {
    if !require_root() {
        return;
    }
    let parent = Parent::new("leaf");
    let leaf = RunCgroup::create_unlimited(&parent.run(SUPERVISOR_LEAF)).unwrap();
    let _run = RunCgroup::create_unlimited(&parent.run("r")).unwrap();
    assert_eq!(sweep(&parent.0, false).unwrap(), ["r"]);
    assert!(hierarchy_dirs(&leaf).iter().all(|dir| dir.exists()));
    leaf.remove().unwrap();
}

/// Watches `dirs` for writes to their files (inotify: a write is `IN_MODIFY`).
struct WriteWatch(std::os::fd::OwnedFd);

impl WriteWatch {
    fn new(dirs: &[std::path::PathBuf]) -> Self {
        use std::os::fd::FromRawFd as _;
        use std::os::unix::ffi::OsStrExt as _;
        #[allow(unsafe_code)]
        // SAFETY: inotify_init1 takes flags only; the new descriptor is owned here.
        let fd = unsafe {
            std::os::fd::OwnedFd::from_raw_fd(libc::inotify_init1(
                libc::IN_NONBLOCK | libc::IN_CLOEXEC,
            ))
        };
        for dir in dirs {
            let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
            #[allow(unsafe_code)]
            // SAFETY: a live NUL-terminated path and a descriptor this watch owns.
            let added = unsafe {
                libc::inotify_add_watch(
                    std::os::fd::AsRawFd::as_raw_fd(&fd),
                    path.as_ptr(),
                    libc::IN_MODIFY,
                )
            };
            assert!(added >= 0, "watching {}", dir.display());
        }
        Self(fd)
    }

    /// Whether any file was written since the last call.
    fn written(&self) -> bool {
        let mut events = [0u8; 4096];
        nix::unistd::read(&self.0, &mut events).is_ok_and(|n| n > 0)
    }
}

#[test]
fn limits_already_held_are_not_written_again_and_limits_can_rise() {
    if !require_root() {
        return;
    }
    let parent = Parent::new("rewrite");
    let cgroup = RunCgroup::create(&parent.run("r"), LIMITS).unwrap();
    // What a sandbox prepared with one run's limits and taken by another needs: higher
    // limits (memory+swap rises before memory), then lower ones, each read back.
    let higher = CgroupLimits {
        memory_bytes: 128 << 20,
        pids: 200,
        cpu_millicores: 1000,
    };
    cgroup.apply_limits(higher).unwrap();
    cgroup.apply_limits(LIMITS).unwrap();
    // The same limits again: nothing is written (a CPU quota write walks every CPU cgroup on
    // the host).
    let watch = WriteWatch::new(&hierarchy_dirs(&cgroup));
    cgroup.apply_limits(LIMITS).unwrap();
    assert!(
        !watch.written(),
        "limits the cgroup held were written again"
    );
    // The watch sees writes: different limits are written.
    cgroup.apply_limits(higher).unwrap();
    assert!(watch.written(), "the watch saw no write at all");
}

/// The file that weighs `parent` against its siblings for the CPU on this host, and the
/// highest value it takes: v1 `cpu.shares`, or v2 `cpu.weight` on a unified host.
fn weight_file(parent: &str) -> (std::path::PathBuf, &'static str) {
    if CgroupMode::detect() == CgroupMode::Unified {
        (
            std::path::Path::new("/sys/fs/cgroup")
                .join(parent)
                .join("cpu.weight"),
            "10000",
        )
    } else {
        let cpu = ["/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"]
            .into_iter()
            .map(std::path::Path::new)
            .find(|dir| dir.join("cpu.shares").exists())
            .expect("a v1 cpu hierarchy");
        (cpu.join(parent).join("cpu.shares"), "262144")
    }
}

/// A stop raises the parent's CPU weight to the highest the kernel takes and puts it back;
/// the record of what it was is written first and removed after. A stop that never put it
/// back (its supervisor died) leaves the record, from which the next start puts it back,
/// unless someone set the weight meanwhile.
#[test]
fn a_stop_raises_the_parents_cpu_weight_and_puts_it_back() {
    if !require_root() {
        return;
    }
    let parent = Parent::new("weight");
    make_shards(&parent.0).unwrap();
    let (file, most) = weight_file(&parent.0);
    let read = || std::fs::read_to_string(&file).unwrap().trim().to_owned();
    let before = read();
    assert_ne!(before, most, "a new cgroup starts at the default weight");
    let data = tempfile::tempdir().unwrap();
    let record = data.path().join("stop-cpu-weight.json");

    let weight = raise_for_stop(&parent.0, &record).unwrap();
    assert!(weight.raised_any());
    assert_eq!(read(), most);
    assert!(
        record.exists(),
        "the record is on disk while the weight is raised"
    );
    weight.restore().unwrap();
    assert_eq!(read(), before);
    assert!(!record.exists());

    // A supervisor that died mid-stop: raised, never restored.
    std::mem::forget(raise_for_stop(&parent.0, &record).unwrap());
    assert_eq!(read(), most);
    assert_eq!(restore_left(&record).unwrap(), 1);
    assert_eq!(read(), before);
    assert!(!record.exists());

    // Set by someone else after the stop raised it: left as they set it.
    std::mem::forget(raise_for_stop(&parent.0, &record).unwrap());
    let theirs = if most == "10000" { "300" } else { "3072" };
    std::fs::write(&file, theirs).unwrap();
    assert_eq!(restore_left(&record).unwrap(), 0);
    assert_eq!(read(), theirs);
    assert!(!record.exists());

    // Already at the highest, with a record this stop did not write (one a crashed stop left
    // that could not be read back): nothing raised, and that record kept for its operator.
    std::fs::write(&file, most).unwrap();
    std::fs::write(&record, "left by another stop").unwrap();
    let weight = raise_for_stop(&parent.0, &record).unwrap();
    assert!(!weight.raised_any());
    weight.restore().unwrap();
    assert_eq!(read(), most);
    assert_eq!(
        std::fs::read_to_string(&record).unwrap(),
        "left by another stop"
    );
}
