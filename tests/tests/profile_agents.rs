//! Each shipped profile (profiles/*.toml), expanded as `tollgate mint --profile` expands it,
//! runs its agent on a C project whose test fails, in a sandbox whose only way to a model is
//! the gateway. The scripted model has the agent run `make test` (the failure must come back),
//! fix `add.c`, and run `make test` again (it must pass): the agent builds with the compiler
//! and runs what it built in its project, as the profile allows.
//!
//! The coding agents are the real ones scripts/test installs (scripts/install-agents); the
//! python, node and shell profiles run the small agents of tests/agents/, as a user's own agent
//! would run: the command given when the run starts.

use std::collections::BTreeMap;
use std::time::Duration;

use tollgate_receipt::profile::Profile;
use tollgate_supervisor::records::RunState;
use tollgate_tests::repo_root;
use tollgate_tests::require_root;
use tollgate_tests::run_fixture::{agents_dir, own_dir, receipt_of, RunFixture as Fixture};
use tollgate_tests::scripted_models::agents::{
    fix_script, C_PROJECT, FIXED, FIXED_ADD, TEST_FAILS, TEST_PASSES,
};
use tollgate_tests::scripted_models::ScriptedModels;

const TASK: &str = "make test fails: fix add.c so that it passes.";

/// How the profile's run is started: its own pinned command, or (profiles that pin none) the
/// agent of tests/agents/ copied into the project.
fn command(profile: &str) -> Option<(&'static str, Vec<String>)> {
    let (file, program) = match profile {
        "python" => ("fix_loop.py", "/usr/bin/python3"),
        "node" => ("fix_loop.mjs", "/usr/bin/node"),
        "shell" => ("fix_loop.sh", "/bin/bash"),
        _ => return None,
    };
    Some((
        file,
        vec![program.into(), format!("/project/{file}"), TASK.into()],
    ))
}

/// Runs profile `name`'s agent on the C project, the route `local` speaking `api` for `model`.
fn fixes_the_failing_test(name: &str, api: &str, model: &str, id_base: u32) {
    if !require_root() {
        return;
    }
    let fx = Fixture::new(&format!("profile-{name}"), id_base);
    let root = fx.data.parent().unwrap().to_owned();
    let (project, home) = (root.join("project"), root.join("home"));
    std::fs::create_dir_all(&project).unwrap();
    for (file, text) in C_PROJECT {
        std::fs::write(project.join(file), text).unwrap();
    }
    let start = command(name);
    if let Some((file, _)) = &start {
        std::fs::copy(
            repo_root().join("tests/agents").join(file),
            project.join(file),
        )
        .unwrap();
    }
    own_dir(&project);
    own_dir(&home);

    // The profile as shipped, expanded as a mint expands it.
    let text = std::fs::read_to_string(repo_root().join(format!("profiles/{name}.toml"))).unwrap();
    let profile = Profile::parse(name, &text).unwrap();
    let mut values: BTreeMap<String, String> = [
        ("project", project.display().to_string()),
        ("home", home.display().to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    if profile.used.contains("install") {
        values.insert(
            "install".into(),
            agents_dir().join(name).display().to_string(),
        );
    }
    if profile.used.contains("task") {
        values.insert("task".into(), TASK.into());
    }
    if profile.used.contains("files") {
        values.insert("files".into(), "add.c".into());
    }
    let request = profile
        .expand(&values)
        .and_then(|spec| {
            spec.to_request().map_err(
                |problem| tollgate_receipt::profile::ProfileError::Expanded {
                    profile: name.into(),
                    problem,
                },
            )
        })
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        request.egress.is_empty(),
        "{name}: the profile grants egress"
    );

    let models = ScriptedModels::start(fix_script(name));
    let _runtime = fx.route_local(api, model, &models.endpoint);
    let signed = fx.sign(receipt_of(request));
    let run_id = match start {
        Some((_, argv)) => fx.start_command(&signed, argv),
        None => fx.start(&signed),
    }
    .unwrap();
    let record = fx.manager.wait(&run_id, Duration::from_secs(300)).unwrap();
    let output = format!(
        "{}{}",
        fx.output_of(&run_id),
        fx.output_of(&format!("{run_id}:stderr"))
    );
    let code = record.report.as_ref().and_then(|r| r.exit_code);
    let context = format!(
        "{:?} exit {code:?}\n{output}\n{}",
        record.state,
        models.report()
    );
    assert_eq!(record.state, RunState::Exited, "{context}");
    assert!(models.problems().is_empty(), "{context}");
    assert!(models.finished(), "{context}");
    assert_eq!(code, Some(0), "{context}");

    // The fix is on the host, and the test program the agent built from it passes.
    let fixed = std::fs::read_to_string(project.join("add.c")).unwrap();
    assert!(fixed.ends_with(FIXED_ADD), "{fixed}\n{context}");
    let built = std::process::Command::new(project.join("test_add"))
        .output()
        .unwrap_or_else(|e| panic!("the test program the agent built: {e}\n{context}"));
    assert_eq!(String::from_utf8_lossy(&built.stdout).trim(), TEST_PASSES);
    if name != "aider" {
        // Its shell tool ran make test twice: failing, then passing.
        let results: Vec<String> = models
            .tool_results()
            .into_iter()
            .map(|r| r.output)
            .collect();
        assert!(results.iter().any(|r| r.contains(TEST_FAILS)), "{context}");
        assert!(results.iter().any(|r| r.contains(TEST_PASSES)), "{context}");
        assert!(output.contains(FIXED), "{context}");
    }
    if matches!(name, "claude-code" | "codex" | "opencode") {
        // It keeps its state in the home the profile gives it, for the next run.
        let kept: Vec<_> = std::fs::read_dir(&home)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(!kept.is_empty(), "nothing in its home\n{context}");
    }
    // Every model call went through the gateway, on the one route.
    let report = record.report.as_ref().unwrap();
    assert_eq!(report.routes_used, ["local"], "{context}");
    fx.assert_gone(&run_id);
}

/// Claude Code: Anthropic Messages, its `Bash` tool.
#[test]
fn the_claude_code_profile_fixes_a_failing_c_test() {
    fixes_the_failing_test("claude-code", "anthropic", "claude-sonnet-4-5", 345_000);
}

/// Codex CLI: the Responses API, its `exec_command` tool.
#[test]
fn the_codex_profile_fixes_a_failing_c_test() {
    fixes_the_failing_test("codex", "openai-responses", "gpt-5-codex", 345_100);
}

/// opencode: Anthropic Messages, its `bash` tool.
#[test]
fn the_opencode_profile_fixes_a_failing_c_test() {
    fixes_the_failing_test("opencode", "anthropic", "claude-sonnet-4-5", 345_200);
}

/// aider: chat completions, its own edit format and `make test` as its test command.
#[test]
fn the_aider_profile_fixes_a_failing_c_test() {
    fixes_the_failing_test("aider", "openai", "gpt-4o", 345_300);
}

/// A Python agent of the user's own (standard library only): chat completions with a tool.
#[test]
fn the_python_profile_fixes_a_failing_c_test() {
    fixes_the_failing_test("python", "openai", "gpt-4o", 345_400);
}

/// A Node.js agent of the user's own (fetch): Anthropic Messages with a tool.
#[test]
fn the_node_profile_fixes_a_failing_c_test() {
    fixes_the_failing_test("node", "anthropic", "claude-sonnet-4-5", 345_500);
}

/// A bash agent of the user's own (curl and jq): chat completions with a tool.
#[test]
fn the_shell_profile_fixes_a_failing_c_test() {
    fixes_the_failing_test("shell", "openai", "gpt-4o", 345_600);
}
