//! Verification of a whole log directory: every line, the chain across files, and every
//! checkpoint against the entry at its count.

use std::iter::Peekable;
use std::path::{Path, PathBuf};

use ed25519_dalek::VerifyingKey;

use crate::checkpoint::{parse_pub_file, Checkpoint};
use crate::entry::{Entry, GENESIS_HASH};
use crate::files::{
    list_log_files, log_file_name, split_lines, Line, CHECKPOINTS_FILE, CHECKPOINT_PUB_FILE,
};
use crate::key::AuditKey;
use crate::kind::EntryKind;
use crate::meta::MetaValue;
use crate::problem::{Problem, VerifyError};
use crate::time::is_canonical_time;

/// How to verify a log.
#[derive(Debug, Clone, Default)]
pub struct VerifyOptions {
    /// The audit key the log was written with; `None` checks plain SHA-256 hashes.
    pub key: Option<AuditKey>,
    /// The checkpoint public key, from a trusted place. `None` trusts `checkpoint.pub` beside the
    /// log, which proves the checkpoints consistent but not who wrote them.
    pub trusted_checkpoint_key: Option<VerifyingKey>,
}

/// Which key the checkpoints were checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointTrust {
    /// [`VerifyOptions::trusted_checkpoint_key`].
    TrustedKey,
    /// The keys in `checkpoint.pub` beside the log: anyone able to rewrite the log could have
    /// rewritten this file too.
    BesideLog(PathBuf),
    /// There were no checkpoints to check.
    NoCheckpoints,
}

/// An incomplete final line (a crash in mid-write), not counted as an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTail {
    /// The file it is in.
    pub file: PathBuf,
    /// Byte offset where it starts.
    pub offset: u64,
    /// Its length in bytes.
    pub bytes: u64,
}

/// A `log_recovered` entry: a torn tail that an earlier writer moved aside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveredTail {
    /// The entry's seq.
    pub seq: u64,
    /// The log file the entry is in.
    pub file: PathBuf,
    /// The `torn_file` the bytes were moved to, as recorded.
    pub torn_file: Option<String>,
    /// The `torn_bytes` recorded.
    pub torn_bytes: Option<i64>,
    /// The `torn_sha256` recorded.
    pub torn_sha256: Option<String>,
}

/// What a successful verification found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    /// Number of log files.
    pub files: usize,
    /// Number of entries.
    pub entries: u64,
    /// Seq of the last entry (0 for an empty log).
    pub head_seq: u64,
    /// Hash of the last entry ([`GENESIS_HASH`](crate::GENESIS_HASH) for an empty log).
    pub head_hash: String,
    /// Number of checkpoints checked.
    pub checkpoints_checked: usize,
    /// Count of the last checkpoint. Entries after it are not protected against truncation.
    pub last_checkpoint_count: Option<u64>,
    /// Which key the checkpoints were checked against.
    pub checkpoint_trust: CheckpointTrust,
    /// Whether hashes were checked as HMACs under an audit key.
    pub keyed: bool,
    /// An incomplete last line of the newest file, if any.
    pub torn_tail: Option<TornTail>,
    /// An incomplete last line of `checkpoints.jsonl`, if any (ignored).
    pub torn_checkpoint: Option<TornTail>,
    /// Torn tails earlier writers recovered, as recorded in `log_recovered` entries.
    pub recovered_tails: Vec<RecoveredTail>,
}

/// Checks entries one after another against the chain so far.
pub(crate) struct ChainChecker<'k> {
    key: Option<&'k AuditKey>,
    /// Seq of the last accepted entry (0 before any).
    pub head_seq: u64,
    /// Hash of the last accepted entry.
    pub head_hash: String,
}

impl<'k> ChainChecker<'k> {
    /// A checker expecting `head_seq + 1` next, chained to `head_hash`.
    pub(crate) fn new(key: Option<&'k AuditKey>, head_seq: u64, head_hash: String) -> Self {
        Self {
            key,
            head_seq,
            head_hash,
        }
    }

    /// Checks one complete line; `file_start` is true for the first line of a file after the
    /// first. On success the line becomes the head.
    pub(crate) fn check(&mut self, bytes: &[u8], file_start: bool) -> Result<Entry, Problem> {
        let entry = parse_entry(bytes)?;
        let expected = self.head_seq + 1;
        if entry.seq != expected {
            return Err(if file_start {
                Problem::FileOutOfOrder {
                    expected_seq: expected,
                    found_seq: entry.seq,
                }
            } else if entry.seq > expected {
                Problem::SeqGap {
                    expected,
                    found: entry.seq,
                }
            } else {
                Problem::SeqRepeated {
                    expected,
                    found: entry.seq,
                }
            });
        }
        if entry.prev_hash != self.head_hash {
            return Err(Problem::PrevHashMismatch {
                expected: self.head_hash.clone(),
                found: entry.prev_hash,
            });
        }
        if entry.expected_hash(self.key) != entry.hash {
            let plain_sha256 = self.key.is_some() && entry.expected_hash(None) == entry.hash;
            return Err(Problem::HashMismatch {
                keyed: self.key.is_some(),
                plain_sha256,
            });
        }
        self.head_seq = entry.seq;
        self.head_hash.clone_from(&entry.hash);
        Ok(entry)
    }
}

/// Parses one line as an entry and requires its exact canonical bytes.
pub(crate) fn parse_entry(bytes: &[u8]) -> Result<Entry, Problem> {
    let entry: Entry = serde_json::from_slice(bytes).map_err(|e| Problem::Unparseable {
        detail: e.to_string(),
    })?;
    if entry.to_line().as_bytes() != bytes {
        return Err(Problem::NotCanonical {
            detail: "bytes differ from the canonical serialization".into(),
        });
    }
    if !is_canonical_time(&entry.time) {
        return Err(Problem::NotCanonical {
            detail: "time is not RFC 3339 UTC with milliseconds".into(),
        });
    }
    Ok(entry)
}

/// The checkpoints of a directory, parsed and checked among themselves.
pub(crate) struct Checkpoints {
    /// (line number, checkpoint), counts strictly increasing.
    pub list: Vec<(usize, Checkpoint)>,
    /// An incomplete final line, if any.
    pub torn: Option<TornTail>,
}

/// Reads `checkpoints.jsonl` (missing = none): every complete line must parse canonically and
/// counts must increase. Signatures are checked separately.
pub(crate) fn read_checkpoints(dir: &Path) -> Result<Checkpoints, VerifyError> {
    let path = dir.join(CHECKPOINTS_FILE);
    let data = match std::fs::read(&path) {
        Ok(data) => data,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(source) => return Err(VerifyError::Read { path, source }),
    };
    let lines = split_lines(&data);
    let mut list: Vec<(usize, Checkpoint)> = Vec::new();
    let mut torn = None;
    for (index, line) in lines.iter().enumerate() {
        let number = index + 1;
        let broken = |problem| VerifyError::Broken {
            file: path.clone(),
            line: number,
            seq: None,
            problem,
        };
        if line.is_torn() && number == lines.len() {
            torn = Some(torn_tail(&path, line));
            break;
        }
        let checkpoint = Checkpoint::parse(line.bytes)
            .map_err(|detail| broken(Problem::CheckpointUnparseable { detail }))?;
        if let Some((_, previous)) = list.last() {
            if checkpoint.count <= previous.count {
                return Err(broken(Problem::CheckpointsNotIncreasing {
                    previous: previous.count,
                    found: checkpoint.count,
                }));
            }
        }
        list.push((number, checkpoint));
    }
    Ok(Checkpoints { list, torn })
}

fn torn_tail(file: &Path, line: &Line<'_>) -> TornTail {
    TornTail {
        file: file.to_owned(),
        offset: line.offset,
        bytes: line.len_on_disk(),
    }
}

/// Verifies the log in `dir`: every line of every file in order, then every checkpoint against
/// the entry at its count. Returns the first problem found; the checkpoint file's own lines
/// (format, order, signatures) are checked before the log.
pub fn verify_dir(dir: &Path, options: &VerifyOptions) -> Result<VerifyReport, VerifyError> {
    // Checkpoints before the files: with a writer still running, the log only grows after its
    // checkpoints, so reading in this order never sees a checkpoint ahead of the log.
    let checkpoints = read_checkpoints(dir)?;
    let files = list_log_files(dir).map_err(|source| VerifyError::Read {
        path: dir.to_owned(),
        source,
    })?;
    let Some(&(last_index, _)) = files.last() else {
        return Err(VerifyError::NoLog {
            dir: dir.to_owned(),
        });
    };
    let checkpoint_path = dir.join(CHECKPOINTS_FILE);
    let checkpoint_trust = check_signatures(dir, &checkpoints, options)?;

    let key = options.key.as_ref();
    let mut chain = ChainChecker::new(key, 0, GENESIS_HASH.to_owned());
    let mut torn_tail_found = None;
    let mut recovered_tails = Vec::new();
    let mut next_checkpoint = checkpoints.list.iter().peekable();
    let mut present = files.iter().peekable();

    for index in 1..=last_index {
        let path = dir.join(log_file_name(index));
        if present.next_if(|(i, _)| *i == index).is_none() {
            return Err(VerifyError::Broken {
                file: path,
                line: 0,
                seq: None,
                problem: Problem::FileMissing {
                    expected: log_file_name(index),
                },
            });
        }
        let torn = verify_file(
            &path,
            index > 1,
            index == last_index,
            &mut chain,
            &mut next_checkpoint,
            &mut recovered_tails,
        )?;
        if torn.is_some() {
            torn_tail_found = torn;
        }
    }

    if let Some((checkpoint_line, checkpoint)) = next_checkpoint.next() {
        return Err(VerifyError::Broken {
            file: checkpoint_path,
            line: *checkpoint_line,
            seq: Some(checkpoint.count),
            problem: Problem::CheckpointBeyondEnd {
                count: checkpoint.count,
                entries: chain.head_seq,
            },
        });
    }

    let report = VerifyReport {
        files: files.len(),
        entries: chain.head_seq,
        head_seq: chain.head_seq,
        head_hash: chain.head_hash,
        checkpoints_checked: checkpoints.list.len(),
        last_checkpoint_count: checkpoints.list.last().map(|(_, c)| c.count),
        checkpoint_trust,
        keyed: key.is_some(),
        torn_tail: torn_tail_found,
        torn_checkpoint: checkpoints.torn,
        recovered_tails,
    };
    tracing::debug!(dir = %dir.display(), entries = report.entries, checkpoints = report.checkpoints_checked, "audit log verified");
    Ok(report)
}

/// Checks one log file line by line onto `chain`, and each checkpoint whose count it reaches;
/// only the last line of the newest file may be torn (returned, not counted).
fn verify_file(
    path: &Path,
    continues_chain: bool,
    newest: bool,
    chain: &mut ChainChecker<'_>,
    next_checkpoint: &mut Peekable<std::slice::Iter<'_, (usize, Checkpoint)>>,
    recovered_tails: &mut Vec<RecoveredTail>,
) -> Result<Option<TornTail>, VerifyError> {
    let data = std::fs::read(path).map_err(|source| VerifyError::Read {
        path: path.to_owned(),
        source,
    })?;
    let lines = split_lines(&data);
    for (line_index, line) in lines.iter().enumerate() {
        let number = line_index + 1;
        let broken = |seq, problem| VerifyError::Broken {
            file: path.to_owned(),
            line: number,
            seq,
            problem,
        };
        if line.is_torn() {
            if newest && number == lines.len() {
                return Ok(Some(torn_tail(path, line)));
            }
            return Err(broken(None, Problem::TornLine));
        }
        let entry = chain
            .check(line.bytes, continues_chain && line_index == 0)
            .map_err(|problem| {
                let seq = parse_entry(line.bytes).ok().map(|e| e.seq);
                broken(seq, problem)
            })?;
        if let Some((checkpoint_line, checkpoint)) =
            next_checkpoint.next_if(|(_, c)| c.count == entry.seq)
        {
            if checkpoint.head_hash != entry.hash {
                return Err(broken(
                    Some(entry.seq),
                    Problem::CheckpointHeadMismatch {
                        count: checkpoint.count,
                        checkpoint_line: *checkpoint_line,
                        signed_head: checkpoint.head_hash.clone(),
                        log_head: entry.hash.clone(),
                    },
                ));
            }
        }
        if entry.kind == EntryKind::LogRecovered {
            recovered_tails.push(recovered_tail(path, &entry));
        }
    }
    Ok(None)
}

fn recovered_tail(file: &Path, entry: &Entry) -> RecoveredTail {
    let text = |key: &str| match entry.metadata.get(key) {
        Some(MetaValue::Str(s)) => Some(s.clone()),
        _ => None,
    };
    RecoveredTail {
        seq: entry.seq,
        file: file.to_owned(),
        torn_file: text("torn_file"),
        torn_bytes: match entry.metadata.get("torn_bytes") {
            Some(MetaValue::Int(n)) => Some(*n),
            _ => None,
        },
        torn_sha256: text("torn_sha256"),
    }
}

/// Checks every checkpoint's signature with the trusted key or `checkpoint.pub`.
fn check_signatures(
    dir: &Path,
    checkpoints: &Checkpoints,
    options: &VerifyOptions,
) -> Result<CheckpointTrust, VerifyError> {
    if checkpoints.list.is_empty() {
        return Ok(match options.trusted_checkpoint_key {
            Some(_) => CheckpointTrust::TrustedKey,
            None => CheckpointTrust::NoCheckpoints,
        });
    }
    let path = dir.join(CHECKPOINTS_FILE);
    let bad = |line: usize, checkpoint: &Checkpoint, detail: String| VerifyError::Broken {
        file: path.clone(),
        line,
        seq: Some(checkpoint.count),
        problem: Problem::CheckpointSignature { detail },
    };
    if let Some(key) = &options.trusted_checkpoint_key {
        for (line, checkpoint) in &checkpoints.list {
            checkpoint
                .verify(key)
                .map_err(|detail| bad(*line, checkpoint, detail))?;
        }
        return Ok(CheckpointTrust::TrustedKey);
    }
    let pub_path = dir.join(CHECKPOINT_PUB_FILE);
    let text = match std::fs::read_to_string(&pub_path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(VerifyError::NoCheckpointKey {
                dir: dir.to_owned(),
            })
        }
        Err(source) => {
            return Err(VerifyError::Read {
                path: pub_path,
                source,
            })
        }
    };
    let keys = parse_pub_file(&text).map_err(|detail| VerifyError::CheckpointPub {
        path: pub_path.clone(),
        detail,
    })?;
    for (line, checkpoint) in &checkpoints.list {
        let key = keys
            .iter()
            .find(|(id, _)| *id == checkpoint.key_id)
            .map(|(_, key)| key)
            .ok_or_else(|| {
                bad(
                    *line,
                    checkpoint,
                    format!(
                        "key id {} is not in {CHECKPOINT_PUB_FILE}",
                        checkpoint.key_id
                    ),
                )
            })?;
        checkpoint
            .verify(key)
            .map_err(|detail| bad(*line, checkpoint, detail))?;
    }
    Ok(CheckpointTrust::BesideLog(pub_path))
}
