//! Start rate and start latency against the number of live runs, beside bwrap.
//!
//! Tollgate: one run manager (this process is its supervisor) starts runs of
//! `sh -c 'echo x; exec sleep …'` one after another and keeps them all live. At each count of
//! `--at` (0, 1,000, …) the next `--samples` starts are timed from the call that admits the
//! receipt to the agent's first output byte; their p50 and p99 and their rate are reported
//! with the supervisor's threads, RSS and descriptors, and the host's memory per live run
//! (`MemAvailable` before the first start less now, over the live runs). Then a clean stop of
//! every run is timed. Each side's ramp begins once the host is quiet (at most a fifth of a
//! CPU busy over half a second): the kernel goes on freeing the namespaces of sandboxes killed
//! just before, by the other side or by a run before this one, after their last process has
//! exited.
//!
//! The peer, after Tollgate's runs are gone (or before Tollgate's side, with `--peer-first`):
//! the same program under `bwrap --unshare-all`, spawned one after another and kept alive,
//! timed from spawn to first byte at the same counts, with the host's memory per live
//! sandbox; then every sandbox is killed at once and the time until all their processes have
//! exited is reported beside Tollgate's clean stop.
//!
//! With `--gateway-check` (issue 32's item 4), each run's program stays a shell that, on
//! SIGUSR1, makes one gateway call (`tollgate-shim receipt`); once the last count is live,
//! every run's shell is signalled and the answers counted, then `ListRuns` (live only, what
//! `tollgate ps` asks) in this process, the real `tollgate ps` over gRPC against this run
//! manager's API served as the daemon serves it, and one revocation to its run's end are
//! timed, and
//! after the clean stop the bench checks that no cgroup under its parent, no mount beneath
//! its data directory and no run directory is left.
//!
//! A start that fails ends that side's ramp and is reported with the count it failed at
//! (today's supervisor holds five threads per run: high counts may run out of pids or
//! descriptors); what was measured before it is still printed.

use std::io::Read as _;
use std::process::Child;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tollgate_proto::v1 as pb;
use tollgate_receipt::{timestamp_from_unix, unix_now};
use tollgate_supervisor::callers::CallerCheck;
use tollgate_supervisor::daemon::serve_api;
use tollgate_supervisor::metrics::SandboxSource;
use tollgate_supervisor::runs::{OutputSink, RunManager};
use tollgate_supervisor::service::SupervisorService;

use crate::sandbox::{bwrap, Tollgate};
use crate::stats::percentile;

/// The program every run and sandbox runs: one byte out, then asleep for the whole bench.
const SLEEPER: &str = "echo x; exec /usr/bin/sleep 7200";

/// With `--gateway-check`, each run's program instead: the same byte, then asleep until
/// SIGUSR1, on which it makes one gateway call (`tollgate-shim receipt`, GetRunReceipt) and
/// says whether it was answered (or why not, the client's own words). Its shell stays (a process more per run than `SLEEPER`).
const ANSWERER: &str = "trap 'e=$(/run/tollgate/bin/tollgate-shim receipt 2>&1 >/dev/null) && echo answered || echo \"refused: $e\"' USR1; echo x; while :; do /usr/bin/sleep 7200 & s=$!; wait $s; kill $s 2>/dev/null; done";

/// How long every live run has to answer its gateway call.
const ANSWER_DEADLINE: Duration = Duration::from_secs(300);

/// How long one start may take before the bench calls it failed.
const START_DEADLINE: Duration = Duration::from_secs(30);

/// What was seen at one count of live runs.
struct Window {
    /// Live runs when its first timed start began, and after its last.
    live: usize,
    live_after: usize,
    /// Each timed start, admitted (or spawned) → first byte.
    starts: Vec<Duration>,
    /// Tollgate's side: the same starts split by where each one's sandbox came from,
    /// prepared ahead (the warm pool) or by the start itself (the pool was empty).
    ahead: Vec<Duration>,
    own: Vec<Duration>,
    /// Wall time of the timed starts together.
    elapsed: Duration,
    /// After the window: this process's threads, RSS (KiB) and open descriptors.
    threads: u64,
    rss_kib: u64,
    fds: usize,
    /// Host memory taken since before the first start, over the live runs (KiB per run).
    host_kib_per_run: Option<f64>,
}

/// One side's ramp: its windows, and the failure that ended it early, if one did.
struct Ramp {
    windows: Vec<Window>,
    failure: Option<String>,
}

/// A field of `/proc/self/status` (or `/proc/meminfo`), in its own unit.
fn proc_field(file: &str, name: &str) -> u64 {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .find_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix(':')?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .unwrap_or(0)
}

fn mem_available_kib() -> u64 {
    proc_field("/proc/meminfo", "MemAvailable")
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count)
}

/// What one start took, and on Tollgate's side whether its sandbox was prepared ahead.
struct Started {
    took: Duration,
    prepared_ahead: Option<bool>,
}

/// Starts until `target` are live, timing each of the `samples` starts from `at[i]`.
/// `start` starts one and returns its time to first byte.
fn ramp(at: &[usize], samples: usize, mut start: impl FnMut() -> anyhow::Result<Started>) -> Ramp {
    let baseline = mem_available_kib();
    let mut live = 0usize;
    let mut windows = Vec::new();
    for &count in at {
        while live < count {
            if let Err(e) = start() {
                return Ramp {
                    windows,
                    failure: Some(format!(
                        "start #{} failed with {live} live: {e:#}",
                        live + 1
                    )),
                };
            }
            live += 1;
        }
        let first = live;
        let began = Instant::now();
        let mut starts = Vec::with_capacity(samples);
        let (mut ahead, mut own) = (Vec::new(), Vec::new());
        for _ in 0..samples {
            match start() {
                Ok(started) => {
                    starts.push(started.took);
                    match started.prepared_ahead {
                        Some(true) => ahead.push(started.took),
                        Some(false) => own.push(started.took),
                        None => {}
                    }
                }
                Err(e) => {
                    return Ramp {
                        windows,
                        failure: Some(format!(
                            "start #{} failed with {live} live: {e:#}",
                            live + 1
                        )),
                    }
                }
            }
            live += 1;
        }
        let elapsed = began.elapsed();
        let taken = baseline.saturating_sub(mem_available_kib());
        starts.sort();
        ahead.sort();
        own.sort();
        windows.push(Window {
            live: first,
            live_after: live,
            starts,
            ahead,
            own,
            elapsed,
            threads: proc_field("/proc/self/status", "Threads"),
            rss_kib: proc_field("/proc/self/status", "VmRSS"),
            fds: open_fds(),
            host_kib_per_run: (live > 0).then(|| taken as f64 / live as f64),
        });
    }
    Ramp {
        windows,
        failure: None,
    }
}

/// Gateway calls answered and refused by the runs' programs (`ANSWERER`'s lines).
#[derive(Default)]
struct Answers {
    answered: AtomicUsize,
    refused: AtomicUsize,
    /// What the refused calls' client said, and how many said it.
    reasons: std::sync::Mutex<std::collections::BTreeMap<String, usize>>,
}

/// What `--gateway-check` saw once the last count was live.
struct GatewayCheck {
    /// Runs signalled, runs whose call was answered, refused, and how long until the last.
    asked: usize,
    answered: usize,
    refused: usize,
    /// What the refused calls' client said (each reason once, with its count).
    reasons: Vec<(String, usize)>,
    took: Duration,
    /// `ListRuns` with `live_only` (what `tollgate ps` asks), in this process: the runs it
    /// listed and how long it took (no gRPC hop, no CLI start).
    listed: usize,
    ps: Duration,
    /// `tollgate ps` as a user runs it, spawn → exit: the runs it printed and how long.
    cli_listed: usize,
    cli_ps: Duration,
    /// One revocation, recorded → the run's final record.
    revocation: Duration,
}

/// What Tollgate's side saw.
struct TollgateSide {
    ramp: Ramp,
    /// How long the clean stop of every live run took, and how many were live then.
    stop: Duration,
    live: usize,
    /// The gateway check, when asked for.
    check: Option<GatewayCheck>,
    /// What was left after the stop.
    left: Vec<String>,
}

/// Tollgate's side.
fn tollgate(
    at: &[usize],
    samples: usize,
    warm: usize,
    ids: std::ops::Range<u32>,
    gateway_check: bool,
) -> anyhow::Result<TollgateSide> {
    let tollgate = Tollgate::with_ids(warm, ids.clone())?;
    let answers = Arc::new(Answers::default());
    let program = if gateway_check { ANSWERER } else { SLEEPER };
    let ramp = ramp(at, samples, || {
        let mut receipt = tollgate.unsigned_receipt(program);
        // Live for the whole bench, however long the ramp takes.
        receipt.expires_at = Some(timestamp_from_unix(unix_now() + 7200));
        let signed = tollgate.signer.sign(&mut receipt);
        let (first, arrived) = std::sync::mpsc::sync_channel(1);
        let answers = answers.clone();
        let sink: OutputSink = Arc::new(move |_: &str, _, bytes: &[u8]| {
            let _ = first.try_send(Instant::now());
            if bytes.windows(8).any(|w| w == b"answered") {
                answers.answered.fetch_add(1, Ordering::SeqCst);
            } else if let Some(at) = bytes.windows(8).position(|w| w == b"refused:") {
                answers.refused.fetch_add(1, Ordering::SeqCst);
                let reason = String::from_utf8_lossy(&bytes[at + 8..]);
                let reason = reason.lines().next().unwrap_or_default().trim();
                let reason = reason.chars().take(160).collect::<String>();
                *answers
                    .reasons
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(reason)
                    .or_default() += 1;
            }
        });
        let metrics = tollgate_supervisor::metrics::get();
        let ahead_before = metrics.sandboxes_taken_from(SandboxSource::PreparedAhead);
        let begin = Instant::now();
        tollgate.manager.start(&signed, None, sink)?;
        let arrived = arrived
            .recv_timeout(START_DEADLINE)
            .context("no output from the run")?;
        Ok(Started {
            took: arrived - begin,
            // Starts run one at a time, so only this start can have moved the count.
            prepared_ahead: Some(
                metrics.sandboxes_taken_from(SandboxSource::PreparedAhead) > ahead_before,
            ),
        })
    });
    let check = (gateway_check && ramp.failure.is_none())
        .then(|| check_gateways(&tollgate, &answers, ids))
        .transpose()?;
    let live = tollgate.manager.live_ids().len();
    let begin = Instant::now();
    tollgate.manager.shutdown();
    let stop = begin.elapsed();
    let left = left_behind(&tollgate);
    drop(tollgate);
    Ok(TollgateSide {
        ramp,
        stop,
        live,
        check,
        left,
    })
}

/// Every live run answers one gateway call: each run's shell (a process named `sh` running
/// as one of the runs' host ids) is sent SIGUSR1 and its answer awaited; then `ps` and one
/// revocation are timed.
fn check_gateways(
    tollgate: &Tollgate,
    answers: &Answers,
    ids: std::ops::Range<u32>,
) -> anyhow::Result<GatewayCheck> {
    let shells = processes_of("sh", &ids);
    let begin = Instant::now();
    for &pid in &shells {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGUSR1,
        );
    }
    let settled =
        || answers.answered.load(Ordering::SeqCst) + answers.refused.load(Ordering::SeqCst);
    while settled() < shells.len() && begin.elapsed() < ANSWER_DEADLINE {
        std::thread::sleep(Duration::from_millis(5));
    }
    let took = begin.elapsed();
    let listing = Instant::now();
    let listed: Vec<_> = tollgate
        .manager
        .list_live()?
        .iter()
        .map(|record| tollgate.manager.run_view(record))
        .collect();
    let listed = listed.len();
    let ps = listing.elapsed();
    let (cli_ps, cli_listed) = time_cli_ps(&tollgate.manager)?;
    let victim = tollgate
        .manager
        .live_ids()
        .into_iter()
        .next()
        .context("no live run to revoke")?;
    let revoking = Instant::now();
    tollgate
        .manager
        .revoke(&victim, "tollgate-bench gateway check");
    tollgate
        .manager
        .wait(&victim, Duration::from_secs(60))
        .filter(|record| record.state.is_final())
        .context("the revoked run did not end within 60 s")?;
    let revocation = revoking.elapsed();
    Ok(GatewayCheck {
        asked: shells.len(),
        answered: answers.answered.load(Ordering::SeqCst),
        refused: answers.refused.load(Ordering::SeqCst),
        reasons: answers
            .reasons
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(reason, count)| (reason.clone(), *count))
            .collect(),
        took,
        listed,
        ps,
        cli_listed,
        cli_ps,
        revocation,
    })
}

/// Runs the real `tollgate ps` against this run manager: its API served on a loopback port
/// the way the daemon serves it (request bounds, the admin token checked, no TLS), the CLI
/// started as a user starts it. Returns spawn → exit and the runs it printed.
fn time_cli_ps(manager: &Arc<RunManager>) -> anyhow::Result<(Duration, usize)> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let dir = tempfile::tempdir()?;
    let token = tollgate_daemon::token::generate();
    let token_file = dir.path().join("admin.token");
    std::fs::write(&token_file, format!("{}\n", token.expose()))?;
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let addr = listener.local_addr()?;
    let service = SupervisorService::new(
        manager.clone(),
        pb::SupervisorInfo::default(),
        Arc::default(),
    );
    let callers = CallerCheck::new(tollgate_daemon::token::hash(token.expose()), None);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = runtime.spawn(async move {
        let tls = tollgate_daemon::tls::ServerTls::default();
        serve_api(service, callers, &tls, listener, async {
            let _ = stopped.await;
        })
        .await
    });
    let begin = Instant::now();
    let out = std::process::Command::new(tollgate_tests::bin_path("tollgate"))
        .args(["ps", "--json", "--supervisor", &format!("http://{addr}")])
        .arg("--token-file")
        .arg(&token_file)
        .output()
        .context("starting tollgate ps")?;
    let took = begin.elapsed();
    let _ = stop.send(());
    runtime.block_on(server)??;
    anyhow::ensure!(
        out.status.success(),
        "tollgate ps failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok((took, String::from_utf8_lossy(&out.stdout).lines().count()))
}

/// Host pids of the processes named `comm` whose real uid is one of `uids`.
fn processes_of(comm: &str, uids: &std::ops::Range<u32>) -> Vec<i32> {
    let field = |pid: i32, file: &str| std::fs::read_to_string(format!("/proc/{pid}/{file}"));
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
                .filter(|&pid| {
                    field(pid, "comm").is_ok_and(|name| name.trim() == comm)
                        && field(pid, "status").ok().is_some_and(|status| {
                            status
                                .lines()
                                .find_map(|line| line.strip_prefix("Uid:"))
                                .and_then(|ids| ids.split_whitespace().next()?.parse().ok())
                                .is_some_and(|uid: u32| uids.contains(&uid))
                        })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// What a clean stop left: cgroups under the bench's parent (in any hierarchy), mounts
/// beneath its data directory, run directories.
fn left_behind(tollgate: &Tollgate) -> Vec<String> {
    let mut left = Vec::new();
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        let parent = hierarchy.path().join(tollgate.parent());
        for child in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
            if child.file_type().is_ok_and(|kind| kind.is_dir()) {
                left.push(format!("cgroup {}", child.path().display()));
            }
        }
    }
    let data = tollgate.data_dir();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for line in mounts.lines() {
        if let Some(point) = line.split_whitespace().nth(4) {
            if std::path::Path::new(point).starts_with(&data) {
                left.push(format!("mount {point}"));
            }
        }
    }
    for run in std::fs::read_dir(data.join("runs"))
        .into_iter()
        .flatten()
        .flatten()
    {
        left.push(format!("run directory {}", run.path().display()));
    }
    left
}

/// The peer's side: sandboxes kept alive until the ramp is done, then killed all at once;
/// with how many were live then, and how long from the first kill until every process of
/// every sandbox had exited (the peer of Tollgate's clean stop).
fn peer(at: &[usize], samples: usize) -> (Ramp, usize, Duration) {
    // Each sandbox's own pid 1 (bwrap's inner process) is orphaned when its outer bwrap is
    // killed, and dies then (`--die-with-parent`): as their subreaper this process reaps
    // them, so "no child left" is "every sandbox gone".
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        eprintln!("bwrap: not a subreaper ({e}): the stop's time counts the outer bwraps only");
    }
    let mut children: Vec<Child> = Vec::new();
    let ramp = ramp(at, samples, || {
        let begin = Instant::now();
        let mut child = bwrap(SLEEPER)
            .spawn()
            .context("spawn bwrap (apt-get install bubblewrap)")?;
        let mut byte = [0u8; 1];
        // The pipe is closed once the byte is in, as Tollgate's relay holds one per run.
        let mut stdout = child.stdout.take().context("stdout")?;
        let read = stdout.read_exact(&mut byte);
        let took = begin.elapsed();
        children.push(child);
        read.context("no output from bwrap")?;
        Ok(Started {
            took,
            prepared_ahead: None,
        })
    });
    let live = children.len();
    let begin = Instant::now();
    for child in &mut children {
        let _ = child.kill();
    }
    for child in &mut children {
        let _ = child.wait();
    }
    // The sandboxes' pid 1s, orphaned to this process; ECHILD once none is left.
    while let Ok(_) | Err(nix::errno::Errno::EINTR) = nix::sys::wait::waitpid(None, None) {}
    (ramp, live, begin.elapsed())
}

/// The p50 of sorted `starts` in milliseconds, or `-` when there are none.
fn p50_of(starts: &[Duration]) -> String {
    if starts.is_empty() {
        return "-".to_owned();
    }
    format!("{:.2} ms", percentile(starts, 0.5).as_secs_f64() * 1e3)
}

fn print(name: &str, ramp: &Ramp, supervisor: bool) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for window in &ramp.windows {
        let rate = window.starts.len() as f64 / window.elapsed.as_secs_f64();
        let host = window
            .host_kib_per_run
            .map_or("-".to_owned(), |kib| format!("{:.2} MiB", kib / 1024.0));
        let own = if supervisor {
            format!(
                "  threads {:>6}  RSS {:>7.1} MiB  fds {:>6}\n{:<9}             sandboxes prepared ahead {:>4} (p50 {:>9}), by the start {:>4} (p50 {:>9})",
                window.threads,
                window.rss_kib as f64 / 1024.0,
                window.fds,
                "",
                window.ahead.len(),
                p50_of(&window.ahead),
                window.own.len(),
                p50_of(&window.own),
            )
        } else {
            String::new()
        };
        println!(
            "{name:<9} live {:>5}: start p50 {:>7.2} ms  p99 {:>7.2} ms  {:>6.1} starts/s | then at {:>5} live: host {host:>9}/run{own}",
            window.live,
            ms(percentile(&window.starts, 0.5)),
            ms(percentile(&window.starts, 0.99)),
            rate,
            window.live_after,
        );
    }
    if let Some(failure) = &ramp.failure {
        println!("{name:<9} STOPPED: {failure}");
    }
}

/// Runs the benchmark and prints one line per side and count; with `gateway_check`, every
/// run live at the end answers one gateway call first (and `ps` and a revocation are timed).
pub(crate) fn bench(
    mut at: Vec<usize>,
    samples: usize,
    warm: usize,
    host_id_base: u32,
    peer: Peer,
    gateway_check: bool,
) -> anyhow::Result<()> {
    at.sort_unstable();
    at.dedup();
    let most = at.last().copied().unwrap_or(0) + samples * at.len();
    // The supervisor holds descriptors for each run: as many as the hard limit allows (what
    // the daemon itself does when it is root).
    let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)?;
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard)?;
    println!(
        "scale: counts {at:?}, {samples} timed starts at each, warm pool {warm}, host ids {host_id_base}.., open-file limit {hard}"
    );
    let ids = host_id_base..host_id_base + u32::try_from(most + 1)?;
    if peer == Peer::First {
        settle("bwrap");
        peer_side(&at, samples);
    }
    settle("tollgate");
    let TollgateSide {
        ramp,
        stop,
        live,
        check,
        left,
    } = tollgate(&at, samples, warm, ids, gateway_check)?;
    print("tollgate", &ramp, true);
    if let Some(check) = check {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "tollgate  gateway check: {} of {} live runs answered ({} refused) in {:.2} s; ps (ListRuns live_only, in process) {:.2} ms for {} runs; `tollgate ps` (CLI, gRPC) {:.2} ms for {} runs; a revocation ended its run in {:.2} ms",
            check.answered,
            check.asked,
            check.refused,
            check.took.as_secs_f64(),
            ms(check.ps),
            check.listed,
            ms(check.cli_ps),
            check.cli_listed,
            ms(check.revocation),
        );
        for (reason, count) in &check.reasons {
            println!("tollgate  refused ({count}): {reason}");
        }
    }
    println!(
        "tollgate  clean stop with {live} live runs: {:.2} s",
        stop.as_secs_f64()
    );
    if left.is_empty() {
        println!("tollgate  after the stop: no cgroup, mount or run directory left");
    } else {
        println!(
            "tollgate  after the stop, LEFT: {} ({})",
            left.len(),
            left.iter().take(5).cloned().collect::<Vec<_>>().join("; ")
        );
    }
    if peer == Peer::After {
        settle("bwrap");
        peer_side(&at, samples);
    }
    Ok(())
}

/// How much CPU, in CPUs, may have been busy over [`QUIET_WINDOW`] for the host to count as
/// quiet before a side's ramp: a share of all CPUs would let a many-CPU host count as quiet
/// while one kernel worker still frees the last side's namespaces.
const QUIET_BUSY_CPUS: f64 = 0.2;
const QUIET_WINDOW: Duration = Duration::from_millis(500);
/// How long a side waits for a quiet host before it starts anyway.
const QUIET_DEADLINE: Duration = Duration::from_secs(60);

/// Waits until at most [`QUIET_BUSY_CPUS`] have been busy over [`QUIET_WINDOW`] (at most
/// [`QUIET_DEADLINE`]), and says how long that took. A side's first starts are the base every
/// later count is compared with: measured while the kernel still frees the namespaces of the
/// sandboxes just killed (work that goes on after their last process exits, after the other
/// side or a benchmark run just before), they would be slowed, and every ratio with them. Each
/// side waits the same way.
fn settle(side: &str) {
    let begin = Instant::now();
    let mut busy = f64::NAN;
    while begin.elapsed() < QUIET_DEADLINE {
        let before = cpu_times();
        std::thread::sleep(QUIET_WINDOW);
        let (Some(before), Some(after)) = (before, cpu_times()) else {
            println!("{side:<9} host quiet: not known (no /proc/stat to read), not waited for");
            return;
        };
        busy = busy_cpus(before, after);
        if busy <= QUIET_BUSY_CPUS {
            println!(
                "{side:<9} host quiet ({busy:.2} CPUs busy) after {:.1} s",
                begin.elapsed().as_secs_f64()
            );
            return;
        }
    }
    println!(
        "{side:<9} host NOT quiet after {:.0} s ({busy:.2} CPUs busy): its first starts share the CPUs",
        begin.elapsed().as_secs_f64(),
    );
}

/// The host's CPU time so far, idle (with I/O wait) and in all, in clock ticks, and how many
/// CPUs it counts.
#[derive(Debug, Clone, Copy, PartialEq)]
struct CpuTimes {
    idle: u64,
    total: u64,
    cpus: usize,
}

fn cpu_times() -> Option<CpuTimes> {
    parse_cpu_times(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// `/proc/stat`: its first line, `cpu  user nice system idle iowait irq softirq steal guest
/// guest_nice`, summed over the CPUs, then one `cpuN` line a CPU.
fn parse_cpu_times(stat: &str) -> Option<CpuTimes> {
    let mut lines = stat.lines();
    let fields: Vec<u64> = lines
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    // Guest time is counted in user and nice already; steal is time the CPU was not ours.
    let counted = fields.get(..8)?;
    let cpus = lines
        .take_while(|line| line.starts_with("cpu"))
        .filter(|line| line[3..].starts_with(|c: char| c.is_ascii_digit()))
        .count();
    (cpus > 0).then(|| CpuTimes {
        idle: counted[3] + counted[4],
        total: counted.iter().sum(),
        cpus,
    })
}

/// How many CPUs were busy, on average, between `before` and `after`.
fn busy_cpus(before: CpuTimes, after: CpuTimes) -> f64 {
    let total = after.total.saturating_sub(before.total);
    if total == 0 {
        return 0.0;
    }
    let busy = total.saturating_sub(after.idle.saturating_sub(before.idle));
    busy as f64 / total as f64 * after.cpus as f64
}

/// Whether the bwrap peer runs, and on which side of Tollgate's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Peer {
    /// Not at all.
    None,
    /// After Tollgate's side (the usual order).
    After,
    /// Before it (`--peer-first`).
    First,
}

/// The peer's ramp and kill, printed.
fn peer_side(at: &[usize], samples: usize) {
    let (ramp, live, stop) = peer(at, samples);
    print("bwrap", &ramp, false);
    println!(
        "bwrap     kill of {live} live sandboxes -> every process exited: {:.2} s",
        stop.as_secs_f64()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  100 5 50 800 40 3 2 4 7 1\ncpu0 50 2 25 400 20 1 1 2 3 0\ncpu1 50 3 25 400 20 2 1 2 4 1\nintr 1 2 3\n";

    #[test]
    fn cpu_times_count_idle_with_io_wait_steal_as_busy_and_guest_time_once() {
        assert_eq!(
            parse_cpu_times(STAT),
            Some(CpuTimes {
                idle: 840,
                total: 1004,
                cpus: 2
            })
        );
        // Not the summed line first, too few fields, or no CPU of its own: nothing to read.
        assert_eq!(parse_cpu_times("cpu0 1 2 3 4 5 6 7 8\n"), None);
        assert_eq!(parse_cpu_times("cpu  1 2 3\ncpu0 1 2 3\n"), None);
        assert_eq!(parse_cpu_times("cpu  1 2 3 4 5 6 7 8\nintr 1\n"), None);
    }

    #[test]
    fn busy_cpus_are_of_the_time_between_the_readings() {
        let before = CpuTimes {
            idle: 840,
            total: 1000,
            cpus: 2,
        };
        // 200 ticks on 2 CPUs, 180 of them idle: a tenth of the time busy, a fifth of a CPU.
        let after = CpuTimes {
            idle: 1020,
            total: 1200,
            cpus: 2,
        };
        assert!((busy_cpus(before, after) - 0.2).abs() < 1e-9);
        // The same share on 16 CPUs is 1.6 CPUs busy: not quiet.
        let many = |t: CpuTimes| CpuTimes { cpus: 16, ..t };
        assert!((busy_cpus(many(before), many(after)) - 1.6).abs() < 1e-9);
        assert!(busy_cpus(before, before).abs() < 1e-9);
    }
}
