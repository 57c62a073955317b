//! What breaks a log ([`Problem`]) and why verification failed ([`VerifyError`]): a leaf, so
//! the writer's errors can carry a verifier's finding without depending on the verifier.

use std::path::{Path, PathBuf};

use crate::files::CHECKPOINT_PUB_FILE;

/// Why a line or file breaks the log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    /// The line is not an entry (bad JSON, missing or unknown field, float, unknown kind...).
    #[error("not an audit entry: {detail}")]
    Unparseable {
        /// What the parser said.
        detail: String,
    },
    /// The line parses, but its bytes are not the canonical serialization: it was edited.
    #[error("not canonical ({detail}): the line was edited")]
    NotCanonical {
        /// What differs.
        detail: String,
    },
    /// An incomplete or non-JSON line before the end of the log: only the very last line of the
    /// newest file may be torn by a crash.
    #[error("incomplete line before the end of the log: only the last line of the newest file may be torn")]
    TornLine,
    /// The seq jumps ahead: entries are missing (deleted or moved).
    #[error("seq gap: expected {expected}, found {found} (entries deleted or reordered)")]
    SeqGap {
        /// The seq that should be here.
        expected: u64,
        /// The seq found.
        found: u64,
    },
    /// The seq repeats or goes back: an entry was duplicated or moved.
    #[error("seq repeated or out of order: expected {expected}, found {found} (entries duplicated or reordered)")]
    SeqRepeated {
        /// The seq that should be here.
        expected: u64,
        /// The seq found.
        found: u64,
    },
    /// `prev_hash` is not the previous entry's hash: an entry before it was changed or replaced.
    #[error("prev_hash {found} is not the previous entry's hash {expected} (an earlier entry was changed or replaced)")]
    PrevHashMismatch {
        /// The previous entry's hash.
        expected: String,
        /// The `prev_hash` found.
        found: String,
    },
    /// `hash` does not match the entry's contents under the verifier's key (or lack of one).
    #[error("{}", hash_mismatch_message(*.keyed, *.plain_sha256))]
    HashMismatch {
        /// Whether the verifier used an audit key.
        keyed: bool,
        /// With a key: whether the hash is instead a plain SHA-256 of the entry, i.e. it was
        /// written or re-hashed without the key.
        plain_sha256: bool,
    },
    /// A log file in the numbered sequence is missing.
    #[error("log file {expected} is missing (files must be numbered from 1 without gaps)")]
    FileMissing {
        /// The missing file's name.
        expected: String,
    },
    /// A file does not continue where the previous one ended: files were renamed or replaced.
    #[error("file starts at seq {found_seq} but the previous file ended at {} (files renamed, reordered or replaced)", .expected_seq - 1)]
    FileOutOfOrder {
        /// The seq the file should start with.
        expected_seq: u64,
        /// The seq it starts with.
        found_seq: u64,
    },
    /// A checkpoint line cannot be parsed or is not canonical.
    #[error("bad checkpoint line: {detail}")]
    CheckpointUnparseable {
        /// What is wrong.
        detail: String,
    },
    /// A checkpoint's signature does not verify (or its key is unknown).
    #[error("checkpoint signature is bad: {detail}")]
    CheckpointSignature {
        /// What is wrong.
        detail: String,
    },
    /// A checkpoint covers more entries than the log has: the log was truncated.
    #[error(
        "checkpoint covers {count} entries but the log has only {entries}: the log was truncated"
    )]
    CheckpointBeyondEnd {
        /// The checkpoint's count.
        count: u64,
        /// Entries in the log.
        entries: u64,
    },
    /// The entry at a checkpoint's count is not the one that was signed: the log was truncated
    /// and appended to, or rewritten.
    #[error("checkpoint (checkpoints.jsonl line {checkpoint_line}) signed head {signed_head} at entry {count}, but the log has {log_head} there: the log was truncated and appended to, or rewritten")]
    CheckpointHeadMismatch {
        /// The checkpoint's count (= the entry's seq).
        count: u64,
        /// The checkpoint's line in `checkpoints.jsonl`.
        checkpoint_line: usize,
        /// The hash the checkpoint signed.
        signed_head: String,
        /// The hash of the entry now at that seq.
        log_head: String,
    },
    /// Checkpoint counts must strictly increase.
    #[error("checkpoint count {found} does not increase on the previous checkpoint's {previous}")]
    CheckpointsNotIncreasing {
        /// The previous checkpoint's count.
        previous: u64,
        /// This checkpoint's count.
        found: u64,
    },
}

fn hash_mismatch_message(keyed: bool, plain_sha256: bool) -> &'static str {
    match (keyed, plain_sha256) {
        (false, _) => "hash mismatch (if this log is keyed, pass the audit key)",
        (true, true) => "hash is a plain SHA-256, not an HMAC under the given audit key: the entry was written or re-hashed without the key",
        (true, false) => "hash mismatch: the entry was changed, or the given audit key is not the one the log was written with",
    }
}

/// Why verification failed.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// The directory holds no log files.
    #[error("no audit log in {dir}: no log-NNNNNN.jsonl files")]
    NoLog {
        /// The directory.
        dir: PathBuf,
    },
    /// A file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// The I/O failure.
        source: std::io::Error,
    },
    /// There are checkpoints but no key to check them with.
    #[error("{dir} has checkpoints but no {CHECKPOINT_PUB_FILE}; pass the checkpoint public key")]
    NoCheckpointKey {
        /// The directory.
        dir: PathBuf,
    },
    /// `checkpoint.pub` cannot be parsed.
    #[error("{path}: {detail}; pass the checkpoint public key instead")]
    CheckpointPub {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The first bad line or file, and why.
    #[error("{}{}: {problem}", location(file, *line), seq.map(|s| format!(" (entry {s})")).unwrap_or_default())]
    Broken {
        /// The file the problem is in.
        file: PathBuf,
        /// 1-based line number; 0 when the problem is the file as a whole.
        line: usize,
        /// The seq of the entry concerned, when known.
        seq: Option<u64>,
        /// What is wrong.
        problem: Problem,
    },
}

fn location(file: &Path, line: usize) -> String {
    if line == 0 {
        file.display().to_string()
    } else {
        format!("{}:{line}", file.display())
    }
}
