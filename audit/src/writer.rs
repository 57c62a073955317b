//! The writer thread: group commit, rotation, checkpoints, and stalling and resuming when
//! the disk refuses writes.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;

use crate::checkpoint::Checkpoint;
use crate::config::Durability;
use crate::entry::Entry;
use crate::files::{log_file_name, open_append, sync_dir, CHECKPOINTS_FILE};
use crate::key::AuditKey;
use crate::queue::{
    lock, Ack, ChainState, Command, Refused, Sealed, FIRST_RETRY, LINGER, MAX_GROUP, MAX_RETRY,
    RECORD_MAX_DELAY,
};

/// The writer thread's state: it alone touches the files after open.
///
/// A write or fsync that fails (a full disk, an I/O error) does not stop it: it takes back
/// whatever of the failed bytes reached the file, *stalls* (nothing new is accepted: callers
/// get [`AuditError::Unavailable`](crate::AuditError::Unavailable)), refuses every durable entry it holds (whose caller then
/// does nothing), keeps the rest (entries handed over without waiting, already answered)
/// and tries again, waiting [`FIRST_RETRY`] and doubling up to [`MAX_RETRY`]. Once a try
/// writes and fsyncs what it kept, it reseals those entries onto the chain as it stands on
/// disk, so the chain stays whole, and accepts entries again.
pub(crate) struct Writer {
    pub(crate) dir: PathBuf,
    pub(crate) file: File,
    pub(crate) file_index: u64,
    pub(crate) file_size: u64,
    /// `file_size` at the last fsync: what a failed fsync rolls back to.
    pub(crate) synced_size: u64,
    /// The chain head at the last fsync.
    pub(crate) synced_head: (u64, String),
    /// Written since the last fsync, with whoever waits on them: rewritten if it fails.
    pub(crate) unsynced: Vec<(Sealed, Option<Ack>)>,
    /// Entries nobody waits on, kept while stalled, to write when space returns.
    pub(crate) backlog: VecDeque<Sealed>,
    /// Why it cannot write, while it cannot.
    pub(crate) stalled: Option<String>,
    pub(crate) retry: Duration,
    pub(crate) state: Arc<Mutex<ChainState>>,
    pub(crate) key: Option<AuditKey>,
    pub(crate) checkpoints: File,
    pub(crate) checkpoints_size: u64,
    pub(crate) max_file_bytes: u64,
    pub(crate) checkpoint_every: u64,
    pub(crate) checkpoint_interval: Duration,
    /// When the oldest durable entry no checkpoint covers became durable.
    pub(crate) uncovered_since: Option<Instant>,
    pub(crate) last_checkpoint: u64,
    pub(crate) head_seq: u64,
    pub(crate) head_hash: String,
    pub(crate) signing_key: SigningKey,
    pub(crate) key_id: String,
    pub(crate) component: String,
    pub(crate) durability: Durability,
    pub(crate) failure: Arc<Mutex<Option<String>>>,
}

/// What one group of commands asked of the writer once its entries are written.
struct Group {
    /// Callers waiting for everything so far to be durable.
    flushes: Vec<Ack>,
    /// Whether anyone waits for an fsync.
    must_sync: bool,
    /// Whether any entry was written.
    wrote: bool,
    /// The caller closing the log, if one did.
    close: Option<Ack>,
}

impl Writer {
    pub(crate) fn run(mut self, rx: &Receiver<Command>) {
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
                // Idle, everything durable: wake for a checkpoint that is due.
                _ => match self.checkpoint_wait() {
                    Some(left) => match rx.recv_timeout(left) {
                        Ok(command) => Some(command),
                        Err(RecvTimeoutError::Timeout) => {
                            self.checkpoint_now();
                            continue;
                        }
                        Err(RecvTimeoutError::Disconnected) => None,
                    },
                    None => rx.recv().ok(),
                },
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

            let Group {
                flushes,
                must_sync,
                wrote,
                close,
            } = self.take_group(group, rx);
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

    /// Writes the entries of one group and gathers what its flushes and close ask for.
    fn take_group(&mut self, group: Vec<Command>, rx: &Receiver<Command>) -> Group {
        let mut taken = Group {
            flushes: Vec::new(),
            must_sync: false,
            wrote: false,
            close: None,
        };
        let mut group = group.into_iter();
        while let Some(command) = group.next() {
            match command {
                Command::Write { entry, ack } => {
                    taken.must_sync |= ack.is_some();
                    if let Err(detail) = self.permanent() {
                        refuse(ack, Refused::Failed(detail));
                        continue;
                    }
                    if self.stalled.is_some() {
                        self.hold(entry, ack);
                        continue;
                    }
                    match self.write(entry, ack) {
                        Ok(()) => taken.wrote = true,
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
                    taken.flushes.push(ack);
                    taken.must_sync = true;
                }
                Command::Close(ack) => {
                    taken.close = Some(ack);
                    taken.must_sync = true;
                    // Nothing is sent after Close.
                    for rest in group.by_ref() {
                        if let Command::Write { entry, ack } = rest {
                            self.hold(entry, ack);
                        }
                    }
                }
            }
        }
        taken
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
    /// entry durable) the bound of entries handed over with [`AuditLog::record`](crate::AuditLog::record).
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
        if self.head_seq > self.last_checkpoint {
            self.uncovered_since.get_or_insert_with(Instant::now);
        }
        let by_count = self.head_seq.saturating_sub(self.last_checkpoint) >= self.checkpoint_every;
        if by_count || self.checkpoint_wait() == Some(Duration::ZERO) {
            self.checkpoint_now();
        }
        Ok(())
    }

    /// How long until durable entries no checkpoint covers must be covered; `None` when every
    /// durable entry is.
    fn checkpoint_wait(&self) -> Option<Duration> {
        let since = self.uncovered_since?;
        Some(self.checkpoint_interval.saturating_sub(since.elapsed()))
    }

    /// Writes a checkpoint of the durable head. A checkpoint is derived data: one that cannot
    /// be written now is written later.
    fn checkpoint_now(&mut self) {
        match self.checkpoint() {
            Ok(()) => self.uncovered_since = None,
            Err(detail) => {
                tracing::warn!(dir = %self.dir.display(), error = %detail, "checkpoint not written; retrying later");
            }
        }
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
