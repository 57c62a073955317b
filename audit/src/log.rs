//! The writer: opening and recovering a log directory, appending, group commit, rotation and
//! checkpoints.

use std::collections::{BTreeSet, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use ed25519_dalek::SigningKey;
use sha2::{Digest as _, Sha256};

use crate::checkpoint::{parse_pub_file, pub_line, Checkpoint};
use crate::entry::{Entry, EntryDraft, EntryKind, MetaValue, Redactor, GENESIS_HASH};
use crate::error::AuditError;
use crate::files::{
    ensure_log_dir, list_log_files, log_file_name, open_append, split_lines, sync_dir,
    unix_seconds, write_atomic, write_new_private, CHECKPOINTS_FILE, CHECKPOINT_PUB_FILE,
};
use crate::key::AuditKey;
use crate::verify::{parse_entry, read_checkpoints, ChainChecker, Problem, TornTail, VerifyError};

/// Default size at which a new log file is started: 10 MiB.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 10 * 1024 * 1024;

/// Default number of entries between checkpoints.
pub const DEFAULT_CHECKPOINT_EVERY: u64 = 1000;

// Most commands the writer takes in one group, so one huge burst cannot delay every ack in it
// without bound.
const MAX_GROUP: usize = 4096;
/// Longest time an entry handed over with [`AuditLog::record`] stays written but not
/// fsynced (it is fsynced sooner along with any durable entry).
pub const RECORD_MAX_DELAY: Duration = Duration::from_millis(10);
/// How long the writer lets entries gather after writing some that nobody waits for. A
/// durable append arriving meanwhile waits at most this much longer.
const LINGER: Duration = Duration::from_millis(1);

/// First wait before a stalled writer (disk full, I/O error) tries again; it doubles up to
/// [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(10);
/// Longest wait between two tries of a stalled writer.
pub const MAX_RETRY: Duration = Duration::from_secs(1);

// Suffix of a torn-bytes file whose `log_recovered` entry may not be written yet.
const PENDING_SUFFIX: &str = ".pending";

/// When [`AuditLog::append`] returns, relative to the entry reaching the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// `append` returns after the entry is written and fsynced (entries queued together share
    /// one fsync). Nothing acknowledged is lost in any crash.
    #[default]
    EveryEntry,
    /// `append` returns once the entry is queued; the writer fsyncs at least every
    /// `max_delay`. A crash of the machine may lose what was appended in the last `max_delay`
    /// (plus the time the write and fsync in progress take); a crash of the process may lose
    /// what was still queued. Use [`AuditLog::flush`] where an entry must be durable.
    Batched {
        /// Longest time an entry stays written but not fsynced.
        max_delay: Duration,
    },
}

/// How to open an audit log.
pub struct AuditConfig {
    /// The log directory (created 0700 if missing).
    pub dir: PathBuf,
    /// The component owning the log, named in checkpoints and in entries the log writes itself.
    pub component: String,
    /// The Ed25519 key that signs checkpoints.
    pub checkpoint_key: SigningKey,
    /// The id of `checkpoint_key`, written in each checkpoint and in `checkpoint.pub`.
    pub checkpoint_key_id: String,
    /// The audit key for HMAC entry hashes; `None` for plain SHA-256.
    pub key: Option<AuditKey>,
    /// Scrubs reasons and metadata strings before they are hashed and written.
    pub redactor: Option<Arc<dyn Redactor + Send + Sync>>,
    /// When `append` returns.
    pub durability: Durability,
    /// A new file is started before an append that would take the current one past this size.
    pub max_file_bytes: u64,
    /// A checkpoint is written once this many entries have been appended since the last one.
    pub checkpoint_every: u64,
}

impl AuditConfig {
    /// A configuration with defaults: no audit key, no redactor, [`Durability::EveryEntry`],
    /// [`DEFAULT_MAX_FILE_BYTES`] and [`DEFAULT_CHECKPOINT_EVERY`].
    pub fn new(
        dir: impl Into<PathBuf>,
        component: impl Into<String>,
        checkpoint_key: SigningKey,
        checkpoint_key_id: impl Into<String>,
    ) -> Self {
        Self {
            dir: dir.into(),
            component: component.into(),
            checkpoint_key,
            checkpoint_key_id: checkpoint_key_id.into(),
            key: None,
            redactor: None,
            durability: Durability::EveryEntry,
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            checkpoint_every: DEFAULT_CHECKPOINT_EVERY,
        }
    }

    fn validate(&self) -> Result<(), AuditError> {
        let bad = |what: &str| Err(AuditError::Config(what.to_owned()));
        if self.component.is_empty() || self.component.chars().any(char::is_control) {
            return bad("component must be non-empty and free of control characters");
        }
        if self.checkpoint_key_id.is_empty()
            || self
                .checkpoint_key_id
                .chars()
                .any(|c| c.is_whitespace() || c.is_control())
        {
            return bad("checkpoint_key_id must be non-empty and free of whitespace");
        }
        if self.max_file_bytes == 0 {
            return bad("max_file_bytes must be at least 1");
        }
        if self.checkpoint_every == 0 {
            return bad("checkpoint_every must be at least 1");
        }
        Ok(())
    }
}

impl std::fmt::Debug for AuditConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // No secrets: the signing key and audit key are shown only as present.
        f.debug_struct("AuditConfig")
            .field("dir", &self.dir)
            .field("component", &self.component)
            .field("checkpoint_key_id", &self.checkpoint_key_id)
            .field("keyed", &self.key.is_some())
            .field("redactor", &self.redactor.is_some())
            .field("durability", &self.durability)
            .field("max_file_bytes", &self.max_file_bytes)
            .field("checkpoint_every", &self.checkpoint_every)
            .finish_non_exhaustive()
    }
}

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
#[derive(Debug)]
#[must_use = "wait() tells whether the entry reached the disk"]
pub struct PendingEntry {
    appended: Appended,
    ack: Option<Receiver<Result<(), Refused>>>,
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

/// Why the writer did not acknowledge.
#[derive(Debug, Clone)]
enum Refused {
    /// It cannot write now and retries (disk full, I/O error): the entry was not written.
    Stalled(String),
    /// It stopped for good.
    Failed(String),
}

impl From<Refused> for AuditError {
    fn from(refused: Refused) -> Self {
        match refused {
            Refused::Stalled(detail) => AuditError::Unavailable { detail },
            Refused::Failed(detail) => AuditError::WriterFailed { detail },
        }
    }
}

type Ack = SyncSender<Result<(), Refused>>;

/// An entry's line, sealed (seq and hashes fixed) and not yet known to be on disk.
struct Sealed {
    line: Vec<u8>,
    seq: u64,
    hash: String,
}

enum Command {
    Write { entry: Sealed, ack: Option<Ack> },
    Flush(Ack),
    Close(Ack),
}

struct ChainState {
    head_seq: u64,
    head_hash: String,
    // None once closed. Sending under the chain lock keeps the queue in seq order.
    tx: Option<Sender<Command>>,
    /// Set by the writer while it cannot write: nothing new is sealed or accepted then, so
    /// what it holds is all that must be written when it resumes.
    stalled: Option<String>,
}

struct Inner {
    dir: PathBuf,
    component: String,
    key: Option<AuditKey>,
    redactor: Option<Arc<dyn Redactor + Send + Sync>>,
    durability: Durability,
    state: Arc<Mutex<ChainState>>,
    failure: Arc<Mutex<Option<String>>>,
    // Held while closing, so a second close waits for the first.
    writer: Mutex<Option<JoinHandle<()>>>,
    // Released by close, so the directory can be opened again while clones linger.
    registration: Mutex<Option<Registration>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves consistent data (plain assignments).
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

fn wait(ack: &Receiver<Result<(), Refused>>) -> Result<(), AuditError> {
    match ack.recv() {
        Ok(Ok(())) => Ok(()),
        Ok(Err(refused)) => Err(refused.into()),
        Err(_) => Err(AuditError::WriterFailed {
            detail: "the writer thread ended".into(),
        }),
    }
}

// Directories with an open AuditLog in this process: two writers on one chain would fork it.
static OPEN_DIRS: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

/// The name of the lock file that keeps a second process from writing the same log.
pub(crate) const WRITER_LOCK_FILE: &str = "writer.lock";

/// The right to write one log directory: registered in this process, and an exclusive
/// `flock` on `<dir>/writer.lock` against other processes (released when the holder exits,
/// however it exits).
struct Registration {
    dir: PathBuf,
    _flock: nix::fcntl::Flock<File>,
}

impl Registration {
    fn claim(dir: PathBuf) -> Result<Self, AuditError> {
        if !lock(&OPEN_DIRS).insert(dir.clone()) {
            return Err(AuditError::AlreadyOpen { dir });
        }
        let path = dir.join(WRITER_LOCK_FILE);
        let flock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(|source| AuditError::Write {
                path: path.clone(),
                source,
            })
            .and_then(|file| {
                nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
                    .map_err(|_| AuditError::InUse { dir: dir.clone() })
            });
        match flock {
            Ok(flock) => Ok(Self { dir, _flock: flock }),
            Err(e) => {
                lock(&OPEN_DIRS).remove(&dir);
                Err(e)
            }
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        lock(&OPEN_DIRS).remove(&self.dir);
    }
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
            }),
        };
        for pending in &scan.pending {
            log.record_recovery(pending, scan.head_entry.as_ref())?;
        }
        let head = log.head_seq();
        tracing::info!(dir = %dir.display(), head_seq = head, file = scan.file_index, recovered = scan.pending.len(), "audit log open");
        Ok(log)
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
    /// once and fsynced with the next durable entry or within [`RECORD_MAX_DELAY`] (with
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

/// What opening found and repaired.
struct Scan {
    file_index: u64,
    file_size: u64,
    head_seq: u64,
    head_hash: String,
    head_entry: Option<Entry>,
    last_checkpoint: u64,
    pending: Vec<PathBuf>,
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

fn scan_and_recover(config: &AuditConfig) -> Result<Scan, AuditError> {
    let dir = config.dir.as_path();
    let key = config.key.as_ref();
    let files = list_log_files(dir).map_err(|source| AuditError::Dir {
        path: dir.to_owned(),
        source,
    })?;
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
    let mut pending = pending_torn_files(dir)?;

    // Checkpoints first: the newest file is compared with the last one as it is scanned.
    let checkpoints_path = dir.join(CHECKPOINTS_FILE);
    let checkpoints = read_checkpoints(dir).map_err(|source| AuditError::Broken {
        dir: dir.to_owned(),
        source: Box::new(source),
    })?;
    let last_checkpoint = checkpoints.list.last().cloned();

    let Some((last_index, last_path)) = files.last().cloned() else {
        if let Some((line, checkpoint)) = last_checkpoint {
            return Err(broken(
                dir,
                checkpoints_path,
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
        repair_checkpoints(dir, checkpoints.torn.as_ref())?;
        return Ok(Scan {
            file_index: 1,
            file_size: 0,
            head_seq: 0,
            head_hash: GENESIS_HASH.to_owned(),
            head_entry: None,
            last_checkpoint: 0,
            pending,
        });
    };

    // The chain before the newest file: the last entry of the nearest non-empty earlier file.
    let mut head_entry: Option<Entry> = None;
    let mut head_location: Option<(PathBuf, usize)> = None;
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
        head_entry = Some(entry);
        head_location = Some((path, number));
        break;
    }
    let (start_seq, start_hash) = match &head_entry {
        Some(entry) => (entry.seq, entry.hash.clone()),
        None => (0, GENESIS_HASH.to_owned()),
    };
    let mut chain = ChainChecker::new(key, start_seq, start_hash);
    let check_checkpoint = |entry: &Entry, path: &Path, number: usize| -> Result<(), AuditError> {
        match &last_checkpoint {
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
    };
    if let (Some(entry), Some((path, number))) = (&head_entry, &head_location) {
        check_checkpoint(entry, path, *number)?;
    }

    // The newest file, line by line.
    let data = read_file(&last_path)?;
    let lines = split_lines(&data);
    let mut torn_at = None;
    for (line_index, line) in lines.iter().enumerate() {
        let number = line_index + 1;
        if line.is_torn() {
            if number != lines.len() {
                return Err(broken(
                    dir,
                    last_path.clone(),
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
                broken(dir, last_path.clone(), number, seq, problem)
            })?;
        check_checkpoint(&entry, &last_path, number)?;
        head_entry = Some(entry);
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
    let mut file_size = data.len() as u64;
    if let Some(offset) = torn_at {
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
fn ensure_checkpoint_pub(config: &AuditConfig) -> Result<(), AuditError> {
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

/// The writer thread's state: it alone touches the files after open.
///
/// A write or fsync that fails (a full disk, an I/O error) does not stop it: it takes back
/// whatever of the failed bytes reached the file, *stalls* (nothing new is accepted: callers
/// get [`AuditError::Unavailable`]), refuses every durable entry it holds (whose caller then
/// does nothing), keeps the rest (entries handed over without waiting, already answered)
/// and tries again, waiting [`FIRST_RETRY`] and doubling up to [`MAX_RETRY`]. Once a try
/// writes and fsyncs what it kept, it reseals those entries onto the chain as it stands on
/// disk, so the chain stays whole, and accepts entries again.
struct Writer {
    dir: PathBuf,
    file: File,
    file_index: u64,
    file_size: u64,
    /// `file_size` at the last fsync: what a failed fsync rolls back to.
    synced_size: u64,
    /// The chain head at the last fsync.
    synced_head: (u64, String),
    /// Written since the last fsync, with whoever waits on them: rewritten if it fails.
    unsynced: Vec<(Sealed, Option<Ack>)>,
    /// Entries nobody waits on, kept while stalled, to write when space returns.
    backlog: VecDeque<Sealed>,
    /// Why it cannot write, while it cannot.
    stalled: Option<String>,
    retry: Duration,
    state: Arc<Mutex<ChainState>>,
    key: Option<AuditKey>,
    checkpoints: File,
    checkpoints_size: u64,
    max_file_bytes: u64,
    checkpoint_every: u64,
    last_checkpoint: u64,
    head_seq: u64,
    head_hash: String,
    signing_key: SigningKey,
    key_id: String,
    component: String,
    durability: Durability,
    failure: Arc<Mutex<Option<String>>>,
}

impl Writer {
    fn run(mut self, rx: &Receiver<Command>) {
        // When written-but-unsynced entries first appeared.
        let mut dirty_since: Option<Instant> = None;
        loop {
            if self.stalled.is_some() {
                if self.stalled_step(rx) {
                    return;
                }
                continue;
            }
            let first = match dirty_since {
                Some(since) => {
                    let left = self.max_dirty().saturating_sub(since.elapsed());
                    match rx.recv_timeout(left) {
                        Ok(command) => Some(command),
                        Err(RecvTimeoutError::Timeout) => {
                            self.sync_or_stall(rx);
                            dirty_since = None;
                            continue;
                        }
                        Err(RecvTimeoutError::Disconnected) => None,
                    }
                }
                _ => rx.recv().ok(),
            };
            let Some(first) = first else {
                // Every handle is gone without a close (only if sending Close failed).
                self.sync_or_stall(rx);
                let _ = self.final_checkpoint();
                return;
            };
            let mut group = vec![first];
            while group.len() < MAX_GROUP {
                match rx.try_recv() {
                    Ok(command) => group.push(command),
                    Err(_) => break,
                }
            }

            let mut flushes = Vec::new();
            let mut must_sync = false;
            let mut wrote = false;
            let mut close = None;
            let mut group = group.into_iter();
            while let Some(command) = group.next() {
                match command {
                    Command::Write { entry, ack } => {
                        must_sync |= ack.is_some();
                        if let Err(detail) = self.permanent() {
                            refuse(ack, Refused::Failed(detail));
                            continue;
                        }
                        if self.stalled.is_some() {
                            self.hold(entry, ack);
                            continue;
                        }
                        match self.write(entry, ack) {
                            Ok(()) => wrote = true,
                            Err((detail, entry, ack)) => {
                                // What was written before it is kept if an fsync makes it
                                // durable; then the failed entry and everything after it
                                // wait for space.
                                let _ = self.sync_durable();
                                self.stall(detail, rx);
                                self.hold(entry, ack);
                            }
                        }
                    }
                    Command::Flush(ack) => {
                        flushes.push(ack);
                        must_sync = true;
                    }
                    Command::Close(ack) => {
                        close = Some(ack);
                        must_sync = true;
                        // Nothing is sent after Close.
                        for rest in group.by_ref() {
                            if let Command::Write { entry, ack } = rest {
                                self.hold(entry, ack);
                            }
                        }
                    }
                }
            }
            if wrote {
                dirty_since.get_or_insert_with(Instant::now);
            }
            let batched_due = dirty_since.is_some_and(|since| since.elapsed() >= self.max_dirty());
            if (must_sync || batched_due) && !self.unsynced.is_empty() && self.stalled.is_none() {
                self.sync_or_stall(rx);
            }
            if self.unsynced.is_empty() {
                dirty_since = None;
            }
            let nobody_waits = flushes.is_empty() && close.is_none();
            let status = self.status();
            for ack in flushes {
                let _ = ack.send(status.clone());
            }
            if let Some(ack) = close {
                let _ = ack.send(self.close_now());
                return;
            }
            if wrote && nobody_waits {
                // Nobody waits on what was just written: let more gather before the next
                // write, rather than waking (and competing for a core) once per entry.
                std::thread::sleep(LINGER);
            }
        }
    }

    /// One step while stalled: wait for a command or the next try. Whether to stop.
    fn stalled_step(&mut self, rx: &Receiver<Command>) -> bool {
        match rx.recv_timeout(self.retry) {
            Ok(Command::Write { entry, ack }) => self.hold(entry, ack),
            Ok(Command::Flush(ack)) => {
                self.try_resume();
                let _ = ack.send(self.status());
            }
            Ok(Command::Close(ack)) => {
                let _ = ack.send(self.close_now());
                return true;
            }
            Err(RecvTimeoutError::Timeout) => {
                if !self.try_resume() {
                    self.retry = (self.retry * 2).min(MAX_RETRY);
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                let _ = self.close_now();
                return true;
            }
        }
        false
    }

    /// At close: one more try if stalled, then the final checkpoint.
    fn close_now(&mut self) -> Result<(), Refused> {
        if self.stalled.is_some() {
            self.try_resume();
        }
        if let Some(detail) = &self.stalled {
            let lost = self.backlog.len();
            tracing::error!(dir = %self.dir.display(), lost, error = %detail, "audit log closed while it could not be written; entries handed over without waiting are lost");
            return Err(Refused::Stalled(format!(
                "{detail}; {lost} entries handed over without waiting could not be written"
            )));
        }
        self.permanent().map_err(Refused::Failed)?;
        self.final_checkpoint().map_err(Refused::Failed)
    }

    /// Longest time written entries may wait for an fsync: the batch bound, or (with every
    /// entry durable) the bound of entries handed over with [`AuditLog::record`].
    fn max_dirty(&self) -> Duration {
        match self.durability {
            Durability::Batched { max_delay } => max_delay,
            Durability::EveryEntry => RECORD_MAX_DELAY,
        }
    }

    fn permanent(&self) -> Result<(), String> {
        match lock(&self.failure).as_ref() {
            Some(detail) => Err(detail.clone()),
            None => Ok(()),
        }
    }

    /// What a caller waiting now is told.
    fn status(&self) -> Result<(), Refused> {
        self.permanent().map_err(Refused::Failed)?;
        match &self.stalled {
            Some(detail) => Err(Refused::Stalled(detail.clone())),
            None => Ok(()),
        }
    }

    // Records a failure nothing can repair (the file could not be put back to a whole
    // entry); every later command is answered with it.
    fn fail(&self, detail: String) -> String {
        let mut failure = lock(&self.failure);
        if failure.is_none() {
            tracing::error!(dir = %self.dir.display(), error = %detail, "audit writer failed; no further entries will be recorded");
            *failure = Some(detail.clone());
        }
        detail
    }

    /// Stops accepting entries: from now on callers are told the log is unavailable, so
    /// nothing new is sealed; what is still queued is taken in (durable entries refused).
    fn stall(&mut self, detail: String, rx: &Receiver<Command>) {
        if self.stalled.is_none() {
            tracing::error!(dir = %self.dir.display(), error = %detail, "audit log cannot be written; refusing entries and retrying");
        }
        lock(&self.state).stalled = Some(detail.clone());
        self.stalled = Some(detail);
        self.retry = FIRST_RETRY;
        // Written but not durable: taken back, written again on resume.
        let unsynced = std::mem::take(&mut self.unsynced);
        if !unsynced.is_empty() {
            if let Err(e) = self.file.set_len(self.synced_size) {
                self.fail(format!(
                    "taking back unsynced entries of {}: {e}",
                    self.current().display()
                ));
            }
            self.file_size = self.synced_size;
            (self.head_seq, self.head_hash) = self.synced_head.clone();
            for (entry, ack) in unsynced {
                self.hold(entry, ack);
            }
        }
        // Everything sent before the flag was set is queued by now (sends happen under the
        // same lock): take it in, so that nothing sealed on the old chain arrives later.
        let mut deferred = Vec::new();
        while let Ok(command) = rx.try_recv() {
            match command {
                Command::Write { entry, ack } => self.hold(entry, ack),
                other => deferred.push(other),
            }
        }
        for command in deferred {
            match command {
                Command::Flush(ack) => {
                    let _ = ack.send(self.status());
                }
                Command::Close(ack) => {
                    // Answered at once; the writer's loop ends when the channel closes.
                    let _ = ack.send(self.close_now());
                }
                Command::Write { .. } => {}
            }
        }
    }

    /// While stalled: a durable entry is refused (its caller does nothing); one nobody waits
    /// on is kept for later.
    fn hold(&mut self, entry: Sealed, ack: Option<Ack>) {
        match ack {
            Some(ack) => {
                let detail = self
                    .stalled
                    .clone()
                    .unwrap_or_else(|| "the audit log cannot be written".into());
                let _ = ack.send(Err(Refused::Stalled(detail)));
            }
            None => self.backlog.push_back(entry),
        }
    }

    /// Writes what was kept (resealed onto the chain on disk) and fsyncs; on success
    /// accepts entries again. Whether it resumed.
    fn try_resume(&mut self) -> bool {
        if self.permanent().is_err() {
            return false;
        }
        while let Some(entry) = self.backlog.pop_front() {
            let entry = match self.resealed(entry) {
                Ok(entry) => entry,
                Err(detail) => {
                    self.fail(detail);
                    return false;
                }
            };
            if let Err((detail, entry, _)) = self.write(entry, None) {
                self.backlog.push_front(entry);
                self.stalled = Some(detail.clone());
                lock(&self.state).stalled = Some(detail);
                return self.retake_unsynced();
            }
        }
        if let Err(detail) = self.sync_durable() {
            self.stalled = Some(detail);
            return self.retake_unsynced();
        }
        let mut state = lock(&self.state);
        state.head_seq = self.head_seq;
        state.head_hash.clone_from(&self.head_hash);
        state.stalled = None;
        drop(state);
        self.stalled = None;
        self.retry = FIRST_RETRY;
        tracing::warn!(dir = %self.dir.display(), head_seq = self.head_seq, "audit log writable again; accepting entries");
        true
    }

    /// After a failed try: what it wrote but could not fsync goes back to the front of the
    /// backlog. Always `false` (not resumed).
    fn retake_unsynced(&mut self) -> bool {
        let unsynced = std::mem::take(&mut self.unsynced);
        if unsynced.is_empty() {
            return false;
        }
        if let Err(e) = self.file.set_len(self.synced_size) {
            self.fail(format!(
                "taking back unsynced entries of {}: {e}",
                self.current().display()
            ));
        }
        self.file_size = self.synced_size;
        (self.head_seq, self.head_hash) = self.synced_head.clone();
        for (entry, _) in unsynced.into_iter().rev() {
            self.backlog.push_front(entry);
        }
        false
    }

    /// `entry`, moved onto the chain as it stands on disk if entries before it were refused.
    fn resealed(&self, entry: Sealed) -> Result<Sealed, String> {
        if entry.seq == self.head_seq + 1 {
            // Nothing was refused before it: it already follows the head.
            return Ok(entry);
        }
        let body = entry.line.strip_suffix(b"\n").unwrap_or(&entry.line);
        let parsed: Entry = serde_json::from_slice(body)
            .map_err(|e| format!("resealing a kept audit entry: {e}"))?;
        let sealed = parsed.reseal(self.head_seq + 1, self.head_hash.clone(), self.key.as_ref());
        let mut line = sealed.to_line().into_bytes();
        line.push(b'\n');
        Ok(Sealed {
            line,
            seq: sealed.seq,
            hash: sealed.hash,
        })
    }

    fn current(&self) -> PathBuf {
        self.dir.join(log_file_name(self.file_index))
    }

    /// Writes one entry (rotating first if it would overflow the file). On failure the file
    /// still ends on a whole entry, and the entry comes back with the reason.
    #[allow(clippy::type_complexity)]
    fn write(
        &mut self,
        entry: Sealed,
        ack: Option<Ack>,
    ) -> Result<(), (String, Sealed, Option<Ack>)> {
        let len = entry.line.len() as u64;
        if self.file_size > 0 && self.file_size.saturating_add(len) > self.max_file_bytes {
            if let Err(detail) = self.rotate() {
                return Err((detail, entry, ack));
            }
        }
        if let Err(e) = self.file.write_all(&entry.line) {
            // Take back a partial line so the file still ends on a complete entry.
            if let Err(undo) = self.file.set_len(self.file_size) {
                self.fail(format!(
                    "taking back a partial entry of {}: {undo}",
                    self.current().display()
                ));
            }
            let detail = format!("writing {}: {e}", self.current().display());
            return Err((detail, entry, ack));
        }
        self.file_size += len;
        self.head_seq = entry.seq;
        self.head_hash.clone_from(&entry.hash);
        self.unsynced.push((entry, ack));
        Ok(())
    }

    fn rotate(&mut self) -> Result<(), String> {
        // The old file must be durable before entries land in the new one.
        self.sync_durable()?;
        let next = self.file_index + 1;
        let path = self.dir.join(log_file_name(next));
        let (file, _) = open_append(&path)
            .and_then(|opened| sync_dir(&self.dir).map(|()| opened))
            .map_err(|e| format!("creating {}: {e}", path.display()))?;
        self.file = file;
        self.file_index = next;
        self.file_size = 0;
        self.synced_size = 0;
        tracing::debug!(file = %path.display(), "audit log rotated");
        Ok(())
    }

    /// Fsyncs; on success acknowledges what it made durable. On failure nothing is
    /// acknowledged (the caller takes the unsynced entries back).
    fn sync_durable(&mut self) -> Result<(), String> {
        self.permanent()?;
        if let Err(e) = self.file.sync_all() {
            return Err(format!("fsync of {}: {e}", self.current().display()));
        }
        self.synced_size = self.file_size;
        self.synced_head = (self.head_seq, self.head_hash.clone());
        for (_, ack) in self.unsynced.drain(..) {
            if let Some(ack) = ack {
                let _ = ack.send(Ok(()));
            }
        }
        if self.head_seq.saturating_sub(self.last_checkpoint) >= self.checkpoint_every {
            // A checkpoint is derived data: one that cannot be written now is written at a
            // later fsync.
            if let Err(detail) = self.checkpoint() {
                tracing::warn!(dir = %self.dir.display(), error = %detail, "checkpoint not written; retrying later");
            }
        }
        Ok(())
    }

    /// Fsyncs what was written; if that fails, stalls (the unsynced entries are taken back).
    fn sync_or_stall(&mut self, rx: &Receiver<Command>) {
        if self.unsynced.is_empty() {
            return;
        }
        if let Err(detail) = self.sync_durable() {
            if self.permanent().is_err() {
                let refused = Refused::Failed(detail);
                for (_, ack) in self.unsynced.drain(..) {
                    refuse(ack, refused.clone());
                }
                return;
            }
            self.stall(detail, rx);
        }
    }

    fn final_checkpoint(&mut self) -> Result<(), String> {
        if self.head_seq > self.last_checkpoint {
            self.checkpoint()?;
        }
        Ok(())
    }

    // Only called right after the log was fsynced up to head_seq.
    fn checkpoint(&mut self) -> Result<(), String> {
        self.permanent()?;
        let checkpoint = Checkpoint::sign(
            &self.signing_key,
            &self.key_id,
            &self.component,
            self.head_seq,
            &self.head_hash,
        );
        let path = self.dir.join(CHECKPOINTS_FILE);
        let line = checkpoint.to_line();
        if let Err(e) = self
            .checkpoints
            .write_all(&line)
            .and_then(|()| self.checkpoints.sync_all())
        {
            // Take back a partial line: the file must end on a whole checkpoint.
            if let Err(undo) = self.checkpoints.set_len(self.checkpoints_size) {
                return Err(self.fail(format!(
                    "taking back a partial checkpoint of {}: {undo}",
                    path.display()
                )));
            }
            return Err(format!("writing {}: {e}", path.display()));
        }
        self.checkpoints_size += line.len() as u64;
        self.last_checkpoint = self.head_seq;
        Ok(())
    }
}

fn refuse(ack: Option<Ack>, refused: Refused) {
    if let Some(ack) = ack {
        let _ = ack.send(Err(refused));
    }
}
