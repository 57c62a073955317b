//! Untampered logs, rotation, reopening, torn tails, redaction, concurrency, modes, reading.

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tollgate_audit::{
    read_entries, verify_dir, AuditError, AuditLog, CheckpointTrust, Durability, EntryDraft,
    EntryFilter, EntryKind, MetaValue, Problem, Redactor, VerifyError, VerifyOptions,
};

use crate::common::*;

#[test]
fn untampered_logs_verify_with_and_without_key_across_rotation() {
    for keyed in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        write_log(dir.path(), keyed, 25, 7, 1000);
        let report = verify_dir(dir.path(), &options(keyed)).unwrap();
        assert_eq!(report.entries, 25);
        assert_eq!(report.head_seq, 25);
        assert!(report.files >= 5, "{report:?}");
        assert_eq!(report.keyed, keyed);
        assert_eq!(report.last_checkpoint_count, Some(25));
        assert_eq!(report.checkpoints_checked, 4, "7, 14, 21 and 25 at close");
        assert!(matches!(
            report.checkpoint_trust,
            CheckpointTrust::BesideLog(_)
        ));
        assert!(report.torn_tail.is_none() && report.recovered_tails.is_empty());
        let trusted = VerifyOptions {
            key: keyed.then(audit_key),
            trusted_checkpoint_key: Some(signing_key().verifying_key()),
        };
        assert_eq!(
            verify_dir(dir.path(), &trusted).unwrap().checkpoint_trust,
            CheckpointTrust::TrustedKey
        );
        // The last entry's hash is the report's head.
        let last = read_lines(&log_path(dir.path(), report.files as u64));
        assert_eq!(hash_of(last.last().unwrap()), report.head_hash);
        // Every file respects the size bound (each holds at least one entry).
        for index in 1..=report.files as u64 {
            let size = fs::metadata(log_path(dir.path(), index)).unwrap().len();
            assert!(size <= 1000, "file {index} has {size} bytes");
        }
    }
}

#[test]
fn the_chain_continues_across_reopen_and_the_hash_rule_matches_the_docs() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), true, 5, 1000, 1 << 20);
    let log = AuditLog::open(config(dir.path(), true)).unwrap();
    assert_eq!(log.head_seq(), 5);
    let appended = log.append(draft(6)).unwrap();
    assert_eq!(appended.seq, 6);
    log.close().unwrap();
    let lines = read_lines(&log_path(dir.path(), 1));
    assert_eq!(lines.len(), 6);
    assert!(lines[0].contains(&format!("\"prev_hash\":\"{}\"", "0".repeat(64))));
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(hash_line(line, Some(&KEY)), hash_of(line), "line {}", i + 1);
        if i > 0 {
            assert!(line.contains(&format!("\"prev_hash\":\"{}\"", hash_of(&lines[i - 1]))));
        }
    }
    assert_eq!(hash_of(&lines[5]), appended.hash);
    let report = verify_dir(dir.path(), &options(true)).unwrap();
    assert_eq!(report.checkpoints_checked, 2);
    assert_eq!(report.last_checkpoint_count, Some(6));
    // Field order is the documented one.
    let fields = [
        "seq",
        "time",
        "component",
        "kind",
        "receipt_id",
        "run_id",
        "call_id",
        "decision",
        "reason",
        "metadata",
        "prev_hash",
        "hash",
    ];
    let mut at = 0;
    for field in fields {
        let found = lines[0][at..].find(&format!("\"{field}\":")).unwrap();
        at += found;
    }
}

#[test]
fn the_writer_refuses_a_log_under_the_wrong_key() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), true, 3, 1000, 1 << 20);
    let problem = match AuditLog::open(config(dir.path(), false)) {
        Err(AuditError::Broken { source, .. }) => match *source {
            VerifyError::Broken { problem, line, .. } => {
                assert_eq!(line, 1);
                problem
            }
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    };
    assert!(matches!(
        problem,
        Problem::HashMismatch { keyed: false, .. }
    ));
    let mut wrong = config(dir.path(), true);
    wrong.key = Some(tollgate_audit::AuditKey::from_bytes(vec![1u8; 32]).unwrap());
    assert!(matches!(
        AuditLog::open(wrong),
        Err(AuditError::Broken { .. })
    ));
    // A verifier with the wrong key says the key may be wrong.
    let wrong_options = VerifyOptions {
        key: Some(tollgate_audit::AuditKey::from_bytes(vec![1u8; 32]).unwrap()),
        trusted_checkpoint_key: None,
    };
    let error = verify_dir(dir.path(), &wrong_options).unwrap_err();
    assert!(error.to_string().contains("audit key"), "{error}");
}

#[test]
fn torn_tail_is_reported_then_recovered_on_reopen() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), true, 5, 1000, 1 << 20);
    let path = log_path(dir.path(), 1);
    let complete = fs::metadata(&path).unwrap().len();
    let torn = b"{\"seq\":6,\"time\":\"2025-01-";
    let mut file = fs::OpenOptions::new().append(true).open(&path).unwrap();
    std::io::Write::write_all(&mut file, torn).unwrap();
    drop(file);

    let report = verify_dir(dir.path(), &options(true)).unwrap();
    let tail = report.torn_tail.expect("torn tail reported");
    assert_eq!(tail.offset, complete);
    assert_eq!(tail.bytes, torn.len() as u64);
    assert_eq!(report.entries, 5);

    let log = AuditLog::open(config(dir.path(), true)).unwrap();
    assert_eq!(log.head_seq(), 6, "the log_recovered entry");
    log.append(draft(7)).unwrap();
    log.close().unwrap();

    let report = verify_dir(dir.path(), &options(true)).unwrap();
    assert!(report.torn_tail.is_none());
    assert_eq!(report.entries, 7);
    assert_eq!(report.recovered_tails.len(), 1);
    let recovered = &report.recovered_tails[0];
    assert_eq!(recovered.seq, 6);
    assert_eq!(recovered.torn_bytes, Some(torn.len() as i64));
    use sha2::Digest as _;
    assert_eq!(
        recovered.torn_sha256.as_deref(),
        Some(hex::encode(sha2::Sha256::digest(torn)).as_str())
    );
    let torn_file = dir.path().join(recovered.torn_file.as_ref().unwrap());
    assert!(torn_file
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("log-000001.jsonl.torn-"));
    assert_eq!(fs::read(&torn_file).unwrap(), torn);
    assert_eq!(
        fs::metadata(&torn_file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let entry = read_entries(dir.path()).unwrap().nth(5).unwrap().unwrap();
    assert_eq!(entry.kind, EntryKind::LogRecovered);
}

#[test]
fn unparseable_final_line_with_newline_is_torn_too() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), false, 3, 1000, 1 << 20);
    let path = log_path(dir.path(), 1);
    let mut file = fs::OpenOptions::new().append(true).open(&path).unwrap();
    std::io::Write::write_all(&mut file, b"\0\0\0\0\n").unwrap();
    drop(file);
    assert!(verify_dir(dir.path(), &options(false))
        .unwrap()
        .torn_tail
        .is_some());
    AuditLog::open(config(dir.path(), false))
        .unwrap()
        .close()
        .unwrap();
    let report = verify_dir(dir.path(), &options(false)).unwrap();
    assert_eq!(report.recovered_tails.len(), 1);
    assert_eq!(report.recovered_tails[0].torn_bytes, Some(5));
}

#[test]
fn recovery_interrupted_by_a_crash_is_finished_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), false, 3, 1000, 1 << 20);
    // As if a crash hit after the torn bytes were saved and the log truncated, before the
    // log_recovered entry: the next open writes the entry.
    let pending = dir.path().join("log-000001.jsonl.torn-100.pending");
    fs::write(&pending, b"partial").unwrap();
    AuditLog::open(config(dir.path(), false))
        .unwrap()
        .close()
        .unwrap();
    let report = verify_dir(dir.path(), &options(false)).unwrap();
    assert_eq!(report.recovered_tails.len(), 1);
    assert_eq!(
        report.recovered_tails[0].torn_file.as_deref(),
        Some("log-000001.jsonl.torn-100")
    );
    assert!(!pending.exists());
    // As if the crash hit after the entry, before the rename: no second entry.
    fs::rename(dir.path().join("log-000001.jsonl.torn-100"), &pending).unwrap();
    AuditLog::open(config(dir.path(), false))
        .unwrap()
        .close()
        .unwrap();
    let report = verify_dir(dir.path(), &options(false)).unwrap();
    assert_eq!(report.recovered_tails.len(), 1);
    assert_eq!(report.entries, 4);
    assert!(!pending.exists());
}

/// A redactor is any function: this one masks one marker.
fn marker_redactor() -> Redactor {
    Arc::new(|text: &str| {
        text.contains("SECRET-TOKEN-123")
            .then(|| text.replace("SECRET-TOKEN-123", "[redacted]"))
    })
}

#[test]
fn redaction_keeps_the_marker_off_the_disk() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), true);
    config.redactor = Some(marker_redactor());
    let log = AuditLog::open(config).unwrap();
    log.append(
        EntryDraft::new("router", EntryKind::RouteDecision)
            .reason("prompt held SECRET-TOKEN-123 twice: SECRET-TOKEN-123")
            .meta("snippet", "xxSECRET-TOKEN-123yy")
            .meta("list", vec!["clean", "SECRET-TOKEN-123"])
            .meta("count", 2),
    )
    .unwrap();
    log.append(EntryDraft::new("router", EntryKind::RouteDecision).reason("clean"))
        .unwrap();
    log.close().unwrap();
    for file in fs::read_dir(dir.path()).unwrap() {
        let bytes = fs::read(file.unwrap().path()).unwrap();
        assert!(
            !bytes.windows(16).any(|w| w == b"SECRET-TOKEN-123"),
            "marker found on disk"
        );
    }
    let entries: Vec<_> = read_entries(dir.path())
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        entries[0].reason.as_deref(),
        Some("prompt held [redacted] twice: [redacted]")
    );
    assert_eq!(
        entries[0].metadata["list"],
        MetaValue::from(vec!["clean", "[redacted]"])
    );
    assert_eq!(entries[1].reason.as_deref(), Some("clean"));
    verify_dir(dir.path(), &options(true)).unwrap();
}

#[test]
fn eight_threads_append_without_gaps() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), true);
    config.checkpoint_every = 16;
    config.max_file_bytes = 4096;
    let log = AuditLog::open(config).unwrap();
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let log = log.clone();
            std::thread::spawn(move || {
                (0..50u64)
                    .map(|i| log.append(draft(t * 1000 + i)).unwrap().seq)
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut seqs: Vec<u64> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=400).collect::<Vec<_>>());
    drop(log);
    let report = verify_dir(dir.path(), &options(true)).unwrap();
    assert_eq!(report.entries, 400);
    assert!(report.files > 1);
    assert_eq!(
        report.last_checkpoint_count,
        Some(400),
        "dropping the last handle closes"
    );
    let read: Vec<u64> = read_entries(dir.path())
        .unwrap()
        .map(|e| e.unwrap().seq)
        .collect();
    assert_eq!(read, (1..=400).collect::<Vec<_>>());
}

#[test]
fn batched_durability_returns_early_and_flush_makes_it_durable() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), false);
    config.durability = Durability::Batched {
        max_delay: Duration::from_millis(20),
    };
    let log = AuditLog::open(config).unwrap();
    for i in 1..=100 {
        assert_eq!(log.append(draft(i)).unwrap().seq, i);
    }
    log.flush().unwrap();
    assert_eq!(read_lines(&log_path(dir.path(), 1)).len(), 100);
    log.append(draft(101)).unwrap();
    // The writer fsyncs on its own within max_delay.
    let deadline = Instant::now() + Duration::from_secs(5);
    while read_lines(&log_path(dir.path(), 1)).len() < 101 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(5));
    }
    log.close().unwrap();
    assert_eq!(
        verify_dir(dir.path(), &options(false)).unwrap().entries,
        101
    );
}

#[test]
fn close_is_final_and_a_directory_opens_once_per_process() {
    let dir = tempfile::tempdir().unwrap();
    let log = AuditLog::open(config(dir.path(), false)).unwrap();
    assert!(matches!(
        AuditLog::open(config(dir.path(), false)),
        Err(AuditError::AlreadyOpen { .. })
    ));
    let other = log.clone();
    log.append(draft(1)).unwrap();
    other.close().unwrap();
    assert!(matches!(log.append(draft(2)), Err(AuditError::Closed)));
    log.close().unwrap();
    log.flush().unwrap();
    drop((log, other));
    let log = AuditLog::open(config(dir.path(), false)).unwrap();
    assert_eq!(log.head_seq(), 1);
    // No entries since the last checkpoint: close writes no duplicate checkpoint.
    log.close().unwrap();
    let report = verify_dir(dir.path(), &options(false)).unwrap();
    assert_eq!(report.checkpoints_checked, 1);
}

#[test]
fn directory_and_files_are_private() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("audit");
    write_log(&dir, false, 3, 2, 1 << 20);
    let mode = |p: &std::path::Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    for name in ["log-000001.jsonl", "checkpoints.jsonl", "checkpoint.pub"] {
        assert_eq!(mode(&dir.join(name)), 0o600, "{name}");
    }
    let public = fs::read_to_string(dir.join("checkpoint.pub")).unwrap();
    assert_eq!(
        public,
        format!(
            "{} {KEY_ID}\n",
            hex::encode(signing_key().verifying_key().as_bytes())
        )
    );
}

#[test]
fn a_new_checkpoint_key_is_added_to_checkpoint_pub() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), false, 3, 1000, 1 << 20);
    let mut rotated = config(dir.path(), false);
    rotated.checkpoint_key = ed25519_dalek::SigningKey::from_bytes(&[8u8; 32]);
    rotated.checkpoint_key_id = "cp-next".into();
    let log = AuditLog::open(rotated).unwrap();
    log.append(draft(4)).unwrap();
    log.close().unwrap();
    let report = verify_dir(dir.path(), &options(false)).unwrap();
    assert_eq!(report.checkpoints_checked, 2);
    // Reusing a key id for a different key is refused.
    let mut conflicting = config(dir.path(), false);
    conflicting.checkpoint_key = ed25519_dalek::SigningKey::from_bytes(&[9u8; 32]);
    let result = AuditLog::open(conflicting);
    assert!(
        matches!(result, Err(AuditError::CheckpointKeyConflict { .. })),
        "{result:?}"
    );
}

#[test]
fn reader_filters_by_run_receipt_and_time() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), false, 12, 1000, 1500);
    let runs: Vec<u64> = read_entries(dir.path())
        .unwrap()
        .filtered(EntryFilter {
            run_id: Some("run-1".into()),
            ..EntryFilter::default()
        })
        .map(|e| e.unwrap().seq)
        .collect();
    assert_eq!(runs, vec![1, 4, 7, 10]);
    let both: Vec<u64> = read_entries(dir.path())
        .unwrap()
        .filtered(EntryFilter {
            run_id: Some("run-1".into()),
            receipt_id: Some("receipt-0".into()),
            since: None,
        })
        .map(|e| e.unwrap().seq)
        .collect();
    assert_eq!(both, vec![4, 10]);
    let future = read_entries(dir.path())
        .unwrap()
        .filtered(EntryFilter {
            since: Some(SystemTime::now() + Duration::from_secs(60)),
            ..EntryFilter::default()
        })
        .count();
    assert_eq!(future, 0);
    let past = read_entries(dir.path())
        .unwrap()
        .filtered(EntryFilter {
            since: Some(SystemTime::UNIX_EPOCH),
            ..EntryFilter::default()
        })
        .count();
    assert_eq!(past, 12);
    assert!(matches!(
        read_entries(&dir.path().join("nope")),
        Err(AuditError::Dir { .. })
    ));
}

#[test]
fn an_empty_directory_is_not_a_log_and_a_fresh_log_is_empty() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        verify_dir(dir.path(), &VerifyOptions::default()),
        Err(VerifyError::NoLog { .. })
    ));
    AuditLog::open(config(dir.path(), false))
        .unwrap()
        .close()
        .unwrap();
    let report = verify_dir(dir.path(), &VerifyOptions::default()).unwrap();
    assert_eq!(report.entries, 0);
    assert_eq!(report.head_hash, "0".repeat(64));
    assert_eq!(report.checkpoint_trust, CheckpointTrust::NoCheckpoints);
}

#[test]
fn short_keys_are_refused() {
    assert!(matches!(
        tollgate_audit::AuditKey::from_bytes(vec![1u8; 31]),
        Err(AuditError::KeyTooShort { len: 31, .. })
    ));
}

#[test]
fn torn_checkpoint_line_is_tolerated_and_moved_aside() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), false, 3, 1000, 1 << 20);
    let path = dir.path().join("checkpoints.jsonl");
    let before = fs::read(&path).unwrap();
    let mut file = fs::OpenOptions::new().append(true).open(&path).unwrap();
    std::io::Write::write_all(&mut file, b"{\"count\":9,\"head").unwrap();
    drop(file);
    let report = verify_dir(dir.path(), &options(false)).unwrap();
    let torn = report.torn_checkpoint.expect("torn checkpoint reported");
    assert_eq!(torn.offset, before.len() as u64);
    assert_eq!(report.checkpoints_checked, 1);
    AuditLog::open(config(dir.path(), false))
        .unwrap()
        .close()
        .unwrap();
    assert_eq!(fs::read(&path).unwrap(), before);
    let saved: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("checkpoints.jsonl.torn-"))
        .collect();
    assert_eq!(saved.len(), 1);
    assert_eq!(
        fs::read(dir.path().join(&saved[0])).unwrap(),
        b"{\"count\":9,\"head"
    );
    assert!(verify_dir(dir.path(), &options(false))
        .unwrap()
        .torn_checkpoint
        .is_none());
}

#[test]
fn a_refused_log_is_left_exactly_as_found() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), false, 6, 1000, 1 << 20);
    // Truncated (the closing checkpoint covers 6) and with a torn tail: refused, untouched.
    let path = log_path(dir.path(), 1);
    let mut lines = read_lines(&path);
    lines.truncate(4);
    let mut bytes = (lines.join("\n") + "\n").into_bytes();
    bytes.extend_from_slice(b"{\"seq\":5");
    fs::write(&path, &bytes).unwrap();
    let listing = |dir: &std::path::Path| {
        let mut names: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    };
    let names = listing(dir.path());
    assert!(matches!(
        AuditLog::open(config(dir.path(), false)),
        Err(AuditError::Broken { .. })
    ));
    assert_eq!(fs::read(&path).unwrap(), bytes);
    assert_eq!(listing(dir.path()), names);
}

#[test]
fn another_process_cannot_write_an_open_log() {
    let dir = tempfile::tempdir().unwrap();
    let log = AuditLog::open(config(dir.path(), false)).unwrap();
    // flock(2) locks belong to an open file description, so a second open of the lock file
    // stands for another process.
    let lock_file = dir.path().join("writer.lock");
    let other = fs::OpenOptions::new().write(true).open(&lock_file).unwrap();
    let taken = nix::fcntl::Flock::lock(other, nix::fcntl::FlockArg::LockExclusiveNonblock);
    assert!(
        taken.is_err(),
        "the writer holds the lock while the log is open"
    );
    log.close().unwrap();
    drop(log);
    let other = fs::OpenOptions::new().write(true).open(&lock_file).unwrap();
    assert!(
        nix::fcntl::Flock::lock(other, nix::fcntl::FlockArg::LockExclusiveNonblock).is_ok(),
        "closing the log releases the lock"
    );
}

#[test]
fn recorded_entries_join_the_chain_and_reach_the_file_without_a_flush() {
    let dir = tempfile::tempdir().unwrap();
    let log = AuditLog::open(config(dir.path(), true)).unwrap();
    // Recorded, appended and recorded again: one chain, in order.
    let first = log.record(draft(1)).unwrap();
    let second = log.append(draft(2)).unwrap();
    let third = log.record(draft(3)).unwrap();
    assert_eq!((first.seq, second.seq, third.seq), (1, 2, 3));
    // The last one is written (and fsynced) within the bound, with nothing else to carry it.
    let deadline = Instant::now() + tollgate_audit::RECORD_MAX_DELAY * 50;
    while read_lines(&log_path(dir.path(), 1)).len() < 3 {
        assert!(Instant::now() < deadline, "never written");
        std::thread::sleep(Duration::from_millis(2));
    }
    log.close().unwrap();
    let report = verify_dir(dir.path(), &options(true)).unwrap();
    assert_eq!(report.entries, 3);
}

/// A quiet log is checkpointed within `checkpoint_interval` of its last durable entry, not
/// only every `checkpoint_every` entries: a crash then loses truncation detection for at most
/// that window.
#[test]
fn a_quiet_log_is_checkpointed_on_time_without_closing() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), true);
    config.checkpoint_interval = Duration::from_millis(200);
    let log = AuditLog::open(config).unwrap();
    for i in 1..=3 {
        log.append(draft(i)).unwrap();
    }
    let checkpoints = dir.path().join("checkpoints.jsonl");
    let count = || {
        fs::read_to_string(&checkpoints)
            .unwrap_or_default()
            .lines()
            .filter(|line| line.contains("\"count\":3"))
            .count()
    };
    assert_eq!(count(), 0, "not before the interval");
    let deadline = Instant::now() + Duration::from_secs(5);
    while count() == 0 {
        assert!(
            Instant::now() < deadline,
            "no checkpoint within the interval"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Nothing new: no more checkpoints.
    std::thread::sleep(Duration::from_millis(500));
    let lines = fs::read_to_string(&checkpoints).unwrap().lines().count();
    assert_eq!(lines, 1, "one checkpoint for one quiet stretch");
    log.close().unwrap();
}
