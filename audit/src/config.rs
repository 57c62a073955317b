//! How to open an audit log: [`AuditConfig`] and [`Durability`].

use std::path::PathBuf;
use std::time::Duration;

use ed25519_dalek::SigningKey;

use crate::draft::Redactor;
use crate::error::AuditError;
use crate::key::AuditKey;

/// Default size at which a new log file is started: 10 MiB.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 10 * 1024 * 1024;

/// Default number of entries between checkpoints.
pub const DEFAULT_CHECKPOINT_EVERY: u64 = 1000;
/// Longest a durable entry waits for a checkpoint to cover it, however few entries follow: a
/// crash never loses truncation detection for more than this window.
pub const DEFAULT_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(10);
/// When [`AuditLog::append`](crate::AuditLog::append) returns, relative to the entry reaching the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// `append` returns after the entry is written and fsynced (entries queued together share
    /// one fsync). Nothing acknowledged is lost in any crash.
    #[default]
    EveryEntry,
    /// `append` returns once the entry is queued; the writer fsyncs at least every
    /// `max_delay`. A crash of the machine may lose what was appended in the last `max_delay`
    /// (plus the time the write and fsync in progress take); a crash of the process may lose
    /// what was still queued. Use [`AuditLog::flush`](crate::AuditLog::flush) where an entry must be durable.
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
    pub redactor: Option<Redactor>,
    /// When `append` returns.
    pub durability: Durability,
    /// A new file is started before an append that would take the current one past this size.
    pub max_file_bytes: u64,
    /// A checkpoint is written once this many entries have been appended since the last one.
    pub checkpoint_every: u64,
    /// ... or once the oldest entry no checkpoint covers is this old, whichever comes first.
    pub checkpoint_interval: Duration,
}

impl AuditConfig {
    /// A configuration with defaults: no audit key, no redactor, [`Durability::EveryEntry`],
    /// [`DEFAULT_MAX_FILE_BYTES`], [`DEFAULT_CHECKPOINT_EVERY`] and
    /// [`DEFAULT_CHECKPOINT_INTERVAL`].
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
            checkpoint_interval: DEFAULT_CHECKPOINT_INTERVAL,
        }
    }

    pub(crate) fn validate(&self) -> Result<(), AuditError> {
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
            .field("checkpoint_interval", &self.checkpoint_interval)
            .finish_non_exhaustive()
    }
}
