//! Profiles through the `tollgate` CLI against the real authority: listed and shown, an
//! operator's copy winning over the built-in one, `mint --profile` and a spec naming a profile
//! signing the explicit spec, a default home made for the invoking user, and one-line errors.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tollgate_tests::repo_root;
use tollgate_tests::{bin_path, stderr_line, AuthorityProcess};

/// An unprivileged uid of no one on this host: the user minting in the home test.
const USER: u32 = 4_327;

/// An authority and (in the same directory) `token`, the token of an operator whose ceiling
/// is examples/ceiling-agents.toml with its /home standing for `dir`.
struct Operator {
    authority: AuthorityProcess,
    token: PathBuf,
}

impl Operator {
    fn start(dir: &Path) -> Self {
        let authority = AuthorityProcess::start(&dir.join("authority"));
        let ceiling = std::fs::read_to_string(repo_root().join("examples/ceiling-agents.toml"))
            .unwrap()
            .replace(
                "path = \"/home\"",
                &format!("path = {:?}", dir.display().to_string()),
            );
        let ceiling_file = dir.join("ceiling.toml");
        std::fs::write(&ceiling_file, ceiling).unwrap();
        let token = dir.join("coder.token");
        let added = Command::new(bin_path("tollgate"))
            .args(["--authority", authority.addr()])
            .arg("--token-file")
            .arg(authority.data_dir().join("admin.token"))
            .args(["operator", "add", "coder", "--ceiling"])
            .arg(&ceiling_file)
            .arg("--token-out")
            .arg(&token)
            .output()
            .unwrap();
        assert!(added.status.success(), "{added:?}");
        Self { authority, token }
    }
}

/// `tollgate` with a clean environment: only PATH, HOME and what `env` adds.
fn tollgate(operator: Option<&Operator>, env: &[(&str, &Path)], args: &[&str]) -> Command {
    let mut command = Command::new(bin_path("tollgate"));
    command
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", "/nonexistent-home")
        .envs(env.iter().map(|(k, v)| (k, v)));
    if let Some(operator) = operator {
        command
            .args(["--authority", operator.authority.addr()])
            .arg("--token-file")
            .arg(&operator.token);
    }
    command.args(args);
    command
}

fn run(mut command: Command) -> Output {
    command.output().expect("run tollgate")
}

fn ok(output: &Output) -> String {
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn profiles_are_listed_and_shown_and_an_operators_copy_wins() {
    let dir = tempfile::tempdir().unwrap();
    let none = dir.path().join("none");
    let listed = ok(&run(tollgate(
        None,
        &[("TOLLGATE_PROFILES_DIR", &none)],
        &["profiles", "--json"],
    )));
    let rows: Vec<serde_json::Value> = listed
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
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
    assert!(rows.iter().all(|r| r["source"] == "built-in"), "{listed}");
    let claude = &rows[1];
    assert_eq!(
        claude["variables"],
        serde_json::json!(["home", "install", "project", "route", "supervisor", "task"])
    );

    // `profile show` prints the file as shipped, comments and all: what an operator copies.
    for name in names {
        let shown = ok(&run(tollgate(
            None,
            &[("TOLLGATE_PROFILES_DIR", &none)],
            &["profile", "show", name],
        )));
        let shipped =
            std::fs::read_to_string(repo_root().join(format!("profiles/{name}.toml"))).unwrap();
        assert_eq!(shown, shipped, "{name}");
    }

    // An operator's copy wins over the built-in profile; a broken one is listed as such.
    let mine = dir.path().join("profiles");
    std::fs::create_dir_all(&mine).unwrap();
    let shipped = std::fs::read_to_string(repo_root().join("profiles/codex.toml")).unwrap();
    let edited = shipped.replace(
        "description = \"Codex CLI on one project",
        "description = \"Our Codex",
    );
    assert_ne!(edited, shipped);
    std::fs::write(mine.join("codex.toml"), &edited).unwrap();
    std::fs::write(mine.join("broken.toml"), "[profile]\n").unwrap();
    std::fs::write(mine.join("Not A Name.toml"), "").unwrap();
    let env = [("TOLLGATE_PROFILES_DIR", mine.as_path())];
    let listed = ok(&run(tollgate(None, &env, &["profiles"])));
    assert!(
        listed.contains("codex        file        Our Codex"),
        "{listed}"
    );
    assert!(
        listed.contains("broken       file        unusable: "),
        "{listed}"
    );
    assert!(!listed.contains("Not A Name"), "{listed}");
    assert_eq!(
        ok(&run(tollgate(None, &env, &["profile", "show", "codex"]))),
        edited
    );

    // A profile's own default home wins over the one every profile gets.
    std::fs::write(
        mine.join("homed.toml"),
        "subject = \"homed\"\nttl = \"1h\"\naudience = [\"workstation\"]\n[profile]\ndescription = \"d\"\nvars = { home = \"/srv/agents/homed\" }\n[home]\npath = \"${home}\"\n",
    )
    .unwrap();
    let expanded = ok(&run(tollgate(
        None,
        &env,
        &["profile", "show", "homed", "--expanded"],
    )));
    assert!(
        expanded.contains("[home]\npath = \"/srv/agents/homed\""),
        "{expanded}"
    );

    // Errors: one line, naming what was wrong and what to do.
    let unknown = run(tollgate(None, &env, &["profile", "show", "nope"]));
    assert_eq!(unknown.status.code(), Some(66));
    assert!(
        stderr_line(&unknown).contains("no profile named \"nope\": `tollgate profiles` lists them"),
        "{unknown:?}"
    );
    let traversal = run(tollgate(None, &env, &["profile", "show", "../codex"]));
    assert!(stderr_line(&traversal).contains("is not a profile name"));
}

#[test]
fn mint_from_a_profile_signs_the_explicit_spec() {
    let dir = tempfile::tempdir().unwrap();
    let operator = Operator::start(dir.path());
    let none = dir.path().join("none");
    let env = [("TOLLGATE_PROFILES_DIR", none.as_path())];
    let project = dir.path().join("project");
    let home = dir.path().join("agent-home");
    std::fs::create_dir_all(&project).unwrap();
    let out = dir.path().join("claude.tgr");
    let home_var = format!("home={}", home.display());
    ok(&run(tollgate(
        Some(&operator),
        &env,
        &[
            "mint",
            "--profile",
            "claude-code",
            "--project",
            project.to_str().unwrap(),
            "--task",
            "make the tests pass",
            "--var",
            &home_var,
            "--out",
            out.to_str().unwrap(),
        ],
    )));
    let shown = ok(&run(tollgate(
        Some(&operator),
        &env,
        &["receipt", "show", out.to_str().unwrap(), "--json"],
    )));
    let json: serde_json::Value = serde_json::from_str(&shown).unwrap();
    let receipt = &json["receipt"];
    assert_eq!(json["valid"], true, "{shown}");
    // Everything the profile expanded to is in the signed receipt; no profile name is.
    assert_eq!(receipt["subject"], "claude-code");
    assert_eq!(receipt["audience"], serde_json::json!(["workstation"]));
    let argv = receipt["agent"]["argv"].as_array().unwrap();
    assert_eq!(argv[2], "make the tests pass", "{shown}");
    assert_eq!(
        receipt["agent"]["env"]["DISABLE_AUTOUPDATER"], "1",
        "{shown}"
    );
    assert_eq!(receipt["home"], "/home/agent");
    let fs = receipt["fs"].as_array().unwrap();
    let project_grant = fs.iter().find(|g| g["mount"] == "/project").unwrap();
    assert_eq!(project_grant["path"], project.to_str().unwrap());
    assert_eq!(project_grant["executable"], true);
    assert!(fs
        .iter()
        .any(|g| g["path"] == home.to_str().unwrap() && g["mount"] == "/home/agent"));
    assert!(receipt["exec"]
        .as_array()
        .unwrap()
        .contains(&serde_json::json!("/usr/bin/")));
    assert!(!shown.contains("\"profile\""), "{shown}");

    // A spec naming a profile: its own settings on top, its [vars] filling the profile's.
    let spec = dir.path().join("codex.toml");
    std::fs::write(
        &spec,
        format!(
            "profile = \"codex\"\nttl = \"10m\"\n[vars]\nproject = \"{}\"\nhome = \"{}\"\ntask = \"fix it\"\nmodel = \"gpt-5\"\n[limits]\nmemory = \"1GiB\"\n",
            project.display(),
            home.display()
        ),
    )
    .unwrap();
    let minted = ok(&run(tollgate(
        Some(&operator),
        &env,
        &["mint", "--spec", spec.to_str().unwrap(), "--json"],
    )));
    let json: serde_json::Value = serde_json::from_str(&minted).unwrap();
    assert_eq!(json["limits"]["memory_bytes"], 1 << 30, "{minted}");
    assert_eq!(json["limits"]["pids"], 256, "{minted}");
    let argv: Vec<&str> = json["agent"]["argv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        argv.windows(2).any(|w| w == ["--model", "gpt-5"]),
        "{argv:?}"
    );
    assert_eq!(argv.last(), Some(&"fix it"));
    let ttl = json["expires_at"].as_i64().unwrap() - json["issued_at"].as_i64().unwrap();
    assert_eq!(ttl, 600, "{minted}");

    // An unpinned profile: env and workdir signed, the command given at start.
    let minted = ok(&run(tollgate(
        Some(&operator),
        &env,
        &[
            "mint",
            "--profile",
            "python",
            "--project",
            project.to_str().unwrap(),
            "--var",
            &home_var,
            "--json",
        ],
    )));
    let json: serde_json::Value = serde_json::from_str(&minted).unwrap();
    assert_eq!(json["agent"]["argv"], serde_json::json!([]), "{minted}");
    assert_eq!(json["agent"]["workdir"], "/project");
    assert_eq!(json["agent"]["env"]["PIP_NO_INPUT"], "1");

    // Errors: one line each, nothing minted.
    let p = project.to_str().unwrap();
    let cases: [(&[&str], &str); 5] = [
        (
            &["mint", "--profile", "claude-code", "--project", p],
            "profile claude-code needs a value for task: give each on the command line (--project DIR, --task TEXT, --var NAME=VALUE)",
        ),
        (
            &["mint", "--profile", "codex", "--project", p, "--task", "t", "--var", "modle=x", "--var", &home_var],
            "profile codex has no variable modle (its variables: home, install, model, project, route, supervisor, task)",
        ),
        (
            &["mint", "--profile", "codex", "--project", "/nonexistent/project", "--task", "t"],
            "--project /nonexistent/project: no such directory",
        ),
        (
            &["mint", "--profile", "codex", "--project", p, "--task", "t", "--var", "nonsense"],
            "--var \"nonsense\": write NAME=VALUE",
        ),
        (
            // As root, the default home would be root's, which the agent never owns.
            &["mint", "--profile", "codex", "--project", p, "--task", "t"],
            "its home /nonexistent-home/.local/state/tollgate/homes/codex would belong to root",
        ),
    ];
    for (args, expected) in cases {
        if expected.contains("belong to root") && !nix::unistd::geteuid().is_root() {
            continue;
        }
        let refused = run(tollgate(Some(&operator), &env, args));
        assert_eq!(refused.status.code(), Some(66), "{args:?}: {refused:?}");
        let line = stderr_line(&refused);
        assert!(line.contains(expected), "{args:?}: {line}");
    }
    let listed = ok(&run(tollgate(
        Some(&operator),
        &env,
        &["receipts", "--all", "--json"],
    )));
    assert_eq!(
        listed.lines().count(),
        3,
        "only the three good mints: {listed}"
    );
}

/// Minting as a user, a profile's default home is made under the user's state directory,
/// private to them (so the sandbox shows it as the agent's own), and kept: a second mint
/// finds it.
#[test]
fn a_profiles_default_home_is_made_for_the_user_who_mints() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let operator = Operator::start(dir.path());
    let user_home = dir.path().join("user");
    let project = user_home.join("project");
    std::fs::create_dir_all(&project).unwrap();
    // The user's own copy of the token, as an operator has one.
    let token = user_home.join("token");
    std::fs::copy(&operator.token, &token).unwrap();
    let chown = Command::new("chown")
        .args(["-R", &format!("{USER}:{USER}")])
        .arg(&user_home)
        .status()
        .unwrap();
    assert!(chown.success());
    let none = dir.path().join("none");
    for _ in 0..2 {
        let mut command = Command::new(bin_path("tollgate"));
        command
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", &user_home)
            .env("TOLLGATE_PROFILES_DIR", &none)
            .args(["--authority", operator.authority.addr()])
            .arg("--token-file")
            .arg(&token)
            .args(["mint", "--profile", "shell", "--project"])
            .arg(&project)
            .arg("--json")
            .uid(USER)
            .gid(USER);
        let minted = ok(&run(command));
        let json: serde_json::Value = serde_json::from_str(&minted).unwrap();
        let home = user_home.join(".local/state/tollgate/homes/shell");
        assert!(json["fs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["path"] == home.to_str().unwrap() && g["mount"] == "/home/agent"));
        let meta = std::fs::metadata(&home).unwrap();
        assert!(meta.is_dir());
        assert_eq!((meta.uid(), meta.mode() & 0o777), (USER, 0o700));
    }
}
