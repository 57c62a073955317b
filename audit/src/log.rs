//! The writer: opening and recovering a log directory, appending, group commit, rotation and
//! checkpoints.

use std::collections::VecDeque;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::SystemTime;

use sha2::{Digest as _, Sha256};

use crate::config::{AuditConfig, Durability};
use crate::draft::{EntryDraft, Redactor};
use crate::entry::Entry;
use crate::error::AuditError;
use crate::files::{ensure_log_dir, log_file_name, open_append, sync_dir, CHECKPOINTS_FILE};
use crate::key::AuditKey;
use crate::kind::EntryKind;
use crate::meta::MetaValue;
use crate::queue::{lock, wait, ChainState, Command, Refused, Sealed, FIRST_RETRY};
use crate::recovery::{ensure_checkpoint_pub, scan_and_recover, PENDING_SUFFIX};
use crate::registration::Registration;
use crate::writer::Writer;

/// Where an appended entry landed.
///
/// For an entry handed over with [`AuditLog::record`] (or appended with
/// [`Durability::Batched`]) `seq` and `hash` are where it was queued: if the writer stalls
/// before writing it and durable entries before it are refused meanwhile, it is written
/// later under the next free `seq`. What [`AuditLog::append`] returns with
/// [`Durability::EveryEntry`] is final.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    /// Its seq.
    pub seq: u64,
    /// Its hash.
    pub hash: String,
    /// The bytes its line takes on disk (newline included).
    pub bytes: u64,
}

/// An entry handed to the writer by [`AuditLog::submit`], not yet known to be durable.
#[must_use = "wait() tells whether the entry reached the disk"]
pub struct PendingEntry {
    appended: Appended,
    ack: Option<Receiver<Result<(), Refused>>>,
    /// When it was handed over, and who is told how long it took to become durable.
    submitted: std::time::Instant,
    observer: Option<AppendObserver>,
}

/// Told how long each durable append took, from submission to the entry being on disk
/// (a daemon's audit append latency metric).
pub type AppendObserver = Arc<dyn Fn(std::time::Duration) + Send + Sync>;

impl std::fmt::Debug for PendingEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingEntry")
            .field("appended", &self.appended)
            .finish_non_exhaustive()
    }
}

impl PendingEntry {
    /// The entry's sequence number.
    pub fn seq(&self) -> u64 {
        self.appended.seq
    }

    /// Waits until the entry is durable (with [`Durability::EveryEntry`]; at once otherwise).
    pub fn wait(self) -> Result<Appended, AuditError> {
        if let Some(ack) = &self.ack {
            wait(ack)?;
            if let Some(observer) = &self.observer {
                observer(self.submitted.elapsed());
            }
        }
        Ok(self.appended)
    }
}

/// An open audit log. Cheap to clone; all clones append to the same chain.
#[derive(Clone)]
pub struct AuditLog {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog")
            .field("dir", &self.inner.dir)
            .finish_non_exhaustive()
    }
}
struct Inner {
    dir: PathBuf,
    component: String,
    key: Option<AuditKey>,
    redactor: Option<Redactor>,
    durability: Durability,
    state: Arc<Mutex<ChainState>>,
    failure: Arc<Mutex<Option<String>>>,
    // Held while closing, so a second close waits for the first.
    writer: Mutex<Option<JoinHandle<()>>>,
    // Released by close, so the directory can be opened again while clones linger.
    registration: Mutex<Option<Registration>>,
    observer: std::sync::OnceLock<AppendObserver>,
}
impl AuditLog {
    /// Opens (or creates) the log in `config.dir`, recovering a torn final line, and starts its
    /// writer thread. Refuses a log whose newest file does not verify under the configured key,
    /// or that the last checkpoint shows was truncated.
    pub fn open(config: AuditConfig) -> Result<Self, AuditError> {
        config.validate()?;
        let dir = config.dir.clone();
        ensure_log_dir(&dir)?;
        let canonical = fs::canonicalize(&dir).map_err(|source| AuditError::Dir {
            path: dir.clone(),
            source,
        })?;
        let registration = Registration::claim(canonical)?;

        let scan = scan_and_recover(&config)?;
        ensure_checkpoint_pub(&config)?;

        let log_path = dir.join(log_file_name(scan.file_index));
        let (file, _) = open_append(&log_path).map_err(|source| AuditError::Write {
            path: log_path.clone(),
            source,
        })?;
        let checkpoints_path = dir.join(CHECKPOINTS_FILE);
        let (checkpoints, created) =
            open_append(&checkpoints_path).map_err(|source| AuditError::Write {
                path: checkpoints_path.clone(),
                source,
            })?;
        if created {
            sync_dir(&dir).map_err(|source| AuditError::Dir {
                path: dir.clone(),
                source,
            })?;
        }

        let failure = Arc::new(Mutex::new(None));
        let (tx, rx) = mpsc::channel();
        let state = Arc::new(Mutex::new(ChainState {
            head_seq: scan.head_seq,
            head_hash: scan.head_hash.clone(),
            tx: Some(tx),
            stalled: None,
        }));
        let checkpoints_size = checkpoints.metadata().map_or(0, |m| m.len());
        let writer = Writer {
            dir: dir.clone(),
            file,
            file_index: scan.file_index,
            file_size: scan.file_size,
            synced_size: scan.file_size,
            synced_head: (scan.head_seq, scan.head_hash.clone()),
            unsynced: Vec::new(),
            backlog: VecDeque::new(),
            stalled: None,
            retry: FIRST_RETRY,
            state: Arc::clone(&state),
            key: config.key.clone(),
            checkpoints,
            checkpoints_size,
            max_file_bytes: config.max_file_bytes,
            checkpoint_every: config.checkpoint_every,
            checkpoint_interval: config.checkpoint_interval,
            uncovered_since: (scan.head_seq > scan.last_checkpoint).then(std::time::Instant::now),
            last_checkpoint: scan.last_checkpoint,
            head_seq: scan.head_seq,
            head_hash: scan.head_hash.clone(),
            signing_key: config.checkpoint_key,
            key_id: config.checkpoint_key_id,
            component: config.component.clone(),
            durability: config.durability,
            failure: Arc::clone(&failure),
        };
        let handle = std::thread::Builder::new()
            .name("tollgate-audit".into())
            .spawn(move || writer.run(&rx))
            .map_err(|source| AuditError::Spawn { source })?;

        let log = Self {
            inner: Arc::new(Inner {
                dir: dir.clone(),
                component: config.component,
                key: config.key,
                redactor: config.redactor,
                durability: config.durability,
                state,
                failure,
                writer: Mutex::new(Some(handle)),
                registration: Mutex::new(Some(registration)),
                observer: std::sync::OnceLock::new(),
            }),
        };
        for pending in &scan.pending {
            log.record_recovery(pending, scan.head_entry.as_ref())?;
        }
        let head = log.head_seq();
        tracing::info!(dir = %dir.display(), head_seq = head, file = scan.file_index, recovered = scan.pending.len(), "audit log open");
        Ok(log)
    }

    /// Tells `observer` how long each durable append takes from now on (once; later calls
    /// are ignored).
    pub fn observe_appends(&self, observer: AppendObserver) {
        let _ = self.inner.observer.set(observer);
    }

    /// Appends an entry (redacting its free text first). With [`Durability::EveryEntry`] this
    /// returns once the entry is on disk; with [`Durability::Batched`] once it is queued.
    pub fn append(&self, draft: EntryDraft) -> Result<Appended, AuditError> {
        self.submit(draft)?.wait()
    }

    /// Hands an entry to the writer (redacting its free text first) without waiting: its
    /// `seq` and `hash` are fixed, and [`PendingEntry::wait`] returns once it is as durable as
    /// [`AuditLog::append`] would have made it. Lets a caller overlap the fsync with other
    /// work and still not go on before the entry is on disk.
    pub fn submit(&self, mut draft: EntryDraft) -> Result<PendingEntry, AuditError> {
        draft.pre_bound();
        if let Some(redactor) = &self.inner.redactor {
            let changed = draft.redact_with(redactor.as_ref());
            if changed > 0 {
                tracing::debug!(kind = %draft.kind, fields = changed, "redacted audit entry text");
            }
        }
        self.submit_unredacted(draft)
    }

    /// Hands an entry to the writer (redacting its free text first) for records whose loss
    /// in a crash of the machine is bounded rather than excluded: it is written in order at
    /// once and fsynced with the next durable entry or within [`RECORD_MAX_DELAY`](crate::RECORD_MAX_DELAY) (with
    /// [`Durability::Batched`], within its `max_delay`), without an fsync of its own. The
    /// gateway records read-only calls this way: a fsync per read would double its cost.
    pub fn record(&self, mut draft: EntryDraft) -> Result<Appended, AuditError> {
        draft.pre_bound();
        if let Some(redactor) = &self.inner.redactor {
            draft.redact_with(redactor.as_ref());
        }
        self.send(draft, false).map(|pending| pending.appended)
    }

    fn append_unredacted(&self, draft: EntryDraft) -> Result<Appended, AuditError> {
        self.submit_unredacted(draft)?.wait()
    }

    fn submit_unredacted(&self, draft: EntryDraft) -> Result<PendingEntry, AuditError> {
        self.send(draft, true)
    }

    fn send(&self, mut draft: EntryDraft, durable: bool) -> Result<PendingEntry, AuditError> {
        self.inner.check_failure()?;
        // Redacted first (a secret is never cut in two and half kept), then bounded.
        let cuts = draft.bound();
        if cuts > 0 {
            tracing::debug!(kind = %draft.kind, fields = cuts, "cut an oversized audit entry");
        }
        let (ack, ack_rx) = match self.inner.durability {
            Durability::EveryEntry if durable => {
                let (ack, rx) = mpsc::sync_channel(1);
                (Some(ack), Some(rx))
            }
            Durability::EveryEntry | Durability::Batched { .. } => (None, None),
        };
        let appended = {
            let mut state = lock(&self.inner.state);
            let Some(tx) = &state.tx else {
                return Err(AuditError::Closed);
            };
            if let Some(detail) = &state.stalled {
                return Err(AuditError::Unavailable {
                    detail: detail.clone(),
                });
            }
            let seq = state.head_seq + 1;
            let entry = Entry::seal(
                draft,
                seq,
                SystemTime::now(),
                state.head_hash.clone(),
                self.inner.key.as_ref(),
            );
            let mut line = entry.to_line().into_bytes();
            line.push(b'\n');
            let bytes = line.len() as u64;
            tx.send(Command::Write {
                entry: Sealed {
                    line,
                    seq,
                    hash: entry.hash.clone(),
                },
                ack,
            })
            .map_err(|_| AuditError::WriterFailed {
                detail: "the writer thread ended".into(),
            })?;
            state.head_seq = seq;
            state.head_hash.clone_from(&entry.hash);
            Appended {
                seq,
                hash: entry.hash,
                bytes,
            }
        };
        Ok(PendingEntry {
            appended,
            ack: ack_rx,
            submitted: std::time::Instant::now(),
            observer: self.inner.observer.get().cloned(),
        })
    }

    /// Waits until every entry appended so far is fsynced (useful with
    /// [`Durability::Batched`]). After `close` there is nothing to flush.
    pub fn flush(&self) -> Result<(), AuditError> {
        self.inner.check_failure()?;
        let (ack, rx) = mpsc::sync_channel(1);
        {
            let state = lock(&self.inner.state);
            let Some(tx) = &state.tx else {
                return Ok(());
            };
            tx.send(Command::Flush(ack))
                .map_err(|_| AuditError::WriterFailed {
                    detail: "the writer thread ended".into(),
                })?;
        }
        wait(&rx)
    }

    /// Writes everything queued, fsyncs, writes a final checkpoint and stops the writer. Later
    /// appends on any clone fail with [`AuditError::Closed`]. Closing twice is harmless.
    pub fn close(&self) -> Result<(), AuditError> {
        self.inner.close()
    }

    /// The log directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Seq of the newest entry appended (queued or written); 0 for an empty log.
    pub fn head_seq(&self) -> u64 {
        lock(&self.inner.state).head_seq
    }

    /// Appends the `log_recovered` entry for a torn-bytes file (unless a crash after appending it
    /// last time left it as the head), then gives the file its final name.
    fn record_recovery(&self, pending: &Path, head: Option<&Entry>) -> Result<(), AuditError> {
        let bytes = fs::read(pending).map_err(|source| AuditError::Read {
            path: pending.to_owned(),
            source,
        })?;
        let pending_name = pending
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let torn_file = pending_name
            .strip_suffix(PENDING_SUFFIX)
            .unwrap_or(&pending_name)
            .to_owned();
        let log_file = torn_file
            .split(".torn-")
            .next()
            .unwrap_or_default()
            .to_owned();
        let already = head.is_some_and(|entry| {
            entry.kind == EntryKind::LogRecovered
                && entry.metadata.get("torn_file") == Some(&MetaValue::Str(torn_file.clone()))
        });
        if !already {
            let draft = EntryDraft::new(self.inner.component.clone(), EntryKind::LogRecovered)
                .reason(format!(
                    "torn final line of {log_file} moved aside to {torn_file}"
                ))
                .meta("torn_bytes", i64::try_from(bytes.len()).unwrap_or(i64::MAX))
                .meta("torn_sha256", hex::encode(Sha256::digest(&bytes)))
                .meta("torn_file", torn_file.clone())
                .meta("log_file", log_file.clone());
            // Our own facts (a file name, a digest): nothing for a redactor to hide, and a
            // redactor that took the digest for a secret would destroy the evidence.
            self.append_unredacted(draft)?;
            self.flush()?;
        }
        let final_path = pending.with_file_name(&torn_file);
        fs::rename(pending, &final_path)
            .and_then(|()| sync_dir(&self.inner.dir))
            .map_err(|source| AuditError::Write {
                path: final_path.clone(),
                source,
            })?;
        tracing::warn!(log_file = %log_file, torn_file = %torn_file, torn_bytes = bytes.len(), "audit log recovered a torn final line");
        Ok(())
    }
}

impl Inner {
    fn check_failure(&self) -> Result<(), AuditError> {
        match lock(&self.failure).as_ref() {
            Some(detail) => Err(AuditError::WriterFailed {
                detail: detail.clone(),
            }),
            None => Ok(()),
        }
    }

    fn close(&self) -> Result<(), AuditError> {
        let mut writer = lock(&self.writer);
        let Some(tx) = lock(&self.state).tx.take() else {
            return Ok(());
        };
        let (ack, rx) = mpsc::sync_channel(1);
        let result = match tx.send(Command::Close(ack)) {
            Ok(()) => wait(&rx),
            Err(_) => Err(AuditError::WriterFailed {
                detail: "the writer thread ended".into(),
            }),
        };
        drop(tx);
        if let Some(handle) = writer.take() {
            if handle.join().is_err() {
                tracing::error!(dir = %self.dir.display(), "audit writer thread panicked");
            }
        }
        lock(&self.registration).take();
        result
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Err(error) = self.close() {
            tracing::error!(dir = %self.dir.display(), %error, "closing the audit log failed");
        }
    }
}
