//! Run specs that let the agent build and run, and keep a home.

use super::*;

#[test]
fn a_spec_builds_and_runs_in_its_grants_and_keeps_a_home() {
    let text = r#"
subject = "coder"
ttl = "10m"
audience = ["w"]
[[fs]]
path = "/srv/proj"
access = "write"
mount = "/proj"
exec = true
[exec]
allow = ["/usr/bin/", "/proj/hello"]
[workspace]
exec = true
[home]
path = "/srv/agents/coder"
"#;
    let request = RunSpec::parse(text)
        .unwrap()
        .to_request_for(Some("/home/me"))
        .unwrap();
    assert!(request.fs[0].exec);
    assert_eq!(request.exec, ["/usr/bin/", "/proj/hello"]);
    assert!(request.workspace_exec);
    assert_eq!(request.workspace_keep_seconds, 0);
    assert_eq!(request.home, "/home/agent");
    assert_eq!(
        (request.fs[1].path.as_str(), request.fs[1].mount.as_str()),
        ("/srv/agents/coder", "/home/agent")
    );
    assert_eq!(request.fs[1].access, pb::FsAccess::Write as i32);
    assert!(!request.fs[1].exec, "a home is noexec unless it says exec");
    // Never the operator's own home, or what holds it.
    for own in ["/home/me", "/home"] {
        let error = RunSpec::parse(&text.replace("/srv/agents/coder", own))
            .unwrap()
            .to_request_for(Some("/home/me"))
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("home.path: "), "{own}: {error}");
    }
}
