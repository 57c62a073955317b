//! Each direction of a relay: sandbox to upstream (the first flight checked: a ClientHello
//! must name the host), upstream to sandbox, copied or spliced socket to socket, every byte
//! counted against the run's budget.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tollgate_receipt::egress::Host;
use tonic::Status;

use super::relay::{Progress, Side};
use super::{clip, EgressCalls, HELLO_DEADLINE, READ_CHUNK};
use crate::egress::hello::{first_flight, ClientHello, FirstFlight, MAX_HELLO};
use crate::egress::splice::{AsSocket, Socket, SplicePipe};
use crate::gateway::gate::Refusal;

impl EgressCalls {
    /// Sandbox to upstream: checks the first bytes (a ClientHello must name the host),
    /// counts every byte, passes the sandbox's end of sending on as a half-close.
    pub(super) async fn outbound<R, W>(
        self: Arc<Self>,
        mut sandbox: R,
        mut preread: Vec<u8>,
        mut upstream: W,
        host: Host,
        progress: Progress,
    ) -> Result<Side, Refusal>
    where
        R: AsyncRead + AsSocket + Unpin + Send + 'static,
        W: AsyncWrite + AsSocket + Unpin + Send + 'static,
    {
        // The first bytes, held until they are known not to be TLS or to be a ClientHello
        // naming the host.
        let mut first: Option<Vec<u8>> = Some(Vec::new());
        let mut hello_deadline = None;
        let mut buffer = vec![0u8; READ_CHUNK.max(preread.len())];
        loop {
            if first.is_none() && preread.is_empty() {
                // Checked: from here on an opaque connection's bytes are only counted.
                if let (Some(from), Some(to)) = (sandbox.socket(), upstream.socket()) {
                    if let Ok(pipe) = SplicePipe::new() {
                        let side = self.splice(&pipe, from, to, 0, &progress).await;
                        if matches!(side, Ok(Side::Finished)) {
                            let _ = upstream.shutdown().await;
                        }
                        return side;
                    }
                }
            }
            // What the proxy read before the hand-off comes first.
            let read = if preread.is_empty() {
                let next = sandbox.read(&mut buffer);
                let read = match hello_deadline {
                    Some(deadline) => match tokio::time::timeout_at(deadline, next).await {
                        Ok(read) => read,
                        Err(_) => {
                            return Err(Refusal::denied(
                                &self.gate.run_id,
                                format!(
                                    "the TLS ClientHello did not arrive whole within {} s",
                                    HELLO_DEADLINE.as_secs()
                                ),
                            )
                            .coded("egress_sni"))
                        }
                    },
                    None => next.await,
                };
                let Ok(read) = read else {
                    return Ok(Side::SandboxGone);
                };
                read
            } else {
                let read = preread.len();
                buffer[..read].copy_from_slice(&preread);
                preread.clear();
                read
            };
            if read == 0 {
                if first.as_ref().is_some_and(|held| !held.is_empty()) {
                    return Err(Refusal::denied(
                        &self.gate.run_id,
                        "the sandbox stopped sending in the middle of a TLS ClientHello".into(),
                    )
                    .coded("egress_sni"));
                }
                let _ = upstream.shutdown().await;
                return Ok(Side::Finished);
            }
            progress.touch();
            self.charge(&self.usage.sent, read, "sent")?;
            progress.counted[0].fetch_add(read as u64, Ordering::SeqCst);
            let held;
            let data: &[u8] = match first.take() {
                None => &buffer[..read],
                Some(mut start) => {
                    start.extend_from_slice(&buffer[..read]);
                    match first_flight(&start) {
                        FirstFlight::NeedMore if start.len() < MAX_HELLO => {
                            hello_deadline.get_or_insert_with(|| {
                                tokio::time::Instant::now() + HELLO_DEADLINE
                            });
                            first = Some(start);
                            continue;
                        }
                        FirstFlight::NeedMore => {
                            return Err(Refusal::denied(
                                &self.gate.run_id,
                                "a TLS ClientHello longer than 16 KiB".into(),
                            )
                            .coded("egress_sni"))
                        }
                        FirstFlight::Malformed(why) => {
                            return Err(
                                Refusal::denied(&self.gate.run_id, why.into()).coded("egress_sni")
                            )
                        }
                        FirstFlight::Hello(hello) => self.check_hello(&host, &hello)?,
                        FirstFlight::NotTls => {}
                    }
                    held = start;
                    &held
                }
            };
            hello_deadline = None;
            if let Err(e) = upstream.write_all(data).await {
                return Err(Refusal::with(
                    Status::unavailable,
                    format!("the upstream stopped taking bytes: {}", e.kind()),
                )
                .ran());
            }
        }
    }

    /// A ClientHello on a connection opened to a name must name exactly that server, in
    /// the clear.
    fn check_hello(&self, host: &Host, hello: &ClientHello) -> Result<(), Refusal> {
        let refuse = |why: String| Err(Refusal::denied(&self.gate.run_id, why).coded("egress_sni"));
        if hello.encrypted_client_hello {
            return refuse(format!(
                "the TLS ClientHello to {host} hides its server name (encrypted_client_hello)"
            ));
        }
        let Host::Name(name) = host else {
            // The address itself was granted: whatever name the handshake asks that server for.
            return Ok(());
        };
        match hello.server_name.as_deref() {
            None => refuse(format!(
                "the TLS ClientHello names no server; a connection to {name} must name {name}"
            )),
            Some(sni) => match Host::parse(sni) {
                Ok(Host::Name(sni)) if sni == *name => Ok(()),
                _ => refuse(format!(
                    "the TLS ClientHello names {:?}, not {name}, the host this connection was granted for",
                    clip(sni)
                )),
            },
        }
    }

    /// Upstream to sandbox: counts every byte; at the upstream's end of data, a half-close.
    pub(super) async fn inbound<R, W>(
        self: Arc<Self>,
        mut upstream: R,
        mut sandbox: W,
        progress: Progress,
    ) -> Result<Side, Refusal>
    where
        R: AsyncRead + AsSocket + Unpin + Send + 'static,
        W: AsyncWrite + AsSocket + Unpin + Send + 'static,
    {
        if let (Some(from), Some(to)) = (upstream.socket(), sandbox.socket()) {
            if let Ok(pipe) = SplicePipe::new() {
                let side = self.splice(&pipe, from, to, 1, &progress).await;
                if matches!(side, Ok(Side::Finished)) {
                    let _ = sandbox.shutdown().await;
                }
                return side;
            }
        }
        let mut buffer = vec![0u8; READ_CHUNK];
        loop {
            let read = match upstream.read(&mut buffer).await {
                Ok(read) => read,
                Err(e) => {
                    return Err(Refusal::with(
                        Status::unavailable,
                        format!("the upstream connection failed: {}", e.kind()),
                    )
                    .ran())
                }
            };
            if read == 0 {
                let _ = sandbox.shutdown().await;
                return Ok(Side::Finished);
            }
            progress.touch();
            self.charge(&self.usage.received, read, "received")?;
            progress.counted[1].fetch_add(read as u64, Ordering::SeqCst);
            if sandbox.write_all(&buffer[..read]).await.is_err() {
                return Ok(Side::SandboxGone);
            }
        }
    }

    /// One direction of an opaque connection, socket to socket through `pipe`: `way` 0 is
    /// the sandbox sending (`from` is its client's socket), 1 the upstream. Each pipe-full is charged
    /// to the run's budget before it goes on, as copied bytes are. Returns at `from`'s end of
    /// data (the caller passes the half-close on).
    pub(super) async fn splice(
        &self,
        pipe: &SplicePipe,
        from: Socket<'_>,
        to: Socket<'_>,
        way: usize,
        progress: &Progress,
    ) -> Result<Side, Refusal> {
        let (usage, name) = if way == 0 {
            (&self.usage.sent, "sent")
        } else {
            (&self.usage.received, "received")
        };
        loop {
            let moved = match pipe.fill(from).await {
                Ok(0) => return Ok(Side::Finished),
                Ok(moved) => moved,
                Err(_) if way == 0 => return Ok(Side::SandboxGone),
                Err(e) => {
                    return Err(Refusal::with(
                        Status::unavailable,
                        format!("the upstream connection failed: {}", e.kind()),
                    )
                    .ran())
                }
            };
            progress.touch();
            self.charge(usage, moved, name)?;
            progress.counted[way].fetch_add(moved as u64, Ordering::SeqCst);
            match pipe.drain(to, moved).await {
                Ok(()) => {}
                Err(_) if way == 1 => return Ok(Side::SandboxGone),
                Err(e) => {
                    return Err(Refusal::with(
                        Status::unavailable,
                        format!("the upstream stopped taking bytes: {}", e.kind()),
                    )
                    .ran())
                }
            }
        }
    }
}
