//! What the handles send the writer thread and what it answers: the commands, the sealed
//! lines, the shared chain head, and the timing constants both sides agree on.

use std::sync::mpsc::{Receiver, Sender, SyncSender};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::error::AuditError;

// Most commands the writer takes in one group, so one huge burst cannot delay every ack in it
// without bound.
pub(crate) const MAX_GROUP: usize = 4096;
/// Longest time an entry handed over with [`AuditLog::record`](crate::AuditLog::record) stays written but not
/// fsynced (it is fsynced sooner along with any durable entry).
pub const RECORD_MAX_DELAY: Duration = Duration::from_millis(10);
/// How long the writer lets entries gather after writing some that nobody waits for. A
/// durable append arriving meanwhile waits at most this much longer.
pub(crate) const LINGER: Duration = Duration::from_millis(1);

/// First wait before a stalled writer (disk full, I/O error) tries again; it doubles up to
/// [`MAX_RETRY`].
pub(crate) const FIRST_RETRY: Duration = Duration::from_millis(10);
/// Longest wait between two tries of a stalled writer.
pub(crate) const MAX_RETRY: Duration = Duration::from_secs(1);

/// Why the writer did not acknowledge.
#[derive(Debug, Clone)]
pub(crate) enum Refused {
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

pub(crate) type Ack = SyncSender<Result<(), Refused>>;

/// An entry's line, sealed (seq and hashes fixed) and not yet known to be on disk.
pub(crate) struct Sealed {
    pub(crate) line: Vec<u8>,
    pub(crate) seq: u64,
    pub(crate) hash: String,
}

pub(crate) enum Command {
    Write { entry: Sealed, ack: Option<Ack> },
    Flush(Ack),
    Close(Ack),
}

pub(crate) struct ChainState {
    pub(crate) head_seq: u64,
    pub(crate) head_hash: String,
    // None once closed. Sending under the chain lock keeps the queue in seq order.
    pub(crate) tx: Option<Sender<Command>>,
    /// Set by the writer while it cannot write: nothing new is sealed or accepted then, so
    /// what it holds is all that must be written when it resumes.
    pub(crate) stalled: Option<String>,
}
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves consistent data (plain assignments).
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn wait(ack: &Receiver<Result<(), Refused>>) -> Result<(), AuditError> {
    match ack.recv() {
        Ok(Ok(())) => Ok(()),
        Ok(Err(refused)) => Err(refused.into()),
        Err(_) => Err(AuditError::WriterFailed {
            detail: "the writer thread ended".into(),
        }),
    }
}
