//! Sandbox start and teardown, Tollgate beside bwrap, same program, same machine, same run.
//!
//! * start: from the call that admits the receipt (Tollgate) or spawns bwrap, to the first
//!   byte the program writes (its first instruction that can be observed from outside).
//! * teardown with 200 processes: the program forks 200 sleepers and says "ready"; then
//!   from the stop (StopRun path / SIGKILL of bwrap) until every process is gone (Tollgate:
//!   until teardown has also removed the cgroup and directory and written its report).

use std::io::Read as _;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tollgate_proto::v1 as pb;
use tollgate_receipt::{timestamp_from_unix, unix_now, KeySet, ReceiptSigner};
use tollgate_supervisor::cgroup::sweep;
use tollgate_supervisor::runs::{OutputSink, RunManager, RunSettings};

const SLEEPERS: &str =
    "i=0; while [ $i -lt 200 ]; do sleep 4711 & i=$((i+1)); done; echo ready; wait";

fn percentiles(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    (
        ms(samples[samples.len() / 2]),
        ms(samples[((samples.len() as f64 - 1.0) * 0.9).round() as usize]),
    )
}

fn sleepers_alive() -> usize {
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| std::fs::read_to_string(e.path().join("cmdline")).ok())
                .filter(|cmd| cmd.starts_with("sleep\u{0}4711"))
                .count()
        })
        .unwrap_or(0)
}

/// bwrap with `--unshare-all` and the host's /usr read-only, running `script` in `sh`.
pub(crate) fn bwrap(script: &str) -> Command {
    let mut command = Command::new("bwrap");
    command
        .args(["--unshare-all", "--die-with-parent"])
        .args(["--ro-bind", "/usr", "/usr"])
        .args(["--symlink", "usr/bin", "/bin"])
        .args(["--symlink", "usr/lib", "/lib"])
        .args(["--symlink", "usr/lib64", "/lib64"])
        .args(["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"])
        .args(["/bin/sh", "-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    command
}

fn bwrap_start() -> anyhow::Result<Duration> {
    let start = Instant::now();
    let mut child = bwrap("echo x")
        .spawn()
        .context("spawn bwrap (apt-get install bubblewrap)")?;
    let mut byte = [0u8; 1];
    child
        .stdout
        .as_mut()
        .context("stdout")?
        .read_exact(&mut byte)?;
    let elapsed = start.elapsed();
    child.wait()?;
    Ok(elapsed)
}

fn bwrap_teardown() -> anyhow::Result<Duration> {
    let mut child = bwrap(SLEEPERS).spawn()?;
    let mut ready = [0u8; 6];
    child
        .stdout
        .as_mut()
        .context("stdout")?
        .read_exact(&mut ready)?;
    while sleepers_alive() < 200 {
        std::thread::sleep(Duration::from_micros(200));
    }
    let start = Instant::now();
    child.kill()?;
    child.wait()?;
    while sleepers_alive() > 0 {
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(start.elapsed())
}

pub(crate) struct Tollgate {
    pub(crate) manager: Arc<RunManager>,
    pub(crate) signer: ReceiptSigner,
    parent: String,
    _dir: tempfile::TempDir,
}

impl Tollgate {
    /// A run manager keeping `warm` sandboxes prepared (0: every start prepares its own),
    /// with its own cgroup parent and host ids (`id_base`..+100).
    pub(crate) fn new(warm: usize, id_base: u32) -> anyhow::Result<Self> {
        Self::with_ids(warm, id_base..id_base + 100)
    }

    /// A run manager keeping `warm` sandboxes prepared, handing out the host ids `ids`.
    pub(crate) fn with_ids(warm: usize, ids: std::ops::Range<u32>) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let signer = ReceiptSigner::generate();
        let mut keys = KeySet::new();
        keys.insert(signer.public_key());
        let parent = format!("tollgate-bench-{}-warm{warm}", std::process::id());
        let settings = RunSettings {
            data_dir: dir.path().join("supervisor"),
            supervisor_id: "bench".into(),
            shim: tollgate_tests::bin_path("tollgate-shim"),
            cgroup_parent: parent.clone(),
            host_ids: ids,
            clock_skew: Duration::ZERO,
            warm_sandboxes: warm,
            live_restore: None,
            rootfs_dir: dir.path().join("rootfs"),
            egress: Default::default(),
        };
        let audit = tollgate_tests::supervisor_audit(&settings.data_dir);
        let (manager, _) = RunManager::open(settings, keys, audit)?;
        Ok(Self {
            manager,
            signer,
            parent,
            _dir: dir,
        })
    }

    /// The cgroup parent of its runs.
    pub(crate) fn parent(&self) -> &str {
        &self.parent
    }

    /// The supervisor's data directory.
    pub(crate) fn data_dir(&self) -> std::path::PathBuf {
        self._dir.path().join("supervisor")
    }

    fn receipt(&self, script: &str) -> tollgate_receipt::SignedReceipt {
        let mut receipt = self.unsigned_receipt(script);
        self.signer.sign(&mut receipt)
    }

    /// The receipt every run of this bench uses, not yet signed.
    pub(crate) fn unsigned_receipt(&self, script: &str) -> pb::Receipt {
        let now = unix_now();
        pb::Receipt {
            receipt_id: uuid::Uuid::now_v7().to_string(),
            owner: "bench".into(),
            subject: "bench".into(),
            audience: vec!["bench".into()],
            issued_at: Some(timestamp_from_unix(now)),
            not_before: Some(timestamp_from_unix(now)),
            expires_at: Some(timestamp_from_unix(now + 300)),
            agent: Some(pb::AgentSpec {
                argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
                ..Default::default()
            }),
            limits: Some(pb::Limits {
                memory_bytes: 512 << 20,
                pids: 512,
                cpu_millicores: 2000,
                output_bytes: 1 << 20,
                tmpfs_bytes: 8 << 20,
                tool_calls: 1,
                tokens: 1,
                files: 1024,
                ..Default::default()
            }),
            exec: vec!["/bin/sh".into(), "/usr/bin/sleep".into()],
            ..Default::default()
        }
    }

    /// Starts `script`; returns the run id and a receiver of its first output's arrival.
    fn start(&self, script: &str) -> anyhow::Result<(String, mpsc::Receiver<Instant>)> {
        self.start_signed(&self.receipt(script))
    }

    /// Starts `receipt`; returns the run id and a receiver of its first output's arrival.
    pub(crate) fn start_signed(
        &self,
        receipt: &tollgate_receipt::SignedReceipt,
    ) -> anyhow::Result<(String, mpsc::Receiver<Instant>)> {
        let (tx, rx) = mpsc::sync_channel(1);
        let sink: OutputSink = Arc::new(move |_: &str, _, _: &[u8]| {
            let _ = tx.try_send(Instant::now());
        });
        let run_id = self.manager.start(receipt, None, sink)?;
        Ok((run_id, rx))
    }
}

impl Drop for Tollgate {
    fn drop(&mut self) {
        self.manager.shutdown();
        let _ = sweep(&self.parent, true);
    }
}

/// Runs the benchmark and prints the table.
pub(crate) fn bench(runs: usize) -> anyhow::Result<()> {
    // The default: one sandbox prepared ahead, refilled in the background after each start.
    let tollgate = Tollgate::new(1, 2_900_000)?;
    // No sandbox prepared ahead: what a start costs in a burst that drains the pool.
    let cold = Tollgate::new(0, 2_900_100)?;
    let (mut t_start, mut t_exec, mut b_start) = (Vec::new(), Vec::new(), Vec::new());
    let (mut c_start, mut c_exec) = (Vec::new(), Vec::new());
    let (mut t_teardown, mut b_teardown) = (Vec::new(), Vec::new());
    let (mut idmapped_start, mut rootfs_start) = (Vec::new(), Vec::new());
    let mut granted_start = Vec::new();
    // The same grant owned by root: mounted, not id-mapped (what the mapping itself costs).
    let rooted = tollgate._dir.path().join("srv");
    std::fs::create_dir(&rooted)?;
    // A grant owned by an unprivileged user (id-mapped at every start), and a root file
    // system: TOLLGATE_BENCH_ROOTFS, or the Debian rootfs scripts/test makes, when present.
    let owned = tollgate._dir.path().join("home");
    std::fs::create_dir(&owned)?;
    nix::unistd::chown(
        &owned,
        Some(nix::unistd::Uid::from_raw(4321)),
        Some(nix::unistd::Gid::from_raw(4321)),
    )?;
    let rootfs = std::env::var("TOLLGATE_BENCH_ROOTFS")
        .unwrap_or_else(|_| "/var/cache/tollgate-test/rootfs-trixie".into());
    let rootfs = std::path::Path::new(&rootfs)
        .join("usr")
        .is_dir()
        .then_some(rootfs);
    let variant = |tollgate: &Tollgate, change: &dyn Fn(&mut pb::Receipt)| {
        let mut receipt = tollgate.unsigned_receipt("echo x");
        change(&mut receipt);
        tollgate.signer.sign(&mut receipt)
    };
    let measure = |tollgate: &Tollgate,
                   receipt: Option<tollgate_receipt::SignedReceipt>|
     -> anyhow::Result<(Duration, Duration)> {
        let receipt = receipt.unwrap_or_else(|| tollgate.receipt("echo x"));
        let begin = Instant::now();
        let (run_id, first) = tollgate.start_signed(&receipt)?;
        let exec = begin.elapsed();
        let first = first.recv_timeout(Duration::from_secs(10))? - begin;
        tollgate.manager.wait(&run_id, Duration::from_secs(10));
        Ok((first, exec))
    };
    // Interleave them so machine noise hits all alike; round 0 warms up.
    for round in 0..=runs {
        let (first, exec) = measure(&tollgate, None)?;
        let (cold_first, cold_exec) = measure(&cold, None)?;
        let bwrap = bwrap_start()?;
        let idmapped = variant(&tollgate, &|r: &mut pb::Receipt| {
            r.fs.push(pb::FsGrant {
                path: owned.display().to_string(),
                access: pb::FsAccess::Write as i32,
                mount: "/home/me".into(),
                exec: false,
                ask: false,
                ask_reads: false,
            });
        });
        let (idmapped_first, _) = measure(&tollgate, Some(idmapped))?;
        let granted = variant(&tollgate, &|r: &mut pb::Receipt| {
            r.fs.push(pb::FsGrant {
                path: rooted.display().to_string(),
                access: pb::FsAccess::Write as i32,
                mount: "/home/me".into(),
                exec: false,
                ask: false,
                ask_reads: false,
            });
        });
        let (granted_first, _) = measure(&tollgate, Some(granted))?;
        let rootfs_first = match &rootfs {
            Some(rootfs) => {
                let on_rootfs = variant(&tollgate, &|r: &mut pb::Receipt| {
                    r.rootfs = rootfs.clone();
                });
                Some(measure(&tollgate, Some(on_rootfs))?.0)
            }
            None => None,
        };
        if round > 0 {
            t_start.push(first);
            t_exec.push(exec);
            c_start.push(cold_first);
            c_exec.push(cold_exec);
            b_start.push(bwrap);
            idmapped_start.push(idmapped_first);
            granted_start.push(granted_first);
            rootfs_start.extend(rootfs_first);
        }
    }
    for round in 0..=(runs / 3).max(3) {
        let (run_id, ready) = tollgate.start(SLEEPERS)?;
        ready.recv_timeout(Duration::from_secs(20))?;
        while sleepers_alive() < 200 {
            std::thread::sleep(Duration::from_micros(200));
        }
        let begin = Instant::now();
        tollgate.manager.stop(&run_id, "bench");
        let record = tollgate.manager.wait(&run_id, Duration::from_secs(20));
        let elapsed = begin.elapsed();
        anyhow::ensure!(
            sleepers_alive() == 0,
            "sleepers survived teardown: {record:?}"
        );
        let bwrap = bwrap_teardown()?;
        if round > 0 {
            t_teardown.push(elapsed);
            b_teardown.push(bwrap);
        }
    }
    let row = |name: &str, samples: Vec<Duration>| {
        let n = samples.len();
        let (p50, p90) = percentiles(samples);
        println!("{name:<64} p50 {p50:>7.2} ms   p90 {p90:>7.2} ms   (n={n})");
    };
    row(
        "tollgate: receipt admitted -> agent's first output byte",
        t_start,
    );
    row(
        "tollgate: receipt admitted -> agent exec'd (start returns)",
        t_exec,
    );
    row(
        "tollgate, none prepared ahead: admitted -> first output byte",
        c_start,
    );
    row(
        "tollgate, none prepared ahead: admitted -> agent exec'd",
        c_exec,
    );
    row("bwrap --unshare-all: spawn -> first output byte", b_start);
    row(
        "tollgate, a root-owned write grant mounted: admitted -> first byte",
        granted_start,
    );
    row(
        "tollgate, a user-owned grant id-mapped: admitted -> first byte",
        idmapped_start,
    );
    if rootfs_start.is_empty() {
        println!("(no root file system to start on: set TOLLGATE_BENCH_ROOTFS)");
    } else {
        row(
            "tollgate, on a debootstrap rootfs: admitted -> first byte",
            rootfs_start,
        );
    }
    row(
        "tollgate: teardown of 200 processes (stop -> report written)",
        t_teardown,
    );
    row("bwrap: SIGKILL -> all 200 processes gone", b_teardown);
    Ok(())
}
