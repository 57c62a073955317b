//! A hostile agent against the real daemons (root): attacks on the supervisor itself, each
//! reproduced as issue 13 found it, and held by a rule rather than a filter.
//!
//! - A grant path with a symbolic link in it: one run's agent plants a link inside its own
//!   write grant; a second run granted the path through that link is refused at start,
//!   naming the link, before its receipt is spent — and nothing outside is ever mounted.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Output};

use tollgate_proto::v1 as pb;
use tollgate_tests::{
    authed, bin_path, daemons, require_root, AuthorityProcess, SupervisorProcess,
};

/// The host path of run `run_id`'s gateway socket.
fn gateway_socket(supervisor: &SupervisorProcess, run_id: &str) -> std::path::PathBuf {
    supervisor
        .data_dir()
        .join("runs")
        .join(run_id)
        .join("gateway.sock")
}

/// `tollgate ARGS` against `supervisor` with its admin token.
fn tollgate(supervisor: &SupervisorProcess, args: &[&str]) -> Output {
    Command::new(bin_path("tollgate"))
        .args(["--supervisor", supervisor.addr()])
        .arg("--token-file")
        .arg(supervisor.token_file())
        .args(args)
        .output()
        .unwrap()
}

/// What an operator asks for: `script` under /bin/sh with `fs` grants.
fn request(script: &str, fs: Vec<pb::FsGrant>) -> pb::MintReceiptRequest {
    pb::MintReceiptRequest {
        subject: "hostile".into(),
        ttl_seconds: 120,
        audience: vec!["workstation".into()],
        agent: Some(pb::AgentSpec {
            argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
            ..Default::default()
        }),
        exec: ["/bin/sh", "/usr/bin/ln", "/usr/bin/cat", "/usr/bin/ls"]
            .map(String::from)
            .to_vec(),
        fs,
        ..Default::default()
    }
}

fn write_grant(path: &Path, mount: &str) -> pb::FsGrant {
    pb::FsGrant {
        path: path.display().to_string(),
        access: pb::FsAccess::Write as i32,
        mount: mount.into(),
        exec: false,
        ask: false,
        ask_reads: false,
    }
}

/// Mints `request` as `token` and writes its text form to `file`.
async fn mint_to(
    authority: &AuthorityProcess,
    token: &str,
    request: pb::MintReceiptRequest,
    file: &Path,
) {
    let minted = authority
        .client()
        .await
        .mint_receipt(authed(token, request))
        .await
        .expect("minted within the ceiling")
        .into_inner();
    std::fs::write(file, minted.text).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_through_a_planted_link_is_refused_before_the_receipt_is_spent() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let grant = dir.path().join("grant");
    let outside = dir.path().join("outside");
    std::fs::create_dir(&grant).unwrap();
    std::fs::create_dir(&outside).unwrap();
    // The agents' host ids must be able to write the grant; the outside too, so only the
    // supervisor's rule (not a permission) stands between run 2 and it.
    for path in [&grant, &outside] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    std::fs::write(outside.join("secret"), "outside secret\n").unwrap();

    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let supervisor = SupervisorProcess::start(
        &dir.path().join("supervisor"),
        authority.addr(),
        "planted-link",
        236_000,
    );
    // The operator's ceiling covers only the grant.
    let operator = authority
        .add_operator(
            "carol",
            pb::Ceiling {
                fs: vec![write_grant(&grant, "")],
                exec: vec!["/bin/".into(), "/usr/bin/".into()],
                max_ttl_seconds: 3600,
                audience: vec!["workstation".into()],
                ..Default::default()
            },
        )
        .await;

    // Run 1: its agent plants links inside its own write grant.
    let first = dir.path().join("first.tgr");
    let plant = format!(
        "ln -s {o} /g/link && ln -s / /g/root && ls /g",
        o = outside.display()
    );
    mint_to(
        &authority,
        &operator,
        request(&plant, vec![write_grant(&grant, "/g")]),
        &first,
    )
    .await;
    let planted = tollgate(&supervisor, &["run", "--receipt", first.to_str().unwrap()]);
    assert_eq!(planted.status.code(), Some(0), "{planted:?}");
    assert!(grant.join("link").is_symlink() && grant.join("root").is_symlink());

    // Run 2: granted the path through the link (the link itself, or beneath it), within the
    // operator's ceiling as far as the authority can tell.
    let steal = "cat /x/secret; echo stolen > /x/planted";
    for (through, link) in [
        (grant.join("link"), grant.join("link")),
        (grant.join("root/etc"), grant.join("root")),
    ] {
        let second = dir.path().join("second.tgr");
        mint_to(
            &authority,
            &operator,
            request(steal, vec![write_grant(&through, "/x")]),
            &second,
        )
        .await;
        let refused = tollgate(&supervisor, &["run", "--receipt", second.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(125), "{refused:?}");
        assert!(
            stderr.contains("grant_link")
                && stderr.contains(&format!("{} is a symbolic link", link.display()))
                && stderr.trim_end().lines().count() == 1,
            "{stderr}"
        );
        assert!(!String::from_utf8_lossy(&refused.stdout).contains("outside secret"));
        assert!(!outside.join("planted").exists(), "run 2 wrote outside");

        // Refused before the receipt was spent: with the link replaced by a real directory,
        // the same receipt starts, and its writes land in that directory.
        if through == grant.join("link") {
            std::fs::remove_file(grant.join("link")).unwrap();
            std::fs::create_dir(grant.join("link")).unwrap();
            std::fs::set_permissions(grant.join("link"), std::fs::Permissions::from_mode(0o777))
                .unwrap();
            let ran = tollgate(&supervisor, &["run", "--receipt", second.to_str().unwrap()]);
            assert_eq!(ran.status.code(), Some(0), "{ran:?}");
            assert_eq!(
                std::fs::read_to_string(grant.join("link/planted")).unwrap(),
                "stolen\n"
            );
        }
    }
    assert!(
        !outside.join("planted").exists(),
        "nothing outside was written"
    );
    assert!(!Path::new("/etc/planted").exists());
}

/// A run whose agent waits for `<grant>/go`, then makes one gateway call; started with
/// `tollgate run` in the background. Returns the CLI's process, the run id and the grant.
async fn waiting_run(
    dir: &Path,
    authority: &AuthorityProcess,
    supervisor: &SupervisorProcess,
) -> (std::process::Child, String, std::path::PathBuf) {
    let grant = dir.join("grant");
    std::fs::create_dir_all(&grant).unwrap();
    std::fs::set_permissions(&grant, std::fs::Permissions::from_mode(0o777)).unwrap();
    let script = format!(
        "while [ ! -e /g/go ]; do sleep 0.05; done; tollgate-shim tool stat {}/go && echo answered",
        grant.display()
    );
    let mut spec = request(&script, vec![write_grant(&grant, "/g")]);
    spec.exec.push("/usr/bin/sleep".into());
    let minted = authority
        .client()
        .await
        .mint_receipt(authed(&authority.admin_token(), spec))
        .await
        .unwrap()
        .into_inner();
    let file = dir.join("waiting.tgr");
    std::fs::write(&file, minted.text).unwrap();
    let run_id = minted.receipt.unwrap().receipt_id;
    let cli = Command::new(bin_path("tollgate"))
        .args(["--supervisor", supervisor.addr()])
        .arg("--token-file")
        .arg(supervisor.token_file())
        .args(["run", "--receipt", file.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let socket = gateway_socket(supervisor, &run_id);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while !socket.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the run never started"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    (cli, run_id, grant)
}

/// Lets the waiting run's agent make its call, and checks it was answered.
fn release_and_expect_an_answer(cli: std::process::Child, grant: &Path) {
    std::fs::write(grant.join("go"), "").unwrap();
    let output = cli.wait_with_output().unwrap();
    assert!(
        output.status.success() && String::from_utf8_lossy(&output.stdout).contains("answered"),
        "the run's own call was not answered: {output:?}"
    );
}

/// A 16 MiB `fs.write` as a gRPC request body.
fn sixteen_mib_write(path: &Path) -> bytes::Bytes {
    use prost::Message as _;
    let request = pb::CallToolRequest {
        tool: Some(pb::call_tool_request::Tool::FsWrite(pb::FsWriteRequest {
            path: path.display().to_string(),
            data: vec![b'x'; 16 << 20],
            mode: pb::WriteMode::Overwrite as i32,
        })),
    };
    tollgate_tests::flood::grpc_frame(&request.encode_to_vec())
}

const MIB: u64 = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_writes_on_the_gateway_leave_the_supervisors_memory_bounded() {
    if !require_root() {
        return;
    }
    let (dir, authority, supervisor) = daemons("stalled-writes", 236_100);
    let (cli, run_id, grant) = waiting_run(dir.path(), &authority, &supervisor).await;
    let socket = gateway_socket(&supervisor, &run_id);
    let pid = supervisor.pid();
    let baseline = tollgate_tests::flood::rss_bytes(pid);
    // 8 connections x 16 calls, each all but the last byte of a 16 MiB write (2 GiB offered).
    let flood = tollgate_tests::flood::stalled_calls(
        || tokio::net::UnixStream::connect(socket.clone()),
        8,
        16,
        "/tollgate.v1.Gateway/CallTool",
        &[],
        sixteen_mib_write(&grant.join("big")),
    )
    .await;
    let growth = tokio::task::spawn_blocking(move || {
        tollgate_tests::flood::peak_growth(pid, baseline, std::time::Duration::from_secs(4))
    })
    .await
    .unwrap();
    eprintln!(
        "supervisor growth under stalled writes: {} MiB",
        growth / MIB
    );
    // The run's own calls are still answered while the flood holds its streams.
    release_and_expect_an_answer(cli, &grant);
    drop(flood);
    assert!(
        growth < 64 * MIB,
        "the supervisor grew by {} MiB under stalled writes",
        growth / MIB
    );
    assert!(!grant.join("big").exists(), "no stalled write completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_gateway_connections_leave_the_supervisor_answering() {
    if !require_root() {
        return;
    }
    let (dir, authority, supervisor) = daemons("many-connections", 236_200);
    let (cli, run_id, grant) = waiting_run(dir.path(), &authority, &supervisor).await;
    let socket = gateway_socket(&supervisor, &run_id);
    // This test process needs the descriptors itself.
    let (_, hard) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    let wanted = 20_000.min(usize::try_from(hard).unwrap() - 512);
    // As many connections as the socket takes (the supervisor stops accepting at its
    // per-run limit; the rest wait in the kernel's backlog or are refused there).
    let mut held = Vec::new();
    for _ in 0..wanted {
        if let Ok(Ok(stream)) = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            tokio::net::UnixStream::connect(&socket),
        )
        .await
        {
            held.push(stream);
        }
    }
    let opened = held.len();
    // `tollgate ps` answers within a second.
    let started = std::time::Instant::now();
    let ps = tollgate(&supervisor, &["ps", "--all"]);
    let took = started.elapsed();
    assert!(ps.status.success(), "{ps:?}");
    assert!(
        took < std::time::Duration::from_secs(1),
        "ps took {took:?} with {opened} connections held"
    );
    // Another run starts and ends normally, and the flooded run's own call is answered.
    let other = dir.path().join("other.tgr");
    mint_to(
        &authority,
        &authority.admin_token(),
        request("echo other", vec![]),
        &other,
    )
    .await;
    let ran = tollgate(&supervisor, &["run", "--receipt", other.to_str().unwrap()]);
    assert_eq!(ran.status.code(), Some(0), "{ran:?}");
    assert_eq!(String::from_utf8_lossy(&ran.stdout), "other\n");
    // The supervisor holds at most its per-run limit of them.
    let fds = std::fs::read_dir(format!("/proc/{}/fd", supervisor.pid()))
        .unwrap()
        .count();
    assert!(fds < 1000, "the supervisor holds {fds} descriptors");
    // Once they close, the flooded run's own calls are answered again.
    drop(held);
    release_and_expect_an_answer(cli, &grant);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_stalled_requests_leave_both_daemons_bounded() {
    if !require_root() {
        return;
    }
    let (_dir, authority, supervisor) = daemons("unauthenticated", 236_300);
    let body = tollgate_tests::flood::grpc_frame(&vec![0x0a; 4 << 20]);
    for (pid, addr, path) in [
        (
            authority.pid(),
            authority.addr().to_owned(),
            "/tollgate.v1.Authority/MintReceipt",
        ),
        (
            authority.pid(),
            authority.addr().to_owned(),
            "/tollgate.v1.Authority/GetKeySet",
        ),
        (
            supervisor.pid(),
            supervisor.addr().to_owned(),
            "/tollgate.v1.Supervisor/StartRun",
        ),
    ] {
        let baseline = tollgate_tests::flood::rss_bytes(pid);
        let flood = tollgate_tests::flood::stalled_calls(
            || tokio::net::TcpStream::connect(addr.clone()),
            8,
            16,
            path,
            &[],
            body.clone(),
        )
        .await;
        let growth = tokio::task::spawn_blocking(move || {
            tollgate_tests::flood::peak_growth(pid, baseline, std::time::Duration::from_secs(3))
        })
        .await
        .unwrap();
        drop(flood);
        eprintln!("{path}: growth {} MiB", growth / MIB);
        assert!(
            growth < 64 * MIB,
            "{path}: the daemon grew by {} MiB under unauthenticated stalled requests",
            growth / MIB
        );
    }
    // Both still answer their real clients.
    let ps = tollgate(&supervisor, &["ps", "--all"]);
    assert!(ps.status.success(), "{ps:?}");
    authority
        .client()
        .await
        .get_key_set(pb::GetKeySetRequest {})
        .await
        .expect("the authority answers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_chosen_text_cannot_drive_the_operators_terminal() {
    if !require_root() {
        return;
    }
    let (dir, authority, supervisor) = daemons("terminal", 236_400);
    // A path that would forge a line and set the terminal's title, and argv that would clear
    // the screen, sent by the agent through its gateway (refused, and audited as sent).
    let script = r#"tollgate-shim tool stat "$(printf '/forged\n2026-01-01 fake entry\033]0;pwned\007\302\233')"; tollgate-shim tool exec -- "$(printf '/bin/\033[2J')"; true"#;
    let receipt = dir.path().join("terminal.tgr");
    mint_to(
        &authority,
        &authority.admin_token(),
        request(script, vec![]),
        &receipt,
    )
    .await;
    let ran = tollgate(
        &supervisor,
        &["run", "--receipt", receipt.to_str().unwrap()],
    );
    assert_eq!(ran.status.code(), Some(0), "{ran:?}");
    let run_id = tollgate(&supervisor, &["ps", "--all", "--json"]);
    let run_id: serde_json::Value = serde_json::from_str(
        String::from_utf8_lossy(&run_id.stdout)
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    let run_id = run_id["run_id"].as_str().unwrap().to_owned();
    let audit = supervisor.data_dir().join("audit");
    let audit = audit.to_str().unwrap();
    let authority_audit = authority.data_dir().join("audit");
    let views: Vec<Vec<&str>> = vec![
        vec!["calls", &run_id, audit],
        vec!["audit", "query", audit],
        vec!["trace", &run_id, audit, authority_audit.to_str().unwrap()],
        vec!["ps", "--all"],
        vec!["inspect", &run_id],
    ];
    let mut saw_the_path = false;
    for view in views {
        let output = tollgate(&supervisor, &view);
        assert!(output.status.success(), "{view:?}: {output:?}");
        let text = String::from_utf8_lossy(&output.stdout);
        for line in text.lines() {
            assert!(
                !line.chars().any(|c| c.is_control() && c != '\t'),
                "{view:?} printed a control character: {line:?}"
            );
            assert!(
                !line.starts_with("2026-01-01 fake entry"),
                "{view:?} let the agent forge a line: {text}"
            );
        }
        saw_the_path |= text.contains("/forged\\n2026-01-01 fake entry\\x1b]0;pwned\\x07\\u{9b}");
    }
    assert!(saw_the_path, "the path is shown, escaped");
}

/// A tmpfs mounted for one test, unmounted when dropped (even when the test fails).
struct SmallDisk(std::path::PathBuf);

impl SmallDisk {
    fn mount(path: &Path, size: &str) -> Self {
        std::fs::create_dir_all(path).unwrap();
        nix::mount::mount(
            Some("tollgate-test"),
            path,
            Some("tmpfs"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some(format!("size={size},mode=0700").as_str()),
        )
        .expect("mount a small tmpfs");
        Self(path.to_owned())
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_calls_and_freed_space_resumes_them_without_a_restart() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("supervisor");
    // Declared before the daemons: unmounted after they are gone.
    let _disk = SmallDisk::mount(&data, "24m");
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let supervisor = SupervisorProcess::start(&data, authority.addr(), "full-disk", 236_500);
    let grant = dir.path().join("grant");
    std::fs::create_dir(&grant).unwrap();
    std::fs::set_permissions(&grant, std::fs::Permissions::from_mode(0o777)).unwrap();
    // The agent writes through the gateway (each write durably audited first) until told to
    // stop, saying how each call went.
    let script = format!(
        "while [ ! -e /g/stop ]; do if tollgate-shim tool write {}/f < /dev/null 2>/dev/null; then echo ok; else echo refused; fi; sleep 0.05; done",
        grant.display()
    );
    let mut spec = request(&script, vec![write_grant(&grant, "/g")]);
    spec.exec.push("/usr/bin/sleep".into());
    spec.limits = Some(pb::Limits {
        tool_calls: 100_000,
        ..Default::default()
    });
    let receipt = dir.path().join("writer.tgr");
    mint_to(&authority, &authority.admin_token(), spec, &receipt).await;
    let mut cli = Command::new(bin_path("tollgate"))
        .args(["--supervisor", supervisor.addr()])
        .arg("--token-file")
        .arg(supervisor.token_file())
        .args(["run", "--receipt", receipt.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    let stdout = cli.stdout.take().unwrap();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });
    let wait_for = |want: &str, within: std::time::Duration| {
        let deadline = std::time::Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) if line == want => return,
                Ok(_) => {}
                Err(e) => panic!("no {want:?} from the agent within {within:?} ({e})"),
            }
        }
    };
    let seconds = std::time::Duration::from_secs;
    wait_for("ok", seconds(15));

    // Fill the supervisor's disk.
    let filler = data.join("filler");
    {
        use std::io::Write as _;
        let mut file = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; 1 << 20];
        while file
            .write_all(&chunk)
            .and_then(|()| file.sync_all())
            .is_ok()
        {}
    }
    // Enough refused calls for their audit entries to need pages the disk no longer has.
    for _ in 0..30 {
        wait_for("refused", seconds(15));
    }
    // Free it: the same supervisor, never restarted, serves the run's calls again.
    std::fs::remove_file(&filler).unwrap();
    // Calls refused before the space came back may still be draining.
    let deadline = std::time::Instant::now() + seconds(20);
    loop {
        wait_for(
            "ok",
            deadline.saturating_duration_since(std::time::Instant::now()),
        );
        // Two answers in a row mean the writer is back, not one call slipping through.
        if lines.recv_timeout(seconds(5)).as_deref() == Ok("ok") {
            break;
        }
    }
    std::fs::write(grant.join("stop"), "").unwrap();
    assert!(cli.wait().unwrap().success());
    let verified = Command::new(bin_path("tollgate"))
        .args(["audit", "verify"])
        .arg(data.join("audit"))
        .output()
        .unwrap();
    assert!(
        verified.status.success(),
        "the log does not verify: {verified:?}"
    );
    drop(supervisor);
}
