//! The shim does nothing of the sandbox before its go-ahead.
//!
//! The supervisor starts a shim without copying itself (through its spawner), so the shim runs
//! for a moment outside the sandbox's cgroup; the supervisor then writes its pid into the
//! cgroup and only after that sends the first message (`Prepare`). Nothing of the sandbox may
//! exist before the join: the shim must wait for that first message before unsharing a
//! namespace, forking pid 1 or compiling anything. Run as root (the shim needs it to unshare).

use std::os::fd::AsRawFd as _;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tollgate_shim_protocol::protocol::CONTROL_FD;

/// The namespaces the shim unshares for the sandbox.
const NAMESPACES: [&str; 6] = ["mnt", "pid", "net", "ipc", "uts", "cgroup"];

/// Where a process is blocked: its state letter and, when it is in a system call, the call's
/// number and first argument (`/proc/PID/syscall`).
fn blocked_in(pid: u32) -> Option<(i64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The state follows the command name, which is in parentheses.
    let state = stat.rsplit_once(") ")?.1.chars().next()?;
    if state != 'S' {
        return None;
    }
    let syscall = std::fs::read_to_string(format!("/proc/{pid}/syscall")).ok()?;
    let mut fields = syscall.split_whitespace();
    let number = fields.next()?.parse().ok()?;
    let first = u64::from_str_radix(fields.next()?.trim_start_matches("0x"), 16).ok()?;
    Some((number, first))
}

#[test]
fn shim_waits_for_its_go_ahead_before_anything_of_the_sandbox() {
    let (ours, theirs) = UnixStream::pair().expect("socket pair");
    let control = theirs.as_raw_fd();
    let mut command = Command::new(env!("CARGO_BIN_EXE_tollgate-shim"));
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .env_clear();
    // SAFETY: runs between fork and exec and makes one async-signal-safe call (dup2) on a
    // descriptor opened before the fork.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(move || {
            if libc::dup2(control, CONTROL_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut shim = command.spawn().expect("starting tollgate-shim");
    drop(theirs);
    let pid = shim.id();
    // Wait (bounded) until the shim sleeps in a system call: the first thing it waits for.
    let deadline = Instant::now() + Duration::from_secs(20);
    let blocked = loop {
        if let Some(blocked) = blocked_in(pid) {
            break Some(blocked);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    let unshared: Vec<&str> = NAMESPACES
        .into_iter()
        .filter(|ns| {
            std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).ok()
                != std::fs::read_link(format!("/proc/self/ns/{ns}")).ok()
        })
        .collect();
    // Closing our end without a word: the shim must end, having built nothing.
    drop(ours);
    let status = shim.wait().expect("reaping the shim");
    let (number, fd) = blocked.expect("the shim never waited for anything");
    assert!(
        number == libc::SYS_recvmsg || number == libc::SYS_read,
        "before its go-ahead the shim waited in system call {number}, not in reading its \
         control socket (unshared: {unshared:?}, children: {children:?})"
    );
    assert_eq!(
        fd, CONTROL_FD as u64,
        "the shim waited on another descriptor"
    );
    assert!(
        unshared.is_empty(),
        "the shim unshared {unshared:?} before its go-ahead"
    );
    assert!(
        children.trim().is_empty(),
        "the shim forked ({children}) before its go-ahead"
    );
    assert!(
        !status.success(),
        "a shim whose supervisor left without a word must fail"
    );
}
