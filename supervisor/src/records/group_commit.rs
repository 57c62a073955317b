//! Final records written in groups: every run's end queued while the connection was held
//! goes out in the next durable transaction (see [`Finishing::finish_all`]).

use std::sync::{Arc, Mutex, OnceLock};

use rusqlite::{params, Connection};

use super::error::RecordsError;
use super::types::{RunState, TeardownReport};

/// Final records waiting to be written: whoever next holds the connection commits every one
/// queued in one durable transaction.
#[derive(Debug, Default)]
pub(super) struct Finishing(Mutex<Vec<Finish>>);

/// One run's final record, queued for the next group commit.
#[derive(Debug)]
struct Finish {
    run_id: String,
    state: RunState,
    report: String,
    now: i64,
    /// Set by the commit that wrote it (or failed to).
    done: Arc<OnceLock<Result<(), rusqlite::Error>>>,
}

/// A copy of `e` for every run of a group that one failure failed: SQLite's code and
/// message kept where it has them.
fn copy_error(e: &rusqlite::Error) -> rusqlite::Error {
    match e {
        rusqlite::Error::SqliteFailure(code, message) => {
            rusqlite::Error::SqliteFailure(*code, message.clone())
        }
        other => failure(&other.to_string()),
    }
}

/// A generic SQLite failure saying `what`.
fn failure(what: &str) -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
        Some(what.to_owned()),
    )
}

/// Writes a group of final records in one durable transaction: at a supervisor's stop every
/// live run ends at once, and one commit (one WAL fsync) a run, in series under the
/// connection's lock, made the stop wait on the disk once per run. Each run's outcome goes to
/// its `done`: its own statement's failure, or the transaction's (then every run of the group
/// failed, and none is written).
fn commit_finishes(conn: &mut Connection, group: Vec<Finish>) {
    if group.is_empty() {
        return;
    }
    let tx = match conn.transaction() {
        Ok(tx) => tx,
        Err(e) => {
            for finish in group {
                let _ = finish.done.set(Err(copy_error(&e)));
            }
            return;
        }
    };
    let mut outcomes = Vec::with_capacity(group.len());
    {
        // Compiled once for the group (and kept by the connection), not once a run: a stop's
        // group is every live run.
        let mut update = tx.prepare_cached(
            "UPDATE runs SET state = ?2, ended_at = ?3, report = ?4, detached = NULL WHERE run_id = ?1",
        );
        for finish in &group {
            let updated = match &mut update {
                Ok(update) => update
                    .execute(params![
                        finish.run_id,
                        finish.state.name(),
                        finish.now,
                        finish.report
                    ])
                    .map(|_| ()),
                Err(e) => Err(copy_error(e)),
            };
            outcomes.push(updated);
        }
    }
    let committed = if tx.is_autocommit() {
        // A failure that rolled the whole transaction back (a full disk, an I/O error).
        Err(outcomes
            .iter()
            .find_map(|outcome| outcome.as_ref().err().map(copy_error))
            .unwrap_or_else(|| failure("the final records' transaction was rolled back")))
    } else {
        tx.commit()
    };
    for (finish, outcome) in group.into_iter().zip(outcomes) {
        let result = match &committed {
            Ok(()) => outcome,
            Err(e) => Err(copy_error(e)),
        };
        let _ = finish.done.set(result);
    }
}

impl Finishing {
    /// Records the ends of several runs with their reports over `conn`, in one durable
    /// transaction with every end queued meanwhile (see `commit_finishes`); one outcome per
    /// run, in order.
    pub(super) fn finish_all(
        &self,
        conn: &Mutex<Connection>,
        ends: &[(&str, RunState, &TeardownReport)],
        now: i64,
    ) -> Vec<Result<(), RecordsError>> {
        let mut outcomes: Vec<Result<(), RecordsError>> = Vec::with_capacity(ends.len());
        let mut queued = Vec::with_capacity(ends.len());
        for &(run_id, state, report) in ends {
            let Ok(report) = serde_json::to_string(report) else {
                outcomes.push(Err(RecordsError::Report(run_id.into())));
                queued.push(None);
                continue;
            };
            let done = Arc::new(OnceLock::new());
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Finish {
                    run_id: run_id.to_owned(),
                    state,
                    report,
                    now,
                    done: done.clone(),
                });
            outcomes.push(Ok(()));
            queued.push(Some(done));
        }
        let mut conn = conn.lock().unwrap_or_else(|p| p.into_inner());
        // Queued before the connection was taken: either a holder before us committed them
        // (and set `done` before letting go of the connection), or they are still queued and
        // this call commits them, with every other one queued meanwhile.
        if queued.iter().flatten().any(|done| done.get().is_none()) {
            let group = std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()));
            commit_finishes(&mut conn, group);
        }
        drop(conn);
        for (outcome, done) in outcomes.iter_mut().zip(queued) {
            let Some(done) = done else { continue };
            *outcome = match done.get() {
                Some(Ok(())) => Ok(()),
                Some(Err(e)) => Err(RecordsError::Sqlite(copy_error(e))),
                // Never: the group that held it set it before letting go of the connection.
                None => Err(RecordsError::Sqlite(failure(
                    "the final record was not committed",
                ))),
            };
        }
        outcomes
    }
}
