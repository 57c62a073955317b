//! Tunnel hand-offs on a run's gateway socket. An outbound connection's bytes do not travel
//! through gRPC (an HTTP/2 stream's framing, windows and copies cost more than half the
//! throughput of a download) nor through the sandbox's proxy: the proxy hands its client's
//! TCP connection itself to the supervisor. It connects to the gateway socket, sends
//! [`EGRESS_TUNNEL_PREFACE`] and the token `opened` gave it with the client's socket attached
//! (SCM_RIGHTS), then the bytes it already read from the client that go upstream first, and
//! ends. The supervisor takes only a connected TCP socket, never any other descriptor, and
//! relays between it and the upstream itself.
//!
//! Every accepted connection is sorted by its first byte — an HTTP/2 client's is the `P` of
//! its preface, a hand-off's the `T` of its own — without consuming it, so gRPC connections
//! reach the server untouched. Sorting happens per connection, beside the accept loop, and
//! every connection stays counted against the socket's limits until it ends.

use std::io;
use std::os::fd::{AsFd as _, AsRawFd as _, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::Interest;
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt as _;
use tollgate_daemon::serve::Counted;
use tollgate_proto::{EGRESS_TUNNEL_PREFACE, EGRESS_TUNNEL_TOKEN_LEN};

use super::egress::{EgressCalls, Tunnel, TunnelToken};
use crate::sandbox::recv_with_fds;

/// How long a new connection may take to send its first byte, and a hand-off all of it.
const SORT_DEADLINE: Duration = Duration::from_secs(10);
/// Most bytes a hand-off carries for the upstream after its token: what the proxy read with
/// a request head (at most 64 KiB of head, and what came with it), rewritten.
const MAX_FIRST_BYTES: usize = 96 << 10;

/// The connections of `incoming` that are not tunnels, for the gRPC server; tunnels go to
/// `egress` when they come from the run's host id and name a connection waiting for them,
/// and are closed otherwise.
pub(super) fn sort(
    mut incoming: ReceiverStream<io::Result<Counted<UnixStream>>>,
    egress: Arc<EgressCalls>,
    host_id: u32,
) -> ReceiverStream<io::Result<Counted<UnixStream>>> {
    let (grpc, served) = mpsc::channel(1);
    tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                () = grpc.closed() => return,
                next = incoming.next() => next,
            };
            let connection = match next {
                Some(Ok(connection)) => connection,
                Some(Err(e)) => {
                    if grpc.send(Err(e)).await.is_err() {
                        return;
                    }
                    continue;
                }
                None => return,
            };
            let grpc = grpc.clone();
            let egress = egress.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(SORT_DEADLINE, first_byte(connection.get_ref())).await {
                    Ok(Ok(Some(byte))) if byte == EGRESS_TUNNEL_PREFACE[0] => {
                        attach(connection, &egress, host_id).await;
                    }
                    // Anything else is the gRPC server's to answer (or refuse).
                    Ok(Ok(Some(_))) => {
                        let _ = grpc.send(Ok(connection)).await;
                    }
                    // Closed, failed or silent: nothing to serve.
                    Ok(Ok(None)) | Ok(Err(_)) | Err(_) => {}
                }
            });
        }
    });
    ReceiverStream::new(served)
}

/// The connection's first byte, left unread; `None` when it closed without one.
async fn first_byte(stream: &UnixStream) -> io::Result<Option<u8>> {
    let mut byte = [0u8; 1];
    loop {
        stream.readable().await?;
        let peeked = stream.try_io(Interest::READABLE, || {
            nix::sys::socket::recv(
                stream.as_raw_fd(),
                &mut byte,
                nix::sys::socket::MsgFlags::MSG_PEEK,
            )
            .map_err(io::Error::from)
        });
        match peeked {
            Ok(0) => return Ok(None),
            Ok(_) => return Ok(Some(byte[0])),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Reads a hand-off and gives its client's socket to the connection its token names.
async fn attach(connection: Counted<UnixStream>, egress: &EgressCalls, host_id: u32) {
    // Only the run's sandbox may hand connections over (as only it may call).
    let peer = connection.get_ref().peer_cred().ok().map(|cred| cred.uid());
    if peer != Some(host_id) {
        tracing::warn!(peer = ?peer, "a tunnel hand-off from another uid than the run's was closed");
        return;
    }
    // The hand-off connection counts against the socket's limits until it is read.
    let (stream, _slot) = connection.into_parts();
    let handoff = match tokio::time::timeout(SORT_DEADLINE, read_handoff(&stream)).await {
        Ok(Ok(handoff)) => handoff,
        Ok(Err(why)) => {
            tracing::debug!(why = %why, "a tunnel hand-off was refused");
            return;
        }
        Err(_) => return,
    };
    let (token, tunnel) = handoff;
    if !egress.attach(&token, tunnel) {
        tracing::debug!("a tunnel hand-off named no waiting connection and was closed");
    }
}

/// A hand-off, read whole: the token, and the client's socket with the bytes that go first.
async fn read_handoff(stream: &UnixStream) -> Result<(TunnelToken, Tunnel), String> {
    let head = EGRESS_TUNNEL_PREFACE.len() + EGRESS_TUNNEL_TOKEN_LEN;
    let mut received = Vec::with_capacity(head);
    let mut fds: Vec<OwnedFd> = Vec::new();
    let mut buffer = vec![0u8; 16 << 10];
    loop {
        stream.readable().await.map_err(|e| e.to_string())?;
        let read = stream.try_io(Interest::READABLE, || {
            recv_with_fds(stream.as_fd(), &mut buffer)
        });
        let (read, more) = match read {
            Ok(read) => read,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e.to_string()),
        };
        fds.extend(more);
        if read == 0 {
            break;
        }
        received.extend_from_slice(&buffer[..read]);
        if received.len() > head + MAX_FIRST_BYTES {
            return Err(format!("more than {MAX_FIRST_BYTES} bytes to send first"));
        }
    }
    if received.len() < head || &received[..EGRESS_TUNNEL_PREFACE.len()] != EGRESS_TUNNEL_PREFACE {
        return Err("not a tunnel preface and token".into());
    }
    // Exactly one descriptor, and it must be a connected TCP socket: the relay reads and
    // writes it, so nothing else (a file, a pipe, another kind of socket) is ever taken.
    let [client]: [OwnedFd; 1] = fds
        .try_into()
        .map_err(|fds: Vec<OwnedFd>| format!("{} descriptors, not one socket", fds.len()))?;
    let client = tcp_client(client).map_err(|e| format!("the descriptor: {e}"))?;
    let mut token = TunnelToken::default();
    token.copy_from_slice(&received[EGRESS_TUNNEL_PREFACE.len()..head]);
    Ok((
        token,
        Tunnel {
            client,
            first: received.split_off(head),
        },
    ))
}

/// `fd` as a connected TCP stream, or why it is not one.
fn tcp_client(fd: OwnedFd) -> io::Result<tokio::net::TcpStream> {
    use nix::sys::socket::{
        getpeername, getsockopt, sockopt, AddressFamily, SockType, SockaddrLike as _,
        SockaddrStorage,
    };
    if getsockopt(&fd, sockopt::SockType)? != SockType::Stream {
        return Err(io::Error::other("not a stream socket"));
    }
    let peer: SockaddrStorage = getpeername(fd.as_raw_fd())?;
    if !matches!(
        peer.family(),
        Some(AddressFamily::Inet | AddressFamily::Inet6)
    ) {
        return Err(io::Error::other("not a TCP connection"));
    }
    let client = std::net::TcpStream::from(fd);
    client.set_nonblocking(true)?;
    tokio::net::TcpStream::from_std(client)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    use std::io::Write as _;
    use std::os::fd::AsFd;

    /// Sends a hand-off of `fds` on a new connection and reads it as the supervisor does.
    async fn hand_off(
        fds: &[std::os::fd::BorrowedFd<'_>],
        first: &[u8],
    ) -> Result<(TunnelToken, Tunnel), String> {
        let (sandbox, supervisor) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut head = EGRESS_TUNNEL_PREFACE.to_vec();
        head.extend_from_slice(&[7u8; EGRESS_TUNNEL_TOKEN_LEN]);
        let raw: Vec<_> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
        let rights = [ControlMessage::ScmRights(&raw)];
        let iov = [io::IoSlice::new(&head)];
        let sent =
            sendmsg::<()>(sandbox.as_raw_fd(), &iov, &rights, MsgFlags::empty(), None).unwrap();
        assert_eq!(sent, head.len());
        (&sandbox).write_all(first).unwrap();
        drop(sandbox);
        supervisor.set_nonblocking(true).unwrap();
        read_handoff(&UnixStream::from_std(supervisor).unwrap()).await
    }

    #[tokio::test]
    async fn only_one_connected_tcp_socket_is_taken() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (token, tunnel) = hand_off(&[client.as_fd()], b"GET / HTTP/1.1\r\n\r\n")
            .await
            .expect("a connected TCP socket");
        assert_eq!(token, [7u8; EGRESS_TUNNEL_TOKEN_LEN]);
        assert_eq!(tunnel.first, b"GET / HTTP/1.1\r\n\r\n");

        // What a hostile sandbox might hand over instead: each is refused, never relayed.
        let (pipe_read, _pipe_write) = nix::unistd::pipe().unwrap();
        let refused = hand_off(&[pipe_read.as_fd()], b"").await.unwrap_err();
        assert!(refused.contains("the descriptor"), "{refused}");
        let (unix, _other) = std::os::unix::net::UnixStream::pair().unwrap();
        let refused = hand_off(&[unix.as_fd()], b"").await.unwrap_err();
        assert!(refused.contains("not a TCP connection"), "{refused}");
        let refused = hand_off(&[listener.as_fd()], b"").await.unwrap_err();
        assert!(refused.contains("the descriptor"), "{refused}");
        let refused = hand_off(&[client.as_fd(), client.as_fd()], b"")
            .await
            .unwrap_err();
        assert!(refused.contains("2 descriptors"), "{refused}");
        let refused = hand_off(&[], b"").await.unwrap_err();
        assert!(refused.contains("0 descriptors"), "{refused}");
        let refused = hand_off(&[client.as_fd()], &vec![0u8; MAX_FIRST_BYTES + 1])
            .await
            .unwrap_err();
        assert!(refused.contains("to send first"), "{refused}");
    }
}
