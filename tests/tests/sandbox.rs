//! Real sandboxes (root): the agent runs confined, and what it tries beyond its receipt is
//! refused by the kernel. Every test removes its cgroups and run directories, even on failure.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tollgate_proto::v1 as pb;
use tollgate_shim_protocol::protocol::{AgentExit, FromShim};
use tollgate_supervisor::beneath::{detached_mount, GrantRoot};
use tollgate_supervisor::cgroup::{sweep, CgroupLimits, RunCgroup};
use tollgate_supervisor::sandbox::{
    create_mount_point, plan_for, sandbox_base, IdleShim, RunDirs, SandboxProcess, Spawner,
};
use tollgate_tests::{bin_path, require_root};

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
        self.run_argv(
            vec!["/bin/sh".into(), "-c".into(), script.into()],
            &[],
            limits,
            host_id,
        )
    }

    /// Runs `argv` (whose program, plus `extra_exec`, is added to the exec list).
    fn run_argv(
        &self,
        argv: Vec<String>,
        extra_exec: &[&str],
        limits: CgroupLimits,
        host_id: u32,
    ) -> (AgentExit, String) {
        let mut exec: Vec<String> = [
            "/bin/sh",
            "/usr/bin/id",
            "/usr/bin/cat",
            "/usr/bin/ls",
            "/usr/bin/grep",
        ]
        .map(String::from)
        .to_vec();
        exec.extend(extra_exec.iter().map(|e| e.to_string()));
        exec.push(argv[0].clone());
        let receipt = pb::Receipt {
            receipt_id: "01900000-0000-7000-8000-00000000abcd".into(),
            exec,
            fs: vec![pb::FsGrant {
                path: self.host_data.display().to_string(),
                access: pb::FsAccess::Read as i32,
                mount: "/data".into(),
                exec: false,
                ask: false,
                ask_reads: false,
            }],
            limits: Some(pb::Limits {
                tmpfs_bytes: 8 << 20,
                ..Default::default()
            }),
            ..Default::default()
        };
        self.dirs.create(host_id).unwrap();
        let plan = plan_for(&receipt, &self.dirs, host_id, Some(argv), None).unwrap();
        let cgroup = RunCgroup::create(&format!("{}/run", self.parent), limits).unwrap();
        let base = sandbox_base(
            &self.dirs.base.with_extension("data"),
            &bin_path("tollgate-shim"),
        );
        create_mount_point(&base).unwrap();
        let spawner = Spawner::start(bin_path("tollgate-shim"), base.clone());
        let shim = IdleShim::spawn(&spawner, &cgroup, &base).expect("shim spawns");
        // Each mounted grant goes to the shim as a detached mount of its pinned descriptor.
        let grant = GrantRoot::open(&receipt.fs[0].path).expect("grant pins");
        let mounts = vec![detached_mount(&grant).expect("grant clones")];
        let (mut sandbox, started, output) =
            SandboxProcess::start(shim, &plan, mounts).expect("sandbox starts");
        // Read both streams on their own threads so a chatty agent never blocks on a pipe.
        let read = |mut pipe: std::io::PipeReader| {
            std::thread::spawn(move || {
                let mut text = String::new();
                let _ = std::io::Read::read_to_string(&mut pipe, &mut text);
                text
            })
        };
        let (stdout, stderr) = (read(output.stdout), read(output.stderr));
        match started {
            FromShim::Started {
                agent_pid,
                landlock_abi,
                ..
            } => {
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
        let text = stdout.join().unwrap() + &stderr.join().unwrap();
        (exit, text)
    }
}

impl Harness {
    /// Starts `true` in a sandbox whose plan `adjust` changes first, expecting a set-up step to
    /// fail: the error, with the cgroup removed again.
    fn start_failing(
        &self,
        adjust: impl Fn(&mut tollgate_shim_protocol::plan::SandboxPlan),
        host_id: u32,
    ) -> String {
        let receipt = pb::Receipt {
            receipt_id: "01900000-0000-7000-8000-00000000abce".into(),
            exec: vec!["/bin/true".into()],
            fs: vec![pb::FsGrant {
                path: self.host_data.display().to_string(),
                access: pb::FsAccess::Read as i32,
                mount: "/data".into(),
                exec: false,
                ask: false,
                ask_reads: false,
            }],
            ..Default::default()
        };
        self.dirs.create(host_id).unwrap();
        let mut plan = plan_for(
            &receipt,
            &self.dirs,
            host_id,
            Some(vec!["/bin/true".into()]),
            None,
        )
        .unwrap();
        adjust(&mut plan);
        let cgroup = RunCgroup::create(&format!("{}/run", self.parent), LIMITS).unwrap();
        let base = sandbox_base(
            &self.dirs.base.with_extension("data"),
            &bin_path("tollgate-shim"),
        );
        create_mount_point(&base).unwrap();
        let spawner = Spawner::start(bin_path("tollgate-shim"), base.clone());
        let shim = IdleShim::spawn(&spawner, &cgroup, &base).expect("shim spawns");
        let grant = GrantRoot::open(&receipt.fs[0].path).expect("grant pins");
        let mounts = vec![detached_mount(&grant).expect("grant clones")];
        let error = match SandboxProcess::start(shim, &plan, mounts) {
            Ok(_) => panic!("the sandbox started"),
            Err(e) => e.to_string(),
        };
        cgroup.kill_all(Duration::from_secs(5)).unwrap();
        cgroup.remove().unwrap();
        self.dirs.remove().unwrap();
        error
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
    assert_eq!(
        line(&output, "groups"),
        "1000",
        "no host groups leak: {output}"
    );
    assert_ne!(line(&output, "pid"), "1");
    assert_eq!(line(&output, "hostname"), "tollgate");
    let procs: u32 = line(&output, "procs").parse().unwrap();
    assert!(procs <= 6, "host processes visible: {procs}\n{output}");
    assert!(
        line(&output, "capeff").contains("0000000000000000"),
        "{output}"
    );
    assert!(
        line(&output, "capbnd").contains("0000000000000000"),
        "{output}"
    );
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

/// `/tmp` holds the receipt's `tmpfs` size (8 MiB here) and no more, and the rest of the root
/// stays read-only to the agent: `/tmp` is a writable bind of a directory of the root's own
/// tmpfs, grown by that size when the plan arrives.
#[test]
fn tmp_holds_the_receipts_size_and_no_more() {
    if !require_root() {
        return;
    }
    let harness = Harness::new("tmp-size");
    let script = r#"
if cat /dev/zero > /tmp/fill 2>/dev/null; then echo "fill=ended"; else echo "fill=full"; fi
set -- $(ls -ln /tmp/fill); echo "filled=$5"
if echo x > /tmp/more 2>/dev/null; then echo "more=allowed"; else echo "more=refused"; fi
: > /tmp/fill
if echo x > /tmp/again 2>/dev/null; then echo "again=allowed"; else echo "again=refused"; fi
if mkdir /evil 2>/dev/null; then echo "root_dir=allowed"; else echo "root_dir=refused"; fi
grep ' / / ' /proc/self/mountinfo | { read -r _ _ _ _ _ options _; echo "root_mount=$options"; }
grep ' /tmp ' /proc/self/mountinfo | { read -r _ _ _ _ _ options _; echo "tmp_mount=$options"; }
"#;
    let (exit, output) = harness.run_argv(
        vec!["/bin/sh".into(), "-c".into(), script.into()],
        &["/usr/bin/mkdir"],
        LIMITS,
        200_108,
    );
    assert_eq!(exit, AgentExit::Code(0), "{output}");
    assert_eq!(line(&output, "fill"), "full", "{output}");
    let filled: u64 = line(&output, "filled").parse().unwrap();
    // All of the 8 MiB, less at most a few pages the agent's own files took.
    assert!(
        ((8 << 20) - (64 << 10)..=8 << 20).contains(&filled),
        "/tmp took {filled} bytes, not the receipt's 8 MiB\n{output}"
    );
    assert_eq!(line(&output, "more"), "refused", "{output}");
    assert_eq!(
        line(&output, "again"),
        "allowed",
        "space comes back\n{output}"
    );
    assert_eq!(line(&output, "root_dir"), "refused", "{output}");
    let root = line(&output, "root_mount");
    assert!(root.split(',').any(|o| o == "ro"), "{root}\n{output}");
    let tmp = line(&output, "tmp_mount");
    for option in ["rw", "nosuid", "nodev", "noexec"] {
        assert!(
            tmp.split(',').any(|o| o == option),
            "{option}: {tmp}\n{output}"
        );
    }
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
    let (exit, _) = harness.run("sleep 4242 & sleep 4242 & exit 0", LIMITS, 200_103);
    assert_eq!(exit, AgentExit::Code(0));
    // pid 1 exited with the agent, so the kernel killed the background sleeps.
    let leftovers = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("cmdline")).ok())
        .filter(|cmd| cmd.starts_with("sleep\u{0}4242"))
        .count();
    assert_eq!(leftovers, 0);
    drop(harness);
    assert!(!Path::new("/sys/fs/cgroup/pids")
        .join(format!("tollgate-test-{}-cleanup", std::process::id()))
        .exists());
}

/// Each line: `name=result`, where result is "refused", or what happened instead.
const ESCAPES: &str = r#"
import ctypes, errno, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
def attempt(name, call):
    try:
        result = call()
    except OSError as e:
        print(f"{name}=refused" if e.errno in (errno.EPERM, errno.EACCES, errno.EINVAL, errno.ENOSYS, errno.ENOENT, errno.ENETUNREACH, errno.ECONNREFUSED, errno.EROFS) else f"{name}=errno{e.errno}")
        return
    print(f"{name}=ALLOWED:{result}")
def syscall(nr, *args):
    def call():
        r = libc.syscall(nr, *args)
        if r == -1:
            raise OSError(ctypes.get_errno(), "")
        return r
    return call
SYS = {"unshare": 272, "mount": 165, "ptrace": 101, "bpf": 321, "io_uring_setup": 425,
       "keyctl": 250, "perf_event_open": 298, "userfaultfd": 323, "setns": 308,
       "kexec_load": 246, "init_module": 175, "open_by_handle_at": 304}
attempt("userns", syscall(SYS["unshare"], 0x10000000))
attempt("mount", syscall(SYS["mount"], b"none", b"/tmp", b"tmpfs", 0, None))
attempt("ptrace", syscall(SYS["ptrace"], 16, 1, 0, 0))
attempt("bpf", syscall(SYS["bpf"], 0, None, 0))
attempt("io_uring", syscall(SYS["io_uring_setup"], 8, ctypes.create_string_buffer(120)))
attempt("keyctl", syscall(SYS["keyctl"], 0, 0))
attempt("perf", syscall(SYS["perf_event_open"], ctypes.create_string_buffer(128), 0, -1, -1, 0))
attempt("userfaultfd", syscall(SYS["userfaultfd"], 0))
attempt("kexec", syscall(SYS["kexec_load"], 0, 0, None, 0))
attempt("module", syscall(SYS["init_module"], None, 0, b""))
attempt("by_handle", syscall(SYS["open_by_handle_at"], -100, ctypes.create_string_buffer(16), 0))
attempt("setuid0", lambda: os.setuid(0))
attempt("shadow", lambda: open("/etc/shadow").read())
def below_root():
    # The base the sandbox's root was built on lies beneath it in its mount namespace.
    if os.stat("/..").st_ino != os.stat("/").st_ino or sorted(os.listdir("/..")) != sorted(os.listdir("/")):
        return "/.. is not /"
    if os.path.lexists("/.tollgate-dev") or os.path.lexists("/.tollgate-masked"):
        return "the base's own entries show"
    mounts = open("/proc/self/mountinfo").read()
    if "tollgate-base" in mounts or ".tollgate-dev" in mounts:
        return "the base's mounts are listed"
    raise OSError(errno.EACCES, "out of reach")
attempt("below_root", below_root)
attempt("chroot", syscall(161, b"/tmp"))
attempt("cgroup", lambda: open("/sys/fs/cgroup/cgroup.procs", "w").write("1"))
attempt("host_port", lambda: socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2))
attempt("internet", lambda: socket.create_connection(("10.0.0.1", 80), timeout=2))
attempt("kill_host_init", lambda: os.kill(1, 9))
import glob, shutil, subprocess
def through_loader(directory):
    def call():
        loader = sorted(glob.glob("/lib64/ld-linux*.so*") + glob.glob("/lib/ld-linux*.so*"))[0]
        copy = os.path.join(directory, "copied-true")
        shutil.copy("/usr/bin/true", copy)
        result = subprocess.run([loader, copy], capture_output=True)
        if result.returncode == 0:
            return "ran"
        raise OSError(errno.EACCES, result.stderr.decode())
    return call
attempt("loader_tmp", through_loader("/tmp"))
attempt("loader_work", through_loader("/work"))
def memfd_exec():
    fd = os.memfd_create("payload", 0)
    os.write(fd, open("/usr/bin/true", "rb").read())
    result = subprocess.run([f"/proc/self/fd/{fd}"], pass_fds=(fd,))
    if result.returncode == 0:
        return "ran"
    raise OSError(errno.EACCES, "")
attempt("memfd_exec", memfd_exec)
attempt("x32_unshare", syscall(0x40000000 | SYS["unshare"], 0x10000000))
print("done=yes")
"#;

#[test]
fn escape_attempts_are_refused() {
    if !require_root() {
        return;
    }
    if !Path::new("/usr/bin/python3").exists() {
        panic!("this test needs /usr/bin/python3 on the host (apt-get install python3)");
    }
    // A real listener on the host's loopback: the sandbox must not reach it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let harness = Harness::new("escapes");
    let (exit, output) = harness.run_argv(
        vec!["/usr/bin/python3".into(), "-c".into(), ESCAPES.into(), port],
        &[],
        LIMITS,
        200_104,
    );
    assert_eq!(exit, AgentExit::Code(0), "{output}");
    assert_eq!(line(&output, "done"), "yes", "{output}");
    for attempt in [
        "userns",
        "mount",
        "ptrace",
        "bpf",
        "io_uring",
        "keyctl",
        "perf",
        "userfaultfd",
        "kexec",
        "module",
        "by_handle",
        "setuid0",
        "shadow",
        "below_root",
        "chroot",
        "cgroup",
        "host_port",
        "internet",
        "kill_host_init",
        "loader_tmp",
        "loader_work",
        "memfd_exec",
        "x32_unshare",
    ] {
        assert_eq!(line(&output, attempt), "refused", "{attempt}\n{output}");
    }
    listener.set_nonblocking(true).unwrap();
    assert!(
        listener.accept().is_err(),
        "the sandbox reached a host port"
    );
}

#[test]
fn fork_and_memory_bombs_hit_the_cgroup_limits() {
    if !require_root() {
        return;
    }
    let harness = Harness::new("bombs");
    let limits = CgroupLimits {
        memory_bytes: 64 << 20,
        pids: 32,
        cpu_millicores: 500,
    };
    let bomb = r#"
import os, time
pids = []
for _ in range(200):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    pids.append(pid)
print(f"forked={len(pids)}", flush=True)
for pid in pids:
    os.kill(pid, 9)
"#;
    let (_, output) = harness.run_argv(
        vec!["/usr/bin/python3".into(), "-c".into(), bomb.into()],
        &[],
        limits,
        200_105,
    );
    let forked: u32 = line(&output, "forked").parse().unwrap();
    assert!(
        forked < 32,
        "the pids limit (32) did not stop the bomb: {forked}\n{output}"
    );
    let harness = Harness::new("membomb");
    let (exit, output) = harness.run_argv(
        vec![
            "/usr/bin/python3".into(),
            "-c".into(),
            "b = bytearray(512 * 1024 * 1024); print('survived')".into(),
        ],
        &[],
        limits,
        200_106,
    );
    assert!(!output.contains("survived"), "{output}");
    assert_ne!(exit, AgentExit::Code(0), "{output}");
}

/// A set-up step of the agent process that fails says which step and why, every time: here
/// Landlock cannot open a path of its allow-list. The agent process used to build its
/// Landlock rules while pid 1 wrote its id map, and a failure there closed the pipe pid 1
/// was about to write to: the supervisor then reported `EPIPE: Broken pipe` instead.
#[test]
fn a_failing_set_up_step_is_named_every_time() {
    if !require_root() {
        return;
    }
    let harness = Harness::new("setup-error");
    for attempt in 0..20 {
        let error = harness.start_failing(
            |plan| plan.landlock.read.push("/no/such/path".into()),
            200_107,
        );
        assert!(
            error.starts_with("sandbox setup failed: landlock: /no/such/path: ")
                && !error.contains('\n'),
            "attempt {attempt}: {error}"
        );
    }
}
