//! Where a receipt lifts W^X (writable executable grants, /work, directory exec entries) and
//! its home, measured against ceilings.

use super::*;

#[test]
fn a_writable_executable_grant_and_workspace_need_the_ceilings_word() {
    let check = |c: &pb::Ceiling, r: &pb::MintReceiptRequest| {
        validate_mint(r).unwrap();
        CeilingCheck {
            operator: "bob",
            ceiling: c,
            defaults: &default_limits(),
        }
        .check_grants(r)
    };
    let build = || {
        let mut r = request();
        r.fs.push(pb::FsGrant {
            exec: true,
            ..grant("/home/me/proj", pb::FsAccess::Write, "/opt/tools")
        });
        r.exec.push("/opt/tools/hello".into());
        r
    };
    // The ceiling's write entry must say exec = true for the host path...
    let denied = check(&ceiling(), &build()).unwrap_err().to_string();
    assert!(
        denied.contains("fs[0] = /home/me/proj (write, exec = true"),
        "{denied}"
    );
    let mut c = ceiling();
    c.fs[0].exec = true;
    assert!(validate_ceiling(&c).is_ok());
    check(&c, &build()).unwrap();
    // ...and its exec list cover the mount as a directory.
    let mut r = build();
    r.fs[0].mount = "/proj".into();
    r.exec = vec!["/proj/hello".into()];
    let denied = check(&c, &r).unwrap_err().to_string();
    assert!(
        denied.contains("fs[0].mount = /proj (executable)"),
        "{denied}"
    );
    // /work: the ceiling's exec covers "/work/".
    let mut r = request();
    r.workspace_exec = true;
    let denied = check(&c, &r).unwrap_err().to_string();
    assert!(denied.contains("workspace.exec"), "{denied}");
    c.exec.push("/work/".into());
    check(&c, &r).unwrap();
    // Directory entries are signed as directories, within a directory of the ceiling's.
    let mut r = request();
    r.exec = vec!["/opt/tools/bin/".into()];
    check(&c, &r).unwrap();
    r.exec = vec!["/usr/bin/".into()];
    assert!(check(&c, &r)
        .unwrap_err()
        .to_string()
        .contains("exec[0] = /usr/bin/"));
    // A directory holding a program the ceiling asks before: only with that program
    // granted to the gateway alone.
    c.exec.push("/usr/lib/git-core/".into());
    c.exec_ask = vec!["/usr/lib/git-core/git".into()];
    r.exec = vec!["/usr/lib/git-core/".into()];
    let denied = check(&c, &r).unwrap_err().to_string();
    assert!(denied.contains("holds /usr/lib/git-core/git"), "{denied}");
    r.gateway_exec = vec![pb::GatewayExecGrant {
        program: "/usr/lib/git-core/git".into(),
        ask: true,
    }];
    check(&c, &r).unwrap();
}

#[test]
fn a_home_is_a_write_grant_mounted_where_home_says() {
    let mut r = request();
    r.home = "/home/agent".into();
    assert!(reason(&r).starts_with("home"), "{}", reason(&r));
    r.fs.push(grant(
        "/home/me/agent-home",
        pb::FsAccess::Write,
        "/home/agent",
    ));
    assert!(validate_mint(&r).is_ok());
    r.fs[0].path = "/usr/local".into();
    assert!(reason(&r).contains("system path"), "{}", reason(&r));
}
