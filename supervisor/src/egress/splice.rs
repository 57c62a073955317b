//! Moving an opaque connection's bytes between two sockets without copying them through the
//! supervisor: `splice(2)` from one socket into a pipe, then from the pipe into the other.
//! The kernel moves page references; the supervisor sees only counts, which is all an opaque
//! tunnel needs (every byte still counted against the run's budget, every move still a sign
//! of activity).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nix::fcntl::{FcntlArg, OFlag, SpliceFFlags};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Bytes one pipe holds, and so the most one splice moves: fewer system calls per byte than
/// the 64 KiB default, and still small beside a socket's own buffers.
const PIPE_BYTES: usize = 1 << 20;

/// One socket end of a splice: an upstream connection, or the sandbox client's own.
#[derive(Debug, Clone, Copy)]
pub struct Socket<'a>(pub &'a TcpStream);

impl Socket<'_> {
    async fn ready(&self, interest: Interest) -> io::Result<()> {
        self.0.ready(interest).await.map(|_| ())
    }

    fn try_io<R>(&self, interest: Interest, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        self.0.try_io(interest, f)
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// What may be a socket end of a splice: the socket halves are, the supervisor's in-memory
/// pipes to its own TLS side are not.
pub trait AsSocket {
    /// The socket, when this is one.
    fn socket(&self) -> Option<Socket<'_>>;
}

impl AsSocket for tokio::net::tcp::OwnedReadHalf {
    fn socket(&self) -> Option<Socket<'_>> {
        Some(Socket(self.as_ref()))
    }
}

impl AsSocket for tokio::net::tcp::OwnedWriteHalf {
    fn socket(&self) -> Option<Socket<'_>> {
        Some(Socket(self.as_ref()))
    }
}

impl<T> AsSocket for tokio::io::ReadHalf<T> {
    fn socket(&self) -> Option<Socket<'_>> {
        None
    }
}

impl<T> AsSocket for tokio::io::WriteHalf<T> {
    fn socket(&self) -> Option<Socket<'_>> {
        None
    }
}

/// A pipe that carries one direction of one connection.
#[derive(Debug)]
pub struct SplicePipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl SplicePipe {
    /// A new, empty, non-blocking pipe.
    pub fn new() -> io::Result<Self> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
        // A larger pipe is an optimisation only: the default size works.
        let _ = nix::fcntl::fcntl(&write, FcntlArg::F_SETPIPE_SZ(PIPE_BYTES as i32));
        Ok(Self { read, write })
    }

    /// Takes what `from` has (up to a pipe-full) into the pipe and returns how many bytes
    /// that was: 0 at `from`'s end of data. Call on an empty pipe (a new one, or after
    /// [`drain`](Self::drain)).
    pub async fn fill(&self, from: Socket<'_>) -> io::Result<usize> {
        loop {
            from.ready(Interest::READABLE).await?;
            // The pipe is empty, so "would block" can only mean `from` has nothing yet.
            match from.try_io(Interest::READABLE, || {
                nix::fcntl::splice(from.fd(), None, &self.write, None, PIPE_BYTES, FLAGS)
                    .map_err(io::Error::from)
            }) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                moved => return moved,
            }
        }
    }

    /// Gives the `filled` bytes in the pipe to `to`, leaving the pipe empty.
    pub async fn drain(&self, to: Socket<'_>, filled: usize) -> io::Result<()> {
        let mut left = filled;
        while left > 0 {
            to.ready(Interest::WRITABLE).await?;
            match to.try_io(Interest::WRITABLE, || {
                nix::fcntl::splice(&self.read, None, to.fd(), None, left, FLAGS)
                    .map_err(io::Error::from)
            }) {
                Ok(written) => left -= written,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// Never block on the pipe (the sockets are non-blocking already); move pages, not bytes.
const FLAGS: SpliceFFlags = SpliceFFlags::SPLICE_F_NONBLOCK.union(SpliceFFlags::SPLICE_F_MOVE);

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    #[tokio::test]
    async fn bytes_pass_between_two_tcp_sockets_in_order_and_the_end_is_zero() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let sender = tokio::spawn(async move {
            let mut upstream = TcpStream::connect(address).await.unwrap();
            let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
            upstream.write_all(&data).await.unwrap();
            data
        });
        let (upstream, _) = listener.accept().await.unwrap();
        let mut sandbox = TcpStream::connect(address).await.unwrap();
        let (client, _) = listener.accept().await.unwrap();
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            sandbox.read_to_end(&mut got).await.unwrap();
            got
        });
        let pipe = SplicePipe::new().unwrap();
        let mut total = 0;
        loop {
            let moved = pipe.fill(Socket(&upstream)).await.unwrap();
            if moved == 0 {
                break;
            }
            assert!(moved <= PIPE_BYTES);
            pipe.drain(Socket(&client), moved).await.unwrap();
            total += moved;
        }
        drop(client);
        let sent = sender.await.unwrap();
        assert_eq!(total, sent.len());
        assert_eq!(reader.await.unwrap(), sent);
    }
}
