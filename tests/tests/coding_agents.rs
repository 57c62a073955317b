//! Today's coding agents, installed from the package registries by scripts/test
//! (scripts/install-agents) and run unmodified against a scripted model server
//! (tollgate_tests::scripted_models) on a task that needs their own tools: write a file, run a
//! command whose output must come back to the model.
//!
//! For each agent, two tests:
//! - `*_on_the_host`: the control. The agent talks straight to the scripted server, with no
//!   sandbox; it proves the script and the agent's settings are right.
//! - `*_in_a_sandbox`: the agent's run spec from `examples/agents/` as shipped (only host paths
//!   replaced), no egress grant: its only way to a model is the sandbox's endpoint, and the
//!   supervisor's one route points at the scripted server in the API that agent speaks.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use tollgate_proto::v1 as pb;
use tollgate_receipt::{timestamp_from_unix, unix_now};
use tollgate_supervisor::records::RunState;
use tollgate_tests::require_root;
use tollgate_tests::run_fixture::RunFixture as Fixture;
use tollgate_tests::scripted_models::{Call, ModelScript, ScriptedModels, Turn};

/// What the task writes, and what the command's output says about it.
const CONTENT: &str = "hello from the agent\n";
const COUNTED: &str = "21 hello.txt";
const FINAL: &str = "hello.txt holds 21 bytes.";

/// Where the shipped specs install the agents (scripts/install-agents as root).
const SHIPPED_AGENTS: &str = "/usr/local/lib/tollgate-agents";

/// Where scripts/install-agents put the agents: `$TOLLGATE_AGENTS_DIR`, else its defaults.
fn agents_dir() -> PathBuf {
    let dir = std::env::var_os("TOLLGATE_AGENTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            if nix::unistd::geteuid().is_root() {
                PathBuf::from(SHIPPED_AGENTS)
            } else {
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tollgate-agents")
            }
        });
    dir.canonicalize().unwrap_or(dir)
}

/// The installed file `inside` the agents' directory; panics naming scripts/test if missing.
fn installed(inside: &str) -> PathBuf {
    let path = agents_dir().join(inside);
    assert!(
        path.exists(),
        "{} is missing: scripts/test installs the agents (scripts/install-agents)",
        path.display()
    );
    path
}

/// A directory the sandbox's unprivileged uid may use.
fn open_dir(path: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::create_dir_all(path).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).unwrap();
}

/// What a finished agent process left.
struct Finished {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `argv` on the host in `cwd` with exactly `env` (plus PATH), for at most `limit`.
fn run_on_host(argv: &[String], env: &[(&str, String)], cwd: &Path, limit: Duration) -> Finished {
    let logs = tempfile::tempdir().unwrap();
    let (out, err) = (logs.path().join("out"), logs.path().join("err"));
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .current_dir(cwd)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("LANG", "C.UTF-8")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", argv[0]));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Finished {
        code: status.and_then(|s| s.code()),
        stdout: std::fs::read_to_string(out).unwrap_or_default(),
        stderr: std::fs::read_to_string(err).unwrap_or_default(),
    }
}

/// The checks every test makes once the agent has ended: it exited 0 having played the whole
/// script with nothing against it, the file is there, the command's output came back.
fn assert_task_done(models: &ScriptedModels, code: Option<i32>, output: &str, project: &Path) {
    let context = format!("exit {code:?}\n{output}\n{}", models.report());
    assert!(models.problems().is_empty(), "{context}");
    assert!(models.finished(), "{context}");
    assert_eq!(code, Some(0), "{context}");
    assert_eq!(
        std::fs::read_to_string(project.join("hello.txt"))
            .ok()
            .as_deref(),
        Some(CONTENT),
        "{context}"
    );
    assert!(
        models
            .tool_results()
            .iter()
            .any(|r| r.output.contains(COUNTED)),
        "{context}"
    );
}

// --- The agents: their scripts and their command lines ---

/// Claude Code's script: its `Write` and `Bash` tools, Anthropic Messages.
fn claude_script(project: &str) -> ModelScript {
    ModelScript {
        turns: vec![
            Turn::calls(vec![Call::new(
                "Write",
                json!({"file_path": format!("{project}/hello.txt"), "content": CONTENT}),
            )]),
            Turn::calls(vec![Call::new(
                "Bash",
                json!({"command": "wc -c hello.txt", "description": "Count the bytes of hello.txt"}),
            )]),
            Turn::text(FINAL).expecting(COUNTED),
        ],
        tools_required: true,
        side_reply: "ok".into(),
        models: vec!["claude-sonnet-4-5".into(), "claude-haiku-4-5".into()],
    }
}

/// Codex CLI's script: its `exec_command` tool (it writes files with the shell too), the
/// Responses API.
fn codex_script() -> ModelScript {
    ModelScript {
        turns: vec![
            Turn::calls(vec![Call::new(
                "exec_command",
                json!({"cmd": "printf 'hello from the agent\\n' > hello.txt"}),
            )]),
            Turn::calls(vec![Call::new(
                "exec_command",
                json!({"cmd": "wc -c hello.txt"}),
            )]),
            Turn::text(FINAL).expecting(COUNTED),
        ],
        tools_required: true,
        side_reply: "ok".into(),
        models: vec!["gpt-5-codex".into()],
    }
}

/// llm's script: the two functions of examples/agents/llm-tools.py, chat completions.
fn llm_script() -> ModelScript {
    ModelScript {
        turns: vec![
            Turn::calls(vec![Call::new(
                "write_file",
                json!({"path": "hello.txt", "content": CONTENT}),
            )]),
            Turn::calls(vec![Call::new(
                "run_command",
                json!({"command": "wc -c hello.txt"}),
            )]),
            Turn::text(FINAL).expecting(COUNTED),
        ],
        tools_required: true,
        side_reply: "ok".into(),
        models: vec!["gpt-4o".into()],
    }
}

/// aider's script: its own edit format (SEARCH/REPLACE blocks, no tool calling) writes
/// `greet.py`; aider runs the project's test command, whose failure must come back to the
/// model; the second edit fixes it.
fn aider_script() -> ModelScript {
    let first = "I'll create greet.py.\n\ngreet.py\n```python\n<<<<<<< SEARCH\n=======\ndef greet(name):\n    return \"hello \" + name\n>>>>>>> REPLACE\n```\n";
    let second = "The test wants a capital and a comma.\n\ngreet.py\n```python\n<<<<<<< SEARCH\n    return \"hello \" + name\n=======\n    return f\"Hello, {name}!\"\n>>>>>>> REPLACE\n```\n";
    ModelScript {
        turns: vec![
            Turn::text(first),
            Turn::text(second).expecting("AssertionError: hello tollgate"),
        ],
        tools_required: false,
        side_reply: String::new(),
        models: vec!["gpt-4o".into()],
    }
}

/// The project aider works in: a test of `greet.py`, which does not exist yet.
const AIDER_TEST: &str = "from greet import greet\n\nassert greet(\"tollgate\") == \"Hello, tollgate!\", greet(\"tollgate\")\nprint(\"greeted\")\n";

/// The task each shipped spec gives its agent (the prompt in its argv).
const TASK: &str = "Create hello.txt containing one line, 'hello from the agent', then run wc -c on it and tell me the result.";

/// What the agents' host runs are told, so that none calls home: the same settings as the
/// shipped specs.
fn quiet_env(home: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("HOME", home.display().to_string()),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
        ("DISABLE_AUTOUPDATER", "1".into()),
        ("DISABLE_TELEMETRY", "1".into()),
        ("DISABLE_ERROR_REPORTING", "1".into()),
        ("NO_UPDATE_NOTIFIER", "1".into()),
    ]
}

/// A host project with a home beside it.
fn host_project() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("project");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    (dir, project, home)
}

#[test]
fn claude_code_does_the_task_on_the_host() {
    let claude = installed("claude-code/node_modules/@anthropic-ai/claude-code/bin/claude.exe");
    let (_dir, project, home) = host_project();
    let models = ScriptedModels::start(claude_script(project.to_str().unwrap()));
    let mut env = quiet_env(&home);
    env.push(("ANTHROPIC_BASE_URL", models.endpoint.clone()));
    env.push(("ANTHROPIC_API_KEY", "sk-ant-api03-scripted".into()));
    let argv: Vec<String> = vec![
        claude.display().to_string(),
        "-p".into(),
        TASK.into(),
        "--allowedTools".into(),
        "Write,Bash".into(),
    ];
    let done = run_on_host(&argv, &env, &project, Duration::from_secs(120));
    assert_task_done(
        &models,
        done.code,
        &format!("{}{}", done.stdout, done.stderr),
        &project,
    );
    assert!(done.stdout.contains(FINAL), "{}", done.stdout);
}

/// Codex's settings for a model provider at `base_url` that speaks the Responses API over
/// HTTP (the built-in `openai` provider tries a WebSocket first), as `-c` flags.
fn codex_provider(base_url: &str) -> Vec<String> {
    [
        "model_provider=\"tollgate\"".to_owned(),
        "model_providers.tollgate.name=\"Tollgate\"".to_owned(),
        format!("model_providers.tollgate.base_url=\"{base_url}\""),
        "model_providers.tollgate.env_key=\"OPENAI_API_KEY\"".to_owned(),
        "model_providers.tollgate.wire_api=\"responses\"".to_owned(),
    ]
    .into_iter()
    .flat_map(|setting| ["-c".to_owned(), setting])
    .collect()
}

#[test]
fn codex_does_the_task_on_the_host() {
    let codex = installed(
        "codex/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex",
    );
    let (_dir, project, home) = host_project();
    let models = ScriptedModels::start(codex_script());
    let mut env = quiet_env(&home);
    env.push(("OPENAI_BASE_URL", models.openai_base()));
    env.push(("OPENAI_API_KEY", "sk-scripted".into()));
    let argv: Vec<String> = [
        codex.display().to_string(),
        "exec".into(),
        "--skip-git-repo-check".into(),
        "--sandbox".into(),
        "danger-full-access".into(),
        "--model".into(),
        "gpt-5-codex".into(),
    ]
    .into_iter()
    .chain(codex_provider(&models.openai_base()))
    .chain([TASK.to_owned()])
    .collect();
    let done = run_on_host(&argv, &env, &project, Duration::from_secs(120));
    assert_task_done(
        &models,
        done.code,
        &format!("{}{}", done.stdout, done.stderr),
        &project,
    );
}

#[test]
fn llm_does_the_task_on_the_host() {
    let llm = installed("llm/bin/llm");
    let (_dir, project, home) = host_project();
    let models = ScriptedModels::start(llm_script());
    let tools = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/agents/llm-tools.py");
    let mut env = quiet_env(&home);
    env.push(("OPENAI_BASE_URL", models.openai_base()));
    env.push(("OPENAI_API_KEY", "sk-scripted".into()));
    let argv: Vec<String> = vec![
        llm.display().to_string(),
        "--no-log".into(),
        "-m".into(),
        "gpt-4o".into(),
        "--functions".into(),
        tools.display().to_string(),
        TASK.into(),
    ];
    let done = run_on_host(&argv, &env, &project, Duration::from_secs(120));
    assert_task_done(
        &models,
        done.code,
        &format!("{}{}", done.stdout, done.stderr),
        &project,
    );
    assert!(done.stdout.contains(FINAL), "{}", done.stdout);
}

#[test]
fn aider_does_the_task_on_the_host() {
    let python = installed("aider/bin/python");
    let (_dir, project, home) = host_project();
    std::fs::write(project.join("test_greet.py"), AIDER_TEST).unwrap();
    let models = ScriptedModels::start(aider_script());
    let mut env = quiet_env(&home);
    env.push(("OPENAI_BASE_URL", models.openai_base()));
    env.push(("OPENAI_API_KEY", "sk-scripted".into()));
    let argv: Vec<String> = vec![
        python.display().to_string(),
        "-m".into(),
        "aider".into(),
        "--model".into(),
        "openai/gpt-4o".into(),
        "--no-git".into(),
        "--yes-always".into(),
        "--no-check-update".into(),
        "--no-analytics".into(),
        "--no-show-release-notes".into(),
        "--no-show-model-warnings".into(),
        "--no-pretty".into(),
        "--auto-test".into(),
        "--test-cmd".into(),
        "python3 test_greet.py".into(),
        "--message".into(),
        "Write greet.py so that test_greet.py passes.".into(),
        "greet.py".into(),
    ];
    let done = run_on_host(&argv, &env, &project, Duration::from_secs(180));
    let context = format!("{}{}\n{}", done.stdout, done.stderr, models.report());
    assert!(models.problems().is_empty(), "{context}");
    assert!(models.finished(), "{context}");
    assert_eq!(done.code, Some(0), "{context}");
    assert_eq!(
        std::fs::read_to_string(project.join("greet.py")).unwrap(),
        "def greet(name):\n    return f\"Hello, {name}!\"\n",
        "{context}"
    );
}
