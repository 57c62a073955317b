//! Today's coding agents, installed from the package registries by scripts/test
//! (scripts/install-agents) and run unmodified against a scripted model server
//! (tollgate_tests::scripted_models) on a task that needs their own tools: write a file, run a
//! command whose output must come back to the model.
//!
//! For each agent, three tests:
//! - `*_on_the_host`: the control. The shipped spec's command, mapped to the host, talks
//!   straight to the scripted server: the script and the agent's settings are right.
//! - `*_in_a_sandbox_beside_its_model`: the sandbox's control. The shipped spec in a sandbox,
//!   the scripted server started beside the agent on the sandbox's own loopback instead of a
//!   route: the spec gives the agent all it needs in a sandbox (programs, limits, settings).
//! - `*_in_a_sandbox`: the real test. The agent's run spec from `examples/agents/` as shipped
//!   (only host paths replaced), no egress grant: its only way to a model is the sandbox's
//!   endpoint, and the supervisor's one route points at the scripted server in the API that
//!   agent speaks.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tollgate_proto::v1 as pb;
use tollgate_supervisor::records::RunState;
use tollgate_tests::repo_root;
use tollgate_tests::require_root;
use tollgate_tests::run_fixture::{agents_dir, receipt_of, RunFixture as Fixture};
use tollgate_tests::scripted_models::agents::{script, AIDER_TEST, CONTENT, COUNTED, FINAL};
use tollgate_tests::scripted_models::ScriptedModels;

/// Where the shipped specs name the agents (scripts/install-agents installs them there as root).
const SHIPPED_AGENTS: &str = "/usr/local/lib/tollgate-agents";

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

/// The sandbox's model endpoint, as the shipped specs name it where they must (Codex's
/// provider settings): the shim's fixed loopback port.
const SANDBOX_ENDPOINT: &str = "http://127.0.0.1:7710";

/// `examples/agents/NAME.toml` as shipped, its host paths replaced (the project, this
/// repository, where the agents are installed), as the mint request it makes.
fn shipped(name: &str, project: &Path) -> pb::MintReceiptRequest {
    let file = repo_root().join(format!("examples/agents/{name}.toml"));
    let text = std::fs::read_to_string(&file)
        .unwrap()
        .replace("/home/me/project", project.to_str().unwrap())
        .replace("/home/me/tollgate", repo_root().to_str().unwrap())
        .replace(SHIPPED_AGENTS, agents_dir().to_str().unwrap());
    tollgate_receipt::spec::RunSpec::parse(&text)
        .and_then(|spec| spec.to_request())
        .unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// `text` (a path inside the sandbox) as the host sees it: a mounted grant's mount replaced by
/// its host path.
fn on_host(request: &pb::MintReceiptRequest, text: &str) -> String {
    for grant in request.fs.iter().filter(|g| !g.mount.is_empty()) {
        if let Some(rest) = text.strip_prefix(grant.mount.as_str()) {
            if rest.is_empty() || rest.starts_with('/') {
                return format!("{}{rest}", grant.path);
            }
        }
    }
    text.to_owned()
}

/// What a test's project holds before the agent starts.
fn prepare(name: &str, project: &Path) {
    if name == "aider" {
        std::fs::write(project.join("test_greet.py"), AIDER_TEST).unwrap();
    }
}

/// The control: the shipped spec's command, env and working directory mapped to the host,
/// against the scripted server straight, with the variables the sandbox would set.
fn control(name: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (project, home) = (dir.path().join("project"), dir.path().join("home"));
    std::fs::create_dir_all(&project).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    prepare(name, &project);
    let request = shipped(name, &project);
    let agent = request.agent.clone().unwrap();
    let program = on_host(&request, &agent.argv[0]);
    assert!(
        Path::new(&program).exists(),
        "{program} is missing: scripts/test installs the agents (scripts/install-agents)"
    );
    let models = ScriptedModels::start(script(name, project.to_str().unwrap()));
    let argv: Vec<String> = agent
        .argv
        .iter()
        .map(|arg| on_host(&request, arg).replace(SANDBOX_ENDPOINT, &models.endpoint))
        .collect();
    let mut env: Vec<(&str, String)> = agent
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    env.extend([
        ("HOME", home.display().to_string()),
        ("OPENAI_BASE_URL", models.openai_base()),
        ("OPENAI_API_KEY", "tollgate".into()),
        ("ANTHROPIC_BASE_URL", models.endpoint.clone()),
        ("ANTHROPIC_API_KEY", "tollgate".into()),
    ]);
    let cwd = on_host(&request, &agent.workdir);
    let done = run_on_host(&argv, &env, Path::new(&cwd), Duration::from_secs(180));
    check(name, &models, &done, &project);
}

/// The checks for agent `name` once it has ended.
fn check(name: &str, models: &ScriptedModels, done: &Finished, project: &Path) {
    let output = format!("{}{}", done.stdout, done.stderr);
    if name == "aider" {
        let context = format!("exit {:?}\n{output}\n{}", done.code, models.report());
        assert!(models.problems().is_empty(), "{context}");
        assert!(models.finished(), "{context}");
        assert_eq!(done.code, Some(0), "{context}");
        assert_eq!(
            std::fs::read_to_string(project.join("greet.py"))
                .ok()
                .as_deref(),
            Some("def greet(name):\n    return f\"Hello, {name}!\"\n"),
            "{context}"
        );
        // The vendor's name, as the agent sends it.
        assert!(
            models.models_asked().iter().all(|m| m == "gpt-4o"),
            "{context}"
        );
    } else {
        assert_task_done(models, done.code, &output, project);
        assert!(done.stdout.contains(FINAL), "{output}");
    }
}

/// The real test: the shipped spec in a sandbox with no egress grant, whose one model route
/// (`local`, speaking `api`) is the scripted server.
fn in_sandbox(name: &str, api: &str, model: &str, id_base: u32) {
    if !require_root() {
        return;
    }
    let fx = Fixture::new(&format!("coding-{name}"), id_base);
    let project = fx.data.parent().unwrap().join("project");
    open_dir(&project);
    prepare(name, &project);
    let request = shipped(name, &project);
    assert!(request.egress.is_empty(), "{name}: the spec grants egress");
    let models = ScriptedModels::start(script(name, "/project"));
    let _runtime = fx.route_local(api, model, &models.endpoint);

    let receipt = receipt_of(request);
    let run_id = fx.start(&fx.sign(receipt)).unwrap();
    let record = fx.manager.wait(&run_id, Duration::from_secs(300)).unwrap();
    let done = Finished {
        code: record.report.as_ref().and_then(|r| r.exit_code),
        stdout: fx.output_of(&run_id),
        stderr: fx.output_of(&format!("{run_id}:stderr")),
    };
    assert_eq!(
        record.state,
        RunState::Exited,
        "{}{}\n{}",
        done.stdout,
        done.stderr,
        models.report()
    );
    check(name, &models, &done, &project);
    // Every model call went through the gateway, on the one route, and was counted.
    let report = record.report.as_ref().unwrap();
    assert_eq!(report.routes_used, ["local"], "{}", models.report());
    assert!(
        report.route_usage[0].calls >= models.turns_served() as u64,
        "{:?}",
        report.route_usage
    );
    fx.assert_gone(&run_id);
}

/// The sandbox's control: the shipped spec in a sandbox, but with the scripted server beside
/// the agent (the `scripted-models` program, started ahead of it by a shell, on the sandbox's
/// own loopback) instead of a route. It proves the spec gives the agent what it needs in a
/// sandbox — its programs, limits and settings — whatever the gateway does.
fn beside_in_sandbox(name: &str, id_base: u32) {
    if !require_root() {
        return;
    }
    let fx = Fixture::new(&format!("coding-beside-{name}"), id_base);
    let project = fx.data.parent().unwrap().join("project");
    open_dir(&project);
    prepare(name, &project);
    let mut request = shipped(name, &project);
    request.routes.clear();
    let server = tollgate_tests::bin_path("scripted-models");
    let mut agent = request.agent.take().unwrap();
    // The agent's own command, quoted for sh; the sandbox's endpoint is the server's.
    let command: Vec<String> = agent
        .argv
        .iter()
        .map(|arg| {
            format!("'{}'", arg.replace('\'', r"'\''")).replace(SANDBOX_ENDPOINT, "'\"$E\"'")
        })
        .collect();
    agent.argv = vec![
        "/bin/sh".into(),
        "-c".into(),
        format!(
            "/opt/scripted/scripted-models {name} /tmp/endpoint /project/scripted.txt & \
             while [ ! -s /tmp/endpoint ]; do /usr/bin/sleep 0.1; done; read -r E < /tmp/endpoint; \
             export OPENAI_BASE_URL=$E/v1 OPENAI_API_KEY=tollgate ANTHROPIC_BASE_URL=$E ANTHROPIC_API_KEY=tollgate; \
             {}; code=$?; i=0; while [ $i -lt 100 ]; do read -r F < /project/scripted.txt; \
             case \"$F\" in finished=true*) break;; esac; /usr/bin/sleep 0.1; i=$((i+1)); done; \
             /usr/bin/sleep 0.2; exit $code",
            command.join(" ")
        ),
    ];
    request.agent = Some(agent);
    request.fs.push(pb::FsGrant {
        path: server.parent().unwrap().display().to_string(),
        access: pb::FsAccess::Read as i32,
        mount: "/opt/scripted".into(),
        exec: false,
        ask: false,
        ask_reads: false,
    });
    request.exec.extend([
        "/bin/sh".into(),
        "/usr/bin/sleep".into(),
        "/opt/scripted/scripted-models".into(),
    ]);
    let run_id = fx.start(&fx.sign(receipt_of(request))).unwrap();
    let record = fx.manager.wait(&run_id, Duration::from_secs(300)).unwrap();
    let report = std::fs::read_to_string(project.join("scripted.txt")).unwrap_or_default();
    let context = format!(
        "{:?}, exit {:?}\n{}{}\n{report}",
        record.state,
        record.report.as_ref().and_then(|r| r.exit_code),
        fx.output_of(&run_id),
        fx.output_of(&format!("{run_id}:stderr"))
    );
    assert_eq!(record.state, RunState::Exited, "{context}");
    assert_eq!(
        record.report.as_ref().unwrap().exit_code,
        Some(0),
        "{context}"
    );
    assert!(
        report.starts_with("finished=true problems=0\n"),
        "{context}"
    );
    if name == "aider" {
        assert_eq!(
            std::fs::read_to_string(project.join("greet.py"))
                .ok()
                .as_deref(),
            Some("def greet(name):\n    return f\"Hello, {name}!\"\n"),
            "{context}"
        );
    } else {
        assert_eq!(
            std::fs::read_to_string(project.join("hello.txt"))
                .ok()
                .as_deref(),
            Some(CONTENT),
            "{context}"
        );
        assert!(
            report
                .lines()
                .any(|line| line.starts_with("  result of") && line.contains(COUNTED)),
            "{context}"
        );
    }
    fx.assert_gone(&run_id);
}

#[test]
fn claude_code_does_the_task_on_the_host() {
    control("claude-code");
}

#[test]
fn codex_does_the_task_on_the_host() {
    control("codex");
}

#[test]
fn opencode_does_the_task_on_the_host() {
    control("opencode");
}

#[test]
fn aider_does_the_task_on_the_host() {
    control("aider");
}

#[test]
fn llm_does_the_task_on_the_host() {
    control("llm");
}

/// Claude Code speaks Anthropic Messages with tools (`Write`, `Bash`), streamed.
#[test]
fn claude_code_does_the_task_in_a_sandbox() {
    in_sandbox("claude-code", "anthropic", "claude-sonnet-4-5", 330_000);
}

/// Codex speaks only the Responses API (`exec_command`), streamed.
#[test]
fn codex_does_the_task_in_a_sandbox() {
    in_sandbox("codex", "openai-responses", "gpt-5-codex", 330_100);
}

/// opencode speaks Anthropic Messages with tools (`write`, `bash`), streamed, through its
/// built-in `anthropic` provider.
#[test]
fn opencode_does_the_task_in_a_sandbox() {
    in_sandbox("opencode", "anthropic", "claude-sonnet-4-5", 330_800);
}

/// aider speaks chat completions with its own edit format, asking for `gpt-4o` by the
/// vendor's name.
#[test]
fn aider_does_the_task_in_a_sandbox() {
    in_sandbox("aider", "openai", "gpt-4o", 330_200);
}

/// llm speaks chat completions with tools (its `--functions`), streamed.
#[test]
fn llm_does_the_task_in_a_sandbox() {
    in_sandbox("llm", "openai", "gpt-4o", 330_300);
}

/// Claude Code in a sandbox with its model beside it.
#[test]
fn claude_code_does_the_task_in_a_sandbox_beside_its_model() {
    beside_in_sandbox("claude-code", 330_400);
}

/// Codex in a sandbox with its model beside it.
#[test]
fn codex_does_the_task_in_a_sandbox_beside_its_model() {
    beside_in_sandbox("codex", 330_500);
}

/// opencode in a sandbox with its model beside it.
#[test]
fn opencode_does_the_task_in_a_sandbox_beside_its_model() {
    beside_in_sandbox("opencode", 330_900);
}

/// aider in a sandbox with its model beside it.
#[test]
fn aider_does_the_task_in_a_sandbox_beside_its_model() {
    beside_in_sandbox("aider", 330_600);
}

/// llm in a sandbox with its model beside it.
#[test]
fn llm_does_the_task_in_a_sandbox_beside_its_model() {
    beside_in_sandbox("llm", 330_700);
}
