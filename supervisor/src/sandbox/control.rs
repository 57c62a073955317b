//! Talking to a shim: lines on its control socket with descriptors attached (`SCM_RIGHTS`),
//! Unix sockets at long paths, and a pidfd of its pid 1.

use std::fs;
use std::io::Write as _;
use std::os::fd::{AsFd as _, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::UnixStream;
use std::path::Path;

use tollgate_shim_protocol::protocol::ToShim;

/// Sends one message as a JSON line.
pub(super) fn send_line(control: &mut UnixStream, message: &ToShim) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(message).map_err(std::io::Error::other)?;
    line.push(b'\n');
    control.write_all(&line)
}

/// Most descriptors one `sendmsg` carries (the kernel's SCM_MAX_FD is 253).
pub(super) const FDS_PER_MESSAGE: usize = 250;

/// Sends one message as a JSON line with `fds` attached (SCM_RIGHTS), in order: each batch of
/// descriptors rides on one byte of the line, the rest of the line follows. The shim's
/// control reader collects them with the message.
pub(crate) fn send_line_with_fds(
    control: &mut UnixStream,
    message: &ToShim,
    fds: &[OwnedFd],
) -> std::io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let mut line = serde_json::to_vec(message).map_err(std::io::Error::other)?;
    line.push(b'\n');
    let batches: Vec<Vec<RawFd>> = fds
        .chunks(FDS_PER_MESSAGE)
        .map(|batch| batch.iter().map(AsRawFd::as_raw_fd).collect())
        .collect();
    if batches.len() >= line.len() {
        return Err(std::io::Error::other(
            "too many descriptors for one message",
        ));
    }
    for (i, batch) in batches.iter().enumerate() {
        let byte = [std::io::IoSlice::new(&line[i..=i])];
        let rights = [ControlMessage::ScmRights(batch)];
        let sent = sendmsg::<()>(control.as_raw_fd(), &byte, &rights, MsgFlags::empty(), None)
            .map_err(std::io::Error::from)?;
        if sent != 1 {
            return Err(std::io::Error::other("short send on the control socket"));
        }
    }
    control.write_all(&line[batches.len()..])
}

/// Connects to a Unix socket by path, through `/proc/self/fd` so that a long data directory
/// does not hit `sun_path`'s 108 bytes.
pub(crate) fn connect_unix(socket: &Path) -> std::io::Result<UnixStream> {
    let (dir, name) = split_socket_path(socket)?;
    let dir = fs::File::open(dir)?;
    UnixStream::connect(format!("/proc/self/fd/{}/{name}", dir.as_raw_fd()))
}

/// Binds a Unix socket by path (0600, root's), through `/proc/self/fd` as [`connect_unix`].
pub(crate) fn bind_unix(socket: &Path) -> std::io::Result<std::os::unix::net::UnixListener> {
    let (dir, name) = split_socket_path(socket)?;
    let dir = fs::File::open(dir)?;
    let short = format!("/proc/self/fd/{}/{name}", dir.as_raw_fd());
    match fs::remove_file(&short) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = std::os::unix::net::UnixListener::bind(&short)?;
    fs::set_permissions(&short, fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

pub(super) fn split_socket_path(socket: &Path) -> std::io::Result<(&Path, String)> {
    match (socket.parent(), socket.file_name()) {
        (Some(dir), Some(name)) => Ok((dir, name.to_string_lossy().into_owned())),
        _ => Err(std::io::Error::other("not a socket path")),
    }
}

/// Receives one byte and the descriptors that ride on it (SCM_RIGHTS).
pub(super) fn recv_byte_with_fds(control: &UnixStream) -> std::io::Result<(u8, Vec<OwnedFd>)> {
    let mut byte = [0u8; 1];
    let (received, fds) = recv_with_fds(control.as_fd(), &mut byte)?;
    if received == 0 {
        return Err(std::io::Error::other("pid 1 closed the connection"));
    }
    Ok((byte[0], fds))
}

/// Receives into `buffer` from the Unix socket `socket`, with the descriptors (SCM_RIGHTS,
/// at most 8; more are closed by the kernel) that ride on those bytes: how many bytes came
/// (0 at the end), and the descriptors, owned here and close-on-exec. A receive whose
/// descriptors did not all arrive (see [`Received::truncated`]) is an error here, with the
/// bytes lost; a reader that can ask for them again uses [`recv_with_room`].
pub(crate) fn recv_with_fds(
    socket: std::os::fd::BorrowedFd<'_>,
    buffer: &mut [u8],
) -> std::io::Result<(usize, Vec<OwnedFd>)> {
    let received = recv_with_room(socket, buffer, MAX_FDS_RECEIVED)?;
    if received.truncated {
        return Err(std::io::Error::other(
            "descriptors sent with a message did not arrive (this process is out of descriptors)",
        ));
    }
    Ok((received.bytes, received.fds))
}

/// The most descriptors one receive takes ([`recv_with_fds`]).
pub(crate) const MAX_FDS_RECEIVED: usize = 8;

/// What one receive brought.
#[derive(Debug)]
pub(crate) struct Received {
    /// How many bytes came (0: the peer closed the socket).
    pub bytes: usize,
    /// The descriptors that came with them, in the order sent, owned here (close-on-exec).
    pub fds: Vec<OwnedFd>,
    /// Descriptors were sent with these bytes and some did not arrive (`MSG_CTRUNC`): no
    /// free number for one in this process's table (`EMFILE`), or no room for it in the
    /// control buffer. The kernel closed those: a connection among them is closed on its
    /// caller unless its sender kept a copy.
    pub truncated: bool,
}

/// Receives into `buffer` from the Unix socket `socket` with room for `room` descriptors
/// (at most [`MAX_FDS_RECEIVED`]); a truncated receive is reported, with whatever
/// descriptors did arrive, not turned into an error.
pub(crate) fn recv_with_room(
    socket: std::os::fd::BorrowedFd<'_>,
    buffer: &mut [u8],
    room: usize,
) -> std::io::Result<Received> {
    /// Control-message room for [`MAX_FDS_RECEIVED`] descriptors (16 bytes of header and 32
    /// of data on 64-bit Linux), aligned as the kernel's `cmsghdr` requires.
    #[repr(C)]
    struct Space {
        _align: [libc::cmsghdr; 0],
        bytes: [u8; 64],
    }
    let mut space = Space {
        _align: [],
        bytes: [0; 64],
    };
    let room = room.min(MAX_FDS_RECEIVED);
    let control_len = if room == 0 {
        0
    } else {
        // SAFETY: CMSG_SPACE is arithmetic on its argument.
        #[allow(unsafe_code)]
        let space = unsafe { libc::CMSG_SPACE((room * size_of::<RawFd>()) as libc::c_uint) };
        space as usize
    };
    debug_assert!(control_len <= space.bytes.len());
    let mut iov = libc::iovec {
        iov_base: buffer.as_mut_ptr().cast(),
        iov_len: buffer.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    #[allow(unsafe_code)]
    let mut header: libc::msghdr = unsafe { std::mem::zeroed() };
    header.msg_iov = &mut iov;
    header.msg_iovlen = 1;
    if control_len > 0 {
        header.msg_control = space.bytes.as_mut_ptr().cast();
        header.msg_controllen = control_len;
    }
    // SAFETY: `header` points at `buffer` (its length in `iov`) and at `space` (at least
    // `control_len` bytes), both alive and exclusively borrowed for the call.
    #[allow(unsafe_code)]
    let read = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut header, libc::MSG_CMSG_CLOEXEC) };
    if read < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `header.msg_control` with `msg_controllen` bytes of
    // well-formed control messages; CMSG_FIRSTHDR/NXTHDR stay within them, and each
    // SCM_RIGHTS message's data holds `(cmsg_len - CMSG_LEN(0)) / 4` descriptors the kernel
    // installed in this process for this receive, owned by nothing else.
    #[allow(unsafe_code)]
    unsafe {
        let mut message = libc::CMSG_FIRSTHDR(&header);
        while !message.is_null() {
            let cmsg = &*message;
            if cmsg.cmsg_level == libc::SOL_SOCKET && cmsg.cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(message).cast::<RawFd>();
                let count =
                    (cmsg.cmsg_len as usize - libc::CMSG_LEN(0) as usize) / size_of::<RawFd>();
                for i in 0..count {
                    let fd = data.add(i).read_unaligned();
                    fds.push(<OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd));
                }
            }
            message = libc::CMSG_NXTHDR(&header, message);
        }
    }
    Ok(Received {
        bytes: read as usize,
        fds,
        truncated: header.msg_flags & libc::MSG_CTRUNC != 0,
    })
}

/// A pidfd of whichever process has `pid` now: the caller makes sure that is the one it
/// means (its own child not yet reaped, whose pid is its own, or checked after).
pub(super) fn open_pidfd(pid: u32) -> std::io::Result<OwnedFd> {
    #[allow(unsafe_code)]
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; no memory
    // of this process is involved.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    #[allow(unsafe_code)]
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw as RawFd) })
}

/// A pidfd of a detached sandbox's pid 1, from the host pid recorded at its detach: pid 1's
/// own, or (recorded by an older supervisor, whose shim stayed as pid 1's parent) its shim's.
/// Checked after it is opened: a pid 1 is the first process of a pid namespace of its own;
/// a shim's only child is pid 1 when that child's parent is still the shim (a pid reused
/// since is refused). The caller checks that `recorded` is in the run's cgroup.
pub(super) fn pin_recorded_pid_one(recorded: u32) -> std::io::Result<OwnedFd> {
    let pidfd = open_pidfd(recorded)?;
    let status = fs::read_to_string(format!("/proc/{recorded}/status"))?;
    if is_namespace_init(&status) {
        return Ok(pidfd);
    }
    drop(pidfd);
    let children = fs::read_to_string(format!("/proc/{recorded}/task/{recorded}/children"))?;
    let pid: u32 = children
        .split_whitespace()
        .next()
        .and_then(|pid| pid.parse().ok())
        .ok_or_else(|| std::io::Error::other("the sandbox has no pid 1"))?;
    let pidfd = open_pidfd(pid)?;
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let parent = status
        .lines()
        .find_map(|line| line.strip_prefix("PPid:"))
        .and_then(|ppid| ppid.trim().parse::<u32>().ok());
    if parent != Some(recorded) || !is_namespace_init(&status) {
        return Err(std::io::Error::other("the sandbox's pid 1 has ended"));
    }
    Ok(pidfd)
}

/// Whether a `/proc/<pid>/status` is that of a pid namespace's first process: its `NSpid`
/// (its pid in each namespace it is in, outermost first) ends in 1 below the host's.
fn is_namespace_init(status: &str) -> bool {
    status
        .lines()
        .find_map(|line| line.strip_prefix("NSpid:"))
        .map(|pids| pids.split_whitespace().collect::<Vec<_>>())
        .is_some_and(|pids| pids.len() > 1 && pids.last() == Some(&"1"))
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd as _;

    use super::pin_recorded_pid_one;

    /// The pid of the process a pidfd refers to (its `fdinfo`'s `Pid:`).
    fn pid_of(pidfd: &std::os::fd::OwnedFd) -> u32 {
        let info =
            std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd())).unwrap();
        info.lines()
            .find_map(|line| line.strip_prefix("Pid:"))
            .and_then(|pid| pid.trim().parse().ok())
            .unwrap()
    }

    /// A recorded pid is pid 1's own (this build's shims) or its parent shim's (an older
    /// build's, left running across an upgrade); anything else is refused.
    #[test]
    fn a_recorded_pid_pins_pid_one_itself_or_through_its_parent_shim() {
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("skipped: needs root (a pid namespace)");
            return;
        }
        let (ready_read, ready_write) = std::io::pipe().unwrap();
        #[allow(unsafe_code)]
        // SAFETY: the child makes raw system calls only (unshare, fork, write, pause,
        // _exit), all async-signal-safe, on memory that is its own copy.
        let shim = unsafe { libc::fork() };
        if shim == 0 {
            #[allow(unsafe_code)]
            // SAFETY: as above.
            unsafe {
                if libc::unshare(libc::CLONE_NEWPID) < 0 {
                    libc::_exit(1);
                }
                let pid_one = libc::fork();
                if pid_one == 0 {
                    libc::pause();
                    libc::_exit(0);
                }
                // As an older shim: pid 1's parent, waiting. Says pid 1's host pid.
                let said = (pid_one as u32).to_ne_bytes();
                libc::write(ready_write.as_raw_fd(), said.as_ptr().cast(), said.len());
                libc::pause();
                libc::_exit(0);
            }
        }
        drop(ready_write);
        let mut said = [0u8; 4];
        std::io::Read::read_exact(&mut &ready_read, &mut said).unwrap();
        let pid_one = u32::from_ne_bytes(said);
        let shim = shim as u32;
        let through_shim = pin_recorded_pid_one(shim).map(|fd| pid_of(&fd));
        let itself = pin_recorded_pid_one(pid_one).map(|fd| pid_of(&fd));
        // This test process is neither a pid 1 nor the parent of one.
        let neither = pin_recorded_pid_one(std::process::id());
        // pid 1 first, then the shim: pid 1 goes to the host's init, which reaps it.
        for pid in [pid_one, shim] {
            #[allow(unsafe_code)]
            // SAFETY: kill takes numbers only; both are alive (the shim, this process's
            // child, is not reaped; pid 1 is the shim's, not reaped while the shim lives).
            unsafe {
                libc::kill(pid as i32, libc::SIGKILL)
            };
        }
        #[allow(unsafe_code)]
        // SAFETY: waitpid with a null status pointer writes nothing.
        unsafe {
            libc::waitpid(shim as i32, std::ptr::null_mut(), 0)
        };
        assert_eq!(through_shim.unwrap(), pid_one);
        assert_eq!(itself.unwrap(), pid_one);
        assert!(neither.is_err(), "this process was taken for a pid 1");
    }
}
