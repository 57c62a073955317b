//! The database handle: opening it, and every write but the queries' reads.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use rusqlite::{params, Connection, ErrorCode};

use super::error::RecordsError;
use super::group_commit::Finishing;
use super::schema::{make_private, migrate};
use super::types::{NewRun, RunState, TeardownReport, MAX_START_ATTEMPTS};

/// The supervisor's database.
#[derive(Debug)]
pub struct RunRecords {
    path: PathBuf,
    conn: Mutex<Connection>,
    /// Final records waiting to be written: whoever next holds the connection commits every
    /// one queued in one durable transaction (see [`RunRecords::finish`]).
    finishing: Finishing,
}

impl RunRecords {
    /// Opens (creating) the database with WAL, `synchronous=FULL` and an integrity check.
    pub fn open(path: &Path) -> Result<Self, RecordsError> {
        let corrupt = |e: rusqlite::Error| match e.sqlite_error_code() {
            Some(ErrorCode::NotADatabase) | Some(ErrorCode::DatabaseCorrupt) => {
                RecordsError::Corrupt {
                    path: path.to_owned(),
                    detail: e.to_string(),
                }
            }
            _ => RecordsError::Sqlite(e),
        };
        make_private(path, true)?;
        let conn = Connection::open(path).map_err(corrupt)?;
        conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))
            .map_err(corrupt)?;
        // Tighten a -wal or -shm an older supervisor left with a looser mode.
        for suffix in ["-wal", "-shm"] {
            let mut side = path.as_os_str().to_owned();
            side.push(suffix);
            make_private(Path::new(&side), false)?;
        }
        conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA busy_timeout = 5000;")
            .map_err(corrupt)?;
        let check: String = conn
            .query_row("PRAGMA integrity_check", [], |row| row.get(0))
            .map_err(corrupt)?;
        if check != "ok" {
            return Err(RecordsError::Corrupt {
                path: path.to_owned(),
                detail: check,
            });
        }
        let mut conn = conn;
        migrate(&mut conn, path)?;
        Ok(Self {
            path: path.to_owned(),
            conn: Mutex::new(conn),
            finishing: Finishing::default(),
        })
    }

    /// The connection, for this module's writes and `queries`' reads.
    pub(super) fn conn(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a run as `starting` (the single-use record). Returns `false` if the receipt was
    /// used before — unless every earlier start failed before its agent existed
    /// (`failed_before_start`) and fewer than [`MAX_START_ATTEMPTS`] were made.
    pub fn insert(&self, run: &NewRun<'_>) -> Result<bool, RecordsError> {
        let conn = self.conn();
        // Single use must survive power loss: whatever set_running left the connection at.
        conn.execute_batch("PRAGMA synchronous = FULL")?;
        let inserted = conn.execute(
            "INSERT OR IGNORE INTO runs (run_id, owner, subject, receipt, state, host_id, created_at, expires_at, parent_run_id, depth)
             VALUES (?1, ?2, ?3, ?4, 'starting', ?5, ?6, ?7, ?8, ?9)",
            params![run.run_id, run.owner, run.subject, run.receipt, run.host_id, run.now, run.expires_at, run.parent_run_id, run.depth],
        )?;
        if inserted == 1 {
            return Ok(true);
        }
        // Every earlier try failed before the agent existed: this one may go, unless the tries
        // are used up. The row turns `starting` in the same statement, so two starts of one
        // receipt can never both pass.
        let retried = conn.execute(
            "UPDATE runs SET state = 'starting', host_id = ?2, created_at = ?3, ended_at = NULL,
                 report = NULL, attempts = attempts + 1
             WHERE run_id = ?1 AND state = 'failed_before_start' AND attempts < ?4",
            params![run.run_id, run.host_id, run.now, MAX_START_ATTEMPTS],
        )?;
        Ok(retried == 1)
    }

    /// Marks a run running. Committed without waiting for the disk: after a crash,
    /// `starting` and `running` are both swept as `lost`, so losing this update changes
    /// nothing, and it is on every run's start. The next durable commit carries it.
    pub fn set_running(&self, run_id: &str) -> Result<(), RecordsError> {
        let conn = self.conn();
        conn.execute_batch("PRAGMA synchronous = NORMAL")?;
        let updated = conn.execute(
            "UPDATE runs SET state = 'running' WHERE run_id = ?1 AND state = 'starting'",
            params![run_id],
        );
        // Every other write stays durable, even if the update failed.
        conn.execute_batch("PRAGMA synchronous = FULL")?;
        updated?;
        Ok(())
    }

    /// Moves a live run's recorded expiry (an amendment extended it, or a narrowing brought
    /// it forward), so listings and a later restart see the one in force.
    pub fn set_expiry(&self, run_id: &str, expires_at: i64) -> Result<(), RecordsError> {
        self.conn().execute(
            "UPDATE runs SET expires_at = ?2 WHERE run_id = ?1",
            params![run_id, expires_at],
        )?;
        Ok(())
    }

    /// Notes (durably) that `run_id` is left running detached, with what re-adopting it
    /// takes (`state`, JSON), or clears it (`None`: re-adopted, or the detach did not happen).
    pub fn set_detached(&self, run_id: &str, state: Option<&str>) -> Result<(), RecordsError> {
        self.conn().execute(
            "UPDATE runs SET detached = ?2 WHERE run_id = ?1 AND state = 'running'",
            params![run_id, state],
        )?;
        Ok(())
    }

    /// Records the end of a run with its report.
    pub fn finish(
        &self,
        run_id: &str,
        state: RunState,
        report: &TeardownReport,
        now: i64,
    ) -> Result<(), RecordsError> {
        let mut outcome = self.finish_all(&[(run_id, state, report)], now);
        outcome.pop().unwrap_or(Ok(()))
    }

    /// Records the ends of several runs with their reports, in one durable transaction with
    /// every end queued meanwhile (see `commit_finishes`); one outcome per run, in order.
    pub fn finish_all(
        &self,
        ends: &[(&str, RunState, &TeardownReport)],
        now: i64,
    ) -> Vec<Result<(), RecordsError>> {
        self.finishing.finish_all(&self.conn, ends, now)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}
