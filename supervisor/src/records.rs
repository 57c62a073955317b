//! Durable run records in SQLite: single use of receipts, states, teardown reports.
//!
//! A run's row is inserted (with the receipt) before anything is spawned, and `run_id` is
//! the receipt id and the primary key: a receipt can start at most one sandbox, ever, across
//! restarts. WAL with `synchronous=FULL`, integrity check on open, like the authority.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use rusqlite::{params, Connection, ErrorCode, OptionalExtension as _};
use serde::{Deserialize, Serialize};

/// Where a run is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Admitted and recorded; the sandbox is being built.
    Starting,
    /// The agent is running.
    Running,
    /// The agent exited by itself.
    Exited,
    /// The sandbox could not be built or the agent could not start.
    Failed,
    /// An operator stopped it.
    Stopped,
    /// The receipt expired.
    Expired,
    /// The receipt was revoked.
    Revoked,
    /// A resource limit ended it (memory).
    LimitExceeded,
    /// The shim died unexpectedly.
    ShimDied,
    /// The supervisor shut down.
    SupervisorShutdown,
    /// The supervisor crashed while the run was live; found and swept at the next start.
    Lost,
    /// Its parent run (delegation) ended, and the whole subtree with it.
    ParentEnded,
    /// Its sandbox could not be built for a reason of this host's (a cgroup, the shim, the
    /// agent's exec), before the agent existed: the receipt may be started again (at most
    /// [`MAX_START_ATTEMPTS`] times in all).
    FailedBeforeStart,
}

/// How many times one receipt may try to start while every earlier try failed before its
/// agent existed: enough to ride out a host's hiccup, few enough that a broken host does not
/// turn one receipt into many starts.
pub const MAX_START_ATTEMPTS: u32 = 3;

impl RunState {
    /// Whether the run is over.
    pub fn is_final(self) -> bool {
        !matches!(self, Self::Starting | Self::Running)
    }

    /// Stable lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Exited => "exited",
            Self::Failed => "failed",
            Self::Stopped => "stopped",
            Self::Expired => "expired",
            Self::Revoked => "revoked",
            Self::LimitExceeded => "limit_exceeded",
            Self::ShimDied => "shim_died",
            Self::SupervisorShutdown => "supervisor_shutdown",
            Self::Lost => "lost",
            Self::ParentEnded => "parent_ended",
            Self::FailedBeforeStart => "failed_before_start",
        }
    }

    fn parse(text: &str) -> Self {
        match text {
            "starting" => Self::Starting,
            "running" => Self::Running,
            "exited" => Self::Exited,
            "failed" => Self::Failed,
            "stopped" => Self::Stopped,
            "expired" => Self::Expired,
            "revoked" => Self::Revoked,
            "limit_exceeded" => Self::LimitExceeded,
            "shim_died" => Self::ShimDied,
            "supervisor_shutdown" => Self::SupervisorShutdown,
            "parent_ended" => Self::ParentEnded,
            "failed_before_start" => Self::FailedBeforeStart,
            _ => Self::Lost,
        }
    }
}

/// What teardown found and did, recorded when a run ends.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TeardownReport {
    /// Why the run ended, in words.
    pub reason: String,
    /// Milliseconds from admission to the end of teardown.
    pub duration_ms: u64,
    /// The agent's exit code, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that killed the agent, when one did.
    pub signal: Option<i32>,
    /// Peak memory of the run's cgroup, when the kernel reports it.
    pub peak_memory_bytes: Option<u64>,
    /// The last gateway tool call (filled once the gateway exists).
    pub last_tool_call_id: Option<String>,
    /// Model routes the run used (those of `route_usage`).
    pub routes_used: Vec<String>,
    /// Whether relayed output hit the receipt's output limit.
    pub output_truncated: bool,
    /// Problems teardown met (a cgroup or directory it could not remove), if any.
    pub cleanup_errors: Vec<String>,
    /// The Landlock ABI version the agent ran under (none when it never started).
    #[serde(default)]
    pub landlock_abi: Option<u32>,
    /// The sandbox's cgroup, relative to each hierarchy's root (none when it had none).
    #[serde(default)]
    pub cgroup: Option<String>,
    /// What the run spent on each model route it used.
    #[serde(default)]
    pub route_usage: Vec<RouteUsage>,
    /// Where the run's `/work` was kept after it ended (its receipt's
    /// `workspace_keep_seconds`); none when it was removed.
    #[serde(default)]
    pub workspace: Option<String>,
    /// Until when (unix seconds).
    #[serde(default)]
    pub workspace_kept_until: Option<u64>,
    /// The receipt's `workspace_keep_seconds` (0: the workspace goes at teardown).
    #[serde(default)]
    pub workspace_keep_seconds: u64,
}

/// One model route's use by one run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteUsage {
    /// The route's name.
    pub route: String,
    /// Model calls that went out on it.
    pub calls: u64,
    /// Prompt tokens charged.
    pub prompt_tokens: u64,
    /// Completion tokens charged.
    pub completion_tokens: u64,
}

/// One run as recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    /// The run id (= receipt id).
    pub run_id: String,
    /// The receipt's owner.
    pub owner: String,
    /// The receipt's subject.
    pub subject: String,
    /// The state.
    pub state: RunState,
    /// The host uid/gid of the sandbox.
    pub host_id: u32,
    /// Unix seconds.
    pub created_at: i64,
    /// Unix seconds, when it ended.
    pub ended_at: Option<i64>,
    /// The receipt's expiry, Unix seconds.
    pub expires_at: i64,
    /// The teardown report, once ended.
    pub report: Option<TeardownReport>,
    /// The run that delegated this one, for a child run.
    pub parent_run_id: Option<String>,
    /// Delegation depth: 0 for a run an operator started.
    pub depth: u32,
}

/// A records operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RecordsError {
    /// The database is damaged; never reset.
    #[error(
        "database {path} is corrupt ({detail}); refusing to start: restore it or move it aside"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What SQLite said.
        detail: String,
    },
    /// Any other SQLite failure.
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The database file (or its `-wal`/`-shm`) could not be created or made private.
    #[error("database {path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// A stored report does not decode.
    #[error("stored report of run {0} is unreadable")]
    Report(String),
    /// The database was written by a newer supervisor.
    #[error("database {path} has schema version {found}, newer than this supervisor's {known}; run the newer supervisor or move the database aside")]
    NewerSchema {
        /// The file.
        path: PathBuf,
        /// Its `user_version`.
        found: i64,
        /// The newest this binary knows.
        known: i64,
    },
}

/// Schema migrations, in order; `PRAGMA user_version` counts how many have been applied.
/// Version 1 is the original table (created with `IF NOT EXISTS`, so databases from before
/// versioning adopt it unchanged).
const MIGRATIONS: [&str; 4] = [
    "CREATE TABLE IF NOT EXISTS runs (
    run_id     TEXT PRIMARY KEY,
    owner      TEXT NOT NULL,
    subject    TEXT NOT NULL,
    receipt    BLOB NOT NULL,
    state      TEXT NOT NULL,
    host_id    INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    ended_at   INTEGER,
    expires_at INTEGER NOT NULL,
    report     TEXT
);
CREATE INDEX IF NOT EXISTS runs_state ON runs(state);",
    // Delegation: a child run points at the run whose gateway started it.
    "ALTER TABLE runs ADD COLUMN parent_run_id TEXT;
ALTER TABLE runs ADD COLUMN depth INTEGER NOT NULL DEFAULT 0;
CREATE INDEX runs_parent ON runs(parent_run_id) WHERE parent_run_id IS NOT NULL;",
    // Starts that failed before the agent existed may be tried again: count the tries.
    "ALTER TABLE runs ADD COLUMN attempts INTEGER NOT NULL DEFAULT 1;",
    // Live restore: what the next supervisor needs to re-adopt a run left running detached.
    "ALTER TABLE runs ADD COLUMN detached TEXT;",
];

/// The supervisor's database.
#[derive(Debug)]
pub struct RunRecords {
    path: PathBuf,
    conn: Mutex<Connection>,
    /// Final records waiting to be written: whoever next holds the connection commits every
    /// one queued in one durable transaction (see [`RunRecords::finish`]).
    finishing: Mutex<Vec<Finish>>,
}

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

/// A new run to record.
#[derive(Debug, Clone)]
pub struct NewRun<'a> {
    /// Run id (= receipt id).
    pub run_id: &'a str,
    /// Owner.
    pub owner: &'a str,
    /// Subject.
    pub subject: &'a str,
    /// The signed receipt's bytes.
    pub receipt: &'a [u8],
    /// The sandbox's host id.
    pub host_id: u32,
    /// Unix seconds.
    pub now: i64,
    /// The receipt's expiry.
    pub expires_at: i64,
    /// The run that delegated this one (a child run), if any.
    pub parent_run_id: Option<&'a str>,
    /// Delegation depth (0 for an operator's run).
    pub depth: u32,
}

/// Applies the migrations `conn` lacks, each in its own transaction with its version bump.
fn migrate(conn: &mut Connection, path: &Path) -> Result<(), RecordsError> {
    let known = MIGRATIONS.len() as i64;
    let found: i64 = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    if found > known {
        return Err(RecordsError::NewerSchema {
            path: path.to_owned(),
            found,
            known,
        });
    }
    for (version, migration) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        let tx = conn.transaction()?;
        tx.execute_batch(migration)?;
        tx.execute_batch(&format!("PRAGMA user_version = {}", version + 1))?;
        tx.commit()?;
    }
    Ok(())
}

/// Makes `path` mode 0600: every receipt is in the database. With `create`, creates it first
/// if absent (so SQLite never creates it with the umask's mode; SQLite gives `-wal` and `-shm`
/// the database's mode). Without, a missing file is fine.
fn make_private(path: &Path, create: bool) -> Result<(), RecordsError> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let file_error = |source| RecordsError::File {
        path: path.to_owned(),
        source,
    };
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .write(create)
        .create(create)
        .truncate(false)
        .mode(0o600)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if !create && e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(file_error(e)),
    };
    // The mode given to open() is filtered by the umask, and an older file keeps its own.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(file_error)
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
    for finish in &group {
        let updated = tx
            .execute(
                "UPDATE runs SET state = ?2, ended_at = ?3, report = ?4, detached = NULL WHERE run_id = ?1",
                params![finish.run_id, finish.state.name(), finish.now, finish.report],
            )
            .map(|_| ());
        outcomes.push(updated);
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
            finishing: Mutex::default(),
        })
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
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

    /// The host id of each run that is not over: `(run id, host id)`. Read once, when the
    /// supervisor starts (see [`crate::host_ids`]); by the `runs_state` index.
    pub fn live_host_ids(&self) -> Result<Vec<(String, u32)>, RecordsError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare("SELECT run_id, host_id FROM runs WHERE state IN ('starting', 'running')")?;
        let ids = stmt.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?;
        Ok(ids.collect::<Result<_, _>>()?)
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

    /// Runs left running detached: `(run_id, signed receipt, detached state)`.
    pub fn detached(&self) -> Result<Vec<(String, Vec<u8>, String)>, RecordsError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT run_id, receipt, detached FROM runs WHERE state = 'running' AND detached IS NOT NULL",
        )?;
        let rows = stmt.query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
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
        let mut outcomes: Vec<Result<(), RecordsError>> = Vec::with_capacity(ends.len());
        let mut queued = Vec::with_capacity(ends.len());
        for &(run_id, state, report) in ends {
            let Ok(report) = serde_json::to_string(report) else {
                outcomes.push(Err(RecordsError::Report(run_id.into())));
                queued.push(None);
                continue;
            };
            let done = Arc::new(OnceLock::new());
            self.finishing
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
        let mut conn = self.conn();
        // Queued before the connection was taken: either a holder before us committed them
        // (and set `done` before letting go of the connection), or they are still queued and
        // this call commits them, with every other one queued meanwhile.
        if queued.iter().flatten().any(|done| done.get().is_none()) {
            let group =
                std::mem::take(&mut *self.finishing.lock().unwrap_or_else(|p| p.into_inner()));
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

    fn record(row: &rusqlite::Row<'_>) -> rusqlite::Result<(RunRecord, Option<String>)> {
        Ok((
            RunRecord {
                run_id: row.get(0)?,
                owner: row.get(1)?,
                subject: row.get(2)?,
                state: RunState::parse(&row.get::<_, String>(3)?),
                host_id: row.get(4)?,
                created_at: row.get(5)?,
                ended_at: row.get(6)?,
                expires_at: row.get(7)?,
                report: None,
                parent_run_id: row.get(9)?,
                depth: row.get(10)?,
            },
            row.get(8)?,
        ))
    }

    fn with_report(
        (mut record, report): (RunRecord, Option<String>),
    ) -> Result<RunRecord, RecordsError> {
        if let Some(text) = report {
            record.report = Some(
                serde_json::from_str(&text)
                    .map_err(|_| RecordsError::Report(record.run_id.clone()))?,
            );
        }
        Ok(record)
    }

    const COLUMNS: &'static str =
        "run_id, owner, subject, state, host_id, created_at, ended_at, expires_at, report, parent_run_id, depth";

    /// One run.
    pub fn get(&self, run_id: &str) -> Result<Option<RunRecord>, RecordsError> {
        let row = self
            .conn()
            .query_row(
                &format!("SELECT {} FROM runs WHERE run_id = ?1", Self::COLUMNS),
                params![run_id],
                Self::record,
            )
            .optional()?;
        row.map(Self::with_report).transpose()
    }

    /// Every run, newest first.
    pub fn list(&self) -> Result<Vec<RunRecord>, RecordsError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(&format!(
            "SELECT {} FROM runs ORDER BY created_at DESC, run_id DESC",
            Self::COLUMNS
        ))?;
        let rows = stmt.query_map([], Self::record)?;
        rows.map(|row| Self::with_report(row?)).collect()
    }

    /// Runs that are not over (`starting`, `running`), newest first: by the `runs_state`
    /// index, so the cost follows the live runs, not every run ever recorded.
    pub fn list_live(&self) -> Result<Vec<RunRecord>, RecordsError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(&format!(
            "SELECT {} FROM runs WHERE state IN ('starting', 'running')
             ORDER BY created_at DESC, run_id DESC",
            Self::COLUMNS
        ))?;
        let rows = stmt.query_map([], Self::record)?;
        rows.map(|row| Self::with_report(row?)).collect()
    }

    /// `run_id` and every run it delegated, transitively, in pre-order (a parent before its
    /// children, siblings oldest first). Empty when `run_id` is unknown.
    pub fn subtree(&self, run_id: &str) -> Result<Vec<RunRecord>, RecordsError> {
        let conn = self.conn();
        // The path of creation keys orders the walk depth-first; ids break ties.
        let columns: String = Self::COLUMNS
            .split(", ")
            .map(|c| format!("r.{c}"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut stmt = conn.prepare(&format!(
            "WITH RECURSIVE tree(run_id, key) AS (
                 SELECT run_id, printf('%020d/%s', created_at, run_id) FROM runs WHERE run_id = ?1
                 UNION ALL
                 SELECT c.run_id, tree.key || '|' || printf('%020d/%s', c.created_at, c.run_id)
                 FROM runs c JOIN tree ON c.parent_run_id = tree.run_id
             )
             SELECT {columns} FROM tree JOIN runs r ON r.run_id = tree.run_id ORDER BY tree.key"
        ))?;
        let rows = stmt.query_map(params![run_id], Self::record)?;
        rows.map(|row| Self::with_report(row?)).collect()
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs ending at once (a supervisor's stop) share commits: each caller returns only
    /// once its own record is written, whichever caller committed it.
    #[test]
    fn final_records_written_together_are_each_written() {
        let dir = tempfile::tempdir().unwrap();
        let records = RunRecords::open(&dir.path().join("supervisor.db")).unwrap();
        let ids: Vec<String> = (0..64).map(|i| format!("r{i}")).collect();
        for (i, id) in ids.iter().enumerate() {
            let run = NewRun {
                run_id: id,
                owner: "admin",
                subject: "s",
                receipt: id.as_bytes(),
                host_id: 200_000 + i as u32,
                now: 10,
                expires_at: 100,
                parent_run_id: None,
                depth: 0,
            };
            assert!(records.insert(&run).unwrap());
        }
        std::thread::scope(|scope| {
            for id in &ids {
                let records = &records;
                scope.spawn(move || {
                    let report = TeardownReport {
                        reason: format!("{id} ended"),
                        ..Default::default()
                    };
                    records
                        .finish(id, RunState::SupervisorShutdown, &report, 20)
                        .unwrap();
                    // Written when `finish` returns, not later.
                    let record = records.get(id).unwrap().unwrap();
                    assert_eq!(record.state, RunState::SupervisorShutdown, "{id}");
                    assert_eq!(record.report.unwrap().reason, format!("{id} ended"));
                });
            }
        });
        assert!(records.live_host_ids().unwrap().is_empty());
    }

    #[test]
    fn a_receipt_is_recorded_once_and_survives_reopen() {
        let dir = std::env::temp_dir().join(format!("tollgate-records-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("supervisor.db");
        let records = RunRecords::open(&path).unwrap();
        let run = NewRun {
            run_id: "r1",
            owner: "admin",
            subject: "s",
            receipt: b"bytes",
            host_id: 200_000,
            now: 10,
            expires_at: 100,
            parent_run_id: None,
            depth: 0,
        };
        assert!(records.insert(&run).unwrap());
        assert!(!records.insert(&run).unwrap(), "second use refused");
        assert_eq!(
            records.live_host_ids().unwrap(),
            vec![("r1".to_owned(), 200_000)]
        );
        records.set_running("r1").unwrap();
        let report = TeardownReport {
            reason: "agent exited".into(),
            exit_code: Some(0),
            ..Default::default()
        };
        records.finish("r1", RunState::Exited, &report, 20).unwrap();
        drop(records);
        let records = RunRecords::open(&path).unwrap();
        assert!(
            !records.insert(&run).unwrap(),
            "still refused after a restart"
        );
        let got = records.get("r1").unwrap().unwrap();
        assert_eq!(got.state, RunState::Exited);
        assert_eq!(got.report.unwrap(), report);
        assert!(records.live_host_ids().unwrap().is_empty());
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn temp_db(name: &str) -> (PathBuf, PathBuf) {
        let dir =
            std::env::temp_dir().join(format!("tollgate-records-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("supervisor.db");
        (dir, path)
    }

    fn new_run<'a>(id: &'a str, now: i64, parent: Option<&'a str>, depth: u32) -> NewRun<'a> {
        NewRun {
            run_id: id,
            owner: "admin",
            subject: id,
            receipt: b"bytes",
            host_id: 200_000,
            now,
            expires_at: 1000,
            parent_run_id: parent,
            depth,
        }
    }

    #[test]
    fn a_database_from_before_versioning_is_migrated_and_keeps_its_rows() {
        let (dir, path) = temp_db("migrate");
        {
            // What supervisors wrote before migrations: the v1 table, user_version 0.
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(MIGRATIONS[0]).unwrap();
            conn.execute(
                "INSERT INTO runs (run_id, owner, subject, receipt, state, host_id, created_at, expires_at)
                 VALUES ('old', 'admin', 's', x'00', 'exited', 200000, 5, 50)",
                [],
            )
            .unwrap();
        }
        let records = RunRecords::open(&path).unwrap();
        let old = records.get("old").unwrap().unwrap();
        assert_eq!(old.state, RunState::Exited);
        assert_eq!((old.parent_run_id, old.depth), (None, 0));
        drop(records);
        // Reopening applies nothing twice.
        let records = RunRecords::open(&path).unwrap();
        assert!(records.insert(&new_run("new", 6, Some("old"), 1)).unwrap());
        drop(records);
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("PRAGMA user_version = 99").unwrap();
        drop(conn);
        let newer = RunRecords::open(&path).unwrap_err();
        assert!(
            matches!(newer, RecordsError::NewerSchema { found: 99, .. }),
            "{newer}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn live_runs_are_listed_without_the_ended_ones_newest_first() {
        let (dir, path) = temp_db("live");
        let records = RunRecords::open(&path).unwrap();
        for run in [
            new_run("old", 10, None, 0),
            new_run("starting", 12, None, 0),
            new_run("running", 11, None, 0),
        ] {
            assert!(records.insert(&run).unwrap());
        }
        records.set_running("running").unwrap();
        records
            .finish("old", RunState::Exited, &TeardownReport::default(), 13)
            .unwrap();
        let ids =
            |runs: Vec<RunRecord>| -> Vec<String> { runs.into_iter().map(|r| r.run_id).collect() };
        assert_eq!(ids(records.list_live().unwrap()), ["starting", "running"]);
        assert_eq!(ids(records.list().unwrap()), ["starting", "running", "old"]);
        // The listing reads the state index, not the whole table.
        let plan: String = records
            .conn()
            .query_row(
                &format!(
                    "EXPLAIN QUERY PLAN SELECT {} FROM runs WHERE state IN ('starting', 'running')
                     ORDER BY created_at DESC, run_id DESC",
                    RunRecords::COLUMNS
                ),
                [],
                |row| row.get(3),
            )
            .unwrap();
        assert!(plan.contains("runs_state"), "{plan}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_subtree_lists_parents_before_children_and_siblings_oldest_first() {
        let (dir, path) = temp_db("subtree");
        let records = RunRecords::open(&path).unwrap();
        for run in [
            new_run("root", 10, None, 0),
            new_run("b", 12, Some("root"), 1),
            new_run("a", 11, Some("root"), 1),
            new_run("a1", 13, Some("a"), 2),
            new_run("other", 9, None, 0),
            new_run("b1", 14, Some("b"), 2),
        ] {
            assert!(records.insert(&run).unwrap());
        }
        let order = |id: &str| -> Vec<String> {
            records
                .subtree(id)
                .unwrap()
                .into_iter()
                .map(|r| r.run_id)
                .collect()
        };
        assert_eq!(order("root"), ["root", "a", "a1", "b", "b1"]);
        assert_eq!(order("a"), ["a", "a1"]);
        assert!(order("missing").is_empty());
        let b1 = records.get("b1").unwrap().unwrap();
        assert_eq!((b1.parent_run_id.as_deref(), b1.depth), (Some("b"), 2));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
