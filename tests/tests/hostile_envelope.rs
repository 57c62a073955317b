//! A hostile agent against the kernel envelope (root; issue 13, items 5, 6 and 11), in real
//! sandboxes of the real supervisor and authority: it cannot leave a set-uid or set-gid file
//! for the host, by any system call that sets a mode, neither itself nor through the
//! gateway's `exec` tool; it can open only Unix, IPv4, IPv6 and route-netlink sockets; and
//! the host's kernel command line and the other `/proc` files container runtimes mask read
//! empty. Each probe is a Python program written by the test and run by `/usr/bin/python3`
//! (on the system paths: anything the agent writes is on a `noexec` mount).

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;

use tollgate_proto::v1 as pb;
use tollgate_tests::{
    authed, bin_path, leftovers, require_root, AuthorityProcess, SupervisorProcess,
};

/// Where the write grant is mounted inside the sandbox.
const GRANT_IN_SANDBOX: &str = "/out";

/// One authority and one supervisor, a host directory granted writable at [`GRANT_IN_SANDBOX`].
struct Host {
    dir: tempfile::TempDir,
    authority: AuthorityProcess,
    supervisor: SupervisorProcess,
    grant: PathBuf,
}

impl Host {
    fn start(test: &str, host_id_base: u32) -> Self {
        let (dir, authority, supervisor) = tollgate_tests::daemons(test, host_id_base);
        let grant = dir.path().join("grant");
        std::fs::create_dir(&grant).unwrap();
        // The run's unprivileged host id writes here as "others".
        std::fs::set_permissions(&grant, std::fs::Permissions::from_mode(0o777)).unwrap();
        Self {
            dir,
            authority,
            supervisor,
            grant,
        }
    }

    /// Mints a receipt running `/usr/bin/python3 -c PROGRAM agent` (which may ask the gateway
    /// to run python3 too); the path of its text form.
    async fn mint_python(&self, program: &str) -> PathBuf {
        let request = pb::MintReceiptRequest {
            subject: "hostile".into(),
            ttl_seconds: 120,
            audience: vec!["workstation".into()],
            agent: Some(pb::AgentSpec {
                argv: vec![
                    "/usr/bin/python3".into(),
                    "-c".into(),
                    program.into(),
                    "agent".into(),
                ],
                ..Default::default()
            }),
            exec: vec!["/usr/bin/python3".into()],
            fs: vec![pb::FsGrant {
                path: self.grant.display().to_string(),
                access: pb::FsAccess::Write as i32,
                mount: GRANT_IN_SANDBOX.into(),
                exec: false,
                ask: false,
                ask_reads: false,
            }],
            limits: Some(pb::Limits {
                tool_calls: 10,
                ..Default::default()
            }),
            ..Default::default()
        };
        let text = self
            .authority
            .client()
            .await
            .mint_receipt(authed(&self.authority.admin_token(), request))
            .await
            .unwrap()
            .into_inner()
            .text;
        let receipt = self.dir.path().join("receipt.tgr");
        std::fs::write(&receipt, text).unwrap();
        receipt
    }

    /// `tollgate run` against the supervisor, with its token.
    fn tollgate_run(&self) -> Command {
        let mut command = Command::new(bin_path("tollgate"));
        command
            .args(["--supervisor", self.supervisor.addr()])
            .arg("--token-file")
            .arg(self.supervisor.token_file())
            .arg("run");
        command
    }

    /// Runs `/usr/bin/python3 -c PROGRAM agent` with `tollgate run`: the exit code and the
    /// output.
    async fn run_python(&self, program: &str) -> (Option<i32>, String) {
        let receipt = self.mint_python(program).await;
        let output = self
            .tollgate_run()
            .arg("--receipt")
            .arg(&receipt)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr);
        (output.status.code(), text)
    }

    /// Runs `/usr/bin/python3 -c PROGRAM agent` with `tollgate run -t` on a fresh terminal
    /// (tollgate its session's controlling process, as under a person's shell): the exit
    /// code and everything the terminal showed.
    async fn run_python_on_a_terminal(&self, program: &str) -> (Option<i32>, String) {
        use std::io::Read as _;
        let receipt = self.mint_python(program).await;
        let pty = nix::pty::openpty(None, None).unwrap();
        let stdio = || std::process::Stdio::from(pty.slave.try_clone().unwrap());
        let template = self.tollgate_run();
        let mut tollgate = Command::new("setsid")
            .arg("--ctty")
            .arg(template.get_program())
            .args(template.get_args())
            .args(["-t", "--receipt"])
            .arg(&receipt)
            .stdin(stdio())
            .stdout(stdio())
            .stderr(stdio())
            .spawn()
            .unwrap();
        drop(pty.slave);
        // The reader ends when the last holder of the terminal's other side is gone.
        let mut master = std::fs::File::from(pty.master);
        let reader = std::thread::spawn(move || {
            let mut screen = Vec::new();
            let mut buffer = [0u8; 4096];
            while let Ok(n @ 1..) = master.read(&mut buffer) {
                screen.extend_from_slice(&buffer[..n]);
            }
            String::from_utf8_lossy(&screen).replace('\r', "")
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let status = loop {
            if let Some(status) = tollgate.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                tollgate.kill().unwrap();
                panic!("tollgate run -t did not exit");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        (status.code(), reader.join().unwrap())
    }

    fn assert_clean(&self) {
        let left = leftovers(self.supervisor.data_dir(), &self.supervisor.cgroup_parent);
        assert!(left.is_empty(), "left behind: {left:?}");
    }
}

fn python_available() {
    assert!(
        Path::new("/usr/bin/python3").exists(),
        "this test needs /usr/bin/python3 on the host (apt-get install python3)"
    );
}

/// The value of `key=` in the output; panics naming the output when it is missing.
fn value<'a>(output: &'a str, key: &str) -> &'a str {
    output
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in output:\n{output}"))
}

/// Every entry beneath `dir` (recursively, without following links) whose mode carries
/// set-uid or set-gid.
fn set_id_entries(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let meta = std::fs::symlink_metadata(entry.path()).unwrap();
        if meta.mode() & 0o6000 != 0 {
            found.push(format!("{} {:o}", entry.path().display(), meta.mode()));
        }
        if meta.is_dir() {
            found.extend(set_id_entries(&entry.path()));
        }
    }
    found
}

/// Tries every system call that sets a file's mode, with set-uid or set-gid, on files and
/// directories of the write grant; `WHO.NAME=refused` when the call fails with the expected
/// errno, `ok` for the controls that must still work. Run as `agent`, it then asks the
/// gateway to run itself as `exec`.
const SET_ID_PROBE: &str = r#"
import ctypes, errno, os, stat, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
who = sys.argv[1]
base = f"/out/{who}"
os.mkdir(base)
NR = {
    "x86_64": dict(chmod=90, fchmod=91, fchmodat=268, fchmodat2=452, open=2, openat=257,
                   creat=85, mkdir=83, mkdirat=258, mknod=133, mknodat=259, openat2=437),
    "aarch64": dict(fchmod=52, fchmodat=53, fchmodat2=452, openat=56, mkdirat=34,
                    mknodat=33, openat2=437),
}[os.uname().machine]
AT_FDCWD = -100
L = ctypes.c_long
def raw(name, *args):
    def call():
        r = libc.syscall(L(NR[name]), *args)
        if r == -1:
            raise OSError(ctypes.get_errno(), name)
        return r
    return call
def attempt(name, call, expect=errno.EPERM):
    try:
        call()
    except OSError as e:
        print(f"{who}.{name}=" + ("refused" if e.errno == expect else f"errno{e.errno}"), flush=True)
        return
    print(f"{who}.{name}=ALLOWED", flush=True)
def control(name, call):
    try:
        call()
        print(f"{who}.{name}=ok", flush=True)
    except OSError as e:
        print(f"{who}.{name}=errno{e.errno}", flush=True)
def existing(name):
    path = f"{base}/{name}"
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o755))
    return path.encode()
def new(name):
    return f"{base}/{name}".encode()
def directory(name):
    path = f"{base}/{name}"
    os.mkdir(path, 0o755)
    return path.encode()
def fchmod(mode):
    def call():
        fd = os.open(existing(f"fchmod-{mode:o}"), os.O_RDONLY)
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
    return call
def tmpfile():
    fd = os.open(base, os.O_TMPFILE | os.O_WRONLY, 0o4755)
    try:
        # Best effort: Landlock may refuse the link (EXDEV); the open is what must fail.
        os.link(f"/proc/self/fd/{fd}", new("tmpfile"), follow_symlinks=True)
    except OSError:
        pass
    finally:
        os.close(fd)
class OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]
creating = os.O_CREAT | os.O_WRONLY | os.O_EXCL
attempt("os_chmod_setuid", lambda: os.chmod(existing("os-chmod-u"), 0o4755))
attempt("os_chmod_setgid", lambda: os.chmod(existing("os-chmod-g"), 0o2755))
if "chmod" in NR:
    attempt("chmod", raw("chmod", existing("chmod"), 0o4755))
attempt("fchmod_setuid", fchmod(0o4755))
attempt("fchmod_setgid", fchmod(0o2755))
attempt("fchmodat", raw("fchmodat", AT_FDCWD, existing("fchmodat"), 0o6755))
attempt("fchmodat2", raw("fchmodat2", AT_FDCWD, existing("fchmodat2"), 0o4755, 0))
attempt("fchmod_dir_setgid", lambda: os.chmod(directory("dir-g"), 0o2775))
attempt("os_open", lambda: os.close(os.open(new("os-open"), creating, 0o4755)))
if "open" in NR:
    attempt("open", raw("open", new("open"), L(creating), L(0o6755)))
attempt("openat", raw("openat", AT_FDCWD, new("openat"), L(creating), L(0o4755)))
attempt("openat_high_bits", raw("openat", AT_FDCWD, new("openat-high"), L(creating | (1 << 40)), L(0o4755 | (1 << 40))))
attempt("o_tmpfile", tmpfile)
if "creat" in NR:
    attempt("creat", raw("creat", new("creat"), L(0o4755)))
attempt("os_mkdir", lambda: os.mkdir(new("os-mkdir"), 0o2755))
if "mkdir" in NR:
    attempt("mkdir", raw("mkdir", new("mkdir"), L(0o2755)))
attempt("mkdirat", raw("mkdirat", AT_FDCWD, new("mkdirat"), L(0o6755)))
attempt("os_mknod", lambda: os.mknod(new("os-mknod"), stat.S_IFREG | 0o4755))
if "mknod" in NR:
    attempt("mknod", raw("mknod", new("mknod"), L(stat.S_IFREG | 0o4755), L(0)))
attempt("mknodat", raw("mknodat", AT_FDCWD, new("mknodat"), L(stat.S_IFREG | 0o2755), L(0)))
how = OpenHow(flags=creating, mode=0o4755, resolve=0)
attempt("openat2", raw("openat2", AT_FDCWD, new("openat2"), ctypes.byref(how), L(ctypes.sizeof(how))), errno.ENOSYS)
control("control_chmod", lambda: os.chmod(existing("plain"), 0o755))
control("control_sticky", lambda: os.chmod(directory("sticky"), 0o1777))
control("control_create", lambda: os.close(os.open(new("created"), creating, 0o644)))
control("control_mkdir", lambda: os.mkdir(new("made"), 0o755))
control("control_mode_without_create", lambda: os.close(os.open(existing("plain2"), os.O_RDONLY, 0o6755)))
control("control_write", lambda: open(f"{base}/written", "w").write("bytes"))
if who == "agent":
    result = subprocess.run(["tollgate-shim", "tool", "exec", "--", "/usr/bin/python3", "-c", PROGRAM, "exec"])
    print(f"gateway_exec_rc={result.returncode}", flush=True)
print(f"{who}.done=yes", flush=True)
"#;

/// The names the set-id probe reports as refused (where the architecture has the call).
const SET_ID_ATTEMPTS: [&str; 20] = [
    "os_chmod_setuid",
    "os_chmod_setgid",
    "chmod",
    "fchmod_setuid",
    "fchmod_setgid",
    "fchmodat",
    "fchmodat2",
    "fchmod_dir_setgid",
    "os_open",
    "open",
    "openat",
    "openat_high_bits",
    "o_tmpfile",
    "creat",
    "os_mkdir",
    "mkdir",
    "mkdirat",
    "os_mknod",
    "mknod",
    "mknodat",
];

/// The calls only x86_64 has.
const LEGACY: [&str; 5] = ["chmod", "open", "creat", "mkdir", "mknod"];

/// A program that passes its own text on, so the agent can ask the gateway to run it again.
fn self_passing(probe: &str) -> String {
    // PROGRAM is the probe's own source: python3 -c does not keep it anywhere readable.
    format!("PROGRAM = {probe:?}\n{probe}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_set_id_file_reaches_the_host_from_the_agent_or_the_exec_tool() {
    if !require_root() {
        return;
    }
    python_available();
    let host = Host::start("he-setid", 230_000);
    let (code, output) = host.run_python(&self_passing(SET_ID_PROBE)).await;
    assert_eq!(code, Some(0), "{output}");
    for who in ["agent", "exec"] {
        assert_eq!(value(&output, &format!("{who}.done")), "yes", "{output}");
        for name in SET_ID_ATTEMPTS {
            let key = format!("{who}.{name}");
            // aarch64 has only the *at calls.
            if LEGACY.contains(&name) && !cfg!(target_arch = "x86_64") {
                continue;
            }
            assert_eq!(value(&output, &key), "refused", "{key}\n{output}");
        }
        assert_eq!(
            value(&output, &format!("{who}.openat2")),
            "refused",
            "{output}"
        );
        for control in [
            "control_chmod",
            "control_sticky",
            "control_create",
            "control_mkdir",
            "control_mode_without_create",
            "control_write",
        ] {
            let key = format!("{who}.{control}");
            assert_eq!(value(&output, &key), "ok", "{key}\n{output}");
        }
    }
    assert_eq!(value(&output, "gateway_exec_rc"), "0", "{output}");
    // On the host: nothing set-uid or set-gid, and the files are the run's host id's.
    let found = set_id_entries(&host.grant);
    assert!(
        found.is_empty(),
        "set-id entries on the host: {found:?}\n{output}"
    );
    let written = std::fs::metadata(host.grant.join("agent/written")).unwrap();
    assert!(
        (230_000..230_064).contains(&written.uid()),
        "{}",
        written.uid()
    );
    host.assert_clean();
}

/// Opens sockets of every kind an agent might want (`WHO.NAME=refused` when refused with
/// the expected errno, `ok` when it works, as the allowed kinds must) and reads the `/proc`
/// files a sandbox masks (`WHO.proc:PATH=BYTES`). Run as `agent`, it then asks the gateway
/// to run itself as `exec`.
const SOCKET_AND_PROC_PROBE: &str = r#"
import ctypes, errno, os, socket, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
who = sys.argv[1]
SOCKET = {"x86_64": 41, "aarch64": 198}[os.uname().machine]
NETLINK_ROUTE, NETLINK_KOBJECT_UEVENT, NETLINK_AUDIT = 0, 15, 9
def attempt(name, call, expect):
    try:
        call()
    except OSError as e:
        print(f"{who}.{name}=" + ("refused" if e.errno == expect else f"errno{e.errno}"), flush=True)
        return
    print(f"{who}.{name}=ALLOWED", flush=True)
def control(name, call):
    try:
        call()
        print(f"{who}.{name}=ok", flush=True)
    except OSError as e:
        print(f"{who}.{name}=errno{e.errno}", flush=True)
def opened(*args):
    return lambda: socket.socket(*args).close()
def raw_socket(domain, kind, protocol):
    def call():
        fd = libc.syscall(ctypes.c_long(SOCKET), ctypes.c_long(domain), ctypes.c_long(kind), ctypes.c_long(protocol))
        if fd == -1:
            raise OSError(ctypes.get_errno(), "socket")
        os.close(fd)
    return call
def tcp_loopback(family, address):
    server = socket.socket(family, socket.SOCK_STREAM)
    server.bind((address, 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname()[:2])
    peer, _ = server.accept()
    client.sendall(b"x")
    assert peer.recv(1) == b"x"
    for s in (client, peer, server):
        s.close()
def route_dump():
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
    s.bind((0, 0))
    s.close()
def unix_pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a.sendall(b"x")
    assert b.recv(1) == b"x"
    a.close(); b.close()
EAF, EPROTO = errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT
attempt("vsock_stream", opened(socket.AF_VSOCK, socket.SOCK_STREAM), EAF)
attempt("vsock_dgram", opened(socket.AF_VSOCK, socket.SOCK_DGRAM), EAF)
attempt("vsock_high_bits", raw_socket((1 << 32) | socket.AF_VSOCK, socket.SOCK_STREAM, 0), EAF)
attempt("uevent", opened(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_KOBJECT_UEVENT), EPROTO)
attempt("netlink_audit", opened(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_AUDIT), EPROTO)
attempt("alg", opened(38, socket.SOCK_SEQPACKET, 0), EAF)
attempt("packet", opened(17, socket.SOCK_RAW, 0), EAF)
attempt("pair_netlink", lambda: socket.socketpair(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_KOBJECT_UEVENT), EPROTO)
control("control_unix", opened(socket.AF_UNIX, socket.SOCK_STREAM))
control("control_unix_pair", unix_pair)
control("control_tcp", lambda: tcp_loopback(socket.AF_INET, "127.0.0.1"))
control("control_udp", opened(socket.AF_INET, socket.SOCK_DGRAM))
control("control_inet6", opened(socket.AF_INET6, socket.SOCK_STREAM))
control("control_route", route_dump)
control("control_route_high_bits", raw_socket((1 << 32) | socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE))
for path in ("/proc/cmdline", "/proc/keys", "/proc/kcore", "/proc/timer_list", "/proc/sched_debug"):
    try:
        print(f"{who}.proc:{path}={len(open(path, 'rb').read())}", flush=True)
    except FileNotFoundError:
        print(f"{who}.proc:{path}=absent", flush=True)
    except OSError as e:
        print(f"{who}.proc:{path}=errno{e.errno}", flush=True)
if who == "agent":
    result = subprocess.run(["tollgate-shim", "tool", "exec", "--", "/usr/bin/python3", "-c", PROGRAM, "exec"])
    print(f"gateway_exec_rc={result.returncode}", flush=True)
print(f"{who}.done=yes", flush=True)
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_unix_inet_and_route_sockets_open_and_host_proc_files_read_empty() {
    if !require_root() {
        return;
    }
    python_available();
    let host = Host::start("he-sockets", 230_100);
    let (code, output) = host.run_python(&self_passing(SOCKET_AND_PROC_PROBE)).await;
    assert_eq!(code, Some(0), "{output}");
    assert_eq!(value(&output, "gateway_exec_rc"), "0", "{output}");
    for who in ["agent", "exec"] {
        assert_eq!(value(&output, &format!("{who}.done")), "yes", "{output}");
        for name in [
            "vsock_stream",
            "vsock_dgram",
            "vsock_high_bits",
            "uevent",
            "netlink_audit",
            "alg",
            "packet",
            "pair_netlink",
        ] {
            let key = format!("{who}.{name}");
            assert_eq!(value(&output, &key), "refused", "{key}\n{output}");
        }
        for name in [
            "control_unix",
            "control_unix_pair",
            "control_tcp",
            "control_udp",
            "control_inet6",
            "control_route",
            "control_route_high_bits",
        ] {
            let key = format!("{who}.{name}");
            assert_eq!(value(&output, &key), "ok", "{key}\n{output}");
        }
        // The host's kernel command line reads empty, and so do its keys and timers (or
        // the file does not exist on this kernel).
        let key = format!("{who}.proc:/proc/cmdline");
        assert_eq!(value(&output, &key), "0", "{key}\n{output}");
        for path in [
            "/proc/cmdline",
            "/proc/keys",
            "/proc/kcore",
            "/proc/timer_list",
            "/proc/sched_debug",
        ] {
            let key = format!("{who}.proc:{path}");
            let read = value(&output, &key);
            assert!(read == "0" || read == "absent", "{key}={read}\n{output}");
        }
    }
    host.assert_clean();
}

/// Sets `dev.tty.legacy_tiocsti` to 1 (the kernel then lets a process push input into its
/// own controlling terminal, as every kernel before 6.2 did) for as long as it lives, and puts
/// back the value it found. Kernels without the sysctl always allow it.
struct LegacyTiocsti(Option<String>);

impl LegacyTiocsti {
    const PATH: &'static str = "/proc/sys/dev/tty/legacy_tiocsti";

    fn enable() -> Self {
        let Ok(found) = std::fs::read_to_string(Self::PATH) else {
            return Self(None);
        };
        std::fs::write(Self::PATH, "1").unwrap();
        Self(Some(found))
    }
}

impl Drop for LegacyTiocsti {
    fn drop(&mut self) {
        if let Some(found) = &self.0 {
            let _ = std::fs::write(Self::PATH, found.trim());
        }
    }
}

/// On its terminal, tries to push a keystroke into it (`TIOCSTI`, also with the request's
/// high word set, which the kernel ignores) and to use the console selection (`TIOCLINUX`):
/// `NAME=injected` when the call succeeds, `NAME=errnoN` when it fails. The control reads the
/// terminal's size.
const TERMINAL_INJECTION_PROBE: &str = r#"
import ctypes, fcntl, os, termios
libc = ctypes.CDLL(None, use_errno=True)
libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
print(f"tty={os.isatty(0)}", flush=True)
for name, request in [("tiocsti", termios.TIOCSTI), ("tiocsti_high", termios.TIOCSTI | (1 << 32)),
                      ("tioclinux", 0x541C)]:
    byte = ctypes.create_string_buffer(b"\x02")
    if libc.ioctl(0, request, byte) == 0:
        print(f"{name}=injected", flush=True)
    else:
        print(f"{name}=errno{ctypes.get_errno()}", flush=True)
try:
    fcntl.ioctl(0, termios.TIOCGWINSZ, b"\0" * 8)
    print("winsize=ok", flush=True)
except OSError as e:
    print(f"winsize=errno{e.errno}", flush=True)
print("done=yes", flush=True)
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_agent_cannot_push_keystrokes_into_its_terminal() {
    if !require_root() {
        return;
    }
    python_available();
    // The host allows TIOCSTI, as a host left at the old default does: only the sandbox's
    // own rule stands in the way.
    let _legacy = LegacyTiocsti::enable();
    let host = Host::start("he-tiocsti", 230_300);
    let (code, output) = host
        .run_python_on_a_terminal(TERMINAL_INJECTION_PROBE)
        .await;
    assert_eq!(code, Some(0), "{output}");
    assert_eq!(value(&output, "done"), "yes", "{output}");
    assert_eq!(value(&output, "tty"), "True", "{output}");
    // A keystroke that got in is echoed at the start of the next line: look past it.
    let anywhere = |key: &str| {
        output
            .lines()
            .find_map(|l| l.split_once(&format!("{key}=")).map(|(_, v)| v.trim()))
            .unwrap_or_else(|| panic!("no {key}= in output:\n{output}"))
    };
    let eperm = format!("errno{}", nix::errno::Errno::EPERM as i32);
    for name in ["tiocsti", "tiocsti_high", "tioclinux"] {
        assert_eq!(anywhere(name), eperm, "{name}\n{output}");
    }
    assert_eq!(value(&output, "winsize"), "ok", "{output}");
    host.assert_clean();
}
