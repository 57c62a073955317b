//! The run lifecycle on real sandboxes (root): admission refusals spawn nothing, and every
//! teardown trigger leaves no process, cgroup or directory behind.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message as _;
use tollgate_proto::v1 as pb;
use tollgate_receipt::{
    timestamp_from_unix, unix_now, KeySet, ReceiptSigner, SignedReceipt, VerifyFailure,
};
use tollgate_supervisor::cgroup::{
    raise_for_stop, sandbox_cgroups, sweep, CgroupLimits, RunCgroup,
};
use tollgate_supervisor::error::StartError;
use tollgate_supervisor::records::{NewRun, RunRecords, RunState};
use tollgate_supervisor::runs::{stop_weight_record, RunManager};
use tollgate_tests::{bin_path, cpu_weight_file, pids_cgroup_dir, require_root, supervisor_audit};

use tollgate_tests::run_fixture::{settings, with_venv_agent, RunFixture as Fixture};

#[test]
fn warm_sandboxes_take_the_receipts_limits_and_go_at_shutdown() {
    if !require_root() {
        return;
    }
    let fx = Fixture::new("warm", 201_400);
    // The pool prepares one sandbox in the background: wait (bounded) until it exists.
    let warm = wait_for_warm_sandbox(&fx);
    let warm_dir = pids_cgroup_dir(&fx.parent).join(&warm);
    assert_eq!(
        std::fs::read_to_string(warm_dir.join("pids.max"))
            .unwrap()
            .trim(),
        "max",
        "an idle sandbox has no limits yet"
    );

    let signed = fx.sign(fx.receipt("exec /usr/bin/sleep 5353", 60));
    let run_id = fx.start(&signed).unwrap();
    // The run took the warm sandbox, and its cgroup now holds the receipt's limits.
    assert_eq!(
        std::fs::read_to_string(warm_dir.join("pids.max"))
            .unwrap()
            .trim(),
        "64"
    );
    let procs = std::fs::read_to_string(warm_dir.join("cgroup.procs")).unwrap();
    assert_eq!(
        procs.lines().count(),
        2,
        "pid 1 and the agent (the shim that forked pid 1 has exited): {procs}"
    );
    assert!(fx.manager.stop(&run_id, "test"));
    let record = fx.manager.wait(&run_id, Duration::from_secs(10)).unwrap();
    assert_eq!(record.state, RunState::Stopped);
    assert_eq!(
        record.report.as_ref().and_then(|r| r.cgroup.clone()),
        Some(format!("{}/{warm}", fx.parent))
    );
    fx.assert_gone(&run_id);
    // The shim that forked pid 1 and pid 1 itself were both this process's children: both
    // are reaped (a warm sandbox prepared since waits as its pid 1 alone).
    assert_eq!(zombie_children(), Vec::<u32>::new(), "zombies left");

    // Shutdown discards the sandbox prepared since (or in progress): nothing is left.
    fx.manager.shutdown();
    assert_eq!(zombie_children(), Vec::<u32>::new(), "zombies left");
    assert_eq!(sandbox_cgroups(&fx.parent), Vec::<String>::new());
    let left: Vec<_> = std::fs::read_dir("/sys/fs/cgroup")
        .unwrap()
        .flatten()
        .flat_map(|h| {
            std::fs::read_dir(h.path().join(&fx.parent))
                .into_iter()
                .flatten()
                .flatten()
        })
        .filter(|e| e.path().is_dir())
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "cgroups left: {left:?}");
}

/// A start with no sandbox prepared ahead puts pid 1 and the agent in the run's own cgroup in
/// every hierarchy, under the receipt's limits, before the agent runs: on a hybrid host its
/// shim starts in the run's v2 directory and its shard's v1 cgroups while the run's v1
/// cgroups are made, and pid 1 joins them when the plan comes. The agent's cgroup namespace is
/// rooted at the run's cgroup, and the shard keeps no process.
#[test]
fn a_start_with_none_prepared_ahead_runs_the_agent_in_its_own_cgroup_everywhere() {
    if !require_root() {
        return;
    }
    let fx = Fixture::with("cold", 201_425, |settings, _| settings.warm_sandboxes = 0);
    let signed = fx.sign(fx.receipt(
        "while read -r line; do echo \"$line\"; done < /proc/self/cgroup; echo listed; exec /usr/bin/sleep 5454",
        60,
    ));
    let run_id = fx.start(&signed).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !fx.output_of(&run_id).contains("listed") {
        assert!(Instant::now() < deadline, "{}", fx.output_of(&run_id));
        std::thread::sleep(Duration::from_millis(10));
    }
    let output = fx.output_of(&run_id);
    let listed: Vec<&str> = output.lines().take_while(|l| *l != "listed").collect();
    assert!(!listed.is_empty(), "{output}");
    for line in &listed {
        assert!(
            line.ends_with(":/"),
            "not rooted at the run's cgroup: {line}\n{output}"
        );
    }
    let sandboxes = sandbox_cgroups(&fx.parent);
    let [sandbox] = sandboxes.as_slice() else {
        panic!("one sandbox cgroup, not {sandboxes:?}");
    };
    let shard = std::path::Path::new(sandbox).parent().unwrap();
    let hybrid = std::path::Path::new("/sys/fs/cgroup/unified").is_dir()
        && std::path::Path::new("/sys/fs/cgroup/memory").is_dir();
    let roots: Vec<PathBuf> = if std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
    {
        vec![PathBuf::from("/sys/fs/cgroup")]
    } else {
        ["memory", "pids", "cpu", "unified"]
            .iter()
            .map(|h| PathBuf::from("/sys/fs/cgroup").join(h))
            .collect()
    };
    let procs = |dir: PathBuf| -> usize {
        std::fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .lines()
            .count()
    };
    for root in &roots {
        let parent = root.join(&fx.parent);
        assert_eq!(
            procs(parent.join(sandbox)),
            2,
            "pid 1 and the agent in {}",
            root.display()
        );
        assert_eq!(
            procs(parent.join(shard)),
            0,
            "the shard in {}",
            root.display()
        );
    }
    if hybrid {
        let pids = PathBuf::from("/sys/fs/cgroup/pids")
            .join(&fx.parent)
            .join(sandbox)
            .join("pids.max");
        assert_eq!(std::fs::read_to_string(pids).unwrap().trim(), "64");
    }
    assert!(fx.manager.stop(&run_id, "test"));
    let record = fx.manager.wait(&run_id, Duration::from_secs(10)).unwrap();
    assert_eq!(record.state, RunState::Stopped);
    fx.assert_gone(&run_id);
    assert_eq!(zombie_children(), Vec::<u32>::new(), "zombies left");
}

/// This process's children (of any of its threads) that have exited and are not reaped.
fn zombie_children() -> Vec<u32> {
    let tasks = std::fs::read_dir("/proc/self/task").unwrap();
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|children| {
            children
                .split_whitespace()
                .filter_map(|pid| pid.parse::<u32>().ok())
                .collect::<Vec<_>>()
        })
        .filter(|pid| {
            // The state follows the command name, which is in parentheses.
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                stat.rsplit_once(") ")
                    .is_some_and(|(_, rest)| rest.starts_with('Z'))
            })
        })
        .collect()
}

/// Waits (bounded) until the fixture's pool holds a prepared sandbox: one cgroup under the
/// parent holding its pid 1 alone (the shim that forked it has exited).
fn wait_for_warm_sandbox(fx: &Fixture) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let names = sandbox_cgroups(&fx.parent);
        if let [name] = names.as_slice() {
            let procs = std::fs::read_to_string(
                pids_cgroup_dir(&fx.parent).join(name).join("cgroup.procs"),
            )
            .unwrap_or_default();
            if let [pid] = procs.lines().collect::<Vec<_>>().as_slice() {
                let status =
                    std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
                let ns_pids = status
                    .lines()
                    .find_map(|line| line.strip_prefix("NSpid:"))
                    .unwrap_or_default();
                if ns_pids.split_whitespace().last() == Some("1") {
                    return name.clone();
                }
            }
        }
        assert!(Instant::now() < deadline, "no warm sandbox appeared");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Unmounts (lazily) when dropped, so a failing test leaves no mount behind.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

#[test]
fn a_warm_sandbox_binds_the_host_as_it_is_when_the_run_starts() {
    use nix::mount::{mount, MsFlags};
    if !require_root() {
        return;
    }
    // A shared mount, as `/` is on systemd hosts (this VM's mounts are private): mounts made
    // under it later propagate to namespaces copied from it.
    let host = tempfile::tempdir().unwrap();
    let shared = host.path().join("srv");
    std::fs::create_dir_all(shared.join("volume")).unwrap();
    mount(
        Some(&shared),
        &shared,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .unwrap();
    let _shared = Unmount(shared.clone());
    mount(
        None::<&str>,
        &shared,
        None::<&str>,
        MsFlags::MS_SHARED,
        None::<&str>,
    )
    .unwrap();

    let fx = Fixture::new("mountsync", 201_450);
    wait_for_warm_sandbox(&fx);
    // Attached on the host after the sandbox was prepared.
    let volume = shared.join("volume");
    mount(
        Some("tollgate-test"),
        &volume,
        Some("tmpfs"),
        MsFlags::empty(),
        Some("size=64k,mode=0755"),
    )
    .unwrap();
    let _volume = Unmount(volume.clone());
    std::fs::write(
        volume.join("fresh.txt"),
        "attached after the sandbox was prepared\n",
    )
    .unwrap();
    let mut receipt = fx.receipt("cat /volume/fresh.txt", 60);
    receipt.exec.push("/usr/bin/cat".into());
    receipt.fs.push(pb::FsGrant {
        path: volume.display().to_string(),
        access: pb::FsAccess::Read as i32,
        mount: "/volume".into(),
        exec: false,
        ask: false,
        ask_reads: false,
    });
    let run_id = fx.start(&fx.sign(receipt)).unwrap();
    let record = fx.manager.wait(&run_id, Duration::from_secs(10)).unwrap();
    assert_eq!(
        fx.output_of(&run_id),
        "attached after the sandbox was prepared\n"
    );
    assert_eq!(record.report.unwrap().exit_code, Some(0));
    fx.assert_gone(&run_id);
}

#[test]
fn the_agent_reads_its_grant_through_the_gateway_and_nothing_else() {
    if !require_root() {
        return;
    }
    let fx = Fixture::new("gateway", 201_500);
    let host = tempfile::tempdir().unwrap();
    let project = host.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("readme.txt"), "granted bytes").unwrap();
    std::fs::write(host.path().join("secret.txt"), "host secret").unwrap();
    let (project_path, secret_path) = (
        project.display().to_string(),
        host.path().join("secret.txt").display().to_string(),
    );
    let script = format!(
        "tollgate-shim tool read {project_path}/readme.txt; echo \" rc=$?\"\n\
         tollgate-shim tool stat {project_path}/readme.txt; echo \"rc=$?\"\n\
         tollgate-shim tool read {secret_path} 2>&1; echo \"rc=$?\"\n\
         tollgate-shim tool read {project_path}/../secret.txt 2>&1; echo \"rc=$?\""
    );
    let mut receipt = fx.receipt(&script, 60);
    receipt.fs.push(pb::FsGrant {
        path: project_path.clone(),
        access: pb::FsAccess::Read as i32,
        mount: String::new(),
        exec: false,
        ask: false,
        ask_reads: false,
    });
    let run_id = fx.start(&fx.sign(receipt)).unwrap();
    let record = fx.manager.wait(&run_id, Duration::from_secs(15)).unwrap();
    let output = fx.output_of(&run_id);
    assert_eq!(record.state, RunState::Exited, "{output}");
    let lines: Vec<&str> = output.lines().collect();
    assert_eq!(lines[0], "granted bytes rc=0", "{output}");
    assert!(lines[1].starts_with("file\t13\t"), "{output}");
    assert!(lines[1].ends_with("\treadme.txt"), "{output}");
    assert_eq!(lines[2], "rc=0", "{output}");
    assert!(
        lines[3].contains(&format!(
            "refused: receipt {run_id}: no fs grant covers {secret_path}"
        )),
        "{output}"
    );
    assert_eq!(lines[4], "rc=1", "{output}");
    assert!(
        lines[5].contains("not a normalised absolute host path"),
        "{output}"
    );
    assert_eq!(lines[6], "rc=1", "{output}");
    assert!(!output.contains("host secret"));
    let last_call = record
        .report
        .unwrap()
        .last_tool_call_id
        .expect("last call id");
    fx.assert_gone(&run_id);

    // `tollgate calls` lists them from the supervisor's audit log, with their decisions.
    let listed = std::process::Command::new(bin_path("tollgate"))
        .args(["calls", &run_id])
        .arg(fx.data.join("audit"))
        .output()
        .unwrap();
    let calls = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.status.success(), "{calls}");
    let rows: Vec<&str> = calls.lines().collect();
    assert_eq!(rows.len(), 4, "{calls}");
    assert!(
        rows[0].contains("fs.read  allow") && rows[0].contains("readme.txt"),
        "{calls}"
    );
    assert!(rows[1].contains("fs.stat  allow"), "{calls}");
    assert!(
        rows[2].contains("fs.read  deny") && rows[2].contains("no fs grant covers"),
        "{calls}"
    );
    assert!(rows[3].contains(&last_call), "{calls}");
}

#[test]
fn the_agent_writes_and_execs_through_the_gateway_within_its_grants() {
    if !require_root() {
        return;
    }
    let fx = Fixture::new("gateway-write", 201_600);
    let host = tempfile::tempdir().unwrap();
    let (project, docs) = (host.path().join("project"), host.path().join("docs"));
    std::fs::create_dir_all(&project).unwrap();
    std::fs::create_dir_all(&docs).unwrap();
    std::fs::write(docs.join("readme.txt"), "read-only bytes").unwrap();
    std::fs::write(host.path().join("secret.txt"), "host secret").unwrap();
    std::os::unix::fs::symlink(host.path().join("secret.txt"), project.join("link-out")).unwrap();
    let (p, d) = (project.display(), docs.display());
    let script = format!(
        "printf 'new bytes' | tollgate-shim tool write {p}/new.txt --create; echo \"rc=$?\"\n\
         tollgate-shim tool read {p}/new.txt; echo \" rc=$?\"\n\
         tollgate-shim tool list {p}; echo \"rc=$?\"\n\
         printf x | tollgate-shim tool write {d}/readme.txt 2>&1; echo \"rc=$?\"\n\
         printf x | tollgate-shim tool write {p}/link-out 2>&1; echo \"rc=$?\"\n\
         tollgate-shim tool read {p}/link-out 2>&1; echo \"rc=$?\"\n\
         echo \"agent uid $(/usr/bin/id -u)\"\n\
         tollgate-shim tool exec -- /usr/bin/id -u; echo \"rc=$?\"\n\
         tollgate-shim tool exec -- /usr/bin/env 2>&1; echo \"rc=$?\"\n\
         echo piped | tollgate-shim tool exec --stdin -- /bin/sh -c \
           'read line; echo \"got $line\"; echo from-exec > /tmp/marker; \
            while read k v; do case $k in NoNewPrivs:|Seccomp:) echo \"$k $v\";; esac; done < /proc/self/status; \
            echo oops >&2; exit 7' 2>&1; echo \"rc=$?\"\n\
         read marker < /tmp/marker; echo \"agent sees $marker\"\n\
         tollgate-shim tool exec --timeout 1 -- /usr/bin/sleep 30 2>&1; echo \"rc=$?\"\n\
         for i in 1 2 3 4 5; do tollgate-shim tool exec -- /usr/bin/sleep 2 2>>/tmp/busy & done; wait\n\
         while read l; do echo \"busy: $l\"; done < /tmp/busy\n\
         tollgate-shim tool delete {p}/new.txt; echo \"rc=$?\""
    );
    let mut receipt = fx.receipt(&script, 60);
    receipt.exec.push("/usr/bin/id".into());
    receipt.limits.as_mut().unwrap().tool_calls = 100;
    receipt.fs.push(pb::FsGrant {
        path: project.display().to_string(),
        access: pb::FsAccess::Write as i32,
        mount: String::new(),
        exec: false,
        ask: false,
        ask_reads: false,
    });
    receipt.fs.push(pb::FsGrant {
        path: docs.display().to_string(),
        access: pb::FsAccess::Read as i32,
        mount: String::new(),
        exec: false,
        ask: false,
        ask_reads: false,
    });
    let run_id = fx.start(&fx.sign(receipt)).unwrap();
    let record = fx.manager.wait(&run_id, Duration::from_secs(30)).unwrap();
    let output = fx.output_of(&run_id);
    assert_eq!(record.state, RunState::Exited, "{output}");
    let lines: Vec<&str> = output.lines().collect();
    let agent_uid = lines
        .iter()
        .find_map(|l| l.strip_prefix("agent uid "))
        .unwrap_or("<none>")
        .to_owned();
    let mut at = 0;
    let mut next = |expected: &dyn Fn(&str) -> bool| {
        let line = lines.get(at).copied().unwrap_or("<missing>");
        assert!(expected(line), "line {at}: {line:?}\n{output}");
        at += 1;
    };
    next(&|l| l == "rc=0");
    next(&|l| l == "new bytes rc=0");
    next(&|l| l.starts_with("symlink\t") && l.ends_with("\tlink-out"));
    next(&|l| l.starts_with("file\t9\t") && l.ends_with("\tnew.txt"));
    next(&|l| l == "rc=0");
    next(&|l| {
        l.contains(&format!("receipt {run_id}: fs.write needs a write grant"))
            && l.contains(&format!("missing grant: fs write on {d}/readme.txt"))
    });
    next(&|l| l == "rc=1");
    next(&|l| l.contains("not a regular file"));
    next(&|l| l == "rc=1");
    next(&|l| l.contains("not a regular file"));
    next(&|l| l == "rc=1");
    next(&|l| l.starts_with("agent uid "));
    next(&|l| l == agent_uid);
    next(&|l| l == "rc=0");
    next(&|l| l.contains("exec of /usr/bin/env is not granted (missing grant: exec /usr/bin/env)"));
    next(&|l| l == "rc=1");
    next(&|l| l == "got piped");
    next(&|l| l == "NoNewPrivs: 1");
    next(&|l| l == "Seccomp: 2");
    next(&|l| l == "oops");
    next(&|l| l == "rc=7");
    next(&|l| l == "agent sees from-exec");
    next(&|l| l.contains("stopped at its time limit"));
    next(&|l| l == "rc=137");
    next(&|l| l.starts_with("busy: ") && l.contains("already running"));
    next(&|l| l == "rc=0");
    assert_eq!(lines.len(), 26, "{output}");
    assert_eq!(
        std::fs::read_to_string(docs.join("readme.txt")).unwrap(),
        "read-only bytes"
    );
    assert_eq!(
        std::fs::read_to_string(host.path().join("secret.txt")).unwrap(),
        "host secret"
    );
    assert!(!project.join("new.txt").exists());
    fx.assert_gone(&run_id);

    // The delete's snapshot brings the file back.
    let listed = std::process::Command::new(bin_path("tollgate"))
        .args(["calls", &run_id])
        .arg(fx.data.join("audit"))
        .output()
        .unwrap();
    let calls = String::from_utf8_lossy(&listed.stdout);
    let delete = calls
        .lines()
        .find(|row| row.contains("fs.delete") && row.contains(" allow "))
        .unwrap_or_else(|| panic!("{calls}"));
    let call_id = delete.split_whitespace().find(|w| w.len() == 36).unwrap();
    let restored = std::process::Command::new(bin_path("tollgate"))
        .args(["restore", &run_id, call_id, "--data-dir"])
        .arg(&fx.data)
        .output()
        .unwrap();
    assert!(restored.status.success(), "{restored:?}");
    assert_eq!(
        std::fs::read_to_string(project.join("new.txt")).unwrap(),
        "new bytes"
    );
}

#[test]
fn a_directory_swapped_for_a_symlink_between_two_calls_is_refused() {
    if !require_root() {
        return;
    }
    let fx = Fixture::new("gateway-swap", 201_700);
    let host = tempfile::tempdir().unwrap();
    let (project, outside) = (host.path().join("project"), host.path().join("outside"));
    std::fs::create_dir_all(project.join("sub")).unwrap();
    std::fs::create_dir_all(outside.join("sub")).unwrap();
    std::fs::write(project.join("sub/inner.txt"), "inside").unwrap();
    std::fs::write(outside.join("sub/inner.txt"), "host secret").unwrap();
    let p = project.display();
    // The agent reads, waits for the host to swap `sub` for a link out of the grant, reads
    // again.
    let script = format!(
        "tollgate-shim tool read {p}/sub/inner.txt; echo \" first rc=$?\"\n\
         until tollgate-shim tool stat {p}/go >/dev/null 2>&1; do /usr/bin/sleep 0.05; done\n\
         tollgate-shim tool read {p}/sub/inner.txt 2>&1; echo \"rc=$?\""
    );
    let mut receipt = fx.receipt(&script, 60);
    receipt.limits.as_mut().unwrap().tool_calls = 1000;
    receipt.fs.push(pb::FsGrant {
        path: project.display().to_string(),
        access: pb::FsAccess::Read as i32,
        mount: String::new(),
        exec: false,
        ask: false,
        ask_reads: false,
    });
    let run_id = fx.start(&fx.sign(receipt)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let output = || fx.output_of(&run_id);
    while !output().contains("first rc=") {
        assert!(Instant::now() < deadline, "{}", output());
        std::thread::sleep(Duration::from_millis(10));
    }
    std::fs::remove_dir_all(project.join("sub")).unwrap();
    std::os::unix::fs::symlink(outside.join("sub"), project.join("sub")).unwrap();
    std::fs::write(project.join("go"), "").unwrap();
    let record = fx.manager.wait(&run_id, Duration::from_secs(15)).unwrap();
    let output = output();
    assert_eq!(record.state, RunState::Exited, "{output}");
    let lines: Vec<&str> = output.lines().collect();
    assert_eq!(lines[0], "inside first rc=0", "{output}");
    assert!(
        lines[1].contains(&format!(
            "refused: receipt {run_id}: a symbolic link is on the path"
        )),
        "{output}"
    );
    assert_eq!(lines[2], "rc=1", "{output}");
    assert!(!output.contains("host secret"));
    fx.assert_gone(&run_id);
}

#[test]
fn exec_runs_only_what_the_sandbox_could_execute_when_it_started() {
    if !require_root() {
        return;
    }
    let fx = Fixture::new("gateway-exec-list", 201_800);
    // /work/tool is listed but does not exist at start; the agent then makes it a link to an
    // unlisted binary. A command the gateway runs must not gain what the agent could not.
    let script = "/usr/bin/ln -s /usr/bin/id /work/tool; /work/tool 2>&1; echo \"agent rc=$?\"\n\
                  tollgate-shim tool exec -- /work/tool 2>&1; echo \"exec rc=$?\"";
    let mut receipt = fx.receipt(script, 60);
    receipt
        .exec
        .extend(["/usr/bin/ln".into(), "/work/tool".into()]);
    let run_id = fx.start(&fx.sign(receipt)).unwrap();
    let record = fx.manager.wait(&run_id, Duration::from_secs(15)).unwrap();
    let output = fx.output_of(&run_id);
    assert_eq!(record.state, RunState::Exited, "{output}");
    let lines: Vec<&str> = output.lines().collect();
    assert!(lines[0].contains("Permission denied"), "{output}");
    assert_eq!(lines[1], "agent rc=126", "{output}");
    assert!(
        lines[2].contains("could not start in the sandbox") && lines[2].contains("/work/tool"),
        "{output}"
    );
    assert_eq!(lines[3], "exec rc=1", "{output}");
    assert!(!output.contains("uid="), "{output}");
    fx.assert_gone(&run_id);
}

/// A directory entry in `exec` covers the gateway's exec tool as it covers the agent: every
/// program beneath it, in its normalised spelling only.
#[test]
fn exec_through_the_gateway_follows_directory_entries() {
    if !require_root() {
        return;
    }
    let fx = Fixture::new("gateway-exec-dir", 201_870);
    let script =
        "tollgate-shim tool exec -- /usr/bin/id -u >/dev/null 2>&1; echo \"beneath rc=$?\"\n\
                  tollgate-shim tool exec -- /usr/bin/../sbin/nologin 2>&1; echo \"dots rc=$?\"\n\
                  tollgate-shim tool exec -- /usr/sbin/nologin 2>&1; echo \"outside rc=$?\"";
    let mut receipt = fx.receipt(script, 60);
    receipt.exec.push("/usr/bin/".into());
    let run_id = fx.start(&fx.sign(receipt)).unwrap();
    let record = fx.manager.wait(&run_id, Duration::from_secs(15)).unwrap();
    let output = fx.output_of(&run_id);
    assert_eq!(record.state, RunState::Exited, "{output}");
    assert!(output.contains("beneath rc=0"), "{output}");
    assert!(
        output.contains("exec of /usr/bin/../sbin/nologin is not granted")
            && output.contains("dots rc=1"),
        "{output}"
    );
    assert!(
        output.contains("exec of /usr/sbin/nologin is not granted")
            && output.contains("outside rc=1"),
        "{output}"
    );
    fx.assert_gone(&run_id);
}

/// What the sandbox's model endpoint refuses itself (a body that is not JSON, a path it does
/// not serve) reaches the run's audit log from inside a real sandbox, so `tollgate calls`
/// shows why an agent failed; the answers tell SDKs not to retry.
#[test]
fn the_endpoints_own_refusals_are_in_tollgate_calls() {
    if !require_root() {
        return;
    }
    let fx = Fixture::new("models-refused", 201_880);
    let (_runtime, _backend) = fx.serve_local_route(Default::default());
    let agent = r#"
import os, urllib.request, urllib.error
base = os.environ["OPENAI_BASE_URL"]
def post(path, body):
    request = urllib.request.Request(base + path, data=body, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request) as reply:
            return reply.status, reply.headers.get("x-should-retry")
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("x-should-retry")
print("not json", *post("/chat/completions", b"{not json"))
print("unknown path", *post("/embeddings", b"{}"))
"#;
    let mut receipt = fx.receipt(&format!("/usr/bin/python3 - <<'PY'\n{agent}\nPY"), 60);
    receipt.exec.push("/usr/bin/python3".into());
    receipt.routes.push(pb::RouteGrant {
        name: "local".into(),
        max_sensitivity: pb::Sensitivity::High as i32,
        ask: false,
    });
    let run_id = fx.start(&fx.sign(receipt)).unwrap();
    let record = fx.manager.wait(&run_id, Duration::from_secs(30)).unwrap();
    let output = fx.output_of(&run_id);
    assert_eq!(record.state, RunState::Exited, "{output}");
    assert!(output.contains("not json 400 false"), "{output}");
    assert!(output.contains("unknown path 404 false"), "{output}");
    let listed = std::process::Command::new(bin_path("tollgate"))
        .args(["calls", &run_id])
        .arg(fx.data.join("audit"))
        .output()
        .unwrap();
    let calls = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.status.success(), "{listed:?}");
    let refused: Vec<&str> = calls
        .lines()
        .filter(|l| l.contains("model.request"))
        .collect();
    assert_eq!(refused.len(), 2, "{calls}");
    assert!(refused[0].contains("POST /v1/chat/completions"), "{calls}");
    assert!(refused[1].contains("POST /v1/embeddings"), "{calls}");
}

/// The agent inside the sandbox: the official `openai` package, unmodified, against the
/// sandbox's own endpoint (`OPENAI_BASE_URL`).
const SDK_AGENT: &str = r#"
import os, sys, openai
# The agent's own key: the endpoint ignores it; no backend may ever see it.
client = openai.OpenAI(api_key=os.environ["AGENT_KEY"])
print("models", sorted(m.id for m in client.models.list()))
def chat(text):
    stream = client.chat.completions.create(model="auto", messages=[{"role": "user", "content": text}],
                                            stream=True, stream_options={"include_usage": True})
    out, usage = "", None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            out += chunk.choices[0].delta.content
        if chunk.usage:
            usage = chunk.usage
    print("reply", out, usage.prompt_tokens, usage.completion_tokens)
chat("what is the weather like")
chat("deploy with " + os.environ["TOKEN_PREFIX"] + "q7Lm2Xv9Rt4Kp8Ws3Yb6Nc1Zd5Hf0Ja2Ue7Io9")
whole = client.chat.completions.create(model="auto", messages=[{"role": "user", "content": "hi"}])
print("whole", whole.choices[0].message.content, whole.usage.total_tokens)
# The Anthropic shape, as ANTHROPIC_BASE_URL serves it (the agent's key header is ignored).
import json, urllib.request
def messages(stream):
    body = {"model": "auto", "max_tokens": 50, "stream": stream, "messages": [{"role": "user", "content": "hello"}]}
    request = urllib.request.Request(os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages", data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "x-api-key": os.environ["AGENT_KEY"], "anthropic-version": "2023-06-01"})
    with urllib.request.urlopen(request) as reply:
        if not stream:
            r = json.load(reply)
            return r["content"][0]["text"], r["usage"]["output_tokens"], r["stop_reason"]
        text, out, stop = "", None, None
        for line in reply.read().decode().splitlines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                if event["type"] == "content_block_delta":
                    text += event["delta"]["text"]
                if event["type"] == "message_delta":
                    out, stop = event["usage"]["output_tokens"], event["delta"]["stop_reason"]
        return text, out, stop
print("messages", *messages(False))
print("messages", *messages(True))
print("env", sorted(os.environ.items()))
# Nothing in the sandbox looks like a cloud key: files it can read, and the endpoint's error.
found = []
for top in ("/run", "/work", "/tmp", "/etc"):
    for root, dirs, files in os.walk(top):
        for name in files:
            try:
                with open(os.path.join(root, name), "rb") as f:
                    if b"sk-ant-api03" in f.read(1 << 20):
                        found.append(os.path.join(root, name))
            except OSError:
                pass
try:
    # A name nobody claims goes where "auto" would; the cloud route by name, with a secret,
    # is refused.
    client.chat.completions.create(model="claude", max_tokens=1, messages=[
        {"role": "user", "content": "use " + os.environ["TOKEN_PREFIX"] + "q7Lm2Xv9Rt4Kp8Ws3Yb6Nc1Zd5Hf0Ja2Ue7Io9"}])
except openai.APIStatusError as e:
    print("refused", e.status_code, "sk-ant-api03" in str(e.body))
print("found", found)
"#;

/// The official SDK in a sandbox, streaming from the real llama.cpp server of a local route.
const LLAMA_AGENT: &str = r#"
import openai
client = openai.OpenAI(api_key="unused")
stream = client.chat.completions.create(model="local", messages=[{"role": "user", "content": "hello world"}],
                                        max_tokens=8, stream=True, stream_options={"include_usage": True})
chunks, finish, usage = 0, None, None
for chunk in stream:
    if chunk.choices:
        chunks += 1
        finish = chunk.choices[0].finish_reason or finish
    if chunk.usage:
        usage = chunk.usage
print("streamed", chunks > 0, finish, usage.prompt_tokens, usage.completion_tokens <= 8)
"#;

/// A real llama.cpp server behind a local route (`llama-server` built by scripts/test from
/// the llama.cpp sources on PyPI, a tiny random-weights model written at test time): the
/// preset's probe passes, the route's tokenizer endpoints count a prompt exactly as the
/// server itself does, and the official openai SDK in a sandbox streams from it.
#[test]
fn a_real_llama_cpp_server_serves_a_local_route() {
    if !require_root() {
        return;
    }
    let Some(server) = tollgate_tests::llama::LlamaServer::start() else {
        return;
    };
    let fx = Fixture::new("llama", 201_960);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let routes_file = fx.data.join("routes.toml");
    std::fs::write(
        &routes_file,
        format!(
            "[[route]]\nname = \"local\"\nkind = \"local\"\npreset = \"llamacpp\"\nendpoint = \"{}\"\nmodel = \"{}\"\n",
            server.endpoint(),
            tollgate_tests::llama::MODEL
        ),
    )
    .unwrap();
    // The preset's start-up probe: /health, then the model listed by /v1/models.
    let routes = runtime
        .block_on(tollgate_router_backends::ModelRoutes::load(
            &routes_file,
            Duration::from_secs(30),
        ))
        .unwrap();
    // /apply-template then /tokenize count what the server itself counts.
    let route = routes.routes.get("local").unwrap().clone();
    let counted = runtime
        .block_on(routes.backends.count_prompt(
            &route,
            &tollgate_router::wire::ChatRequest {
                model: route.model.clone(),
                call: pb::CompleteRequest {
                    messages: vec![pb::ChatMessage {
                        role: "user".into(),
                        content: "hello world".into(),
                        parts: Vec::new(),
                    }],
                    ..Default::default()
                },
            },
        ))
        .unwrap();
    let served = server.prompt_tokens("hello world");
    assert_eq!(counted, served);

    fx.manager.set_model_routes(Arc::new(routes));
    let mut receipt = fx.receipt("", 60);
    receipt.exec.clear();
    with_venv_agent(&mut receipt, LLAMA_AGENT, &[]);
    receipt.limits.as_mut().unwrap().tokens = 10_000;
    receipt.limits.as_mut().unwrap().memory_bytes = 512 << 20;
    receipt.routes = vec![pb::RouteGrant {
        name: "local".into(),
        max_sensitivity: pb::Sensitivity::High as i32,
        ask: false,
    }];
    let run_id = fx.start(&fx.sign(receipt)).unwrap();
    let record = fx.manager.wait(&run_id, Duration::from_secs(60)).unwrap();
    let output = fx.output_of(&run_id);
    let errors = fx.output_of(&format!("{run_id}:stderr"));
    assert_eq!(record.state, RunState::Exited, "{output}{errors}");
    let words: Vec<&str> = output.split_whitespace().collect();
    assert_eq!(words.first(), Some(&"streamed"), "{output}{errors}");
    assert_eq!(words[1], "True", "{output}");
    assert!(matches!(words[2], "length" | "stop"), "{output}");
    assert_eq!(words[3], served.to_string(), "{output}");
    assert_eq!(words[4], "True", "{output}");
    let usage = &record.report.as_ref().unwrap().route_usage;
    assert_eq!(usage.len(), 1, "{usage:?}");
    assert_eq!((usage[0].route.as_str(), usage[0].calls), ("local", 1));
    fx.assert_gone(&run_id);
}

#[test]
fn a_python_agent_uses_the_official_openai_sdk_inside_its_sandbox() {
    if !require_root() {
        return;
    }
    let fx = Fixture::new("models-sdk", 201_900);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let script = |text: &str| tollgate_tests::fake_models::Script {
        text: text.into(),
        prompt_tokens: 12,
        completion_tokens: 5,
        ..Default::default()
    };
    let local = runtime.block_on(tollgate_tests::fake_models::FakeBackend::start(script(
        "served locally",
    )));
    let cloud = runtime.block_on(tollgate_tests::fake_models::FakeBackend::start(script(
        "served by the cloud",
    )));
    let key = format!("{}{}", "sk-ant-api03-", "Hk2Jd8Lq4Wn7Rt1Yv5Bc9Xm3Zp6Sf0Ga");
    let key_env = "TOLLGATE_TEST_SDK_CLOUD_KEY";
    std::env::set_var(key_env, &key);
    let routes = tollgate_router::config::Routes::parse(
        &format!(
            "[[route]]\nname = \"local\"\nkind = \"local\"\npreset = \"vllm\"\nendpoint = \"{}\"\nmodel = \"qwen\"\n\n\
             [[route]]\nname = \"claude\"\nkind = \"cloud\"\napi = \"anthropic\"\nendpoint = \"{}\"\nmodel = \"claude\"\nkey_secret = \"env:{key_env}\"\n",
            local.endpoint, cloud.endpoint
        ),
        "routes.toml",
    )
    .unwrap();
    fx.manager
        .set_model_routes(Arc::new(tollgate_router_backends::ModelRoutes {
            backends: tollgate_router_backends::Backends::new(&routes).unwrap(),
            routes,
            classifier: tollgate_router::Classifier::new(&Default::default()).unwrap(),
        }));
    let mut receipt = fx.receipt("", 60);
    receipt.exec.clear();
    with_venv_agent(
        &mut receipt,
        SDK_AGENT,
        &[
            ("TOKEN_PREFIX", "ghp_"),
            // The agent's own key (it passes it to the SDK): ignored, never passed on.
            ("AGENT_KEY", "sk-agent-own-key-canary"),
        ],
    );
    receipt.limits.as_mut().unwrap().tokens = 10_000;
    receipt.limits.as_mut().unwrap().memory_bytes = 512 << 20;
    receipt.routes = vec![
        pb::RouteGrant {
            name: "local".into(),
            max_sensitivity: pb::Sensitivity::High as i32,
            ask: false,
        },
        pb::RouteGrant {
            name: "claude".into(),
            max_sensitivity: pb::Sensitivity::Low as i32,
            ask: false,
        },
    ];
    let run_id = fx.start(&fx.sign(receipt)).unwrap();
    let record = fx.manager.wait(&run_id, Duration::from_secs(60)).unwrap();
    let output = fx.output_of(&run_id);
    let errors = fx.output_of(&format!("{run_id}:stderr"));
    assert_eq!(record.state, RunState::Exited, "{output}{errors}");
    assert_eq!(
        record.report.as_ref().unwrap().exit_code,
        Some(0),
        "{output}{errors}"
    );
    let lines: Vec<&str> = output.lines().collect();
    // "auto", the granted routes and the models they serve (the local route's is "qwen").
    assert_eq!(
        lines[0], "models ['auto', 'claude', 'local', 'qwen']",
        "{output}"
    );
    assert_eq!(lines[1], "reply served by the cloud 12 5", "{output}");
    assert_eq!(lines[2], "reply served locally 12 5", "{output}");
    assert_eq!(lines[3], "whole served by the cloud 17", "{output}");
    assert_eq!(
        lines[4], "messages served by the cloud 5 end_turn",
        "{output}"
    );
    assert_eq!(
        lines[5], "messages served by the cloud 5 end_turn",
        "{output}"
    );
    assert_eq!(lines[7], "refused 403 False", "{output}");
    assert_eq!(lines[8], "found []", "{output}");
    // The secret prompt never reached the cloud; the cloud key never entered the sandbox;
    // the agent's own key reached no backend.
    let chats = |backend: &tollgate_tests::fake_models::FakeBackend| {
        backend
            .received()
            .into_iter()
            .filter(|r| r.path == "/v1/chat/completions" || r.path == "/v1/messages")
            .collect::<Vec<_>>()
    };
    let (local_seen, cloud_seen) = (chats(&local), chats(&cloud));
    assert_eq!((local_seen.len(), cloud_seen.len()), (1, 4), "{output}");
    // The teardown report says which routes the run used and what each cost.
    let report = record.report.as_ref().unwrap();
    assert_eq!(report.routes_used, ["claude", "local"]);
    let calls: Vec<(&str, u64)> = report
        .route_usage
        .iter()
        .map(|u| (u.route.as_str(), u.calls))
        .collect();
    assert_eq!(calls, [("claude", 4), ("local", 1)]);
    assert!(report
        .route_usage
        .iter()
        .all(|u| u.prompt_tokens > 0 && u.completion_tokens > 0));
    // And clients see it on the run (GetRun, ps --json, inspect).
    let view = fx.manager.run_view(&record);
    assert_eq!(view.model_usage.len(), 2);
    assert_eq!(view.report.unwrap().route_usage.len(), 2);
    assert!(local_seen[0].body.contains("ghp_"));
    assert!(cloud_seen.iter().all(|r| !r.body.contains("ghp_")));
    assert!(cloud_seen
        .iter()
        .all(|r| r.header("x-api-key") == Some(key.as_str())));
    assert!(
        !output.contains(&key),
        "the cloud key is visible inside the sandbox"
    );
    assert!(
        output.contains("('OPENAI_API_KEY', 'tollgate')"),
        "{output}"
    );
    for request in local.received().iter().chain(&cloud.received()) {
        assert!(!request
            .headers
            .iter()
            .any(|h| h.contains("sk-agent-own-key-canary")));
        assert!(!request.body.contains("sk-agent-own-key-canary"));
    }
    fx.assert_gone(&run_id);
}

#[test]
fn a_start_refused_for_its_argv_does_not_spend_the_receipt() {
    if !require_root() {
        return;
    }
    let fx = Fixture::new("argv-refused", 201_950);
    let mut receipt = fx.receipt("", 60);
    receipt.agent = None;
    let signed = fx.sign(receipt);
    let unlisted = fx
        .manager
        .start(&signed, Some(vec!["/usr/bin/env".into()]), fx.sink());
    assert!(
        matches!(unlisted, Err(StartError::Sandbox(_))),
        "{unlisted:?}"
    );
    let none = fx.manager.start(&signed, None, fx.sink());
    assert!(matches!(none, Err(StartError::Sandbox(_))), "{none:?}");
    // Listed in exec, but on a path a sandbox mounts noexec: refused before the record.
    let mut receipt = fx.receipt("", 60);
    receipt.agent = None;
    receipt.exec.push("/work/agent".into());
    let noexec = fx.sign(receipt);
    let refused = fx
        .manager
        .start(&noexec, Some(vec!["/work/agent".into()]), fx.sink());
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("cannot run in a sandbox")),
        "{refused:?}"
    );
    // Each receipt is still unused: a corrected start runs.
    let run_id = fx
        .manager
        .start(
            &noexec,
            Some(vec!["/bin/sh".into(), "-c".into(), "true".into()]),
            fx.sink(),
        )
        .unwrap();
    let record = fx.manager.wait(&run_id, Duration::from_secs(10)).unwrap();
    assert_eq!(record.state, RunState::Exited);
    let run_id = fx
        .manager
        .start(
            &signed,
            Some(vec!["/bin/sh".into(), "-c".into(), "echo corrected".into()]),
            fx.sink(),
        )
        .unwrap();
    let record = fx.manager.wait(&run_id, Duration::from_secs(10)).unwrap();
    assert_eq!(record.state, RunState::Exited);
    assert_eq!(fx.output_of(&run_id), "corrected\n");
    fx.assert_gone(&run_id);
}

#[test]
fn agent_exit_records_a_report_and_leaves_nothing() {
    if !require_root() {
        return;
    }
    let fx = Fixture::new("exit", 201_000);
    let signed = fx.sign(fx.receipt("echo hello from the sandbox; exit 3", 60));
    let run_id = fx.start(&signed).unwrap();
    let record = fx.manager.wait(&run_id, Duration::from_secs(10)).unwrap();
    assert_eq!(record.state, RunState::Exited);
    let report = record.report.unwrap();
    assert_eq!(report.exit_code, Some(3));
    assert!(
        report.cleanup_errors.is_empty(),
        "{:?}",
        report.cleanup_errors
    );
    assert!(report.peak_memory_bytes.is_some());
    assert!(
        report.landlock_abi.unwrap() >= 3,
        "the Landlock ABI is recorded"
    );
    assert_eq!(
        fx.output.lock().unwrap()[&run_id],
        "hello from the sandbox\n"
    );
    fx.assert_gone(&run_id);

    // Single use: the same receipt never starts a second sandbox.
    match fx.start(&signed) {
        Err(StartError::AlreadyUsed(id)) => assert_eq!(id, run_id),
        other => panic!("{other:?}"),
    }
}

#[test]
fn stop_revocation_and_expiry_tear_down_mid_run() {
    if !require_root() {
        return;
    }
    let fx = Fixture::new("triggers", 201_100);
    let long = "sleep 1000 & sleep 1000 & wait";

    let stopped = fx.start(&fx.sign(fx.receipt(long, 60))).unwrap();
    assert!(fx.manager.stop(&stopped, "operator asked"));
    let record = fx.manager.wait(&stopped, Duration::from_secs(10)).unwrap();
    assert_eq!(record.state, RunState::Stopped);
    assert_eq!(record.report.unwrap().reason, "operator asked");
    fx.assert_gone(&stopped);

    let revoked = fx.start(&fx.sign(fx.receipt(long, 60))).unwrap();
    fx.manager.revoke(&revoked, "key leaked");
    let record = fx.manager.wait(&revoked, Duration::from_secs(10)).unwrap();
    assert_eq!(record.state, RunState::Revoked);
    // The reason given at revocation is the run's.
    assert_eq!(
        record.report.unwrap().reason,
        "the receipt was revoked: key leaked"
    );
    fx.assert_gone(&revoked);

    let receipt = fx.receipt(long, 2);
    let expires_at = receipt.expires_at.unwrap().seconds;
    let expiring = fx.start(&fx.sign(receipt)).unwrap();
    let record = fx.manager.wait(&expiring, Duration::from_secs(10)).unwrap();
    assert_eq!(record.state, RunState::Expired);
    let gone_at = unix_now();
    assert!(
        gone_at <= expires_at + 1,
        "torn down at {gone_at}, expiry {expires_at}"
    );
    fx.assert_gone(&expiring);

    // An agent killed mid-run (here by the OOM killer) is torn down the same way.
    let bomb = fx.receipt("exec /usr/bin/python3 -c 'b = bytearray(1 << 30)'", 60);
    let mut bomb = bomb;
    bomb.exec.push("/usr/bin/python3".into());
    let oom = fx.start(&fx.sign(bomb)).unwrap();
    let record = fx.manager.wait(&oom, Duration::from_secs(20)).unwrap();
    assert_eq!(record.state, RunState::LimitExceeded, "{:?}", record.report);
    fx.assert_gone(&oom);
}

/// `workspace_keep_seconds` holds however a run ends that leaves the host sane: the agent's
/// exit, a stop, revocation, expiry, a limit kill and shutdown each keep `/work` (for
/// `tollgate cp`), and the run's view says so: the setting, the place and the time.
#[test]
fn a_kept_workspace_outlives_every_way_a_run_ends() {
    if !require_root() {
        return;
    }
    let fx = Fixture::new("keep", 213_740);
    let keep = 300;
    let start = |script: &str, ttl: i64, exec: &[&str]| {
        let mut receipt = fx.receipt(
            &format!("echo kept > /work/out.txt && touch /work/ready && {script}"),
            ttl,
        );
        receipt.workspace_keep_seconds = keep;
        receipt.exec.extend(exec.iter().map(|e| (*e).to_owned()));
        receipt.exec.push("/usr/bin/touch".into());
        let run_id = fx.start(&fx.sign(receipt)).unwrap();
        // The agent has written its work before anything ends it.
        let ready = fx.data.join("runs").join(&run_id).join("work/ready");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !ready.exists() && fx.manager.live_ids().contains(&run_id) {
            assert!(Instant::now() < deadline, "the agent never got ready");
            std::thread::sleep(Duration::from_millis(20));
        }
        run_id
    };
    let long = "sleep 1000";
    let exited = start("exit 0", 60, &[]);
    let stopped = start(long, 60, &[]);
    let revoked = start(long, 60, &[]);
    let expired = start(long, 3, &[]);
    let limited = start(
        "exec /usr/bin/python3 -c 'b = bytearray(1 << 30)'",
        60,
        &["/usr/bin/python3"],
    );
    let shut_down = start(long, 60, &[]);
    assert!(fx.manager.stop(&stopped, "operator asked"));
    fx.manager.revoke(&revoked, "done early");
    let mut ended = Vec::new();
    for (run_id, state) in [
        (&exited, RunState::Exited),
        (&stopped, RunState::Stopped),
        (&revoked, RunState::Revoked),
        (&expired, RunState::Expired),
        (&limited, RunState::LimitExceeded),
    ] {
        let record = fx.manager.wait(run_id, Duration::from_secs(20)).unwrap();
        ended.push((run_id.clone(), state, record));
    }
    fx.manager.shutdown();
    let record = fx.manager.get(&shut_down).unwrap().unwrap();
    ended.push((shut_down.clone(), RunState::SupervisorShutdown, record));
    for (run_id, state, record) in ended {
        assert_eq!(record.state, state, "{run_id}: {:?}", record.report);
        let view = fx.manager.run_view(&record);
        assert_eq!(view.workspace_keep_seconds, keep, "{state:?}: the setting");
        let report = view.report.expect("a report");
        assert!(
            !report.workspace.is_empty(),
            "{state:?}: no workspace was kept ({})",
            report.reason
        );
        let now = u64::try_from(unix_now()).unwrap();
        assert!(
            report.workspace_kept_until > now && report.workspace_kept_until <= now + keep,
            "{state:?}: kept until {}",
            report.workspace_kept_until
        );
        assert_eq!(
            std::fs::read_to_string(PathBuf::from(&report.workspace).join("out.txt")).unwrap(),
            "kept\n",
            "{state:?}"
        );
        assert_eq!(
            fx.manager.workspace_of(&run_id).unwrap(),
            PathBuf::from(&report.workspace)
        );
        fx.assert_gone(&run_id);
    }
}

#[test]
fn bad_receipts_are_refused_and_spawn_nothing() {
    if !require_root() {
        return;
    }
    let fx = Fixture::new("refusals", 201_200);
    let failure = |result: Result<String, StartError>| match result {
        Err(StartError::Receipt(e)) => e.failure(),
        other => panic!("expected a receipt refusal, got {other:?}"),
    };
    // Forged: signed by a key the supervisor does not trust.
    let forged = ReceiptSigner::generate().sign(&mut fx.receipt("exit 0", 60));
    assert_eq!(failure(fx.start(&forged)), VerifyFailure::UnknownKey);
    // Tampered: one byte of the signed receipt changed.
    let mut tampered = fx.sign(fx.receipt("exit 0", 60));
    let last = tampered.receipt.len() - 1;
    tampered.receipt[last] ^= 1;
    assert_eq!(failure(fx.start(&tampered)), VerifyFailure::BadSignature);
    // Expired.
    let mut expired = fx.receipt("exit 0", 60);
    expired.not_before = Some(timestamp_from_unix(unix_now() - 120));
    expired.expires_at = Some(timestamp_from_unix(unix_now() - 60));
    assert_eq!(failure(fx.start(&fx.sign(expired))), VerifyFailure::Expired);
    // Wrong audience.
    let mut elsewhere = fx.receipt("exit 0", 60);
    elsewhere.audience = vec!["laptop".into()];
    assert_eq!(
        failure(fx.start(&fx.sign(elsewhere))),
        VerifyFailure::WrongAudience
    );
    // Revoked before it was used.
    let revoked = fx.receipt("exit 0", 60);
    fx.manager.revoke(&revoked.receipt_id, "");
    assert_eq!(failure(fx.start(&fx.sign(revoked))), VerifyFailure::Revoked);
    // An argv for a receipt that pins its agent.
    let pinned = fx.sign(fx.receipt("exit 0", 60));
    assert!(matches!(
        fx.manager
            .start(&pinned, Some(vec!["/bin/sh".into()]), fx.sink()),
        Err(StartError::ArgvNotAllowed(_))
    ));
    // Nothing was spawned or recorded for any of them.
    assert!(fx.manager.list().unwrap().is_empty());
    assert!(std::fs::read_dir(fx.data.join("runs"))
        .unwrap()
        .next()
        .is_none());
    let _ = Instant::now();
}

#[test]
fn restart_after_a_crash_sweeps_what_was_left() {
    if !require_root() {
        return;
    }
    // What a SIGKILLed supervisor leaves: a `running` record, a populated cgroup and a run
    // directory.
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("supervisor");
    let parent = format!("tollgate-test-{}-crash", std::process::id());
    // Swept (its processes killed) however the test ends.
    struct Swept<'a>(&'a str);
    impl Drop for Swept<'_> {
        fn drop(&mut self) {
            let _ = sweep(self.0, true);
        }
    }
    let _swept = Swept(&parent);
    std::fs::create_dir_all(data.join("runs/r-crashed/work")).unwrap();
    let records = RunRecords::open(&data.join("supervisor.db")).unwrap();
    records
        .insert(&NewRun {
            run_id: "r-crashed",
            owner: "admin",
            subject: "s",
            receipt: &SignedReceipt::default().encode_to_vec(),
            host_id: 201_300,
            now: unix_now(),
            expires_at: unix_now() + 60,
            parent_run_id: None,
            depth: 0,
        })
        .unwrap();
    records.set_running("r-crashed").unwrap();
    drop(records);
    let cgroup = RunCgroup::create(
        &format!("{parent}/r-crashed"),
        CgroupLimits {
            memory_bytes: 64 << 20,
            pids: 16,
            cpu_millicores: 500,
        },
    )
    .unwrap();
    let mut orphan = std::process::Command::new("/usr/bin/sleep")
        .arg("1000")
        .spawn()
        .unwrap();
    cgroup.add_process(orphan.id()).unwrap();
    // It died during a stop, the parent's CPU weight raised (see `cgroup::raise_for_stop`).
    let weight = cpu_weight_file(&parent);
    let read_weight = || std::fs::read_to_string(&weight).unwrap().trim().to_owned();
    let default_weight = read_weight();
    std::mem::forget(raise_for_stop(&parent, &stop_weight_record(&data)).unwrap());
    assert_ne!(read_weight(), default_weight);

    let (manager, recovered) = RunManager::open(
        settings(&data, &parent, 201_300),
        KeySet::new(),
        supervisor_audit(&data),
    )
    .unwrap();
    assert_eq!(recovered, ["r-crashed"]);
    let record = manager.get("r-crashed").unwrap().unwrap();
    assert_eq!(record.state, RunState::Lost);
    assert!(record.report.unwrap().reason.contains("swept at restart"));
    assert!(!orphan.wait().unwrap().success(), "the orphan was killed");
    assert!(!data.join("runs/r-crashed").exists());
    assert!(cgroup.pids().unwrap().is_empty());
    assert_eq!(read_weight(), default_weight, "the weight is put back");
    assert!(!stop_weight_record(&data).exists());
    // Shutdown also discards the warm sandbox the manager prepares in the background.
    manager.shutdown();
}

/// A stop with runs live raises the parent's CPU weight while it ends them (see
/// `cgroup::raise_for_stop`), and leaves it as it found it, with no record of it left.
#[test]
fn a_stop_leaves_the_parents_cpu_weight_as_it_found_it() {
    if !require_root() {
        return;
    }
    let fx = Fixture::new("stop-weight", 201_475);
    let weight = cpu_weight_file(&fx.parent);
    let read_weight = || std::fs::read_to_string(&weight).unwrap().trim().to_owned();
    let before = read_weight();
    let run_id = fx
        .start(&fx.sign(fx.receipt("exec /usr/bin/sleep 5354", 60)))
        .unwrap();
    fx.manager.shutdown();
    let record = fx.manager.get(&run_id).unwrap().unwrap();
    assert_eq!(record.state, RunState::SupervisorShutdown);
    fx.assert_gone(&run_id);
    assert_eq!(read_weight(), before);
    assert!(!stop_weight_record(&fx.data).exists());
}

/// A receipt signed by a key the supervisor does not know yet (the authority rotated) gets
/// one fresh look at the key set before it is refused; fetches for unknown keys are held to
/// one a second, so receipts with made-up key ids cannot make it hammer the authority.
#[test]
fn an_unknown_key_refreshes_the_key_set_once_before_refusing() {
    if !require_root() {
        return;
    }
    let fx = Fixture::new("key-refresh", 201_250);
    let rotated = ReceiptSigner::generate();
    let fetches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (counted, old, new) = (
        fetches.clone(),
        fx.signer.public_key(),
        rotated.public_key(),
    );
    let last = Mutex::new(None::<Instant>);
    fx.manager.set_key_refresh(Arc::new(move || {
        // As the daemon's: at most one fetch a second.
        let mut last = last.lock().unwrap();
        if last.is_some_and(|at: Instant| at.elapsed() < Duration::from_secs(1)) {
            return None;
        }
        *last = Some(Instant::now());
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut keys = KeySet::new();
        keys.insert(old);
        keys.insert(new);
        Some(keys)
    }));
    let run = fx
        .start(&rotated.sign(&mut fx.receipt("exit 0", 60)))
        .expect("admitted after one refresh");
    assert_eq!(fetches.load(std::sync::atomic::Ordering::SeqCst), 1);
    // Known now: no further fetch.
    fx.start(&rotated.sign(&mut fx.receipt("exit 0", 60)))
        .unwrap();
    assert_eq!(fetches.load(std::sync::atomic::Ordering::SeqCst), 1);
    // Still unknown after the refresh: refused, and a burst of them fetches at most once a
    // second (on a slow machine the burst may last a few).
    let burst = Instant::now();
    for _ in 0..20 {
        let forged = ReceiptSigner::generate().sign(&mut fx.receipt("exit 0", 60));
        match fx.start(&forged) {
            Err(StartError::Receipt(e)) => assert_eq!(e.failure(), VerifyFailure::UnknownKey),
            other => panic!("expected unknown_key, got {other:?}"),
        }
    }
    let seconds = usize::try_from(burst.elapsed().as_secs()).unwrap_or(usize::MAX);
    let fetched = fetches.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        fetched <= 2 + seconds,
        "{fetched} fetches in a burst of {seconds} s"
    );
    fx.manager.wait(&run, Duration::from_secs(10));
}

/// A start that fails for a reason of the host's before the agent exists (here: the run's
/// directory cannot be made) leaves the receipt startable: its record says
/// `failed_before_start`, each try is audited, the next start of the same receipt runs, and
/// the tries are bounded.
#[test]
fn a_start_that_fails_before_the_agent_exists_leaves_the_receipt_startable() {
    if !require_root() {
        return;
    }
    let fx = Fixture::with("retry", 201_300, |settings, _| {
        // Each start takes its own sandbox.
        settings.warm_sandboxes = 0;
    });
    // Where runs' directories are made, a file: no run directory can be.
    let runs = fx.data.join("runs");
    let away = runs.with_extension("away");
    std::fs::rename(&runs, &away).unwrap();
    std::fs::write(&runs, b"").unwrap();

    let signed = fx.sign(fx.receipt("echo started", 60));
    let run_id = tollgate_proto::v1::Receipt::decode(signed.receipt.as_slice())
        .unwrap()
        .receipt_id;
    for _ in 0..2 {
        let failed = fx.start(&signed);
        assert!(matches!(failed, Err(StartError::Sandbox(_))), "{failed:?}");
        let record = fx.manager.get(&run_id).unwrap().unwrap();
        assert_eq!(record.state, RunState::FailedBeforeStart);
    }

    // The host is fixed: the same receipt runs.
    std::fs::remove_file(&runs).unwrap();
    std::fs::rename(&away, &runs).unwrap();
    fx.start(&signed)
        .expect("a receipt whose starts failed before its agent may start");
    let record = fx.manager.wait(&run_id, Duration::from_secs(30)).unwrap();
    assert_eq!(record.state, RunState::Exited);
    assert_eq!(fx.output_of(&run_id), "started\n");
    // Used now: never again.
    assert!(matches!(fx.start(&signed), Err(StartError::AlreadyUsed(_))));
    // Each try has its own admission entry in the audit log (written within moments).
    let admitted = || {
        std::fs::read_dir(fx.data.join("audit"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("log-"))
            .map(|e| std::fs::read_to_string(e.path()).unwrap())
            .collect::<String>()
            .lines()
            .filter(|line| line.contains("\"run_admitted\"") && line.contains(&run_id))
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while admitted() < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(admitted(), 3);
}

/// The tries are bounded: after three starts that failed before the agent existed, the
/// receipt is spent like any other.
#[test]
fn a_receipt_gets_three_tries_at_most() {
    if !require_root() {
        return;
    }
    let fx = Fixture::with("retry-bound", 201_350, |settings, tmp| {
        settings.shim = tmp.join("no-such-shim");
        settings.warm_sandboxes = 0;
    });
    let signed = fx.sign(fx.receipt("exit 0", 60));
    for _ in 0..3 {
        assert!(matches!(fx.start(&signed), Err(StartError::Sandbox(_))));
    }
    assert!(matches!(fx.start(&signed), Err(StartError::AlreadyUsed(_))));
}

/// One host id per live run, the lowest free first: a full range refuses a start naming it,
/// a duplicate start of a live receipt takes nothing from that run, and an id comes back
/// once its run's end is recorded.
#[test]
fn host_ids_are_one_per_live_run_and_come_back_at_its_end() {
    if !require_root() {
        return;
    }
    let fx = Fixture::with("host-ids", 405_000, |settings, _| {
        settings.host_ids = 405_000..405_002;
    });
    let host_id = |run_id: &str| fx.manager.get(run_id).unwrap().unwrap().host_id;
    let long = "sleep 1000";
    let a_receipt = fx.sign(fx.receipt(long, 60));
    let a = fx.start(&a_receipt).unwrap();
    let b = fx.start(&fx.sign(fx.receipt(long, 60))).unwrap();
    assert_eq!((host_id(&a), host_id(&b)), (405_000, 405_001));
    match fx.start(&fx.sign(fx.receipt(long, 60))) {
        Err(e @ StartError::NoHostId(_)) => {
            assert!(e.to_string().contains("405000..405002"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    // The same receipt again while its run is live: refused, and its id stays its own.
    assert!(matches!(
        fx.start(&a_receipt),
        Err(StartError::AlreadyUsed(_))
    ));
    assert!(fx.manager.stop(&b, "done"));
    fx.manager.wait(&b, Duration::from_secs(10)).unwrap();
    let c = fx.start(&fx.sign(fx.receipt(long, 60))).unwrap();
    assert_eq!(host_id(&c), 405_001, "b's id, not a's");
    assert!(fx.manager.stop(&a, "done"));
    fx.manager.wait(&a, Duration::from_secs(10)).unwrap();
    let d = fx.start(&fx.sign(fx.receipt(long, 60))).unwrap();
    assert_eq!(host_id(&d), 405_000);
    for run in [&c, &d] {
        assert!(fx.manager.stop(run, "done"));
        fx.manager.wait(run, Duration::from_secs(10)).unwrap();
        fx.assert_gone(run);
    }
}

/// A live run's model use is on the run while it runs (`Run.model_usage`, what `inspect`,
/// `ps --json` and `watch` show), counted per route as its calls settle.
#[test]
fn a_live_runs_model_use_is_on_the_run() {
    if !require_root() {
        return;
    }
    let fx = Fixture::new("models-live", 201_980);
    let (_runtime, _local) = fx.serve_local_route(tollgate_tests::fake_models::Script {
        text: "hello".into(),
        prompt_tokens: 7,
        completion_tokens: 3,
        ..Default::default()
    });
    // One call to the sandbox's own endpoint (stdlib only), then the agent waits.
    let agent = "import json, os, sys, time, urllib.request\n\
                 body = json.dumps({'model': 'local', 'messages': [{'role': 'user', 'content': 'hi'}]}).encode()\n\
                 req = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', body, {'content-type': 'application/json'})\n\
                 urllib.request.urlopen(req).read()\n\
                 print('called', flush=True)\n\
                 time.sleep(60)\n";
    let mut receipt = fx.receipt("", 60);
    receipt.agent = Some(pb::AgentSpec {
        argv: vec!["/usr/bin/python3".into(), "-c".into(), agent.into()],
        ..Default::default()
    });
    receipt.exec = vec!["/usr/bin/python3".into()];
    receipt.limits.as_mut().unwrap().tokens = 1_000;
    receipt.limits.as_mut().unwrap().memory_bytes = 256 << 20;
    receipt.routes = vec![pb::RouteGrant {
        name: "local".into(),
        max_sensitivity: pb::Sensitivity::High as i32,
        ask: false,
    }];
    let run_id = fx.start(&fx.sign(receipt)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !fx.output_of(&run_id).contains("called") {
        assert!(
            Instant::now() < deadline,
            "no call: {}{}",
            fx.output_of(&run_id),
            fx.output_of(&format!("{run_id}:stderr"))
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let record = fx.manager.get(&run_id).unwrap().unwrap();
    assert_eq!(record.state, RunState::Running);
    let view = fx.manager.run_view(&record);
    let usage: Vec<(&str, u64, u64, u64)> = view
        .model_usage
        .iter()
        .map(|u| {
            (
                u.route.as_str(),
                u.calls,
                u.prompt_tokens,
                u.completion_tokens,
            )
        })
        .collect();
    assert_eq!(usage, [("local", 1, 7, 3)]);
    assert!(view.report.is_none(), "still live");
    fx.manager.stop(&run_id, "done");
    let ended = fx.manager.wait(&run_id, Duration::from_secs(30)).unwrap();
    assert_eq!(ended.report.unwrap().route_usage.len(), 1);
    fx.assert_gone(&run_id);
}
