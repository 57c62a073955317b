use super::*;

const CODER: &str = r#"
subject = "coder"
ttl = "1h"
audience = ["workstation"]

[profile]
description = "A coder on one project"
vars = { install = "/opt/installed/coder" }

[agent]
argv = ["/opt/coder/bin/coder", "--task", "${task}"]
workdir = "/project"
env = { MODE = "quiet", CACHE = "/home/agent/.cache" }

[limits]
memory = "2GiB"
pids = 256

[[fs]]
path = "${install}"
access = "read"
mount = "/opt/coder"

[[fs]]
path = "${project}"
access = "write"
mount = "/project"
exec = true

[exec]
allow = ["/opt/coder/bin/coder", "/usr/bin/"]

[[routes]]
name = "local"
max_sensitivity = "high"
"#;

fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn coder() -> Profile {
    Profile::parse("coder", CODER).unwrap()
}

#[test]
fn a_profile_lists_its_variables_and_fills_them() {
    let profile = coder();
    assert_eq!(profile.description, "A coder on one project");
    assert_eq!(
        profile.used.iter().map(String::as_str).collect::<Vec<_>>(),
        ["install", "project", "task"]
    );
    let spec = profile
        .expand(&vars(&[
            ("project", "/home/me/p"),
            ("task", "fix ${it} now"),
        ]))
        .unwrap();
    assert_eq!(spec.fs[0].path, "/opt/installed/coder", "the default");
    assert_eq!(spec.fs[1].path, "/home/me/p");
    // A value is text: what it holds is never read as a variable or as TOML.
    assert_eq!(
        spec.agent.unwrap().argv,
        ["/opt/coder/bin/coder", "--task", "fix ${it} now"]
    );
    let request = profile
        .expand(&vars(&[("project", "/home/me/p"), ("task", "t\"\n]")]))
        .unwrap()
        .to_request()
        .unwrap();
    assert_eq!(request.agent.unwrap().argv[2], "t\"\n]");
}

#[test]
fn missing_and_unknown_variables_are_named() {
    let profile = coder();
    assert_eq!(
        profile.expand(&vars(&[])).unwrap_err(),
        ProfileError::MissingVars {
            profile: "coder".into(),
            names: vec!["project".into(), "task".into()],
        }
    );
    let error = profile
        .expand(&vars(&[("project", "/p"), ("task", "t"), ("prjct", "/p")]))
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "profile coder has no variable prjct (its variables: install, project, task)"
    );
}

#[test]
fn a_spec_on_a_profile_adds_to_it_and_overrides_it_key_by_key() {
    let spec = RunSpec::parse(
        r#"
profile = "coder"
ttl = "10m"
vars = { project = "/home/me/p", task = "from the spec" }
[agent]
env = { MODE = "loud", EXTRA = "1" }
[limits]
memory = "4GiB"
[[fs]]
path = "/home/me/p"
access = "write"
mount = "/project"
[[fs]]
path = "/data"
access = "read"
[exec]
allow = ["/usr/bin/", "/bin/sh"]
"#,
    )
    .unwrap();
    let merged = apply(spec, &coder(), &vars(&[("task", "from the caller")])).unwrap();
    assert_eq!(merged.profile, None);
    assert!(merged.vars.is_empty());
    assert_eq!(
        (merged.subject.as_str(), merged.ttl.as_str()),
        ("coder", "10m")
    );
    let agent = merged.agent.clone().unwrap();
    assert_eq!(agent.argv[2], "from the caller", "the caller's value wins");
    assert_eq!(agent.env["MODE"], "loud");
    assert_eq!(agent.env["EXTRA"], "1");
    assert_eq!(agent.env["CACHE"], "/home/agent/.cache");
    assert_eq!(agent.workdir.as_deref(), Some("/project"));
    assert_eq!(merged.limits.pids, Some(256));
    assert_eq!(
        merged.limits.memory,
        Some(crate::spec::SizeValue::Text("4GiB".into()))
    );
    // The spec's grant of the project (same path and mount) replaced the profile's: no exec.
    let fs: Vec<(&str, bool)> = merged
        .fs
        .iter()
        .map(|g| (g.path.as_str(), g.exec))
        .collect();
    assert_eq!(
        fs,
        [
            ("/opt/installed/coder", false),
            ("/home/me/p", false),
            ("/data", false)
        ]
    );
    assert_eq!(
        merged.exec.allow,
        ["/opt/coder/bin/coder", "/usr/bin/", "/bin/sh"]
    );
    assert_eq!(merged.routes[0].name, "local");
    merged.to_request().unwrap();
}

#[test]
fn an_expanded_spec_prints_as_a_spec_that_reads_back_the_same() {
    let spec = coder()
        .expand(&vars(&[
            ("project", "/home/me/p"),
            ("task", "a \"quoted\" task"),
        ]))
        .unwrap();
    let text = toml::to_string(&spec).unwrap();
    assert!(!text.contains("profile"), "{text}");
    assert_eq!(RunSpec::parse(&text).unwrap(), spec, "{text}");
}

#[test]
fn a_spec_naming_a_profile_or_vars_is_not_minted_unexpanded() {
    let spec = RunSpec::parse("profile = \"coder\"\n").unwrap();
    assert!(spec
        .to_request()
        .unwrap_err()
        .to_string()
        .starts_with("profile: \"coder\" is not expanded"));
    let spec =
        RunSpec::parse("subject = \"a\"\nttl = \"1m\"\naudience = [\"w\"]\nvars = { a = \"b\" }\n")
            .unwrap();
    assert!(spec
        .to_request()
        .unwrap_err()
        .to_string()
        .starts_with("vars:"));
    let spec = RunSpec::parse("ttl = \"1m\"\naudience = [\"w\"]\n").unwrap();
    assert!(spec
        .to_request()
        .unwrap_err()
        .to_string()
        .starts_with("subject: missing"));
}

#[test]
fn bad_profiles_are_refused_naming_the_field() {
    let cases = [
        ("[profile]\ndescription = \"d\"\n[limits]\nmemroy = \"1GiB\"\n", "memroy"),
        ("subject = \"${Project}\"\n[profile]\ndescription = \"d\"\n", "subject: ${Project} is not a variable"),
        ("subject = \"${project\"\n[profile]\ndescription = \"d\"\n", "subject: a ${ is not closed"),
        ("[profile]\ndescription = \"d\"\nvars = { x = \"1\" }\n", "profile.vars.x: no setting uses it"),
        ("[profile]\ndescription = \"d\"\nttl = \"1h\"\n", "profile.ttl: unknown field `ttl`, expected `description` or `vars` (keys below [profile] belong to it: put subject, ttl and audience above it)"),
        ("profile2 = 1\n[profile]\ndescription = \"d\"\n", "profile2"),
        ("subject = \"a\"\n", "profile"),
        ("[profile]\ndescription = \"\"\n", "profile.description"),
        ("[profile]\ndescription = \"d\"\n[vars]\nx = \"1\"\n", "vars: a profile's variables"),
    ];
    for (text, expected) in cases {
        let error = Profile::parse("p", text).unwrap_err().to_string();
        assert!(error.starts_with("profile p: "), "{text}: {error}");
        assert!(error.contains(expected), "{text}: {error}");
        assert!(!error.contains('\n'), "{error}");
    }
    assert!(matches!(
        Profile::parse("../etc", CODER),
        Err(ProfileError::BadName(_))
    ));
    // A literal ${ is written $${ and comes out as ${.
    let profile = Profile::parse(
        "p",
        "subject = \"a$${b}\"\n[profile]\ndescription = \"d\"\n",
    )
    .unwrap();
    assert!(profile.used.is_empty());
    assert_eq!(profile.expand(&vars(&[])).unwrap().subject, "a${b}");
}

#[test]
fn an_unpinned_agent_keeps_its_env_and_workdir() {
    let spec = RunSpec::parse(
        "subject = \"a\"\nttl = \"1m\"\naudience = [\"w\"]\n[agent]\nworkdir = \"/project\"\nenv = { A = \"1\" }\n",
    )
    .unwrap();
    let agent = spec.to_request().unwrap().agent.unwrap();
    assert!(agent.argv.is_empty());
    assert_eq!(agent.workdir, "/project");
    assert_eq!(agent.env["A"], "1");
}

/// Every profile shipped in profiles/ parses, and expands (with a project, a task and a home)
/// into a run spec that makes a mint request.
#[test]
fn the_shipped_profiles_expand_into_mint_requests() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiles");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_str().unwrap().to_owned();
        let profile = Profile::parse(&name, &std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut values = vars(&[("project", "/srv/p"), ("home", "/srv/homes/a")]);
        if profile.used.contains("task") {
            values.insert("task".into(), "make the tests pass".into());
        }
        let spec = profile.expand(&values).unwrap();
        let request = spec.to_request().unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(request.home, "/home/agent", "{name}");
        let project = request.fs.iter().find(|g| g.mount == "/project").unwrap();
        assert!(
            project.exec,
            "{name}: the project is where it builds and runs"
        );
        assert!(!request.routes.is_empty(), "{name}");
        assert!(
            request.egress.is_empty(),
            "{name}: a profile grants no egress"
        );
        names.push(name);
    }
    names.sort();
    assert_eq!(
        names,
        [
            "aider",
            "claude-code",
            "codex",
            "node",
            "opencode",
            "python",
            "shell"
        ]
    );
}
