//! Delegation end to end (root): the real authority, a real supervisor with a delegation
//! token, and agents in real sandboxes asking their gateway for children with
//! `tollgate-shim child`. A child within its parent's scope runs; anything wider, deeper or
//! longer is refused naming the grant; a planted link cannot widen a child; and whatever
//! ends a parent ends its whole subtree within a second.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use tollgate_proto::v1 as pb;
use tollgate_tests::{
    authed, bin_path, leftovers, require_root, AuthorityProcess, SupervisorProcess,
};

/// One authority and one supervisor enrolled for delegation.
struct Tree {
    dir: tempfile::TempDir,
    authority: AuthorityProcess,
    supervisor: SupervisorProcess,
}

impl Tree {
    async fn start(test: &str, host_id_base: u32) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let authority = AuthorityProcess::start(&dir.path().join("authority"));
        let supervisor = SupervisorProcess::start_delegating(
            &dir.path().join("supervisor"),
            &authority,
            test,
            host_id_base,
        )
        .await;
        Self {
            dir,
            authority,
            supervisor,
        }
    }

    /// Mints a root receipt running `script` under /bin/sh, allowed to delegate `depth`
    /// levels, with `fs` grants.
    async fn mint(&self, script: &str, ttl: u64, depth: u32, fs: Vec<pb::FsGrant>) -> String {
        self.mint_with(script, ttl, depth, fs, pb::Limits::default())
            .await
    }

    /// [`Self::mint`] with `limits` (tool_calls 200 unless set).
    async fn mint_with(
        &self,
        script: &str,
        ttl: u64,
        depth: u32,
        fs: Vec<pb::FsGrant>,
        limits: pb::Limits,
    ) -> String {
        let request = pb::MintReceiptRequest {
            subject: "orchestrator".into(),
            ttl_seconds: ttl,
            audience: vec!["workstation".into()],
            agent: Some(pb::AgentSpec {
                argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
                ..Default::default()
            }),
            exec: vec![
                "/bin/sh".into(),
                "/usr/bin/sleep".into(),
                "/usr/bin/cat".into(),
                "/usr/bin/ln".into(),
            ],
            limits: Some(pb::Limits {
                tool_calls: if limits.tool_calls == 0 {
                    200
                } else {
                    limits.tool_calls
                },
                ..limits
            }),
            fs,
            delegate: Some(pb::Delegation {
                max_depth: depth,
                ask: false,
            }),
            ..Default::default()
        };
        self.authority
            .client()
            .await
            .mint_receipt(authed(&self.authority.admin_token(), request))
            .await
            .unwrap()
            .into_inner()
            .text
    }

    async fn start_run(&self, text: String) -> String {
        self.supervisor.start_run(text).await
    }

    /// Starts a run and waits for its end: its id, the ended run and everything it printed.
    async fn run_to_end(&self, text: String) -> (String, pb::Run, String) {
        let run_id = self.start_run(text).await;
        let run = self
            .supervisor
            .wait_ended(&run_id, Duration::from_secs(60))
            .await;
        let output = self.output(&run_id).await;
        (run_id, run, output)
    }

    async fn tree(&self, run_id: &str) -> pb::RunTree {
        self.supervisor
            .client()
            .await
            .get_run_tree(authed(
                &self.supervisor.token(),
                pb::GetRunTreeRequest {
                    run_id: run_id.into(),
                },
            ))
            .await
            .unwrap()
            .into_inner()
    }

    /// Waits until `run_id`'s tree has `count` runs, all running.
    async fn wait_running(&self, run_id: &str, count: usize) -> pb::RunTree {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let tree = self.tree(run_id).await;
            let running = tree
                .runs
                .iter()
                .filter(|r| r.state == pb::RunState::Running as i32)
                .count();
            if running == count {
                return tree;
            }
            let ended: Vec<_> = tree.runs.iter().filter(|r| r.report.is_some()).collect();
            assert!(
                ended.is_empty() && Instant::now() < deadline,
                "tree of {run_id} never had {count} running runs: {:?}\n{}",
                tree.runs,
                self.output(run_id).await
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A receipt as the authority stored it (admin view).
    async fn receipt(&self, receipt_id: &str) -> pb::GetReceiptResponse {
        self.authority
            .client()
            .await
            .get_receipt(authed(
                &self.authority.admin_token(),
                pb::GetReceiptRequest {
                    receipt_id: receipt_id.into(),
                },
            ))
            .await
            .unwrap()
            .into_inner()
    }

    /// Everything a run printed (it must have ended or end).
    async fn output(&self, run_id: &str) -> String {
        self.supervisor.output(run_id).await
    }

    fn tollgate(&self, args: &[&str]) -> std::process::Output {
        Command::new(bin_path("tollgate"))
            .args(["--supervisor", self.supervisor.addr()])
            .arg("--token-file")
            .arg(self.supervisor.token_file())
            .args(args)
            .output()
            .unwrap()
    }

    fn assert_clean(&self) {
        let left = leftovers(self.supervisor.data_dir(), &self.supervisor.cgroup_parent);
        assert!(left.is_empty(), "left behind: {left:?}");
    }
}

fn grant(path: &Path, access: pb::FsAccess, mount: &str) -> pb::FsGrant {
    pb::FsGrant {
        path: path.display().to_string(),
        access: access as i32,
        mount: mount.into(),
        exec: false,
        ask: false,
        ask_reads: false,
    }
}

fn state(run: &pb::Run) -> pb::RunState {
    pb::RunState::try_from(run.state).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_delegates_starts_and_watches_a_child_within_its_scope() {
    if !require_root() {
        return;
    }
    let tree = Tree::start("deleg-ok", 208_000).await;
    let project = tree.dir.path().join("project");
    std::fs::create_dir_all(project.join("out")).unwrap();
    let p = project.display();
    // The child may write only project/out, through the gateway; it writes there and says so.
    let script = format!(
        r#"cat > /tmp/spec <<EOF
{{"subject": "writer", "fs": [{{"path": "{p}/out", "access": "write"}}], "exec": ["/bin/sh"],
  "agent": {{"argv": ["/bin/sh", "-c", "printf from-child | tollgate-shim tool write {p}/out/c.txt --create && echo child-wrote; tollgate-shim child stop $TOLLGATE_RUN_ID 2>&1; echo stop-parent rc=\$?; tollgate-shim child watch $TOLLGATE_RUN_ID 2>&1; echo watch-parent rc=\$?"]}}}}
EOF
tollgate-shim child delegate < /tmp/spec > /tmp/id || exit 11
read id < /tmp/id
tollgate-shim child start "$id" || exit 12
tollgate-shim child watch "$id"; echo "watch rc=$?"
tollgate-shim child start "$id" 2>&1; echo "again rc=$?"
tollgate-shim child start 0193f1c3-0000-7000-8000-000000000000 2>&1; echo "unknown rc=$?"
tollgate-shim child stop "$TOLLGATE_RUN_ID" 2>&1; echo "stop-self rc=$?"
tollgate-shim child list --json
echo "child $id"
"#
    );
    let text = tree
        .mint(
            &script,
            120,
            2,
            vec![grant(&project, pb::FsAccess::Write, "")],
        )
        .await;
    let (run_id, parent, output) = tree.run_to_end(text).await;
    assert_eq!(state(&parent), pb::RunState::Exited, "{output}");
    assert_eq!(
        parent.report.as_ref().unwrap().exit_code,
        Some(0),
        "{output}"
    );
    let child_id = output
        .lines()
        .find_map(|l| l.strip_prefix("child "))
        .expect("child id")
        .to_owned();
    assert!(output.contains("child-wrote\n"), "{output}");
    assert!(output.contains("watch rc=0\n"), "{output}");
    // A run reaches only its own descendants: not its parent, not itself.
    for (what, rc) in [("stop-parent", 1), ("watch-parent", 1), ("stop-self", 1)] {
        assert!(
            output.contains(&format!("{what} rc={rc}")),
            "{what}: {output}"
        );
    }
    assert_eq!(
        output.matches("is not a descendant of this run").count(),
        3,
        "{output}"
    );
    assert!(
        output.contains("already started") && output.contains("again rc=1"),
        "{output}"
    );
    assert!(
        output.contains("no child receipt") && output.contains("unknown rc=1"),
        "{output}"
    );
    assert_eq!(
        std::fs::read_to_string(project.join("out/c.txt")).unwrap(),
        "from-child"
    );

    // The tree: the parent, then its child, both ended; the child knows its parent.
    let listed = tree.tollgate(&["tree", &run_id, "--json"]);
    assert!(listed.status.success(), "{listed:?}");
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0]["run_id"], run_id.as_str());
    assert_eq!(rows[1]["run_id"], child_id.as_str());
    assert_eq!(rows[1]["parent_run_id"], run_id.as_str());
    assert_eq!(rows[1]["depth"], 1);
    assert_eq!(rows[1]["state"], "exited");
    assert_eq!(rows[1]["exit_code"], 0);
    let drawn = tree.tollgate(&["tree", &run_id]);
    let drawn = String::from_utf8_lossy(&drawn.stdout).into_owned();
    assert!(drawn.contains(&format!("└── {child_id}")), "{drawn}");

    // The child's receipt: narrower, chained, never longer than its parent.
    let receipts = tree.receipt(&child_id).await;
    let child = receipts.receipt.unwrap();
    assert_eq!(child.parent_receipt_id, run_id);
    assert_eq!(child.depth, 1);
    assert_eq!(child.audience, ["workstation"]);
    assert_eq!(child.owner, "admin");
    assert!(child.expires_at.unwrap().seconds <= parent.expires_at.unwrap().seconds);
    // Carved: half of what the parent had left when it asked (one call kept for the start;
    // its output so far is small).
    let calls = child.limits.unwrap().tool_calls;
    assert!((90..=100).contains(&calls), "carved {calls} tool calls");
    let parent_receipt = tree.receipt(&run_id).await.receipt.unwrap();
    let (parent_output, carved_output) = (
        parent_receipt.limits.unwrap().output_bytes,
        child.limits.unwrap().output_bytes,
    );
    assert!(
        carved_output <= parent_output / 2 && carved_output > parent_output / 2 - 4096,
        "carved {carved_output} of {parent_output} output bytes"
    );

    // An operator cannot start a delegated receipt: it starts only through its parent.
    let direct = tree
        .supervisor
        .client()
        .await
        .start_run(authed(
            &tree.supervisor.token(),
            pb::StartRunRequest {
                receipt: receipts.text,
                argv: vec![],
                ..Default::default()
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(direct.code(), tonic::Code::PermissionDenied, "{direct:?}");
    assert!(
        direct.message().contains("delegated") && direct.message().contains("parent's gateway"),
        "{direct:?}"
    );

    // The gateway calls are in the parent's audit trail.
    let calls = tree.tollgate(&[
        "calls",
        &run_id,
        tree.supervisor.data_dir().join("audit").to_str().unwrap(),
        "--json",
    ]);
    let calls: Vec<(String, String)> = String::from_utf8_lossy(&calls.stdout)
        .lines()
        .map(|l| {
            let call: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                call["tool"].as_str().unwrap_or_default().to_owned(),
                call["decision"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let seen = |tool: &str, decision: &str| {
        calls
            .iter()
            .filter(|(t, d)| t == tool && d == decision)
            .count()
    };
    assert_eq!(seen("delegate", "allow"), 1, "{calls:?}");
    assert_eq!(seen("child.start", "allow"), 1, "{calls:?}");
    assert_eq!(seen("child.start", "deny"), 2, "{calls:?}");
    assert_eq!(seen("child.watch", "allow"), 1, "{calls:?}");
    assert_eq!(seen("child.stop", "deny"), 1, "{calls:?}");
    assert_eq!(seen("child.list", "allow"), 1, "{calls:?}");
    // The supervisor's delegation token is in none of its logs, nor in the sandbox's output.
    let token = std::fs::read_to_string(tree.supervisor.delegation_token_file()).unwrap();
    let token = token.trim();
    let mut logs = std::fs::read_to_string(tree.supervisor.data_dir().with_extension("stderr"))
        .unwrap_or_default();
    for file in std::fs::read_dir(tree.supervisor.data_dir().join("audit"))
        .unwrap()
        .flatten()
    {
        logs += &String::from_utf8_lossy(&std::fs::read(file.path()).unwrap_or_default());
    }
    logs += &output;
    assert!(!logs.contains(&token[4..]), "the delegation token leaked");
    tree.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_scope_delegations_are_refused_naming_the_grant() {
    if !require_root() {
        return;
    }
    let tree = Tree::start("deleg-refused", 208_100).await;
    let project = tree.dir.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    let p = project.display();
    let ask = |name: &str, spec: &str| {
        format!(
            "echo '{spec}' | tollgate-shim child delegate 2>&1 >/dev/null; echo \"{name} rc=$?\"\n"
        )
    };
    let mut script = String::new();
    script += &ask(
        "wider-fs",
        r#"{"subject": "x", "fs": [{"path": "/etc", "access": "read"}]}"#,
    );
    script += &ask(
        "write-on-read",
        &format!(r#"{{"subject": "x", "fs": [{{"path": "{p}/docs", "access": "write"}}]}}"#),
    );
    script += &ask("exec", r#"{"subject": "x", "exec": ["/usr/bin/id"]}"#);
    script += &ask(
        "mount",
        &format!(
            r#"{{"subject": "x", "fs": [{{"path": "{p}", "access": "read", "mount": "/p"}}]}}"#
        ),
    );
    script += &ask("ttl", r#"{"subject": "x", "ttl_seconds": 100000}"#);
    script += &ask("depth", r#"{"subject": "x", "delegate": {"max_depth": 1}}"#);
    script += &ask(
        "memory",
        r#"{"subject": "x", "limits": {"memory_bytes": 999999999999}}"#,
    );
    script += &ask(
        "calls",
        r#"{"subject": "x", "limits": {"tool_calls": 100000}}"#,
    );
    script += &ask(
        "output",
        r#"{"subject": "x", "limits": {"output_bytes": 999999999999}}"#,
    );
    // A child that may not delegate tries to: refused at its own gateway.
    script += r#"cat > /tmp/leaf <<'EOF'
{"subject": "leaf", "exec": ["/bin/sh"],
 "agent": {"argv": ["/bin/sh", "-c", "echo '{\"subject\": \"y\"}' | tollgate-shim child delegate 2>&1; echo leaf rc=$?"]}}
EOF
tollgate-shim child delegate < /tmp/leaf > /tmp/id || exit 11
read id < /tmp/id
tollgate-shim child start "$id" >/dev/null || exit 12
tollgate-shim child watch "$id"
"#;
    let text = tree
        .mint(
            &script,
            120,
            1,
            vec![grant(&project, pb::FsAccess::Read, "")],
        )
        .await;
    let (run_id, parent, output) = tree.run_to_end(text).await;
    assert_eq!(
        parent.report.as_ref().unwrap().exit_code,
        Some(0),
        "{output}"
    );
    let expect = |name: &str, needle: &str| {
        let at = output
            .find(&format!("{name} rc=1"))
            .unwrap_or_else(|| panic!("{name} was not refused:\n{output}"));
        let before = &output[..at];
        let line = before.lines().last().unwrap_or_default();
        assert!(
            line.contains(needle),
            "{name}: {line:?} lacks {needle:?}\n{output}"
        );
    };
    expect("wider-fs", "fs[0] = /etc (read) is above parent receipt");
    expect("write-on-read", "(write) is above parent receipt");
    expect("exec", "exec[0] = /usr/bin/id is above parent receipt");
    expect("mount", "through the gateway only (no mount)");
    expect("ttl", "ttl_seconds");
    expect("depth", "delegate.max_depth = 1 is above");
    expect("memory", "limits.memory_bytes");
    expect("calls", "tool calls left to hand on");
    expect("output", "bytes of output left to hand on");
    expect("leaf", "delegate needs a delegate grant");
    // Refused delegations minted nothing: the tree holds the parent and the leaf only.
    let runs = tree.tree(&run_id).await.runs;
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(runs[1].subject == "leaf" && runs[1].depth == 1);
    tree.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planted_symlink_or_a_mount_beneath_a_writable_grant_cannot_widen_a_child() {
    if !require_root() {
        return;
    }
    let tree = Tree::start("deleg-link", 208_200).await;
    let project = tree.dir.path().join("project");
    std::fs::create_dir_all(project.join("sub")).unwrap();
    // The agent (its own host uid) plants the link through its writable mount.
    std::fs::set_permissions(&project, std::fs::Permissions::from_mode(0o777)).unwrap();
    let secret = tree.dir.path().join("secret");
    std::fs::create_dir_all(&secret).unwrap();
    std::fs::write(secret.join("key"), "host secret").unwrap();
    let (p, s) = (project.display(), secret.display());
    let script = format!(
        r#"/usr/bin/ln -s {s} /p/link || exit 10
start() {{ echo "$2" | tollgate-shim child delegate > /tmp/id || exit 11; read id < /tmp/id; tollgate-shim child start "$id" 2>&1; echo "$1 rc=$?"; }}
start link '{{"subject": "x", "fs": [{{"path": "{p}/link", "access": "read"}}], "exec": ["/bin/sh"], "agent": {{"argv": ["/bin/sh", "-c", "exit 0"]}}}}'
start mount '{{"subject": "x", "fs": [{{"path": "{p}/sub", "access": "read", "mount": "/sub"}}], "exec": ["/bin/sh"], "agent": {{"argv": ["/bin/sh", "-c", "exit 0"]}}}}'
"#
    );
    let text = tree
        .mint(
            &script,
            120,
            1,
            vec![grant(&project, pb::FsAccess::Write, "/p")],
        )
        .await;
    let (run_id, _, output) = tree.run_to_end(text).await;
    assert!(
        output.contains("grant_escapes") && output.contains("symbolic link is on the path"),
        "{output}"
    );
    assert!(output.contains("link rc=1"), "{output}");
    assert!(
        output.contains("fs[0].mount: a mounted grant beneath the parent's writable grant")
            && output.contains("mount rc=1"),
        "{output}"
    );
    // Neither child ever ran.
    assert_eq!(tree.tree(&run_id).await.runs.len(), 1);
    tree.assert_clean();
}

/// A parent whose child and grandchild both run `sleep`; returns the three run ids once
/// all run. The parent agent exits when `stop_file` appears (through its mounted grant).
async fn three_generations(tree: &Tree, ttl: u64, project: &Path) -> [String; 3] {
    let script = r#"cat > /tmp/child <<'EOF'
{"subject": "child", "exec": ["/bin/sh", "/usr/bin/sleep", "/usr/bin/cat"], "delegate": {"max_depth": 1},
 "agent": {"argv": ["/bin/sh", "-c", "G='{\"subject\": \"grandchild\", \"exec\": [\"/usr/bin/sleep\"], \"agent\": {\"argv\": [\"/usr/bin/sleep\", \"1000\"]}}'; echo \"$G\" | tollgate-shim child delegate > /tmp/id && read id < /tmp/id && tollgate-shim child start $id && exec /usr/bin/sleep 1000"]}}
EOF
tollgate-shim child delegate < /tmp/child > /tmp/id || exit 11
read id < /tmp/id
tollgate-shim child start "$id" || exit 12
while [ ! -e /p/stop ]; do /usr/bin/sleep 0.02; done
"#;
    let text = tree
        .mint(
            script,
            ttl,
            2,
            vec![grant(project, pb::FsAccess::Read, "/p")],
        )
        .await;
    let run_id = tree.start_run(text).await;
    let runs = tree.wait_running(&run_id, 3).await.runs;
    assert_eq!(
        runs.iter().map(|r| r.depth).collect::<Vec<_>>(),
        [0, 1, 2],
        "{runs:?}"
    );
    [
        runs[0].run_id.clone(),
        runs[1].run_id.clone(),
        runs[2].run_id.clone(),
    ]
}

/// Polls every 10 ms from `since` until both descendants have ended; returns how long it took.
async fn cascade_time(tree: &Tree, ids: &[String; 3], since: Instant) -> Duration {
    loop {
        let runs = tree.tree(&ids[0]).await.runs;
        let ended = runs[1..].iter().all(|r| r.report.is_some());
        if ended && runs.len() == 3 {
            return since.elapsed();
        }
        assert!(
            since.elapsed() < Duration::from_secs(10),
            "descendants never ended: {runs:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whatever_ends_a_parent_ends_its_subtree_within_one_second() {
    if !require_root() {
        return;
    }
    let tree = Tree::start("deleg-cascade", 208_300).await;
    for trigger in ["stop", "revoke", "exit"] {
        let project = tree.dir.path().join(format!("project-{trigger}"));
        std::fs::create_dir_all(&project).unwrap();
        let ids = three_generations(&tree, 300, &project).await;
        let since = Instant::now();
        match trigger {
            "stop" => {
                let stopped = tree.tollgate(&["stop", &ids[0], "--reason", "test stop"]);
                assert!(stopped.status.success(), "{stopped:?}");
            }
            "revoke" => {
                tree.authority
                    .client()
                    .await
                    .revoke_receipt(authed(
                        &tree.authority.admin_token(),
                        pb::RevokeReceiptRequest {
                            receipt_id: ids[0].clone(),
                            reason: "test revoke".into(),
                        },
                    ))
                    .await
                    .unwrap();
            }
            _ => std::fs::write(project.join("stop"), "").unwrap(),
        }
        let took = cascade_time(&tree, &ids, since).await;
        let runs = tree.tree(&ids[0]).await.runs;
        assert!(
            took < Duration::from_secs(1),
            "{trigger}: the subtree took {took:?} to end: {runs:?}"
        );
        for child in &runs[1..] {
            assert_eq!(
                state(child),
                pb::RunState::ParentEnded,
                "{trigger}: {child:?}"
            );
        }
        let reason = &runs[1].report.as_ref().unwrap().reason;
        assert!(
            reason.contains(&format!("its parent run {}", ids[0])),
            "{trigger}: {reason}"
        );
        tree.supervisor
            .wait_ended(&ids[0], Duration::from_secs(10))
            .await;
        tree.assert_clean();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_never_outlives_its_parent() {
    if !require_root() {
        return;
    }
    let tree = Tree::start("deleg-expiry", 208_400).await;
    let project = tree.dir.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    let ids = three_generations(&tree, 6, &project).await;
    let runs = tree.tree(&ids[0]).await.runs;
    let parent_expiry = runs[0].expires_at.unwrap().seconds;
    // ttl 0: until the parent expires, exactly.
    for child in &runs[1..] {
        assert_eq!(
            child.expires_at.unwrap().seconds,
            parent_expiry,
            "{child:?}"
        );
    }
    let deadline = std::time::UNIX_EPOCH + Duration::from_secs(parent_expiry as u64 + 1);
    let wait = deadline
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_default();
    tokio::time::sleep(wait).await;
    let runs = tree.tree(&ids[0]).await.runs;
    for run in &runs {
        assert!(run.report.is_some(), "still live after its expiry: {run:?}");
    }
    assert_eq!(state(&runs[0]), pb::RunState::Expired);
    for child in &runs[1..] {
        // Both timers fire at the same instant: either is the truth.
        assert!(
            matches!(
                state(child),
                pb::RunState::ParentEnded | pb::RunState::Expired
            ),
            "{child:?}"
        );
    }
    tree.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_children_share_their_parents_memory_pids_and_cpu() {
    if !require_root() {
        return;
    }
    let tree = Tree::start("deleg-limits", 208_500).await;
    let script = r#"ask() { echo "$1" | tollgate-shim child delegate > /tmp/id || exit 11; read id < /tmp/id; }
ask '{"subject": "a", "limits": {"memory_bytes": 402653184, "pids": 16, "cpu_millicores": 200}, "exec": ["/usr/bin/sleep"], "agent": {"argv": ["/usr/bin/sleep", "1000"]}}'
a=$id
tollgate-shim child start "$a" > /dev/null || exit 12
ask '{"subject": "b", "limits": {"memory_bytes": 268435456, "pids": 16, "cpu_millicores": 200}, "exec": ["/bin/sh"], "agent": {"argv": ["/bin/sh", "-c", "echo b-ran"]}}'
b=$id
tollgate-shim child start "$b" 2>&1; echo "b rc=$?"
tollgate-shim child stop "$a" > /dev/null || exit 13
tollgate-shim child start "$b" > /dev/null; echo "b again rc=$?"
tollgate-shim child watch "$b"
"#;
    let limits = pb::Limits {
        memory_bytes: 512 << 20,
        pids: 64,
        cpu_millicores: 1000,
        ..Default::default()
    };
    let text = tree.mint_with(script, 120, 1, vec![], limits).await;
    let (run_id, parent, output) = tree.run_to_end(text).await;
    assert_eq!(
        parent.report.as_ref().unwrap().exit_code,
        Some(0),
        "{output}"
    );
    assert!(
        output.contains(&format!(
            "limits.memory_bytes = 268435456: live children of run {run_id} already hold 402653184 of its 536870912"
        )) && output.contains("b rc=1"),
        "{output}"
    );
    assert!(output.contains("b again rc=0\nb-ran\n"), "{output}");
    tree.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fan_out_example_counts_each_file_in_a_child_of_its_own() {
    if !require_root() {
        return;
    }
    let tree = Tree::start("deleg-example", 208_600).await;
    let example = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/delegation")
        .canonicalize()
        .unwrap();
    let (corpus, counts) = (
        tree.dir.path().join("corpus"),
        tree.dir.path().join("counts"),
    );
    std::fs::create_dir_all(&corpus).unwrap();
    std::fs::create_dir_all(&counts).unwrap();
    for (name, lines) in [("a.txt", 3), ("b.txt", 1), ("c.log", 5)] {
        std::fs::write(corpus.join(name), "line\n".repeat(lines)).unwrap();
    }
    // The example's run spec as shipped, with this test's paths.
    let spec = std::fs::read_to_string(example.join("fan-out.toml"))
        .unwrap()
        .replace(
            "/home/me/tollgate/examples/delegation",
            example.to_str().unwrap(),
        )
        .replace("/home/me/corpus", corpus.to_str().unwrap())
        .replace("/home/me/counts", counts.to_str().unwrap());
    let spec_file = tree.dir.path().join("fan-out.toml");
    std::fs::write(&spec_file, spec).unwrap();
    let minted = Command::new(bin_path("tollgate"))
        .args(["--authority", tree.authority.addr()])
        .arg("--token-file")
        .arg(tree.authority.data_dir().join("admin.token"))
        .args(["mint", "--spec", spec_file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(minted.status.success(), "{minted:?}");
    let text = String::from_utf8(minted.stdout).unwrap().trim().to_owned();
    let (run_id, parent, output) = tree.run_to_end(text).await;
    assert_eq!(
        parent.report.as_ref().unwrap().exit_code,
        Some(0),
        "{output}"
    );
    for (name, lines) in [("a.txt", "3"), ("b.txt", "1"), ("c.log", "5")] {
        let counted = std::fs::read_to_string(counts.join(format!("{name}.lines"))).unwrap();
        assert_eq!(counted.trim(), lines, "{name}: {output}");
    }
    let runs = tree.tree(&run_id).await.runs;
    assert_eq!(runs.len(), 4, "{runs:?}");
    for child in &runs[1..] {
        assert_eq!(state(child), pb::RunState::Exited, "{child:?}");
        assert_eq!(child.report.as_ref().unwrap().exit_code, Some(0));
    }
    tree.assert_clean();
}

/// A delegate grant that asks: each child receipt the agent asks for waits for an operator,
/// who sees the child's subject; approved, the child is minted; denied, the agent is told why
/// and nothing is minted. A child of an asking parent cannot drop the rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delegate_grant_that_asks_waits_for_an_operator() {
    if !require_root() {
        return;
    }
    let tree = Tree::start("deleg-ask", 211_600).await;
    let script = r#"
echo '{"subject": "approved-child", "exec": ["/bin/sh"], "agent": {"argv": ["/bin/sh", "-c", "true"]}}' > /tmp/a
echo '{"subject": "denied-child", "exec": ["/bin/sh"], "agent": {"argv": ["/bin/sh", "-c", "true"]}}' > /tmp/d
echo '{"subject": "no-ask", "exec": ["/bin/sh"], "delegate": {"max_depth": 1}, "agent": {"argv": ["/bin/sh", "-c", "true"]}}' > /tmp/n
tollgate-shim child delegate < /tmp/a > /dev/null 2>&1; echo "approved rc=$?"
tollgate-shim child delegate < /tmp/d 2>&1; echo "denied rc=$?"
tollgate-shim child delegate < /tmp/n 2>&1; echo "no-ask rc=$?"
"#;
    let request = pb::MintReceiptRequest {
        subject: "orchestrator".into(),
        ttl_seconds: 120,
        audience: vec!["workstation".into()],
        agent: Some(pb::AgentSpec {
            argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
            ..Default::default()
        }),
        exec: vec!["/bin/sh".into()],
        limits: Some(pb::Limits {
            tool_calls: 200,
            ..Default::default()
        }),
        delegate: Some(pb::Delegation {
            max_depth: 2,
            ask: true,
        }),
        ..Default::default()
    };
    let text = tree
        .authority
        .client()
        .await
        .mint_receipt(authed(&tree.authority.admin_token(), request))
        .await
        .expect("mint")
        .into_inner()
        .text;
    let run_id = tree.start_run(text).await;
    let admin = tree.supervisor.token();
    let asked = tree
        .supervisor
        .decide_pending(&admin, &run_id, 3, |call| {
            assert_eq!(call.tool, "delegate");
            let approve = call.path != "denied-child";
            (
                approve,
                false,
                if approve { "" } else { "no more children" },
            )
        })
        .await;
    let asked: Vec<&str> = asked.iter().map(|call| call.path.as_str()).collect();
    assert_eq!(asked, ["approved-child", "denied-child", "no-ask"]);
    let run = tree
        .supervisor
        .wait_ended(&run_id, Duration::from_secs(30))
        .await;
    let output = tree.output(&run_id).await;
    assert!(output.contains("approved rc=0"), "{output}");
    assert!(
        output.contains("denied rc=1") && output.contains("no more children"),
        "{output}"
    );
    // Approved by the operator, yet the authority refuses a child that would not ask.
    assert!(
        output.contains("no-ask rc=1") && output.contains("delegate.ask"),
        "{output}"
    );
    assert_eq!(state(&run), pb::RunState::Exited, "{output}");
}

/// Applies a signed amendment of `run_id` adding a gateway-only read of `path`, for its
/// children too or not.
async fn widen(tree: &Tree, run_id: &str, path: &Path, for_children: bool) {
    let admin = tree.authority.admin_token();
    let signed = tree
        .authority
        .client()
        .await
        .amend_receipt(authed(
            &admin,
            pb::AmendReceiptRequest {
                receipt_id: run_id.into(),
                add_fs: vec![grant(path, pb::FsAccess::Read, "")],
                for_children,
                ..Default::default()
            },
        ))
        .await
        .expect("AmendReceipt")
        .into_inner()
        .signed;
    tree.supervisor
        .client()
        .await
        .amend_run(authed(
            &tree.supervisor.token(),
            pb::AmendRunRequest {
                run_id: run_id.into(),
                change: Some(pb::amend_run_request::Change::Amendment(signed.unwrap())),
            },
        ))
        .await
        .expect("AmendRun");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_gain_what_an_amendment_gives_their_parent_only_when_it_says_so() {
    if !require_root() {
        return;
    }
    let tree = Tree::start("deleg-amend", 211_800).await;
    let (kept, shared) = (tree.dir.path().join("kept"), tree.dir.path().join("shared"));
    for dir in [&kept, &shared] {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("f.txt"), "for the child\n").unwrap();
    }
    let (k, s) = (kept.display(), shared.display());
    // The parent asks for a child reading `shared` until it gets one (the amendment for
    // children is applied after the one that is not), starts it, then asks for one reading
    // `kept`.
    let script = format!(
        r#"echo '{{"subject": "shared", "fs": [{{"path": "{s}", "access": "read"}}], "exec": ["/bin/sh"], "agent": {{"argv": ["/bin/sh", "-c", "tollgate-shim tool read {s}/f.txt"]}}}}' > /tmp/s
echo '{{"subject": "kept", "fs": [{{"path": "{k}", "access": "read"}}], "exec": ["/bin/sh"], "agent": {{"argv": ["/bin/sh", "-c", "true"]}}}}' > /tmp/k
tollgate-shim child delegate < /tmp/s > /tmp/id 2>/dev/null; echo "shared before rc=$?"
until tollgate-shim child delegate < /tmp/s > /tmp/id 2>/dev/null; do sleep 0.2; done
read id < /tmp/id
tollgate-shim child start "$id" >/dev/null || exit 12
tollgate-shim child watch "$id"; echo "watch rc=$?"
tollgate-shim child delegate < /tmp/k 2>&1; echo "kept rc=$?"
"#
    );
    let text = tree
        .mint_with(
            &script,
            120,
            1,
            vec![],
            pb::Limits {
                tool_calls: 2_000,
                ..Default::default()
            },
        )
        .await;
    let run_id = tree.start_run(text).await;
    // Widened only once the child was refused without it.
    let admin = tree.supervisor.token();
    tree.supervisor
        .until_printed(&admin, &run_id, "shared before rc=1")
        .await;
    widen(&tree, &run_id, &kept, false).await;
    widen(&tree, &run_id, &shared, true).await;
    let run = tree
        .supervisor
        .wait_ended(&run_id, Duration::from_secs(60))
        .await;
    let output = tree.output(&run_id).await;
    assert_eq!(state(&run), pb::RunState::Exited, "{output}");
    // Before the amendment, the child was above its parent; after it, the child reads there.
    assert!(output.contains("shared before rc=1"), "{output}");
    assert!(
        output.contains("for the child") && output.contains("watch rc=0"),
        "{output}"
    );
    // The parent reads `kept` itself, but no child of it may.
    assert!(
        output.contains("kept rc=1") && output.contains(&format!("{k}")),
        "{output}"
    );
    tree.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_narrowed_away_from_a_parent_leaves_its_live_children_too() {
    if !require_root() {
        return;
    }
    let tree = Tree::start("deleg-narrow", 212_100).await;
    let shared = tree.dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::write(shared.join("f.txt"), "bytes\n").unwrap();
    let s = shared.display();
    // The child reads the parent's grant in a loop; the parent relays what it prints.
    let script = format!(
        r#"echo '{{"subject": "reader", "fs": [{{"path": "{s}", "access": "read"}}], "exec": ["/bin/sh", "/usr/bin/sleep"], "agent": {{"argv": ["/bin/sh", "-c", "while :; do tollgate-shim tool read {s}/f.txt >/dev/null 2>&1; echo child rc=$?; sleep 0.2; done"]}}}}' > /tmp/s
tollgate-shim child delegate < /tmp/s > /tmp/id || exit 11
read id < /tmp/id
tollgate-shim child start "$id" >/dev/null || exit 12
tollgate-shim child watch "$id"
"#
    );
    let text = tree
        .mint_with(
            &script,
            120,
            1,
            vec![grant(&shared, pb::FsAccess::Read, "")],
            pb::Limits {
                tool_calls: 2_000,
                ..Default::default()
            },
        )
        .await;
    let run_id = tree.start_run(text).await;
    let admin = tree.supervisor.token();
    tree.supervisor
        .until_printed(&admin, &run_id, "child rc=0")
        .await;
    tree.supervisor
        .client()
        .await
        .amend_run(authed(
            &admin,
            pb::AmendRunRequest {
                run_id: run_id.clone(),
                change: Some(pb::amend_run_request::Change::Narrow(pb::Narrowing {
                    drop_fs: vec![s.to_string()],
                    ..Default::default()
                })),
            },
        ))
        .await
        .expect("narrow the parent");
    tree.supervisor
        .until_printed(&admin, &run_id, "child rc=1")
        .await;
    // The child's narrowing is its own entry, before the parent's.
    let amended: Vec<String> = tree
        .supervisor
        .audit()
        .into_iter()
        .filter(|e| e.kind == tollgate_audit::EntryKind::RunAmended)
        .filter_map(|e| e.run_id)
        .collect();
    assert_eq!(amended.len(), 2, "{amended:?}");
    assert_eq!(amended[1], run_id, "{amended:?}");
    tree.supervisor
        .client()
        .await
        .stop_run(authed(
            &admin,
            pb::StopRunRequest {
                run_id: run_id.clone(),
                reason: "done".into(),
            },
        ))
        .await
        .expect("stop");
    tree.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_only_program_narrowed_away_is_not_handed_to_a_child() {
    if !require_root() {
        return;
    }
    let tree = Tree::start("deleg-programs", 212_300).await;
    // Waits for a file the test writes once the program is taken away, then asks for a child
    // that would run it through its own gateway.
    let script = r#"while [ ! -e /work/go ]; do sleep 0.05; done
echo '{"subject": "c", "exec": ["/bin/sh"], "gateway_exec": [{"program": "/usr/bin/id"}], "agent": {"argv": ["/bin/sh", "-c", "true"]}}' > /tmp/c
tollgate-shim child delegate < /tmp/c 2>&1; echo "delegate rc=$?"
"#;
    let request = pb::MintReceiptRequest {
        subject: "orchestrator".into(),
        ttl_seconds: 120,
        audience: vec!["workstation".into()],
        agent: Some(pb::AgentSpec {
            argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
            ..Default::default()
        }),
        exec: vec!["/bin/sh".into(), "/usr/bin/sleep".into()],
        gateway_exec: vec![pb::GatewayExecGrant {
            program: "/usr/bin/id".into(),
            ask: false,
        }],
        limits: Some(pb::Limits {
            tool_calls: 200,
            ..Default::default()
        }),
        delegate: Some(pb::Delegation {
            max_depth: 1,
            ask: false,
        }),
        ..Default::default()
    };
    let text = tree
        .authority
        .client()
        .await
        .mint_receipt(authed(&tree.authority.admin_token(), request))
        .await
        .expect("mint")
        .into_inner()
        .text;
    let run_id = tree.start_run(text).await;
    tree.supervisor
        .client()
        .await
        .amend_run(authed(
            &tree.supervisor.token(),
            pb::AmendRunRequest {
                run_id: run_id.clone(),
                change: Some(pb::amend_run_request::Change::Narrow(pb::Narrowing {
                    drop_gateway_exec: vec!["/usr/bin/id".into()],
                    ..Default::default()
                })),
            },
        ))
        .await
        .expect("narrow");
    std::fs::write(
        tree.supervisor
            .data_dir()
            .join("runs")
            .join(&run_id)
            .join("work/go"),
        "",
    )
    .unwrap();
    let run = tree
        .supervisor
        .wait_ended(&run_id, Duration::from_secs(30))
        .await;
    let output = tree.output(&run_id).await;
    assert_eq!(state(&run), pb::RunState::Exited, "{output}");
    assert!(
        output.contains("delegate rc=1") && output.contains("gateway_exec /usr/bin/id"),
        "{output}"
    );
    tree.assert_clean();
}
