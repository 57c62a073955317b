//! The reads: a run, every run, the live ones, a run's subtree, and what start-up needs
//! (the live runs' host ids, the runs left detached).

use rusqlite::{params, OptionalExtension as _};

use super::error::RecordsError;
use super::store::RunRecords;
use super::types::{RunRecord, RunState};

impl RunRecords {
    /// The host id of each run that is not over: `(run id, host id)`. Read once, when the
    /// supervisor starts (see [`crate::host_ids`]); by the `runs_state` index.
    pub fn live_host_ids(&self) -> Result<Vec<(String, u32)>, RecordsError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare("SELECT run_id, host_id FROM runs WHERE state IN ('starting', 'running')")?;
        let ids = stmt.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?;
        Ok(ids.collect::<Result<_, _>>()?)
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

    /// A record from a row of [`Self::COLUMNS`], with its report still as text.
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

    /// The record with its report decoded.
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

    /// The columns every record read selects, in the order `record` reads them.
    pub(super) const COLUMNS: &'static str =
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
}
