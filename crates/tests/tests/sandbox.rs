//! Real sandboxes (root): the agent runs confined, and what it tries beyond its receipt is
//! refused by the kernel. Every test removes its cgroups and run directories, even on failure.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tollgate_agent_shim::protocol::{AgentExit, FromShim};
use tollgate_proto::v1 as pb;
use tollgate_supervisor::cgroup::{sweep, CgroupLimits, RunCgroup};
use tollgate_supervisor::sandbox::{plan_for, RunDirs, SandboxProcess};
use tollgate_tests::bin_path;

fn require_root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("TOLLGATE_SKIP_ROOT_TESTS").is_some(),
        "sandbox tests need root (CI runs as root); set TOLLGATE_SKIP_ROOT_TESTS=1 to skip them"
    );
    false
}

/// One sandboxed run; cleans up its cgroup parent and directories when dropped.
struct Harness {
    parent: String,
    dirs: RunDirs,
    _tmp: tempfile::TempDir,
    host_data: PathBuf,
}

impl Harness {
    fn new(test: &str) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let dirs = RunDirs::new(&tmp.path().join("runs"), "run");
        let host_data = tmp.path().join("host-data");
        std::fs::create_dir_all(&host_data).unwrap();
        std::fs::write(host_data.join("granted.txt"), "granted content\n").unwrap();
        Self {
            parent: format!("tollgate-test-{}-{test}", std::process::id()),
            dirs,
            host_data,
            _tmp: tmp,
        }
    }

    /// Runs `script` under /bin/sh in a sandbox; returns the agent's exit and its output.
    fn run(&self, script: &str, limits: CgroupLimits, host_id: u32) -> (AgentExit, String) {
        let receipt = pb::Receipt {
            receipt_id: "01900000-0000-7000-8000-00000000abcd".into(),
            exec: ["/bin/sh", "/usr/bin/id", "/usr/bin/cat", "/usr/bin/ls", "/usr/bin/grep"]
                .map(String::from)
                .to_vec(),
            fs: vec![pb::FsGrant {
                path: self.host_data.display().to_string(),
                access: pb::FsAccess::Read as i32,
                mount: "/data".into(),
            }],
            limits: Some(pb::Limits {
                tmpfs_bytes: 8 << 20,
                ..Default::default()
            }),
            ..Default::default()
        };
        self.dirs.create(host_id).unwrap();
        let plan = plan_for(
            &receipt,
            &self.dirs,
            host_id,
            Some(vec!["/bin/sh".into(), "-c".into(), script.into()]),
        )
        .unwrap();
        let cgroup = RunCgroup::create(&format!("{}/run", self.parent), limits).unwrap();
        let output = self.dirs.base.with_extension("out");
        let file = std::fs::File::create(&output).unwrap();
        let (mut sandbox, started) = SandboxProcess::start(
            &bin_path("tollgate-shim"),
            &plan,
            &cgroup,
            Stdio::from(file.try_clone().unwrap()),
            Stdio::from(file),
        )
        .expect("sandbox starts");
        match started {
            FromShim::Started { agent_pid, landlock_abi } => {
                assert_ne!(agent_pid, 1, "the agent is never pid 1");
                assert!(landlock_abi >= 3);
            }
            other => panic!("unexpected {other:?}"),
        }
        let exit = match sandbox.next_event().unwrap() {
            Some(FromShim::Exited(exit)) => exit,
            other => panic!("unexpected {other:?}"),
        };
        sandbox.wait().unwrap();
        cgroup.kill_all(Duration::from_secs(5)).unwrap();
        cgroup.remove().unwrap();
        (exit, std::fs::read_to_string(output).unwrap())
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = sweep(&self.parent, true);
        let _ = self.dirs.remove();
    }
}

const LIMITS: CgroupLimits = CgroupLimits {
    memory_bytes: 128 << 20,
    pids: 64,
    cpu_millicores: 1000,
};

fn line<'a>(output: &'a str, key: &str) -> &'a str {
    output
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in output:\n{output}"))
}

#[test]
fn the_agent_runs_confined() {
    if !require_root() {
        return;
    }
    let harness = Harness::new("confined");
    let script = r#"
echo "uid=$(id -u)"
echo "gid=$(id -g)"
echo "groups=$(id -G)"
echo "pid=$$"
echo "hostname=$(cat /proc/sys/kernel/hostname)"
echo "procs=$(ls /proc | grep -c '^[0-9]')"
echo "capeff=$(grep CapEff /proc/self/status | cut -f2 2>/dev/null || grep CapEff /proc/self/status)"
echo "capbnd=$(grep CapBnd /proc/self/status)"
echo "nnp=$(grep NoNewPrivs /proc/self/status)"
echo "seccomp=$(grep '^Seccomp:' /proc/self/status)"
echo "granted=$(cat /data/granted.txt)"
if echo x > /data/new 2>/dev/null; then echo "data_write=allowed"; else echo "data_write=refused"; fi
if echo x > /work/file 2>/dev/null; then echo "work_write=allowed"; else echo "work_write=refused"; fi
if echo x > /tmp/file 2>/dev/null; then echo "tmp_write=allowed"; else echo "tmp_write=refused"; fi
if echo x > /etc/evil 2>/dev/null; then echo "etc_write=allowed"; else echo "etc_write=refused"; fi
if echo x > /usr/evil 2>/dev/null; then echo "usr_write=allowed"; else echo "usr_write=refused"; fi
if echo x > /evil 2>/dev/null; then echo "root_write=allowed"; else echo "root_write=refused"; fi
if ls /home >/dev/null 2>&1; then echo "home=visible"; else echo "home=hidden"; fi
if ls /root >/dev/null 2>&1; then echo "root_home=visible"; else echo "root_home=hidden"; fi
if ls /sys >/dev/null 2>&1; then echo "sys=visible"; else echo "sys=hidden"; fi
echo "net=$(grep -c ':' /proc/net/dev)"
echo "lo=$(grep -c 'lo:' /proc/net/dev)"
echo "owner=$(ls -ld /work | cut -d' ' -f3)"
exit 7
"#;
    let (exit, output) = harness.run(script, LIMITS, 200_101);
    assert_eq!(exit, AgentExit::Code(7), "{output}");
    assert_eq!(line(&output, "uid"), "1000", "{output}");
    assert_eq!(line(&output, "gid"), "1000", "{output}");
    assert_eq!(line(&output, "groups"), "1000", "no host groups leak: {output}");
    assert_ne!(line(&output, "pid"), "1");
    assert_eq!(line(&output, "hostname"), "tollgate");
    let procs: u32 = line(&output, "procs").parse().unwrap();
    assert!(procs <= 6, "host processes visible: {procs}\n{output}");
    assert!(line(&output, "capeff").contains("0000000000000000"), "{output}");
    assert!(line(&output, "capbnd").contains("0000000000000000"), "{output}");
    assert!(line(&output, "nnp").ends_with('1'), "{output}");
    assert!(line(&output, "seccomp").ends_with('2'), "{output}");
    assert_eq!(line(&output, "granted"), "granted content");
    for (key, want) in [
        ("data_write", "refused"),
        ("work_write", "allowed"),
        ("tmp_write", "allowed"),
        ("etc_write", "refused"),
        ("usr_write", "refused"),
        ("root_write", "refused"),
        ("home", "hidden"),
        ("root_home", "hidden"),
        ("sys", "hidden"),
    ] {
        assert_eq!(line(&output, key), want, "{key}\n{output}");
    }
    // /proc/net/dev: two header lines have no ':'... only "lo:" is an interface.
    assert_eq!(line(&output, "lo"), "1", "{output}");
    assert_eq!(line(&output, "net"), "1", "only loopback: {output}");
    // The workspace file is owned by the sandbox's own host id.
    let owner = std::os::unix::fs::MetadataExt::uid(
        &std::fs::metadata(harness.dirs.work.join("file")).unwrap(),
    );
    assert_eq!(owner, 200_101);
}

#[test]
fn exec_outside_the_list_is_refused() {
    if !require_root() {
        return;
    }
    let harness = Harness::new("exec");
    // /usr/bin/env is on the host but not in the receipt's exec list.
    let (exit, output) = harness.run(
        "if /usr/bin/env true 2>/dev/null; then echo exec=allowed; else echo exec=refused; fi",
        LIMITS,
        200_102,
    );
    assert_eq!(exit, AgentExit::Code(0));
    assert_eq!(line(&output, "exec"), "refused", "{output}");
}

#[test]
fn a_missing_run_leaves_nothing_behind() {
    if !require_root() {
        return;
    }
    let harness = Harness::new("cleanup");
    let (exit, _) = harness.run("sleep 1000 & sleep 1000 & exit 0", LIMITS, 200_103);
    assert_eq!(exit, AgentExit::Code(0));
    // pid 1 exited with the agent, so the kernel killed the background sleeps.
    let leftovers = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("cmdline")).ok())
        .filter(|cmd| cmd.starts_with("sleep\0001000"))
        .count();
    assert_eq!(leftovers, 0);
    drop(harness);
    assert!(!Path::new("/sys/fs/cgroup/pids").join(format!("tollgate-test-{}-cleanup", std::process::id())).exists());
}
