//! What a supervisor holds per live run (issue 32): its threads do not grow with its runs
//! (lifecycle work runs as tasks on a fixed runtime), and each run costs it at most three file
//! descriptors and 128 KiB of its memory; the daemon, driven over gRPC, keeps its threads
//! flat too, and its clean stop with every run live leaves nothing behind. Not timed: counts
//! only.

use std::time::Duration;

use nix::sys::signal::Signal;
use tollgate_audit::EntryKind;
use tollgate_proto::v1 as pb;
use tollgate_supervisor::records::RunState;
use tollgate_tests::run_fixture::RunFixture;
use tollgate_tests::{authed, leftovers, require_root, AuthorityProcess, SupervisorProcess};

/// Host ids of these tests: 400000–404999 (one per live run).
const HOST_ID_BASE: u32 = 400_000;

/// Host ids of the daemon's thread test: 430000–430399 (one per live run).
const DAEMON_HOST_ID_BASE: u32 = 430_000;

/// Live runs the thread test accumulates.
const RUNS: usize = 300;

/// Where the thread count is first taken.
const FIRST: usize = 20;

/// Threads the supervisor may gain between `FIRST` and `RUNS` live runs: pools that grow on
/// demand (the runtime's blocking pool), never one per run.
const SLACK: usize = 16;

/// The most threads the daemon may have at any moment of a clean stop of its `RUNS` live runs:
/// its fixed ones (runtimes, audit and records writers) and the few teardown workers, however
/// many runs end at once (tokio's blocking pool, which grows to a thread per queued
/// teardown, took it past 300).
const STOP_THREADS: usize = 16;

/// Descriptors the supervisor may gain between `FIRST` and `RUNS` live runs besides the
/// runs' own: what it opens once, lazily (the runtime's, the records').
const FD_SLACK: usize = 8;

/// One value of `/proc/self/status` (`Threads`, `VmRSS`), as its leading number.
fn status(key: &str) -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("{key} in /proc/self/status"))
}

/// Open descriptors of this process (the supervisor under test).
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn supervisor_threads_stay_flat_as_live_runs_accumulate() {
    if !require_root() {
        return;
    }
    let fixture = RunFixture::with("scale-threads", HOST_ID_BASE, |settings, _| {
        settings.host_ids = HOST_ID_BASE..HOST_ID_BASE + RUNS as u32 + 8;
        // Each start prepares its own sandbox: no refill in the background holds threads or
        // descriptors when they are counted.
        settings.warm_sandboxes = 0;
    });
    let mut runs = Vec::new();
    let mut at_first = None;
    for i in 0..RUNS {
        let signed = fixture.sign(fixture.receipt("exec sleep 600", 600));
        runs.push(
            fixture
                .start(&signed)
                .unwrap_or_else(|e| panic!("start {i}: {e}")),
        );
        if runs.len() == FIRST {
            at_first = Some((status("Threads"), open_fds(), status("VmRSS")));
        }
    }
    let (threads_first, fds_first, rss_first) = at_first.unwrap();
    let (threads, fds, rss) = (status("Threads"), open_fds(), status("VmRSS"));
    let added = RUNS - FIRST;
    eprintln!(
        "threads {threads_first} at {FIRST} runs, {threads} at {RUNS}; fds {fds_first} -> {fds} ({:.2} a run); RSS {rss_first} KiB -> {rss} KiB ({} KiB a run)",
        (fds - fds_first) as f64 / added as f64,
        rss.saturating_sub(rss_first) / added,
    );
    let flat = threads <= threads_first + SLACK;
    let fds_per_run = fds.saturating_sub(fds_first + FD_SLACK) as f64 / added as f64;
    let rss_per_run = rss.saturating_sub(rss_first) / added;
    // Every run is ended and gone before anything is asserted.
    for run_id in &runs {
        fixture.manager.stop(run_id, "the test is over");
    }
    for run_id in &runs {
        let record = fixture
            .manager
            .wait(run_id, Duration::from_secs(60))
            .expect("run recorded");
        assert_eq!(record.state, RunState::Stopped, "{run_id}");
        fixture.assert_gone(run_id);
    }
    assert!(
        flat,
        "the supervisor's threads grew with its runs: {threads_first} at {FIRST} live runs, {threads} at {RUNS}"
    );
    assert!(
        fds_per_run <= 3.0,
        "the supervisor holds {fds_per_run:.2} descriptors a live run (at most 3): {fds_first} at {FIRST} runs, {fds} at {RUNS}"
    );
    assert!(
        rss_per_run <= 128,
        "the supervisor holds {rss_per_run} KiB a live run (at most 128)"
    );
}

#[test]
fn a_start_past_the_open_file_limit_is_resource_exhausted_naming_it() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if !require_root() {
        return;
    }
    let base = HOST_ID_BASE + 1_000;
    let fixture = RunFixture::with("scale-fds", base, |settings, _| {
        settings.host_ids = base..base + 16;
        // Every start prepares its own sandbox: nothing prepared ahead takes descriptors.
        settings.warm_sandboxes = 0;
    });
    let first = fixture
        .start(&fixture.sign(fixture.receipt("exec sleep 600", 600)))
        .unwrap();
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    // A few descriptors short of what a start takes for a moment.
    setrlimit(Resource::RLIMIT_NOFILE, open_fds() as u64 + 2, hard).unwrap();
    let refused = fixture.start(&fixture.sign(fixture.receipt("exec sleep 600", 600)));
    setrlimit(Resource::RLIMIT_NOFILE, soft, hard).unwrap();
    fixture.manager.stop(&first, "the test is over");
    fixture.manager.wait(&first, Duration::from_secs(30));
    fixture.assert_gone(&first);
    let error = refused.expect_err("a start past the open-file limit is refused");
    assert_eq!(error.code(), "host_descriptors", "{error:?}");
    let status = tollgate_supervisor::status::start_status(&error);
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("RLIMIT_NOFILE") && status.message().contains("raise it"),
        "{}",
        status.message()
    );
    assert!(
        fixture.manager.live_ids().is_empty(),
        "the refused start left a live run"
    );
}

/// Connections one run's gateway takes at once (`tollgate_daemon::ServeLimits::GATEWAY`; a
/// receipt without egress gets no more for hand-offs).
const GATEWAY_CONNECTIONS: usize = 32;

/// An agent that floods its gateway socket: opens up to 200 connections (until the socket's
/// backlog is full), sends one byte on each so none is closed as silent, says how many it
/// holds, and waits for SIGUSR1; then closes them all and makes one gateway call.
const FLOODER: &str = r#"
import signal, socket, subprocess
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
held = []
for _ in range(200):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setblocking(False)
    try:
        s.connect("/run/tollgate/gateway.sock")
        s.send(b"P")
    except OSError:
        s.close()
        break
    held.append(s)
print("held", len(held), flush=True)
signal.sigwait({signal.SIGUSR1})
for s in held:
    s.close()
done = subprocess.run(["/run/tollgate/bin/tollgate-shim", "receipt"], capture_output=True)
print("answered" if done.returncode == 0 else "refused", flush=True)
"#;

/// The host pids of processes named `comm` running as a uid in `uids`.
fn pids_of(comm: &str, uids: std::ops::Range<u32>) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let named = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|name| name.trim() == comm);
            let uid = std::fs::read_to_string(format!("/proc/{pid}/status"))
                .ok()
                .and_then(|status| {
                    status
                        .lines()
                        .find_map(|line| line.strip_prefix("Uid:"))?
                        .split_whitespace()
                        .next()?
                        .parse::<u32>()
                        .ok()
                });
            named && uid.is_some_and(|uid| uids.contains(&uid))
        })
        .collect()
}

/// A supervisor in this process for one Python agent's run, with four host ids from `base`
/// and no sandbox prepared ahead.
fn python_fixture(name: &str, base: u32) -> RunFixture {
    RunFixture::with(name, base, |settings, _| {
        settings.host_ids = base..base + 4;
        settings.warm_sandboxes = 0;
    })
}

/// Starts `program` as the agent (`python3 -c`) of a run of `fixture`: its run id.
fn start_python(fixture: &RunFixture, program: &str) -> String {
    let mut receipt = fixture.receipt(&format!("exec /usr/bin/python3 -c '{program}'"), 120);
    receipt.exec.push("/usr/bin/python3".into());
    fixture.start(&fixture.sign(receipt)).unwrap()
}

/// Sends `signal` to the Python agents running as host ids from `base` (four).
fn signal_python(base: u32, signal: Signal) {
    for pid in pids_of("python3", base..base + 4) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
    }
}

/// A run's agent opening many gateway connections makes the supervisor hold at most the
/// gateway's connection limit: the run's pid 1 accepts one only when the gateway asks, and
/// the gateway asks only with a free slot, so the rest wait in the kernel's backlog of the
/// sandbox's socket. Once they close, the gateway answers again.
#[test]
fn an_agent_flooding_its_gateway_holds_at_most_the_connection_limit() {
    if !require_root() {
        return;
    }
    let base = 427_000;
    let fixture = python_fixture("scale-flood", base);
    let before = open_fds();
    let run_id = start_python(&fixture, FLOODER);
    let output = || fixture.output_of(&run_id);
    // Counted until the agent holds its connections and the supervisor has taken the most it
    // takes (or a minute has passed: the assertions below say which).
    let bound = before + 3 + GATEWAY_CONNECTIONS + 1;
    let mut most = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        most = most.max(open_fds());
        if output().contains("held") && most >= bound - 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // A while longer at the limit: nothing more is taken.
    for _ in 0..50 {
        most = most.max(open_fds());
        std::thread::sleep(Duration::from_millis(20));
    }
    let held = output();
    signal_python(base, Signal::SIGUSR1);
    let record = fixture
        .manager
        .wait(&run_id, Duration::from_secs(60))
        .expect("run recorded");
    let after = output();
    fixture.assert_gone(&run_id);
    let opened: usize = held
        .split_whitespace()
        .skip_while(|word| *word != "held")
        .nth(1)
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("the agent said how many it holds: {held:?}"));
    assert!(
        opened > GATEWAY_CONNECTIONS * 2,
        "the agent opened only {opened} connections"
    );
    assert!(
        most >= before + 3 + GATEWAY_CONNECTIONS,
        "the supervisor took only {} of the agent's connections",
        most.saturating_sub(before + 3)
    );
    assert!(
        most <= bound,
        "the supervisor held {most} descriptors with {opened} connections open (at most {bound}: {before} before the run, 3 for it, {GATEWAY_CONNECTIONS} connections and one on its way)"
    );
    assert!(after.contains("answered"), "{after}");
    assert_eq!(record.state, RunState::Exited, "{record:?}");
}

/// A field of `/proc/<pid>/status` (`Threads`), as its leading number.
fn status_of(pid: u32, key: &str) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("{key} in /proc/{pid}/status"))
}

/// The real daemon, over gRPC: its thread count (`/proc/<pid>/status`) stays flat while a few
/// hundred runs accumulate, and a SIGTERM with every one of them live ends each (its audit
/// entry written as `supervisor_shutdown`) and leaves no cgroup or run directory behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemons_threads_stay_flat_over_grpc_and_its_stop_leaves_nothing() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let mut supervisor = SupervisorProcess::start_with_capacity(
        &dir.path().join("supervisor"),
        authority.addr(),
        "scale-daemon",
        DAEMON_HOST_ID_BASE,
        RUNS as u32 + 8,
    );
    let pid = supervisor.pid();
    let (minter, admin) = (authority.admin_token(), supervisor.token());
    let mut authority_client = authority.client().await;
    let mut client = supervisor.client().await;
    let mut runs = Vec::new();
    let mut threads_first = None;
    for i in 0..RUNS {
        let minted = authority_client
            .mint_receipt(authed(
                &minter,
                pb::MintReceiptRequest {
                    subject: "scale".into(),
                    ttl_seconds: 600,
                    audience: vec!["workstation".into()],
                    agent: Some(pb::AgentSpec {
                        argv: vec!["/usr/bin/sleep".into(), "600".into()],
                        ..Default::default()
                    }),
                    limits: Some(pb::Limits {
                        memory_bytes: 64 << 20,
                        pids: 16,
                        ..Default::default()
                    }),
                    exec: vec!["/usr/bin/sleep".into()],
                    ..Default::default()
                },
            ))
            .await
            .unwrap_or_else(|e| panic!("mint {i}: {e:?}"))
            .into_inner();
        let run_id = client
            .start_run(authed(
                &admin,
                pb::StartRunRequest {
                    receipt: minted.text,
                    ..Default::default()
                },
            ))
            .await
            .unwrap_or_else(|e| panic!("start {i}: {e:?}"))
            .into_inner()
            .run_id;
        runs.push(run_id);
        if runs.len() == FIRST {
            threads_first = Some(status_of(pid, "Threads"));
        }
    }
    let threads_first = threads_first.unwrap();
    let threads = status_of(pid, "Threads");
    let live = client
        .list_runs(authed(&admin, pb::ListRunsRequest { live_only: true }))
        .await
        .unwrap()
        .into_inner()
        .runs
        .into_iter()
        .filter(|run| run.state == pb::RunState::Running as i32)
        .count();
    eprintln!("daemon threads {threads_first} at {FIRST} live runs, {threads} at {RUNS}");

    // A clean stop with every run live: each ended and audited, nothing left.
    let (data_dir, parent) = (
        supervisor.data_dir().to_owned(),
        supervisor.cgroup_parent.clone(),
    );
    // The daemon's threads, sampled through the stop until it has exited (not timed: the
    // sampler only keeps the largest count it saw).
    let sampling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let sampling = sampling.clone();
        std::thread::spawn(move || {
            let mut most = 0;
            while sampling.load(std::sync::atomic::Ordering::SeqCst) {
                let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
                    break;
                };
                let threads = status
                    .lines()
                    .find_map(|line| line.strip_prefix("Threads:"))
                    .and_then(|value| value.trim().parse().ok())
                    .unwrap_or(0);
                most = most.max(threads);
                std::thread::sleep(Duration::from_millis(2));
            }
            most
        })
    };
    let stopped = supervisor.terminate(Signal::SIGTERM);
    sampling.store(false, std::sync::atomic::Ordering::SeqCst);
    let threads_in_stop = sampler.join().unwrap();
    eprintln!("daemon threads during the stop of {RUNS} runs: at most {threads_in_stop}");
    let left = leftovers(&data_dir, &parent);
    let parents_left: Vec<_> = std::fs::read_dir("/sys/fs/cgroup")
        .unwrap()
        .flatten()
        .map(|hierarchy| hierarchy.path().join(&parent))
        .filter(|dir| dir.exists())
        .collect();
    let ended: std::collections::HashSet<String> = supervisor
        .audit()
        .into_iter()
        .filter(|entry| {
            entry.kind == EntryKind::Teardown
                && matches!(
                    entry.metadata.get("state"),
                    Some(tollgate_audit::MetaValue::Str(state))
                        if state == RunState::SupervisorShutdown.name()
                )
        })
        .filter_map(|entry| entry.run_id)
        .collect();
    assert_eq!(live, RUNS, "every run was live before the stop");
    assert!(
        threads <= threads_first + SLACK,
        "the daemon's threads grew with its runs: {threads_first} at {FIRST} live runs, {threads} at {RUNS}"
    );
    assert!(stopped.success(), "the daemon's clean stop: {stopped:?}");
    assert!(
        threads_in_stop <= STOP_THREADS,
        "the daemon grew to {threads_in_stop} threads while its {RUNS} runs ended at its stop \
         (at most {STOP_THREADS}): its teardowns must share a few workers"
    );
    assert!(left.is_empty(), "the stop left behind: {left:?}");
    assert!(
        parents_left.is_empty(),
        "the stop left the runs' parent cgroup: {parents_left:?}"
    );
    let unaudited: Vec<&String> = runs.iter().filter(|id| !ended.contains(*id)).collect();
    assert!(
        unaudited.is_empty(),
        "{} runs have no supervisor_shutdown teardown entry: {unaudited:?}",
        unaudited.len()
    );
}

/// An agent that holds 24 gateway connections at once, each having sent one byte, says how
/// many its peer closed within three seconds, then (on SIGUSR2) closes them and makes one call.
const HOLDER: &str = r#"
import signal, socket, subprocess, time
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGUSR2})
print("ready", flush=True)
signal.sigwait({signal.SIGUSR1})
held = []
for _ in range(24):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("/run/tollgate/gateway.sock")
    s.send(b"P")
    held.append(s)
time.sleep(3)
lost = 0
for s in held:
    s.setblocking(False)
    try:
        if s.recv(1, socket.MSG_PEEK) == b"":
            lost += 1
    except BlockingIOError:
        pass
    except OSError:
        lost += 1
print("lost", lost, flush=True)
signal.sigwait({signal.SIGUSR2})
for s in held:
    s.close()
done = subprocess.run(["/run/tollgate/bin/tollgate-shim", "receipt"], capture_output=True)
print("answered" if done.returncode == 0 else "refused", flush=True)
"#;

/// At its open-file limit the supervisor asks pid 1 for no more gateway connections: they
/// wait in the sandbox socket's backlog. A connection pid 1 accepted and handed over with no
/// descriptor free to receive it on would be lost (closed on its caller), as a run's calls
/// were when 5,000 live runs each made one at once.
#[test]
fn at_the_open_file_limit_gateway_connections_wait_and_none_is_lost() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if !require_root() {
        return;
    }
    let base = 427_100;
    let fixture = python_fixture("scale-fd-limit", base);
    let run_id = start_python(&fixture, HOLDER);
    let output = || fixture.output_of(&run_id);
    let wait_for = |text: &str| {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !output().contains(text) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_for("ready");
    let signal = |signal: Signal| signal_python(base, signal);
    // Room for a few of the agent's 24 connections only.
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    let tight = (open_fds() + 10) as u64;
    setrlimit(Resource::RLIMIT_NOFILE, tight, hard).unwrap();
    signal(Signal::SIGUSR1);
    wait_for("lost");
    setrlimit(Resource::RLIMIT_NOFILE, soft, hard).unwrap();
    signal(Signal::SIGUSR2);
    let record = fixture
        .manager
        .wait(&run_id, Duration::from_secs(60))
        .expect("run recorded");
    let said = output();
    assert!(said.contains("lost 0\n"), "{said}");
    assert!(said.contains("answered"), "{said}");
    assert_eq!(record.state, RunState::Exited, "{record:?}");
    fixture.assert_gone(&run_id);
}
