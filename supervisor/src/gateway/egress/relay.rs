//! One connection after `opened`: its client awaited from the sandbox's proxy, relayed
//! (opaque, or through the supervisor's own inspection) until either side, a bound, the
//! receipt or the run ends it, and its end recorded.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncWrite;
use tokio::sync::{mpsc, oneshot};
use tollgate_audit::Decision;
use tollgate_proto::v1 as pb;
use tonic::{Status, Streaming};

use super::connect::Connected;
use super::{default_classify, EgressCalls, Target, Tunnel, ATTACH_DEADLINE, INSPECTED_BUFFER};
use crate::egress::splice::{AsSocket, Socket};
use crate::gateway::gate::Refusal;
use crate::gateway::inspection::Inspection;

impl EgressCalls {
    /// Waits for the connection's tunnel, relays until the connection ends, then records how
    /// it ended.
    pub(super) async fn relay(
        self: Arc<Self>,
        connected: Connected,
        frames: Streaming<pb::EgressFrame>,
        tunnel: oneshot::Receiver<Tunnel>,
        tx: mpsc::Sender<Result<pb::EgressFrame, Status>>,
        call_id: String,
        target: Target,
    ) {
        let started = Instant::now();
        let counted = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let (address, port) = (connected.address, connected.port);
        let end = self
            .relay_until_end(connected, frames, tunnel, &tx, &call_id, &counted, started)
            .await;
        if let Err(refusal) = &end {
            // The sandbox hears why (bounded: a sandbox that stopped reading does not hold
            // this task).
            let status = refusal.status.clone();
            let _ = tokio::time::timeout(Duration::from_secs(1), tx.send(Err(status))).await;
        }
        drop(tx);
        self.usage.open.fetch_sub(1, Ordering::SeqCst);
        let (decision, reason, code) = match &end {
            Ok(reason) => (Decision::Allow, (*reason).to_owned(), None),
            Err(refusal) => (refusal.decision(), refusal.reason.clone(), refusal.code),
        };
        let sent = counted[0].load(Ordering::SeqCst);
        let received = counted[1].load(Ordering::SeqCst);
        let written = tokio::task::block_in_place(|| {
            self.record(&call_id, &target, decision, |entry| {
                let entry = entry
                    .reason(reason.as_str())
                    .meta("phase", "closed")
                    .meta("address", address.to_string())
                    .meta("port", i64::from(port))
                    .meta("bytes_sent", i64::try_from(sent).unwrap_or(i64::MAX))
                    .meta(
                        "bytes_received",
                        i64::try_from(received).unwrap_or(i64::MAX),
                    )
                    .meta(
                        "duration_ms",
                        i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX),
                    );
                match code {
                    Some(code) => entry.meta("code", code),
                    None => entry,
                }
            })
        });
        if let Err(e) = written {
            tracing::error!(run_id = %self.gate.run_id, error = %e.message(), "could not audit an outbound connection's end");
        }
    }

    /// The relay itself: `Ok` with how a normal end came, or the refusal that cut it. Both
    /// sockets are closed when this returns.
    #[allow(clippy::too_many_arguments)]
    async fn relay_until_end(
        self: &Arc<Self>,
        connected: Connected,
        frames: Streaming<pb::EgressFrame>,
        tunnel: oneshot::Receiver<Tunnel>,
        tx: &mpsc::Sender<Result<pb::EgressFrame, Status>>,
        call_id: &str,
        counted: &Arc<[AtomicU64; 2]>,
        started: Instant,
    ) -> Result<&'static str, Refusal> {
        let outside = self.ended_from_outside(tx, frames);
        tokio::pin!(outside);
        let tunnel = tokio::select! {
            attached = tokio::time::timeout(ATTACH_DEADLINE, tunnel) => match attached {
                Ok(Ok(tunnel)) => tunnel,
                Ok(Err(_)) => {
                    return Err(Refusal::with(Status::internal, "the hand-off was lost".into()).ran())
                }
                Err(_) => {
                    return Err(Refusal::with(
                        Status::deadline_exceeded,
                        format!(
                            "the sandbox's proxy did not hand the connection's client over within {} s",
                            ATTACH_DEADLINE.as_secs()
                        ),
                    )
                    .ran()
                    .coded("egress_tunnel"))
                }
            },
            end = &mut outside => return end,
        };
        let activity = Arc::new(AtomicU64::new(elapsed_ms(started)));
        let progress = || Progress {
            activity: activity.clone(),
            counted: counted.clone(),
            started,
        };
        let host = connected.host.clone();
        // The proxy keeps its own descriptor of the client's socket until the stream ends:
        // the connection is ended on the socket itself (a shutdown), not by closing ours.
        let client = match std::os::fd::AsFd::as_fd(&tunnel.client).try_clone_to_owned() {
            Ok(client) => client,
            Err(e) => {
                return Err(Refusal::with(
                    Status::unavailable,
                    format!("keeping the client's connection: {}", e.kind()),
                )
                .ran())
            }
        };
        let first = tunnel.first;
        let (sandbox_read, sandbox_write) = tunnel.client.into_split();
        let sandbox_write = ClientWrite(Some(sandbox_write));
        // Opaque: the sandbox's bytes go straight to the upstream socket. Read: they go to
        // the supervisor's own HTTP (and TLS) side of an in-memory pipe, which makes the
        // upstream connection itself.
        let (mut outbound, mut inbound, mut reader) = if connected.inspected {
            let (client, pipe) = tokio::io::duplex(INSPECTED_BUFFER);
            let (pipe_read, pipe_write) = tokio::io::split(pipe);
            let inspection = Inspection {
                gate: self.gate.clone(),
                host: connected.host.clone(),
                port: connected.port,
                grant: connected.grant,
                config: self.setup.config.clone(),
                ca: self.setup.ca.clone(),
                classify: self.setup.classify.clone().unwrap_or_else(default_classify),
                call_id: call_id.to_owned(),
                plain: connected.http,
            };
            (
                tokio::spawn(self.clone().outbound(
                    sandbox_read,
                    first,
                    pipe_write,
                    host,
                    progress(),
                )),
                tokio::spawn(self.clone().inbound(pipe_read, sandbox_write, progress())),
                Some(tokio::spawn(inspection.serve(client, connected.upstream))),
            )
        } else {
            let (upstream_read, upstream_write) = connected.upstream.into_split();
            (
                tokio::spawn(self.clone().outbound(
                    sandbox_read,
                    first,
                    upstream_write,
                    host,
                    progress(),
                )),
                tokio::spawn(
                    self.clone()
                        .inbound(upstream_read, sandbox_write, progress()),
                ),
                None,
            )
        };
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let (mut outbound_done, mut inbound_done, mut reader_done) = (false, false, false);
        let relay_failed = |e: tokio::task::JoinError| {
            Refusal::with(Status::internal, format!("relay: {e}")).ran()
        };
        let end: Result<&'static str, Refusal> = loop {
            tokio::select! {
                done = async { reader.as_mut().expect("guarded").await }, if reader.is_some() && !reader_done => match done {
                    // The supervisor's side is done: what it wrote last still has to reach the
                    // sandbox (the pipe ends, and `inbound` half-closes).
                    Ok(Ok(())) if inbound_done => break Ok("closed"),
                    Ok(Ok(())) => reader_done = true,
                    Ok(Err(refusal)) => break Err(refusal),
                    Err(e) => break Err(relay_failed(e)),
                },
                done = &mut outbound, if !outbound_done => match done {
                    Ok(Ok(Side::Finished)) if inbound_done => break Ok("closed"),
                    // The sandbox finished sending; the other way may still carry an answer.
                    Ok(Ok(Side::Finished)) => outbound_done = true,
                    Ok(Ok(Side::SandboxGone)) => break Ok("closed by the sandbox"),
                    Ok(Err(refusal)) => break Err(refusal),
                    Err(e) => break Err(relay_failed(e)),
                },
                done = &mut inbound, if !inbound_done => match done {
                    // The upstream finished sending, and the sandbox has been told.
                    Ok(Ok(Side::Finished)) if outbound_done || reader_done => break Ok("closed"),
                    Ok(Ok(Side::Finished)) => inbound_done = true,
                    Ok(Ok(Side::SandboxGone)) => break Ok("closed by the sandbox"),
                    Ok(Err(refusal)) => break Err(refusal),
                    Err(e) => break Err(relay_failed(e)),
                },
                end = &mut outside => break end,
                _ = tick.tick() => {
                    let quiet = elapsed_ms(started).saturating_sub(activity.load(Ordering::SeqCst));
                    if Duration::from_millis(quiet) >= self.idle {
                        break Err(Refusal::with(
                            Status::deadline_exceeded,
                            format!(
                                "nothing was sent either way for {} s (limits.egress_idle_seconds)",
                                self.idle.as_secs()
                            ),
                        ).ran().coded("egress_idle"));
                    }
                    if self.gate.check_alive().is_err() {
                        break Err(self.run_ended());
                    }
                }
            }
        };
        // The halves are dropped with their tasks: the upstream closes.
        outbound.abort();
        inbound.abort();
        if let Some(reader) = reader {
            reader.abort();
        }
        // A plain request refused before any answer is left to the proxy, which answers
        // with the refusal; every other end closes the client's connection here and now.
        let unanswered = connected.http && counted[1].load(Ordering::SeqCst) == 0;
        match end {
            Err(mut refusal) if unanswered => {
                refusal.status.metadata_mut().insert(
                    tollgate_proto::EGRESS_UNANSWERED,
                    tonic::metadata::MetadataValue::from_static("true"),
                );
                Err(refusal)
            }
            end => {
                let _ = nix::sys::socket::shutdown(
                    std::os::fd::AsRawFd::as_raw_fd(&client),
                    nix::sys::socket::Shutdown::Both,
                );
                end
            }
        }
    }

    /// Resolves when something outside the relay ends the connection: the sandbox ending or
    /// misusing its control stream (bytes never go on it), the run's end, the receipt's
    /// expiry.
    async fn ended_from_outside(
        &self,
        tx: &mpsc::Sender<Result<pb::EgressFrame, Status>>,
        mut frames: Streaming<pb::EgressFrame>,
    ) -> Result<&'static str, Refusal> {
        let mut ending = self.gate.streams_end.subscribe();
        let expires = std::time::UNIX_EPOCH
            + Duration::from_secs(u64::try_from(self.gate.expires_at()).unwrap_or(0));
        let until_expiry = expires
            .duration_since(std::time::SystemTime::now())
            .unwrap_or_default();
        let expiry = tokio::time::sleep(until_expiry);
        tokio::pin!(expiry);
        // A sandbox that half-closes its side of the stream keeps the connection.
        let mut control_open = true;
        loop {
            tokio::select! {
                () = tx.closed() => return Ok("closed by the sandbox"),
                message = frames.message(), if control_open => match message {
                    Ok(None) => control_open = false,
                    Ok(Some(_)) => return Err(Refusal::with(
                        Status::invalid_argument,
                        "after `open`, a connection's bytes go on its client's own socket, not its stream".into(),
                    )),
                    Err(_) => return Ok("closed by the sandbox"),
                },
                _ = ending.wait_for(|ended| *ended) => return Err(self.run_ended()),
                () = &mut expiry => return Err(Refusal::denied(
                    &self.gate.run_id,
                    format!("the receipt expired at {}", tollgate_receipt::rfc3339(self.gate.expires_at())),
                )
                .ran()
                .coded("egress_expired")),
            }
        }
    }

    pub(super) fn run_ended(&self) -> Refusal {
        Refusal::denied(&self.gate.run_id, "the run ended".into())
            .ran()
            .coded("egress_run_ended")
    }
}

/// The write half of a client's connection. Dropping tokio's half-closes the connection;
/// dropping this one does not: a plain request refused before any answer stays open for the
/// proxy to answer, and every other end shuts the socket down on purpose.
struct ClientWrite(Option<tokio::net::tcp::OwnedWriteHalf>);

impl ClientWrite {
    fn half(self: std::pin::Pin<&mut Self>) -> std::pin::Pin<&mut tokio::net::tcp::OwnedWriteHalf> {
        std::pin::Pin::new(
            self.get_mut()
                .0
                .as_mut()
                .expect("the half is taken only when dropped"),
        )
    }
}

impl Drop for ClientWrite {
    fn drop(&mut self) {
        if let Some(half) = self.0.take() {
            half.forget();
        }
    }
}

impl AsyncWrite for ClientWrite {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.half().poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.half().poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.half().poll_shutdown(cx)
    }
}

impl AsSocket for ClientWrite {
    fn socket(&self) -> Option<Socket<'_>> {
        self.0.as_ref().and_then(|half| half.socket())
    }
}

/// How one direction of a relay ended without a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    /// Its sender finished, and the receiver was told (a half-close).
    Finished,
    /// The sandbox's side (its client's socket) failed or went away: the connection is over.
    SandboxGone,
}

/// What both halves of a relay report: when a byte last moved, and the bytes each way.
pub(super) struct Progress {
    pub(super) activity: Arc<AtomicU64>,
    pub(super) counted: Arc<[AtomicU64; 2]>,
    pub(super) started: Instant,
}

impl Progress {
    pub(super) fn touch(&self) {
        self.activity
            .store(elapsed_ms(self.started), Ordering::SeqCst);
    }
}

fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}
