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
use tollgate_tests::{authed, bin_path, require_root, AuthorityProcess, SupervisorProcess};

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
        .client()
        .await
        .add_operator(authed(
            &authority.admin_token(),
            pb::AddOperatorRequest {
                name: "carol".into(),
                ceiling: Some(pb::Ceiling {
                    fs: vec![write_grant(&grant, "")],
                    exec: vec!["/bin/".into(), "/usr/bin/".into()],
                    limits: None,
                    max_ttl_seconds: 3600,
                    audience: vec!["workstation".into()],
                    ..Default::default()
                }),
                admin: false,
            },
        ))
        .await
        .unwrap()
        .into_inner()
        .token;

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
