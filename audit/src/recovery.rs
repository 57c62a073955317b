//! Opening an existing log: checking the newest file and the last checkpoint, moving torn
//! tails aside, and keeping `checkpoint.pub` in step with the configured key.

use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};

use crate::checkpoint::{parse_pub_file, pub_line, Checkpoint};
use crate::config::AuditConfig;
use crate::entry::{Entry, GENESIS_HASH};
use crate::error::AuditError;
use crate::files::{
    list_log_files, log_file_name, open_append, split_lines, sync_dir, unix_seconds, write_atomic,
    write_new_private, CHECKPOINTS_FILE, CHECKPOINT_PUB_FILE,
};
use crate::key::AuditKey;
use crate::problem::{Problem, VerifyError};
use crate::verify::{parse_entry, read_checkpoints, ChainChecker, TornTail};

// Suffix of a torn-bytes file whose `log_recovered` entry may not be written yet.
pub(crate) const PENDING_SUFFIX: &str = ".pending";
/// What opening found and repaired.
pub(crate) struct Scan {
    pub(crate) file_index: u64,
    pub(crate) file_size: u64,
    pub(crate) head_seq: u64,
    pub(crate) head_hash: String,
    pub(crate) head_entry: Option<Entry>,
    pub(crate) last_checkpoint: u64,
    pub(crate) pending: Vec<PathBuf>,
}

fn broken(
    dir: &Path,
    file: PathBuf,
    line: usize,
    seq: Option<u64>,
    problem: Problem,
) -> AuditError {
    AuditError::Broken {
        dir: dir.to_owned(),
        source: Box::new(VerifyError::Broken {
            file,
            line,
            seq,
            problem,
        }),
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>, AuditError> {
    fs::read(path).map_err(|source| AuditError::Read {
        path: path.to_owned(),
        source,
    })
}

/// A name `<base>.torn-<unix-seconds>[-n]` free both as-is and with the pending suffix.
fn free_torn_name(dir: &Path, base: &str) -> String {
    let seconds = unix_seconds();
    let mut attempt = 0u32;
    loop {
        let name = if attempt == 0 {
            format!("{base}.torn-{seconds}")
        } else {
            format!("{base}.torn-{seconds}-{attempt}")
        };
        let taken =
            dir.join(&name).exists() || dir.join(format!("{name}{PENDING_SUFFIX}")).exists();
        if !taken {
            return name;
        }
        attempt += 1;
    }
}

/// Saves `bytes` (the torn tail of `path`, starting at `offset`) to `saved`, then truncates
/// `path` to `offset`, fsyncing both and the directory in between so no byte is ever lost.
fn move_tail_aside(
    dir: &Path,
    path: &Path,
    offset: u64,
    bytes: &[u8],
    saved: &Path,
) -> Result<(), AuditError> {
    write_new_private(saved, bytes)
        .and_then(|()| sync_dir(dir))
        .map_err(|source| AuditError::Write {
            path: saved.to_owned(),
            source,
        })?;
    OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|file| {
            file.set_len(offset)?;
            file.sync_all()
        })
        .map_err(|source| AuditError::Write {
            path: path.to_owned(),
            source,
        })
}

/// Checks the newest log file (and its link to the file before) and the last checkpoint,
/// then repairs torn tails; a log that does not verify is left as it was found.
pub(crate) fn scan_and_recover(config: &AuditConfig) -> Result<Scan, AuditError> {
    let dir = config.dir.as_path();
    let key = config.key.as_ref();
    let files = list_log_files(dir).map_err(|source| AuditError::Dir {
        path: dir.to_owned(),
        source,
    })?;
    check_numbering(dir, &files)?;
    let mut pending = pending_torn_files(dir)?;

    // Checkpoints first: the newest file is compared with the last one as it is scanned.
    let checkpoints_path = dir.join(CHECKPOINTS_FILE);
    let checkpoints = read_checkpoints(dir).map_err(|source| AuditError::Broken {
        dir: dir.to_owned(),
        source: Box::new(source),
    })?;
    let last_checkpoint = checkpoints.list.last().cloned();

    let Some((last_index, last_path)) = files.last().cloned() else {
        return start_empty_log(dir, last_checkpoint, checkpoints.torn.as_ref(), pending);
    };

    let mut head_entry = head_before(dir, key, last_index, last_checkpoint.as_ref())?;
    let (start_seq, start_hash) = match &head_entry {
        Some(entry) => (entry.seq, entry.hash.clone()),
        None => (0, GENESIS_HASH.to_owned()),
    };
    let mut chain = ChainChecker::new(key, start_seq, start_hash);
    let newest = scan_newest(
        dir,
        &mut chain,
        last_index,
        &last_path,
        last_checkpoint.as_ref(),
    )?;
    if newest.head_entry.is_some() {
        head_entry = newest.head_entry;
    }

    if let Some((line, checkpoint)) = &last_checkpoint {
        if checkpoint.count > chain.head_seq {
            return Err(broken(
                dir,
                checkpoints_path,
                *line,
                Some(checkpoint.count),
                Problem::CheckpointBeyondEnd {
                    count: checkpoint.count,
                    entries: chain.head_seq,
                },
            ));
        }
    }

    // Everything checked: only now touch the files, so a refused log is left as it was found.
    repair_checkpoints(dir, checkpoints.torn.as_ref())?;
    let data = newest.data;
    let mut file_size = data.len() as u64;
    if let Some(offset) = newest.torn_at {
        let name = free_torn_name(dir, &log_file_name(last_index));
        let saved = dir.join(format!("{name}{PENDING_SUFFIX}"));
        let start = usize::try_from(offset)
            .unwrap_or(data.len())
            .min(data.len());
        move_tail_aside(dir, &last_path, offset, &data[start..], &saved)?;
        file_size = offset;
        pending.push(saved);
    }

    Ok(Scan {
        file_index: last_index,
        file_size,
        head_seq: chain.head_seq,
        head_hash: chain.head_hash,
        head_entry,
        last_checkpoint: last_checkpoint.map_or(0, |(_, c)| c.count),
        pending,
    })
}

/// Log files must be numbered from 1 without gaps.
fn check_numbering(dir: &Path, files: &[(u64, PathBuf)]) -> Result<(), AuditError> {
    for (position, (index, _)) in files.iter().enumerate() {
        let expected = position as u64 + 1;
        if *index != expected {
            return Err(broken(
                dir,
                dir.join(log_file_name(expected)),
                0,
                None,
                Problem::FileMissing {
                    expected: log_file_name(expected),
                },
            ));
        }
    }
    Ok(())
}

/// A directory without log files: its first file, unless a checkpoint says entries existed.
fn start_empty_log(
    dir: &Path,
    last_checkpoint: Option<(usize, Checkpoint)>,
    torn_checkpoint: Option<&TornTail>,
    pending: Vec<PathBuf>,
) -> Result<Scan, AuditError> {
    if let Some((line, checkpoint)) = last_checkpoint {
        return Err(broken(
            dir,
            dir.join(CHECKPOINTS_FILE),
            line,
            Some(checkpoint.count),
            Problem::CheckpointBeyondEnd {
                count: checkpoint.count,
                entries: 0,
            },
        ));
    }
    let path = dir.join(log_file_name(1));
    open_append(&path)
        .and_then(|_| sync_dir(dir))
        .map_err(|source| AuditError::Write { path, source })?;
    repair_checkpoints(dir, torn_checkpoint)?;
    Ok(Scan {
        file_index: 1,
        file_size: 0,
        head_seq: 0,
        head_hash: GENESIS_HASH.to_owned(),
        head_entry: None,
        last_checkpoint: 0,
        pending,
    })
}

/// The chain before the newest file: the last entry of the nearest non-empty earlier file,
/// checked on its own and against the last checkpoint.
fn head_before(
    dir: &Path,
    key: Option<&AuditKey>,
    last_index: u64,
    last_checkpoint: Option<&(usize, Checkpoint)>,
) -> Result<Option<Entry>, AuditError> {
    for index in (1..last_index).rev() {
        let path = dir.join(log_file_name(index));
        let data = read_file(&path)?;
        let lines = split_lines(&data);
        let Some(line) = lines.last() else { continue };
        let number = lines.len();
        if line.is_torn() {
            return Err(broken(dir, path, number, None, Problem::TornLine));
        }
        let entry = parse_entry(line.bytes)
            .map_err(|problem| broken(dir, path.clone(), number, None, problem))?;
        let mut own = ChainChecker::new(key, entry.seq.saturating_sub(1), entry.prev_hash.clone());
        own.check(line.bytes, false)
            .map_err(|problem| broken(dir, path.clone(), number, Some(entry.seq), problem))?;
        check_checkpoint(dir, last_checkpoint, &entry, &path, number)?;
        return Ok(Some(entry));
    }
    Ok(None)
}

/// An entry at the last checkpoint's count must be the one it signed.
fn check_checkpoint(
    dir: &Path,
    last_checkpoint: Option<&(usize, Checkpoint)>,
    entry: &Entry,
    path: &Path,
    number: usize,
) -> Result<(), AuditError> {
    match last_checkpoint {
        Some((checkpoint_line, checkpoint))
            if checkpoint.count == entry.seq && checkpoint.head_hash != entry.hash =>
        {
            Err(broken(
                dir,
                path.to_owned(),
                number,
                Some(entry.seq),
                Problem::CheckpointHeadMismatch {
                    count: checkpoint.count,
                    checkpoint_line: *checkpoint_line,
                    signed_head: checkpoint.head_hash.clone(),
                    log_head: entry.hash.clone(),
                },
            ))
        }
        _ => Ok(()),
    }
}

/// What the newest file holds.
struct Newest {
    /// Its bytes as read.
    data: Vec<u8>,
    /// Where a torn final line starts, if there is one.
    torn_at: Option<u64>,
    /// Its last complete entry, if any.
    head_entry: Option<Entry>,
}

/// Checks the newest file line by line onto `chain`; only its very last line may be torn.
fn scan_newest(
    dir: &Path,
    chain: &mut ChainChecker<'_>,
    last_index: u64,
    last_path: &Path,
    last_checkpoint: Option<&(usize, Checkpoint)>,
) -> Result<Newest, AuditError> {
    let data = read_file(last_path)?;
    let lines = split_lines(&data);
    let mut torn_at = None;
    let mut head_entry = None;
    for (line_index, line) in lines.iter().enumerate() {
        let number = line_index + 1;
        if line.is_torn() {
            if number != lines.len() {
                return Err(broken(
                    dir,
                    last_path.to_owned(),
                    number,
                    None,
                    Problem::TornLine,
                ));
            }
            torn_at = Some(line.offset);
            break;
        }
        let entry = chain
            .check(line.bytes, last_index > 1 && line_index == 0)
            .map_err(|problem| {
                let seq = parse_entry(line.bytes).ok().map(|e| e.seq);
                broken(dir, last_path.to_owned(), number, seq, problem)
            })?;
        check_checkpoint(dir, last_checkpoint, &entry, last_path, number)?;
        head_entry = Some(entry);
    }
    Ok(Newest {
        data,
        torn_at,
        head_entry,
    })
}

/// Moves a torn final checkpoint line aside. No entry records it: checkpoints are derived data,
/// and the bytes are kept beside the file.
fn repair_checkpoints(dir: &Path, torn: Option<&TornTail>) -> Result<(), AuditError> {
    let Some(torn) = torn else { return Ok(()) };
    let path = dir.join(CHECKPOINTS_FILE);
    let data = read_file(&path)?;
    let name = free_torn_name(dir, CHECKPOINTS_FILE);
    let start = usize::try_from(torn.offset)
        .unwrap_or(data.len())
        .min(data.len());
    move_tail_aside(dir, &path, torn.offset, &data[start..], &dir.join(&name))?;
    tracing::warn!(file = %path.display(), saved = %name, bytes = torn.bytes, "torn final checkpoint line moved aside");
    Ok(())
}

/// Torn-bytes files whose recovery a crash interrupted, oldest name first.
fn pending_torn_files(dir: &Path) -> Result<Vec<PathBuf>, AuditError> {
    let entries = fs::read_dir(dir).map_err(|source| AuditError::Dir {
        path: dir.to_owned(),
        source,
    })?;
    let mut pending = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| AuditError::Dir {
            path: dir.to_owned(),
            source,
        })?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("log-") && name.contains(".torn-") && name.ends_with(PENDING_SUFFIX) {
            pending.push(entry.path());
        }
    }
    pending.sort();
    Ok(pending)
}

/// Writes `checkpoint.pub` if absent, or adds the configured key to it.
pub(crate) fn ensure_checkpoint_pub(config: &AuditConfig) -> Result<(), AuditError> {
    let path = config.dir.join(CHECKPOINT_PUB_FILE);
    let public = config.checkpoint_key.verifying_key();
    let line = pub_line(&public, &config.checkpoint_key_id);
    let mut text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(source) => return Err(AuditError::Read { path, source }),
    };
    let keys = parse_pub_file(&text).map_err(|detail| AuditError::CheckpointPub {
        path: path.clone(),
        detail,
    })?;
    match keys.iter().find(|(id, _)| *id == config.checkpoint_key_id) {
        Some((_, key)) if *key == public => return Ok(()),
        Some(_) => {
            return Err(AuditError::CheckpointKeyConflict {
                path,
                key_id: config.checkpoint_key_id.clone(),
            })
        }
        None => {}
    }
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&line);
    write_atomic(&path, text.as_bytes()).map_err(|source| AuditError::Write { path, source })
}
