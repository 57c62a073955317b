//! Load on the real daemons (root): a supervisor sustains 50 concurrent sandboxes started by
//! concurrent clients, and a burst of 200 `StartRun` calls ends with every run accounted for
//! (started once, never twice, ended, torn down) and nothing left behind.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use tollgate_proto::v1 as pb;
use tollgate_tests::{authed, leftovers, require_root, AuthorityProcess, SupervisorProcess};

fn spec(script: &str) -> pb::MintReceiptRequest {
    pb::MintReceiptRequest {
        subject: "stress".into(),
        ttl_seconds: 300,
        audience: vec!["workstation".into()],
        agent: Some(pb::AgentSpec {
            argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
            ..Default::default()
        }),
        limits: Some(pb::Limits {
            memory_bytes: 64 << 20,
            pids: 16,
            ..Default::default()
        }),
        exec: vec!["/bin/sh".into(), "/usr/bin/sleep".into()],
        ..Default::default()
    }
}

async fn mint_many(
    authority: &AuthorityProcess,
    script: &str,
    count: usize,
) -> Vec<(String, String)> {
    let token = authority.admin_token();
    let mut client = authority.client().await;
    let mut minted = Vec::with_capacity(count);
    for _ in 0..count {
        let reply = client
            .mint_receipt(authed(&token, spec(script)))
            .await
            .unwrap()
            .into_inner();
        minted.push((reply.text, reply.receipt.unwrap().receipt_id));
    }
    minted
}

/// Starts every receipt at once, each from its own client connection; returns each start's
/// outcome (the run id, or the refusal).
async fn start_all(
    supervisor: &SupervisorProcess,
    receipts: Vec<(String, String)>,
) -> Vec<(String, Result<String, tonic::Status>)> {
    let token = supervisor.token();
    let mut tasks = Vec::new();
    for (text, receipt_id) in receipts {
        let mut client = supervisor.client().await;
        let token = token.clone();
        tasks.push(tokio::spawn(async move {
            let started = client
                .start_run(authed(
                    &token,
                    pb::StartRunRequest {
                        receipt: text,
                        argv: Vec::new(),
                        ..Default::default()
                    },
                ))
                .await
                .map(|r| r.into_inner().run_id);
            (receipt_id, started)
        }));
    }
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    outcomes
}

async fn runs(supervisor: &SupervisorProcess) -> Vec<pb::Run> {
    supervisor
        .client()
        .await
        .list_runs(authed(&supervisor.token(), pb::ListRunsRequest::default()))
        .await
        .unwrap()
        .into_inner()
        .runs
}

/// Waits until none of `ids` is live any more; returns their final records.
async fn wait_ended(
    supervisor: &SupervisorProcess,
    ids: &HashSet<String>,
    limit: Duration,
) -> Vec<pb::Run> {
    let deadline = Instant::now() + limit;
    loop {
        let mine: Vec<pb::Run> = runs(supervisor)
            .await
            .into_iter()
            .filter(|r| ids.contains(&r.run_id))
            .collect();
        if mine.len() == ids.len() && mine.iter().all(|r| r.report.is_some()) {
            return mine;
        }
        assert!(Instant::now() < deadline, "runs still live after {limit:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_sandboxes_then_a_burst_of_two_hundred_starts() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let supervisor = SupervisorProcess::start_with_capacity(
        &dir.path().join("supervisor"),
        authority.addr(),
        "stress",
        204_000,
        256,
    );

    // 50 at once, each alive until all 50 have been seen running together.
    let receipts = mint_many(&authority, "sleep 8", 50).await;
    let outcomes = start_all(&supervisor, receipts).await;
    let mut ids = HashSet::new();
    for (receipt_id, started) in &outcomes {
        let run_id = started
            .as_ref()
            .unwrap_or_else(|e| panic!("{receipt_id}: {e:?}"));
        assert_eq!(run_id, receipt_id);
        assert!(ids.insert(run_id.clone()), "started twice: {run_id}");
    }
    let live = runs(&supervisor)
        .await
        .into_iter()
        .filter(|r| ids.contains(&r.run_id) && r.state == pb::RunState::Running as i32)
        .count();
    assert_eq!(live, 50, "all 50 sandboxes run at the same time");
    let ended = wait_ended(&supervisor, &ids, Duration::from_secs(60)).await;
    for run in &ended {
        let report = run.report.as_ref().unwrap();
        assert_eq!(report.exit_code, Some(0), "{run:?}");
        assert!(report.cleanup_errors.is_empty(), "{run:?}");
    }

    // A burst of 200 starts from 200 clients: every run accounted for, once.
    let receipts = mint_many(&authority, "exit 0", 200).await;
    let outcomes = start_all(&supervisor, receipts).await;
    let mut ids = HashSet::new();
    let mut refused = Vec::new();
    for (receipt_id, started) in outcomes {
        match started {
            Ok(run_id) => {
                assert_eq!(run_id, receipt_id);
                assert!(ids.insert(run_id), "started twice");
            }
            Err(status) => refused.push(format!("{receipt_id}: {status:?}")),
        }
    }
    assert!(
        refused.is_empty(),
        "{} starts refused: {refused:?}",
        refused.len()
    );
    let ended = wait_ended(&supervisor, &ids, Duration::from_secs(120)).await;
    assert_eq!(ended.len(), 200);
    assert!(ended
        .iter()
        .all(|r| r.report.as_ref().unwrap().exit_code == Some(0)));
    // Nothing left: no run directory, and no cgroup but (at most) the one warm sandbox.
    let left = leftovers(supervisor.data_dir(), &supervisor.cgroup_parent);
    assert!(left.is_empty(), "left behind: {left:?}");
}
