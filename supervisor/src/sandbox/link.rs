//! A started shim's control socket, shared without a thread: the run's watch reads pid 1's
//! events on it, with the gateway connections pid 1 hands over (SCM_RIGHTS), and the run's
//! gateway writes `Accept` on it each time it can hold one more connection (and `Received`
//! once it holds it, `Resend` when its descriptor did not arrive). pid 1 holds the
//! run's gateway listening socket, so the supervisor holds three descriptors a live run: this
//! socket and the agent's two output pipes.
//!
//! Every message written here is one line in one `sendmsg`: a line of a few dozen bytes is one
//! socket buffer in the kernel, sent whole or not at all, so the gateway's `Accept` and a
//! detach written from another thread never interleave.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd as _, AsRawFd as _, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tollgate_shim_protocol::protocol::ToShim;

#[cfg(test)]
use super::control::recv_with_fds;
use super::control::{recv_with_room, MAX_FDS_RECEIVED};

/// The most bytes of shim events read at a time (short JSON lines; on the worker's stack).
const RECEIVE_CHUNK: usize = 1024;

/// A started shim's control socket, registered with the run runtime for reading and writing.
#[derive(Debug)]
pub struct ControlLink {
    socket: AsyncFd<Arc<OwnedFd>>,
    /// A descriptor held while the gateway's `Accept` is outstanding, released just before
    /// each receive: the connection pid 1 hands over then has a free number to land on. One
    /// received with no free number does not arrive (the kernel closes the descriptor; pid 1
    /// kept a copy and is asked to send it again), so the gateway asks only once it holds one
    /// ([`ControlLink::reserve_descriptor`]), and only after pid 1 said a connection waits:
    /// no ask, and no descriptor, is held for a run that makes no call.
    reserved: std::sync::Mutex<Option<OwnedFd>>,
    /// pid 1 said a connection waits on the run's gateway socket (`ConnectionWaiting`).
    connection_waiting: tokio::sync::Notify,
    /// Receives left to make with no room for descriptors (tests: a hand-over the kernel
    /// truncates, as when this process is out of descriptors).
    #[cfg(test)]
    starved: std::sync::atomic::AtomicUsize,
}

impl ControlLink {
    /// Registers `control` (made non-blocking) with the current runtime.
    pub fn register(control: Arc<OwnedFd>) -> io::Result<Self> {
        set_nonblocking(&control)?;
        // SAFETY: the `AsyncFd` holds the descriptor (an `OwnedFd`, open as long as any `Arc`
        // of it lives, this one included) and nothing replaces or closes it while registered.
        #[allow(unsafe_code)]
        let socket = unsafe {
            AsyncFd::register_with_interest(control, Interest::READABLE | Interest::WRITABLE)
        }
        .map_err(io::Error::from)?;
        Ok(Self {
            socket,
            reserved: std::sync::Mutex::new(None),
            connection_waiting: tokio::sync::Notify::new(),
            #[cfg(test)]
            starved: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// Notes that pid 1 said a connection waits (kept until [`Self::connection_waits`] takes
    /// it, if nobody waits yet).
    pub fn note_connection_waiting(&self) {
        self.connection_waiting.notify_one();
    }

    /// Returns once pid 1 has said a connection waits on the run's gateway socket.
    pub async fn connection_waits(&self) {
        self.connection_waiting.notified().await;
    }

    /// Holds one descriptor of this process's table for the next connection pid 1 hands
    /// over, and checks one more is free beside it. At the open-file limit this fails
    /// (`EMFILE`) and nothing should be asked of pid 1: a connection handed over that cannot
    /// be received would only be sent again, over and over, while one not accepted waits in
    /// the socket's backlog until descriptors free up.
    pub fn reserve_descriptor(&self) -> io::Result<()> {
        let copy = || {
            nix::fcntl::fcntl(
                self.socket.get_ref(),
                nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(0),
            )
            .map_err(io::Error::from)
        };
        let held = copy()?;
        // SAFETY: fcntl just returned this descriptor; nothing else owns it.
        #[allow(unsafe_code)]
        let held = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(held) };
        // The one beside it, closed at once: room is left for everything else the supervisor
        // opens (a start's or a teardown's files), not just for this connection.
        let spare = copy()?;
        // SAFETY: as above.
        #[allow(unsafe_code)]
        drop(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(spare) });
        *self.reserved.lock().unwrap_or_else(|p| p.into_inner()) = Some(held);
        Ok(())
    }

    /// Receives what pid 1 sent next: the bytes go to the end of `pending`, the descriptors
    /// that came with them (SCM_RIGHTS, close-on-exec) to the end of `fds`, in the order
    /// sent, and `None` there for a message whose descriptor did not arrive (the kernel
    /// closed it: no free number for it, `MSG_CTRUNC`). pid 1 keeps a copy
    /// of each connection it hands over until told it arrived, so such a connection is asked
    /// for again rather than lost. How many bytes came (0: pid 1 closed the socket).
    pub async fn receive(
        &self,
        pending: &mut Vec<u8>,
        fds: &mut VecDeque<Option<OwnedFd>>,
    ) -> io::Result<usize> {
        loop {
            let mut ready = self.socket.readable().await?;
            let mut chunk = [0u8; RECEIVE_CHUNK];
            // Released just before the receive: a descriptor that comes has a number free,
            // unless another thread takes it meanwhile (then it comes truncated, and is sent
            // again).
            drop(
                self.reserved
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take(),
            );
            let room = self.room();
            let received =
                ready.try_io(|socket| recv_with_room(socket.get_ref().as_fd(), &mut chunk, room));
            match received {
                Ok(Ok(received)) => {
                    #[cfg(test)]
                    if received.bytes > 0 && room == 0 {
                        self.starved
                            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    pending.extend_from_slice(&chunk[..received.bytes]);
                    fds.extend(received.fds.into_iter().map(Some));
                    if received.truncated {
                        // One message's descriptors a receive at most: the kernel ends a
                        // stream receive at a message that carries some.
                        tracing::warn!(
                            "a descriptor pid 1 sent did not arrive (no free number for it)"
                        );
                        fds.push_back(None);
                    }
                    return Ok(received.bytes);
                }
                // A signal: receive again.
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Err(e),
                // Not readable after all: wait for the next readiness.
                Err(_would_block) => continue,
            }
        }
    }

    /// How many descriptors the next receive has room for.
    fn room(&self) -> usize {
        #[cfg(test)]
        if self.starved.load(std::sync::atomic::Ordering::SeqCst) > 0 {
            return 0;
        }
        MAX_FDS_RECEIVED
    }

    /// Makes the next `receives` receives that bring anything leave no room for
    /// descriptors, so the kernel truncates a hand-over as it does when this process is out
    /// of descriptors.
    #[cfg(test)]
    pub(crate) fn starve(&self, receives: usize) {
        self.starved
            .store(receives, std::sync::atomic::Ordering::SeqCst);
    }

    /// Sends `message` to pid 1, waiting for room in the socket's buffer.
    pub async fn send(&self, message: &ToShim) -> io::Result<()> {
        let line = line_of(message)?;
        loop {
            let mut ready = self.socket.writable().await?;
            match ready.try_io(|socket| send_whole(socket.get_ref(), &line, &[])) {
                Ok(sent) => return sent,
                Err(_would_block) => continue,
            }
        }
    }
}

/// Sends `message` with `fds` attached on the control socket `socket` from a thread outside
/// the runtime (a detach at a clean stop), waiting at most `timeout` for room.
pub(crate) fn send_blocking(
    socket: &OwnedFd,
    message: &ToShim,
    fds: &[OwnedFd],
    timeout: Duration,
) -> io::Result<()> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let line = line_of(message)?;
    let deadline = Instant::now() + timeout;
    loop {
        match send_whole(socket, &line, fds) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the shim's control socket stayed full",
                    ));
                }
                let millis = u16::try_from(left.as_millis()).unwrap_or(u16::MAX).max(1);
                let mut ready = [PollFd::new(socket.as_fd(), PollFlags::POLLOUT)];
                // An interrupted or failed wait is retried by the send above.
                let _ = poll(&mut ready, PollTimeout::from(millis));
            }
            sent => return sent,
        }
    }
}

/// `message` as one JSON line.
fn line_of(message: &ToShim) -> io::Result<Vec<u8>> {
    let mut line = serde_json::to_vec(message).map_err(io::Error::other)?;
    line.push(b'\n');
    Ok(line)
}

/// Sends `line` in one `sendmsg` with `fds` attached, without blocking or raising SIGPIPE:
/// all of it, or `WouldBlock` with nothing sent.
fn send_whole(socket: &OwnedFd, line: &[u8], fds: &[OwnedFd]) -> io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let rights = [ControlMessage::ScmRights(&raw)];
    let attached: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &rights };
    let sent = sendmsg::<()>(
        socket.as_raw_fd(),
        &[io::IoSlice::new(line)],
        attached,
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    if sent != line.len() {
        return Err(io::Error::other(
            "a message on the shim's control socket was cut short",
        ));
    }
    Ok(())
}

/// Sets `O_NONBLOCK` on `fd`'s open file description.
pub(crate) fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines sent from the runtime and from another thread arrive whole, with their
    /// descriptors, and what pid 1 sends back is received with its own.
    #[test]
    fn messages_go_whole_and_descriptors_ride_with_them() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let ours = Arc::new(OwnedFd::from(ours));
        let link = runtime
            .block_on(async { ControlLink::register(ours.clone()) })
            .unwrap();
        runtime.block_on(link.send(&ToShim::Accept)).unwrap();
        let (pipe_read, _pipe_write) = io::pipe().unwrap();
        send_blocking(
            &ours,
            &ToShim::Detach { until_ms: 7 },
            &[OwnedFd::from(pipe_read)],
            Duration::from_secs(1),
        )
        .unwrap();
        // However the kernel splits them into reads, both lines come whole and in order.
        let (mut text, mut fds) = (String::new(), Vec::new());
        while text.matches('\n').count() < 2 {
            let mut buffer = [0u8; 256];
            let (read, more) = recv_with_fds(theirs.as_fd(), &mut buffer).unwrap();
            assert!(read > 0, "the socket ended early");
            text.push_str(std::str::from_utf8(&buffer[..read]).unwrap());
            fds.extend(more);
        }
        assert_eq!(text, "\"accept\"\n{\"detach\":{\"until_ms\":7}}\n");
        assert_eq!(fds.len(), 1, "the detach's descriptor");

        let (pipe_read, _pipe_write) = io::pipe().unwrap();
        let raw = [pipe_read.as_raw_fd()];
        nix::sys::socket::sendmsg::<()>(
            theirs.as_raw_fd(),
            &[io::IoSlice::new(b"\"connection\"\n")],
            &[nix::sys::socket::ControlMessage::ScmRights(&raw)],
            nix::sys::socket::MsgFlags::empty(),
            None,
        )
        .unwrap();
        let (mut pending, mut fds) = (Vec::new(), VecDeque::new());
        let read = runtime
            .block_on(link.receive(&mut pending, &mut fds))
            .unwrap();
        assert_eq!(&pending[..read], b"\"connection\"\n");
        assert!(matches!(fds.pop_front(), Some(Some(_))), "{fds:?}");
        drop(theirs);
        let read = runtime
            .block_on(link.receive(&mut pending, &mut fds))
            .unwrap();
        assert_eq!(read, 0, "the end of the socket");
    }
}
