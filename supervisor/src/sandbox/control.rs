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
/// (0 at the end), and the descriptors, owned here and close-on-exec.
pub(crate) fn recv_with_fds(
    socket: std::os::fd::BorrowedFd<'_>,
    buffer: &mut [u8],
) -> std::io::Result<(usize, Vec<OwnedFd>)> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut space = nix::cmsg_space!([RawFd; 8]);
    let mut iov = [std::io::IoSliceMut::new(buffer)];
    let received = recvmsg::<()>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(std::io::Error::from)?;
    let mut fds = Vec::new();
    for message in received.cmsgs().map_err(std::io::Error::from)? {
        if let ControlMessageOwned::ScmRights(raw) = message {
            // SAFETY: the kernel installed these descriptors in this process for this
            // message; nothing else owns them.
            #[allow(unsafe_code)]
            fds.extend(
                raw.into_iter()
                    .map(|fd| unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) }),
            );
        }
    }
    Ok((received.bytes, fds))
}

/// A pidfd of the sandbox's pid 1, the only child of the shim `shim`; checked to still be
/// that shim's child after it is opened (a pid reused since is refused).
pub(super) fn pin_pid_one(shim: u32) -> std::io::Result<OwnedFd> {
    {
        let children = fs::read_to_string(format!("/proc/{shim}/task/{shim}/children"))?;
        let pid: i32 = children
            .split_whitespace()
            .next()
            .and_then(|pid| pid.parse().ok())
            .ok_or_else(|| std::io::Error::other("the sandbox has no pid 1"))?;
        #[allow(unsafe_code)]
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; no
        // memory of this process is involved.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        #[allow(unsafe_code)]
        // SAFETY: the kernel just returned this descriptor; nothing else owns it.
        let pidfd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw as RawFd) };
        let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
        let parent = status
            .lines()
            .find_map(|line| line.strip_prefix("PPid:"))
            .and_then(|ppid| ppid.trim().parse::<u32>().ok());
        if parent != Some(shim) {
            return Err(std::io::Error::other("the sandbox's pid 1 has ended"));
        }
        Ok(pidfd)
    }
}
