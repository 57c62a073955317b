//! Helpers shared by the integration tests. The hashing rule is re-implemented here from the
//! documentation, independently of the crate, so the tests also pin the on-disk contract.

use std::path::{Path, PathBuf};

use ed25519_dalek::SigningKey;
use hmac::{Hmac, Mac as _};
use sha2::{Digest as _, Sha256};
use tollgate_audit::{
    AuditConfig, AuditKey, AuditLog, Decision, EntryDraft, EntryKind, Problem, VerifyError,
    VerifyOptions, VerifyReport,
};

pub(crate) const KEY: [u8; 32] = [0x42; 32];
pub(crate) const KEY_ID: &str = "cp-test";

pub(crate) fn signing_key() -> SigningKey {
    SigningKey::from_bytes(&[7u8; 32])
}

pub(crate) fn audit_key() -> AuditKey {
    AuditKey::from_bytes(KEY.to_vec()).unwrap()
}

pub(crate) fn config(dir: &Path, keyed: bool) -> AuditConfig {
    let mut config = AuditConfig::new(dir, "authority", signing_key(), KEY_ID);
    if keyed {
        config.key = Some(audit_key());
    }
    config
}

pub(crate) fn options(keyed: bool) -> VerifyOptions {
    VerifyOptions {
        key: keyed.then(audit_key),
        trusted_checkpoint_key: None,
    }
}

pub(crate) fn draft(i: u64) -> EntryDraft {
    EntryDraft::new("authority", EntryKind::ToolCall)
        .receipt(format!("receipt-{}", i % 2))
        .run(format!("run-{}", i % 3))
        .call(format!("call-{i}"))
        .decision(if i.is_multiple_of(2) {
            Decision::Allow
        } else {
            Decision::Deny
        })
        .reason(format!("reason {i}"))
        .meta("n", i64::try_from(i).unwrap())
        .meta("tags", vec!["a", "b"])
}

/// Writes `count` entries with the given checkpoint interval and file size, then closes.
pub(crate) fn write_log(
    dir: &Path,
    keyed: bool,
    count: u64,
    checkpoint_every: u64,
    max_file_bytes: u64,
) {
    let mut config = config(dir, keyed);
    config.checkpoint_every = checkpoint_every;
    config.max_file_bytes = max_file_bytes;
    let log = AuditLog::open(config).unwrap();
    for i in 1..=count {
        assert_eq!(log.append(draft(i)).unwrap().seq, i);
    }
    log.close().unwrap();
}

pub(crate) fn log_path(dir: &Path, index: u64) -> PathBuf {
    dir.join(format!("log-{index:06}.jsonl"))
}

pub(crate) fn read_lines(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines().map(str::to_owned).collect()
}

pub(crate) fn write_lines(path: &Path, lines: &[String]) {
    let mut text = lines.join("\n");
    if !lines.is_empty() {
        text.push('\n');
    }
    std::fs::write(path, text).unwrap();
}

fn split_hash(line: &str) -> (&str, &str) {
    let at = line.rfind(",\"hash\":\"").unwrap();
    (&line[..at], &line[at..])
}

/// The hash of a line's body by the documented rule: SHA-256 or HMAC-SHA-256 over
/// `"tollgate-audit-entry-v1\n" || body`, where body is the line without its hash field.
pub(crate) fn hash_line(line: &str, key: Option<&[u8]>) -> String {
    let (before, _) = split_hash(line);
    let body = format!("{before}}}");
    match key {
        Some(key) => {
            let mut mac = Hmac::<Sha256>::new_from_slice(key).unwrap();
            mac.update(b"tollgate-audit-entry-v1\n");
            mac.update(body.as_bytes());
            hex::encode(mac.finalize().into_bytes())
        }
        None => {
            let mut digest = Sha256::new();
            digest.update(b"tollgate-audit-entry-v1\n");
            digest.update(body.as_bytes());
            hex::encode(digest.finalize())
        }
    }
}

pub(crate) fn hash_of(line: &str) -> String {
    let (_, tail) = split_hash(line);
    tail[",\"hash\":\"".len()..tail.len() - 2].to_owned()
}

/// `line` with its hash recomputed under `key`.
pub(crate) fn rehash(line: &str, key: Option<&[u8]>) -> String {
    let (before, _) = split_hash(line);
    format!("{before},\"hash\":\"{}\"}}", hash_line(line, key))
}

/// `line` with its prev_hash replaced.
pub(crate) fn with_prev(line: &str, prev: &str) -> String {
    let at = line.find(",\"prev_hash\":\"").unwrap() + ",\"prev_hash\":\"".len();
    format!("{}{prev}{}", &line[..at], &line[at + 64..])
}

/// Re-links and re-hashes `lines[from..]` under `key`, as a forger would.
pub(crate) fn rechain(lines: &mut [String], from: usize, key: Option<&[u8]>) {
    for i in from..lines.len() {
        if i > 0 {
            let prev = hash_of(&lines[i - 1]);
            lines[i] = with_prev(&lines[i], &prev);
        }
        lines[i] = rehash(&lines[i], key);
    }
}

/// Asserts verification fails at `file` (name) / `line` / `seq` with a problem matching `check`.
#[track_caller]
pub(crate) fn assert_broken(
    result: Result<VerifyReport, VerifyError>,
    file: &str,
    line: usize,
    seq: Option<u64>,
    check: impl FnOnce(&Problem) -> bool,
) -> Problem {
    match result {
        Err(VerifyError::Broken {
            file: got_file,
            line: got_line,
            seq: got_seq,
            problem,
        }) => {
            assert_eq!(
                got_file.file_name().unwrap().to_str().unwrap(),
                file,
                "{problem}"
            );
            assert_eq!(got_line, line, "{problem}");
            assert_eq!(got_seq, seq, "{problem}");
            assert!(check(&problem), "unexpected problem: {problem:?}");
            problem
        }
        other => panic!("expected a broken log at {file}:{line}, got {other:?}"),
    }
}
