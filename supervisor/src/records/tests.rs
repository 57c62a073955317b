//! The records' tests: group commit, single use, migrations and the queries.

use std::path::PathBuf;

use rusqlite::Connection;

use super::schema::MIGRATIONS;
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
    let dir = std::env::temp_dir().join(format!("tollgate-records-{name}-{}", std::process::id()));
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
