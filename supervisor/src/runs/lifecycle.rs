//! A live run's lifecycle work, scheduled without a thread of its own: its expiry, its two
//! output relays, the watch on its shim and the publication of its end are tasks on the run
//! runtime (the gateway's: one worker thread); the teardown that blocks (killing and removing
//! the cgroup, unmounting, writing the report) goes to that runtime's blocking pool once the
//! run has ended. Threads are pids: a supervisor whose thread count grew with its runs would
//! run the host out of pids at a few thousand runs.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::unix::AsyncFd;
use tollgate_audit::{AuditError, PendingEntry};
use tollgate_shim_protocol::protocol::{AgentExit, FromShim};

use super::teardown::Ended;
use super::{LiveRun, OutputSink, OutputStream, RestoreHandles, RestoreMeta, RunManager};
use crate::gateway::handed::{deliver, deliver_not_accepted};
use crate::gateway::HandedSender;
use crate::records::RunState;
use crate::sandbox::{
    set_nonblocking, ControlLink, RunDirs, SandboxOutput, SandboxProcess, ShimWatch,
};

/// The reason of a run that expired.
pub(super) const EXPIRED: &str = "the receipt expired";

/// The most bytes one relay reads at a time (on the worker's stack, never kept per run).
const RELAY_CHUNK: usize = 8192;

/// What a live run's lifecycle tasks need (see [`RunManager::spawn_run_tasks`]).
pub(super) struct RunTasks {
    /// The run id.
    pub run_id: String,
    /// The receipt's expiry, Unix seconds.
    pub expires_at: i64,
    /// The live run.
    pub live: Arc<LiveRun>,
    /// Its directories.
    pub dirs: RunDirs,
    /// When it was admitted (Unix milliseconds).
    pub started_ms: u64,
    /// Set when the run is kept for a live restore (see `RestoreHandles`).
    pub restore: Option<RestoreMeta>,
}

/// How watching a shim ended.
pub(super) enum Watched {
    /// The shim ended, with the agent's exit when it reported one.
    Ended(Option<AgentExit>),
    /// pid 1 took the run over for a live restore.
    Detached,
}

/// Reads shim events until the shim's end or a confirmed detach, blocking the caller (a
/// re-adoption that failed at start-up, before any run is live).
pub(super) fn watch(mut process: SandboxProcess) -> Watched {
    let mut exit = None;
    while let Ok(Some(event)) = process.next_event() {
        match event {
            FromShim::Exited(code) => exit = Some(code),
            FromShim::Detached => return Watched::Detached,
            _ => {}
        }
    }
    let _ = process.wait();
    Watched::Ended(exit)
}

/// Notes one shim event; `Some` once it settles how the watch ends.
fn on_event(event: FromShim, exit: &mut Option<AgentExit>) -> Option<Watched> {
    match event {
        FromShim::Exited(code) => *exit = Some(code),
        FromShim::Detached => return Some(Watched::Detached),
        _ => {}
    }
    None
}

/// What the watch reads besides pid 1's events: where gateway connections go.
struct Handing<'a> {
    /// The run's control link (pid 1 saying a connection waits is noted on it).
    link: &'a ControlLink,
    /// Where connections go.
    connections: &'a HandedSender,
    /// pid 1 keeps each connection until told it arrived (see `ShimWatch`).
    keeps_connections: bool,
}

/// Handles one line from the shim: a gateway connection goes to the gateway with the
/// descriptor that came with it (the first not yet taken; none when it did not arrive), an
/// event is noted.
fn on_line(
    line: &[u8],
    exit: &mut Option<AgentExit>,
    fds: &mut VecDeque<Option<OwnedFd>>,
    handing: &Handing<'_>,
) -> Option<Watched> {
    let Handing {
        link,
        connections,
        keeps_connections,
    } = *handing;
    match serde_json::from_slice(line) {
        Ok(FromShim::Connection) => match fds.pop_front().flatten() {
            Some(fd) => deliver(connections, Some(fd)),
            // Asked for again when pid 1 kept it; an older pid 1 kept none: asked afresh.
            None if !keeps_connections => deliver_not_accepted(connections),
            None => deliver(connections, None),
        },
        Ok(FromShim::NotAccepted) => deliver_not_accepted(connections),
        Ok(FromShim::ConnectionWaiting) => link.note_connection_waiting(),
        Ok(event) => return on_event(event, exit),
        Err(_) => {}
    }
    None
}

/// Reads the shim's control link without blocking a thread, until the socket closes (the
/// shim ended) or pid 1 confirms a detach; the gateway connections pid 1 hands over meanwhile
/// go to `connections`. `buffered`: bytes read ahead; `keeps_connections`: see `ShimWatch`.
async fn watch_events(
    link: &ControlLink,
    buffered: Vec<u8>,
    connections: &HandedSender,
    keeps_connections: bool,
) -> Watched {
    let handing = Handing {
        link,
        connections,
        keeps_connections,
    };
    let mut exit = None;
    let mut pending = buffered;
    let mut fds = VecDeque::new();
    loop {
        while let Some(end) = pending.iter().position(|&byte| byte == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            if let Some(watched) = on_line(&line, &mut exit, &mut fds, &handing) {
                return watched;
            }
        }
        match link.receive(&mut pending, &mut fds).await {
            Ok(0) | Err(_) => {
                // A last line without its newline still counts.
                if !pending.is_empty() {
                    if let Some(watched) = on_line(&pending, &mut exit, &mut fds, &handing) {
                        return watched;
                    }
                }
                return Watched::Ended(exit);
            }
            Ok(_) => {}
        }
    }
}

/// `fd`, non-blocking, registered with the runtime for reading.
fn register(fd: Arc<OwnedFd>) -> std::io::Result<AsyncFd<Arc<OwnedFd>>> {
    set_nonblocking(&fd)?;
    // SAFETY: the `AsyncFd` holds the descriptor (an `OwnedFd`, open as long as any `Arc`
    // of it lives, this one included) and nothing replaces or closes it while registered.
    #[allow(unsafe_code)]
    let registered = unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) };
    registered.map_err(std::io::Error::from)
}

/// One output pipe of a run relayed to its sink, within the run's output budget (shared by
/// both pipes; what is cut is noted in `truncated` for the report).
struct Relay {
    stream: OutputStream,
    run_id: String,
    output: OutputSink,
    budget: Arc<AtomicU64>,
    truncated: Arc<AtomicBool>,
}

impl Relay {
    /// Forwards one read's bytes; the number read (0 at EOF).
    fn forward(
        &self,
        read: &mut dyn FnMut(&mut [u8]) -> std::io::Result<usize>,
    ) -> std::io::Result<usize> {
        let mut buffer = [0u8; RELAY_CHUNK];
        let n = read(&mut buffer)?;
        if n == 0 {
            return Ok(0);
        }
        let allowed = self
            .budget
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                Some(left.saturating_sub(n as u64))
            })
            .unwrap_or(0)
            .min(n as u64) as usize;
        if allowed < n {
            self.truncated.store(true, Ordering::Relaxed);
        }
        if allowed > 0 {
            (self.output)(&self.run_id, self.stream, &buffer[..allowed]);
        }
        Ok(n)
    }

    /// Relays `pipe` until its end (EOF, or an error such as a terminal's hang-up), on the
    /// runtime: readiness from epoll, reads that never block (the descriptor is made
    /// non-blocking).
    async fn run(self, pipe: Arc<OwnedFd>) {
        let pipe = match register(pipe) {
            Ok(pipe) => pipe,
            Err(e) => {
                tracing::error!(run_id = %self.run_id, error = %e, "an output pipe cannot be watched; its output is dropped");
                return;
            }
        };
        loop {
            let Ok(mut ready) = pipe.readable().await else {
                return;
            };
            let read = ready.try_io(|fd| {
                self.forward(&mut |buffer| {
                    nix::unistd::read(fd.get_ref(), buffer).map_err(std::io::Error::from)
                })
            });
            match read {
                // Not readable after all: wait for the next readiness.
                Err(_would_block) => continue,
                Ok(Ok(0) | Err(_)) => return,
                Ok(Ok(_)) => {}
            }
        }
    }
}

/// Waits until `expires_at` (Unix seconds), or the expiry an amendment moved it to; `true`
/// when it came, `false` when the run ended or was left detached first.
pub(super) async fn expire_at(live: &LiveRun, expires_at: i64) -> bool {
    // Subscribed before the state is read: a change made after this is never missed.
    let mut changes = live.changes.subscribe();
    loop {
        if live.is_ended() || live.is_detached() {
            return false;
        }
        let expires_at = match live.amended_expiry.load(Ordering::SeqCst) {
            0 => expires_at,
            amended => amended,
        };
        let deadline = UNIX_EPOCH + Duration::from_secs(expires_at.max(0) as u64);
        let left = match deadline.duration_since(SystemTime::now()) {
            Ok(left) if !left.is_zero() => left,
            _ => return true,
        };
        tokio::select! {
            () = tokio::time::sleep(left) => {}
            changed = changes.changed() => {
                if changed.is_err() {
                    return false;
                }
            }
        }
    }
}

/// Waits until `live` has ended or was left detached.
async fn ended_or_detached(live: &LiveRun) {
    let mut changes = live.changes.subscribe();
    while !live.is_ended() && !live.is_detached() {
        if changes.changed().await.is_err() {
            return;
        }
    }
}

impl RunManager {
    /// Publishes the end of `run_id` to its watchers once teardown has recorded it: a task
    /// that waits on the run's changes, not a thread.
    pub(super) fn publish_end(self: &Arc<Self>, run_id: &str) {
        let (manager, id) = (Arc::downgrade(self), run_id.to_owned());
        let live = self.live_run(run_id);
        self.tasks.spawn(async move {
            if let Some(live) = &live {
                ended_or_detached(live).await;
            }
            // A quick read of one record, off the runtime's worker: on the teardown
            // workers, queued behind the run's teardown.
            let Some(teardowns) = manager.upgrade().map(|m| m.teardowns.clone()) else {
                return;
            };
            teardowns.submit(move || {
                if let Some(manager) = manager.upgrade() {
                    manager.publish_if_ended(&id);
                }
            });
        });
    }

    /// Publishes `run_id`'s end when its record is as final as it will get.
    fn publish_if_ended(&self, run_id: &str) {
        let Some(record) = self.records.get(run_id).ok().flatten() else {
            return;
        };
        // Left running for the next supervisor (live restore): it has not ended, so no end
        // is published; the stream closes with this server.
        if !record.state.is_final() && (self.left_detached() || self.live_run(run_id).is_some()) {
            return;
        }
        // Once torn down, the record is as final as it will get (a failed write leaves it
        // non-final): publish it rather than wait on it forever.
        self.hub.end(run_id, crate::wire::run_proto(&record));
    }

    /// A re-adopted run's tasks: as a started run's, with nothing to audit first.
    pub(super) fn spawn_run_tasks(
        self: &Arc<Self>,
        tasks: RunTasks,
        process: SandboxProcess,
        output: SandboxOutput,
        sink: OutputSink,
    ) {
        self.spawn_run_tasks_after(tasks, process, output, sink, None);
    }

    /// A live run's tasks: its expiry, its output relays, and the watch on its shim, which
    /// (after `created` is on disk) tears the run down once the shim has ended and both
    /// relays have drained — unless pid 1 took the run over for a live restore, which leaves
    /// it to the next supervisor.
    pub(super) fn spawn_run_tasks_after(
        self: &Arc<Self>,
        tasks: RunTasks,
        process: SandboxProcess,
        SandboxOutput {
            stdout,
            stderr,
            input,
        }: SandboxOutput,
        output: OutputSink,
        created: Option<Result<PendingEntry, AuditError>>,
    ) {
        let RunTasks {
            run_id,
            expires_at,
            live,
            dirs,
            started_ms,
            restore,
        } = tasks;
        let ShimWatch {
            child,
            control,
            buffered,
            reaped,
            keeps_connections,
        } = process.into_watch();
        // Shared by the tasks and, for a live restore, the hand-over: one descriptor each.
        let control = Arc::new(OwnedFd::from(control));
        let (stdout, stderr) = (
            Arc::new(OwnedFd::from(stdout)),
            Arc::new(OwnedFd::from(stderr)),
        );
        if let Some((shim_pid, argv, started_ms)) = restore {
            live.keep_for_restore(RestoreHandles {
                control: control.clone(),
                stdout: stdout.clone(),
                stderr: stderr.clone(),
                shim_pid,
                argv,
                started_ms,
            });
        }
        if let Some(end) = input {
            *live.input.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::fs::File::from(end));
        }
        // An expiry that fell during the start fires at once.
        self.tasks.spawn(expire(
            live.clone(),
            Arc::downgrade(self),
            run_id.clone(),
            expires_at,
        ));
        let truncated = Arc::new(AtomicBool::new(false));
        let relays = [
            (stdout, OutputStream::Stdout),
            (stderr, OutputStream::Stderr),
        ]
        .map(|(pipe, stream)| {
            let relay = Relay {
                stream,
                run_id: run_id.clone(),
                output: output.clone(),
                budget: live.output_left.clone(),
                truncated: truncated.clone(),
            };
            self.tasks.spawn(relay.run(pipe))
        });
        let manager = self.clone();
        self.tasks.spawn(async move {
            // The watch reads the link; the gateway asks pid 1 for its connections on it.
            let watched = match ControlLink::register(control) {
                Ok(link) => {
                    let link = Arc::new(link);
                    let (connections, handed) = crate::gateway::handed(link.clone());
                    manager.serve_handed(&run_id, &live, connections);
                    watch_events(&link, buffered, &handed, keeps_connections).await
                }
                Err(e) => {
                    // Not pollable here (it always is on Linux): an error, not a silent end.
                    tracing::error!(run_id = %run_id, error = %e, "the shim's control socket cannot be watched; the run is treated as ended");
                    Watched::Ended(None)
                }
            };
            if let Watched::Detached = watched {
                live.set_detached();
            }
            let exit = match watched {
                Watched::Ended(exit) => exit,
                Watched::Detached => {
                    manager
                        .teardowns
                        .submit(move || audited(&run_id, created));
                    return;
                }
            };
            for relay in relays {
                let _ = relay.await;
            }
            // Queued, not awaited: the run's end (`set_ended`) is what waiters wait on, and
            // a teardown that panicked is logged by the worker.
            let teardowns = manager.teardowns.clone();
            teardowns.submit(move || {
                audited(&run_id, created);
                ShimWatch::reap(child, &reaped);
                manager.teardown(
                    &manager.endings,
                    &run_id,
                    &live,
                    &dirs,
                    Ended::Agent(exit, truncated.load(Ordering::Relaxed)),
                    started_ms,
                );
            });
        });
    }
}

/// Waits for a sandbox's creation to be on disk (its teardown's entry comes after it).
fn audited(run_id: &str, created: Option<Result<PendingEntry, AuditError>>) {
    if let Some(Err(e)) = created.map(|created| created.and_then(PendingEntry::wait)) {
        tracing::error!(run_id = %run_id, error = %e, "could not audit a sandbox's creation");
    }
}

/// Ends the run (and its tree) at its expiry; a detached run's pid 1 enforces its expiry
/// itself.
async fn expire(live: Arc<LiveRun>, manager: Weak<RunManager>, run_id: String, expires_at: i64) {
    if !expire_at(&live, expires_at).await || live.is_detached() {
        return;
    }
    let Some(manager) = manager.upgrade() else {
        live.trigger_without_waiting(RunState::Expired, EXPIRED.into());
        return;
    };
    // Blocking work (cgroup files), on the teardown workers: a thousand runs expiring at
    // once take a few threads, not a thousand. The kill is sent, not waited for: the run's
    // teardown, queued once its shim has died, waits for its cgroup to empty.
    let teardowns = manager.teardowns.clone();
    teardowns.submit(move || manager.expire_tree(&run_id, EXPIRED));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::handed::Handed;

    /// The blocking watch and the task's parse events alike; a connection goes to the
    /// gateway with the descriptor that came with it.
    #[test]
    fn events_settle_the_watch() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _inside = runtime.enter();
        let (ours, _theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let link = ControlLink::register(Arc::new(OwnedFd::from(ours))).unwrap();
        let (sender, mut connections) = tokio::sync::mpsc::channel(1);
        let (mut exit, mut fds) = (None, VecDeque::new());
        let handing = Handing {
            link: &link,
            connections: &sender,
            keeps_connections: true,
        };
        let exited = serde_json::to_vec(&FromShim::Exited(AgentExit::Code(3))).unwrap();
        assert!(on_line(&exited, &mut exit, &mut fds, &handing).is_none());
        assert_eq!(exit, Some(AgentExit::Code(3)));
        let detached = serde_json::to_vec(&FromShim::Detached).unwrap();
        assert!(matches!(
            on_line(&detached, &mut exit, &mut fds, &handing),
            Some(Watched::Detached)
        ));
        assert!(on_line(b"not json\n", &mut exit, &mut fds, &handing).is_none());
        let (connection, _client) = std::os::unix::net::UnixStream::pair().unwrap();
        fds.push_back(Some(OwnedFd::from(connection)));
        let handed = serde_json::to_vec(&FromShim::Connection).unwrap();
        assert!(on_line(&handed, &mut exit, &mut fds, &handing).is_none());
        assert!(matches!(connections.try_recv(), Ok(Handed::Connection(_))));
        assert!(fds.is_empty());
        // One whose descriptor did not arrive, or that came with none, is to be sent again.
        fds.push_back(None);
        assert!(on_line(&handed, &mut exit, &mut fds, &handing).is_none());
        assert!(matches!(connections.try_recv(), Ok(Handed::Lost)));
        assert!(on_line(&handed, &mut exit, &mut fds, &handing).is_none());
        assert!(matches!(connections.try_recv(), Ok(Handed::Lost)));
        let refused = serde_json::to_vec(&FromShim::NotAccepted).unwrap();
        assert!(on_line(&refused, &mut exit, &mut fds, &handing).is_none());
        assert!(matches!(connections.try_recv(), Ok(Handed::NotAccepted)));
        // An older pid 1 (re-adopted after an upgrade) kept no copy: asked afresh instead.
        let older = Handing {
            keeps_connections: false,
            ..handing
        };
        assert!(on_line(&handed, &mut exit, &mut fds, &older).is_none());
        assert!(matches!(connections.try_recv(), Ok(Handed::NotAccepted)));
        // pid 1 saying a connection waits is kept for the gateway's next ask.
        let waiting = serde_json::to_vec(&FromShim::ConnectionWaiting).unwrap();
        assert!(on_line(&waiting, &mut exit, &mut fds, &handing).is_none());
        runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(5), link.connection_waits())
                .await
                .expect("the note was kept")
        });
    }

    /// The watch reads events split across what was read ahead and the socket, and ends
    /// with the agent's exit when the socket closes, or at a detach.
    #[test]
    fn the_watch_reads_events_to_the_sockets_end() {
        use std::io::Write as _;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (sender, _connections) = tokio::sync::mpsc::channel(1);
        let watch = |ours: std::os::unix::net::UnixStream, ahead: Vec<u8>| {
            runtime.block_on(async {
                let link = ControlLink::register(Arc::new(OwnedFd::from(ours))).unwrap();
                watch_events(&link, ahead, &sender, true).await
            })
        };
        let exited = serde_json::to_vec(&FromShim::Exited(AgentExit::Code(7))).unwrap();
        let (ours, mut theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let (ahead, rest) = exited.split_at(3);
        theirs.write_all(rest).unwrap();
        theirs.write_all(b"\n").unwrap();
        drop(theirs);
        let watched = watch(ours, ahead.to_vec());
        assert!(matches!(watched, Watched::Ended(Some(AgentExit::Code(7)))));

        let (ours, mut theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut detached = serde_json::to_vec(&FromShim::Detached).unwrap();
        detached.push(b'\n');
        theirs.write_all(&detached).unwrap();
        // Still open: the detach ends the watch, not the socket's end.
        let watched = watch(ours, Vec::new());
        assert!(matches!(watched, Watched::Detached));
        drop(theirs);
    }

    /// A hand-over whose descriptor does not arrive (the kernel truncates the receive, as
    /// when the supervisor has no free number for it) is asked for again and served: pid 1
    /// keeps its copy until the gateway says it holds the connection, and closes it then, so
    /// the caller still sees the connection end when the gateway ends it.
    #[test]
    fn a_connection_lost_on_its_way_is_sent_again_and_served() {
        use std::io::{BufRead as _, Read as _, Write as _};
        use tokio::io::AsyncReadExt as _;
        use tollgate_daemon::serve::Listener as _;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let (mut client, accepted) = std::os::unix::net::UnixStream::pair().unwrap();
        // pid 1's side, as the shim has it: the connection it accepted is handed over for
        // `accept` and again for `resend`, and kept until `received`.
        let pid_one = std::thread::spawn(move || {
            theirs
                .set_read_timeout(Some(Duration::from_secs(30)))
                .unwrap();
            let mut kept = Some(OwnedFd::from(accepted));
            let mut asked = Vec::new();
            let mut lines = std::io::BufReader::new(&theirs);
            let mut line = String::new();
            while lines.read_line(&mut line).unwrap_or(0) > 0 {
                let message = line.trim().to_owned();
                line.clear();
                asked.push(message.clone());
                match message.as_str() {
                    "\"accept\"" | "\"resend\"" => {
                        use std::os::fd::AsRawFd as _;
                        let raw = [kept.as_ref().expect("a connection is kept").as_raw_fd()];
                        nix::sys::socket::sendmsg::<()>(
                            theirs.as_raw_fd(),
                            &[std::io::IoSlice::new(b"\"connection\"\n")],
                            &[nix::sys::socket::ControlMessage::ScmRights(&raw)],
                            nix::sys::socket::MsgFlags::empty(),
                            None,
                        )
                        .unwrap();
                    }
                    "\"received\"" => {
                        kept = None;
                        break;
                    }
                    _ => {}
                }
            }
            drop(kept);
            asked
        });
        let served = runtime.block_on(async {
            let link = Arc::new(ControlLink::register(Arc::new(OwnedFd::from(ours))).unwrap());
            let (connections, sender) = crate::gateway::handed(link.clone());
            // The next receive that brings anything has no room for a descriptor.
            link.starve(1);
            let watch = tokio::spawn({
                let link = link.clone();
                // pid 1 said a connection waits (read ahead, so the hand-over is the first
                // receive).
                let waiting = b"\"connection_waiting\"\n".to_vec();
                async move { watch_events(&link, waiting, &sender, true).await }
            });
            // As the accept loop does: an error is backed off from and `accept` called again.
            let mut stream = None;
            for _ in 0..3 {
                match tokio::time::timeout(Duration::from_secs(30), connections.accept()).await {
                    Ok(Ok((accepted, _))) => {
                        stream = Some(accepted);
                        break;
                    }
                    Ok(Err(_)) => continue,
                    Err(_) => break,
                }
            }
            let mut stream = stream.expect("the connection was not served");
            client.write_all(b"ping").unwrap();
            let mut four = [0u8; 4];
            stream.read_exact(&mut four).await.unwrap();
            drop(stream);
            let watched = watch.await.unwrap();
            (four, watched)
        });
        assert_eq!(&served.0, b"ping");
        assert!(matches!(served.1, Watched::Ended(None)));
        assert_eq!(
            pid_one.join().unwrap(),
            ["\"accept\"", "\"resend\"", "\"received\""]
        );
        // Neither the gateway nor pid 1 holds the connection now: its caller sees the end.
        client
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut rest = [0u8; 1];
        assert_eq!(client.read(&mut rest).unwrap(), 0);
    }

    /// A relay reads through a non-blocking pipe to its end, within the budget.
    #[test]
    fn relays_drain_within_the_budget() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (reader, mut writer) = std::io::pipe().unwrap();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink_seen = seen.clone();
        let truncated = Arc::new(AtomicBool::new(false));
        let relay = Relay {
            stream: OutputStream::Stdout,
            run_id: "r".into(),
            output: Arc::new(move |_: &str, _, bytes: &[u8]| {
                sink_seen.lock().unwrap().extend_from_slice(bytes)
            }),
            budget: Arc::new(AtomicU64::new(5)),
            truncated: truncated.clone(),
        };
        let writing = std::thread::spawn(move || {
            use std::io::Write as _;
            writer.write_all(b"hello world").unwrap();
        });
        runtime.block_on(relay.run(Arc::new(OwnedFd::from(reader))));
        writing.join().unwrap();
        assert_eq!(&*seen.lock().unwrap(), b"hello");
        assert!(truncated.load(Ordering::Relaxed));
    }
}
