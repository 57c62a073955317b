//! Crash test: a child process (this test binary, re-executed) appends with
//! `Durability::EveryEntry` and prints each acknowledged seq; the parent SIGKILLs it at a random
//! moment, then checks that every acknowledged seq is on disk and the directory verifies.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use tollgate_audit::{read_entries, verify_dir, AuditLog, Durability};

use crate::common::*;

const CHILD_ENV: &str = "TOLLGATE_AUDIT_CRASH_CHILD";
const SEED_ENV: &str = "TOLLGATE_AUDIT_CRASH_SEED";
const TEST_NAME: &str = "crash::acknowledged_entries_survive_sigkill";
const ITERATIONS: usize = 30;
// Bounds the whole test well under 20 s even on a slow disk.
const TIME_BUDGET: Duration = Duration::from_secs(15);
// Bounds how much each child writes, so verifying after every kill stays cheap.
const CHILD_MAX_ENTRIES: u64 = 100;

// xorshift64*: enough to spread kill times; the seed is printed so a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[test]
fn acknowledged_entries_survive_sigkill() {
    if let Some(dir) = std::env::var_os(CHILD_ENV) {
        child(Path::new(&dir));
        return;
    }
    let seed = std::env::var(SEED_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    eprintln!("crash test seed {seed} (rerun with {SEED_ENV}={seed})");
    let mut rng = Rng(seed | 1);
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let started = Instant::now();
    // Every acknowledged (seq, hash), over all children.
    let mut acknowledged: Vec<(u64, String)> = Vec::new();
    let mut previous_head = 0;
    let mut iterations = 0;
    for iteration in 0..ITERATIONS {
        if started.elapsed() > TIME_BUDGET {
            break;
        }
        iterations += 1;
        let mut child = Command::new(&exe)
            .args([TEST_NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .filter_map(|line| {
                    let (seq, hash) = line.strip_prefix("ACK ")?.split_once(' ')?;
                    Some((seq.parse().ok()?, hash.to_owned()))
                })
                .collect::<Vec<(u64, String)>>()
        });
        let delay = Duration::from_millis(5 + rng.next() % 75);
        std::thread::sleep(delay);
        child.kill().unwrap();
        let status = child.wait().unwrap();
        let acked = reader.join().unwrap();
        if let Some(code) = status.code() {
            assert_eq!(code, 0, "seed {seed}: child failed before the kill");
        }

        let report = verify_dir(dir.path(), &options(true)).unwrap_or_else(|e| {
            panic!("seed {seed}, iteration {iteration} (kill after {delay:?}): {e}")
        });
        // verify_dir proved seqs 1..=head_seq are all there, chained; the acknowledged ones
        // must be among them (their hashes are compared at the end).
        assert!(
            report.head_seq >= previous_head,
            "seed {seed}, iteration {iteration}: the log shrank from {previous_head} to {}",
            report.head_seq
        );
        if let Some((max, _)) = acked.last() {
            assert!(
                *max <= report.head_seq,
                "seed {seed}, iteration {iteration}: seq {max} was acknowledged but the log ends at {}",
                report.head_seq
            );
        }
        for pair in acked.windows(2) {
            assert_eq!(pair[1].0, pair[0].0 + 1, "seed {seed}: acks out of order");
        }
        previous_head = report.head_seq;
        acknowledged.extend(acked);
    }
    // A last clean open recovers any torn tail, and the result verifies completely.
    AuditLog::open(config(dir.path(), true))
        .unwrap()
        .close()
        .unwrap();
    let report = verify_dir(dir.path(), &options(true)).unwrap();
    assert!(report.torn_tail.is_none());
    let on_disk: Vec<(u64, String)> = read_entries(dir.path())
        .unwrap()
        .map(|e| e.map(|e| (e.seq, e.hash)).unwrap())
        .collect();
    for (seq, hash) in &acknowledged {
        assert_eq!(
            &on_disk[*seq as usize - 1],
            &(*seq, hash.clone()),
            "seed {seed}: acknowledged entry {seq} is not on disk as acknowledged"
        );
    }
    eprintln!(
        "crash test: {iterations} kills, {} acknowledged, {} entries, {} files, {} recovered tails, {:?}",
        acknowledged.len(),
        report.entries,
        report.files,
        report.recovered_tails.len(),
        started.elapsed()
    );
    assert!(!acknowledged.is_empty(), "the children never got to append");
    assert!(started.elapsed() < Duration::from_secs(20));
}

fn child(dir: &Path) {
    let mut config = config(dir, true);
    config.durability = Durability::EveryEntry;
    config.max_file_bytes = 64 * 1024;
    config.checkpoint_every = 200;
    let log = AuditLog::open(config).unwrap();
    let mut out = std::io::stdout();
    let started = Instant::now();
    let mut written = 0;
    // The parent kills us long before this; the limit only stops an orphan.
    while started.elapsed() < Duration::from_secs(20) {
        if written < CHILD_MAX_ENTRIES {
            let appended = log.append(draft(written)).unwrap();
            writeln!(out, "ACK {} {}", appended.seq, appended.hash).unwrap();
            out.flush().unwrap();
            written += 1;
        } else {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
