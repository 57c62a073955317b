//! The agents people bring, run in place on real sandboxes (root): a Python agent from its own
//! virtualenv (compiled extensions included), a Node.js agent from its `node_modules`, a
//! static binary from a read-only grant — and W^X kept: no receipt whose write grant reaches
//! an executable grant's files starts, by path or through another name.

use std::path::Path;
use std::time::Duration;

use tollgate_proto::v1 as pb;
use tollgate_supervisor::error::StartError;
use tollgate_supervisor::records::RunState;
use tollgate_tests::require_root;
use tollgate_tests::run_fixture::{agent_node, with_venv_agent, RunFixture as Fixture};

/// A directory readable by the sandbox's unprivileged uid (the temporary directory holding
/// it is not: grants are mounted from their own descriptor, not reached through it).
fn open_dir(path: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::create_dir_all(path).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn read_grant(path: &Path, mount: &str) -> pb::FsGrant {
    pb::FsGrant {
        path: path.display().to_string(),
        access: pb::FsAccess::Read as i32,
        mount: mount.into(),
        exec: false,
        ask: false,
        ask_reads: false,
    }
}

fn write_grant(path: &Path, mount: &str) -> pb::FsGrant {
    pb::FsGrant {
        access: pb::FsAccess::Write as i32,
        ..read_grant(path, mount)
    }
}

/// Runs `receipt` to its end and returns (stdout, stderr), asserting it exited 0.
fn run_to_end(fx: &Fixture, receipt: pb::Receipt) -> (String, String) {
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
    fx.assert_gone(&run_id);
    (output, errors)
}

/// The agent: the official SDK (pydantic-core and jiter are compiled extensions, loaded from
/// the read-only virtualenv) against the sandbox's model endpoint, then a write through the
/// gateway with the shim's tool.
const VENV_AGENT: &str = r#"
import os, subprocess, sys, openai, pydantic_core
assert sys.prefix == "/agent/venv", sys.prefix
client = openai.OpenAI()
reply = client.chat.completions.create(model="local", messages=[{"role": "user", "content": "hi"}])
print("reply", reply.choices[0].message.content)
subprocess.run(["tollgate-shim", "tool", "write", os.environ["OUT"] + "/answer.txt", "--create"],
               input=reply.choices[0].message.content.encode(), check=True, stdout=subprocess.DEVNULL)
print("wrote")
"#;

#[test]
fn a_python_agent_runs_from_its_own_virtualenv() {
    if !require_root() {
        return;
    }
    let fx = Fixture::new("agent-venv", 208_700);
    let (_runtime, _local) = fx.serve_local_route(tollgate_tests::fake_models::Script {
        text: "forty-two".into(),
        prompt_tokens: 3,
        completion_tokens: 2,
        ..Default::default()
    });
    let out = fx.data.parent().unwrap().join("out");
    open_dir(&out);
    let mut receipt = fx.receipt("", 60);
    receipt.exec.clear();
    let out_text = out.display().to_string();
    with_venv_agent(&mut receipt, VENV_AGENT, &[("OUT", &out_text)]);
    receipt.fs.push(write_grant(&out, ""));
    receipt.limits.as_mut().unwrap().tokens = 1_000;
    receipt.limits.as_mut().unwrap().memory_bytes = 512 << 20;
    receipt.routes = vec![pb::RouteGrant {
        name: "local".into(),
        max_sensitivity: pb::Sensitivity::High as i32,
        ask: false,
    }];
    let (output, errors) = run_to_end(&fx, receipt);
    assert_eq!(output, "reply forty-two\nwrote\n", "{errors}");
    assert_eq!(
        std::fs::read_to_string(out.join("answer.txt")).unwrap(),
        "forty-two"
    );
}

/// The agent: `semver` required from `node_modules`, and its `.bin/semver` program run (a
/// `#!/usr/bin/env node` script: the kernel runs env, env runs node).
const NODE_AGENT: &str = r#"
const semver = require("semver");
const { execFileSync } = require("child_process");
console.log("valid", semver.valid("1.2.3"));
const bumped = execFileSync("/agent/node_modules/.bin/semver", ["1.2.3", "-i", "minor"]).toString().trim();
console.log("bumped", bumped);
"#;

#[test]
fn a_node_agent_runs_from_its_node_modules() {
    if !require_root() {
        return;
    }
    let fx = Fixture::new("agent-node", 208_720);
    let mut receipt = fx.receipt("", 60);
    receipt.fs.push(read_grant(&agent_node(), "/agent"));
    receipt.exec = vec![
        "/usr/bin/node".into(),
        "/usr/bin/env".into(),
        "/agent/node_modules/.bin/semver".into(),
    ];
    receipt.agent = Some(pb::AgentSpec {
        argv: vec!["/usr/bin/node".into(), "-e".into(), NODE_AGENT.into()],
        env: [("NODE_PATH".to_owned(), "/agent/node_modules".to_owned())].into(),
        ..Default::default()
    });
    receipt.limits.as_mut().unwrap().memory_bytes = 512 << 20;
    let (output, errors) = run_to_end(&fx, receipt);
    assert_eq!(output, "valid 1.2.3\nbumped 1.3.0\n", "{errors}");
}

/// A static program (gcc -static) that prints its argument.
const HELLO_C: &str = r#"
#include <stdio.h>
int main(int argc, char **argv) { printf("hello from %s\n", argc > 1 ? argv[1] : "nobody"); return 0; }
"#;

fn compile_static(dir: &Path, name: &str) {
    let source = dir.join(format!("{name}.c"));
    std::fs::write(&source, HELLO_C).unwrap();
    let built = std::process::Command::new("gcc")
        .args(["-static", "-O1", "-o"])
        .arg(dir.join(name))
        .arg(&source)
        .status()
        .expect("gcc is installed");
    assert!(built.success(), "gcc -static failed");
    std::fs::remove_file(source).unwrap();
}

#[test]
fn a_static_binary_runs_from_a_read_only_grant_and_nothing_unlisted_does() {
    if !require_root() {
        return;
    }
    let fx = Fixture::new("agent-static", 208_740);
    let tools = fx.data.parent().unwrap().join("tools");
    open_dir(&tools);
    compile_static(&tools, "hello");
    compile_static(&tools, "unlisted");
    let mut receipt = fx.receipt(
        "/opt/tools/hello sandbox; \
         /opt/tools/unlisted 2>/dev/null || echo unlisted refused; \
         touch /opt/tools/new 2>/dev/null || echo grant read-only; \
         cp /opt/tools/hello /tmp/copy && { /tmp/copy 2>/dev/null || echo copy refused; }",
        60,
    );
    receipt.fs.push(read_grant(&tools, "/opt/tools"));
    receipt.exec.extend([
        "/opt/tools/hello".into(),
        "/usr/bin/touch".into(),
        "/usr/bin/cp".into(),
    ]);
    let (output, errors) = run_to_end(&fx, receipt);
    assert_eq!(
        output, "hello from sandbox\nunlisted refused\ngrant read-only\ncopy refused\n",
        "{errors}"
    );

    // Pinned as the agent itself, from the grant.
    let mut receipt = fx.receipt("", 60);
    receipt.fs.push(read_grant(&tools, "/opt/tools"));
    receipt.exec = vec!["/opt/tools/hello".into()];
    receipt.agent = Some(pb::AgentSpec {
        argv: vec!["/opt/tools/hello".into(), "itself".into()],
        ..Default::default()
    });
    let (output, errors) = run_to_end(&fx, receipt);
    assert_eq!(output, "hello from itself\n", "{errors}");
}

/// An executable read grant inside a user's private (0700) directory is mounted id-mapped
/// (its owner shown as the agent): it starts every time, not only when the agent process wins
/// a race with pid 1's writing of its id map. A hundred starts in a row, each to its end.
#[test]
fn an_id_mapped_executable_grant_starts_every_time() {
    if !require_root() {
        return;
    }
    use std::os::unix::fs::PermissionsExt as _;
    let fx = Fixture::new("agent-idmap-starts", 208_900);
    let grant = fx.data.parent().unwrap().join("g");
    std::fs::create_dir_all(grant.join("bin")).unwrap();
    compile_static(&grant.join("bin"), "hello");
    for (path, mode) in [(&grant, 0o700), (&grant.join("bin"), 0o700)] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    for path in [grant.clone(), grant.join("bin"), grant.join("bin/hello")] {
        nix::unistd::chown(
            &path,
            Some(nix::unistd::Uid::from_raw(4321)),
            Some(nix::unistd::Gid::from_raw(4321)),
        )
        .unwrap();
    }
    let mut failures = Vec::new();
    for start in 0..100 {
        let mut receipt = fx.receipt("", 60);
        receipt.fs.push(pb::FsGrant {
            exec: true,
            ..read_grant(&grant, "/g")
        });
        receipt.exec = vec!["/g/bin/hello".into()];
        receipt.agent = Some(pb::AgentSpec {
            argv: vec!["/g/bin/hello".into(), format!("start {start}")],
            ..Default::default()
        });
        let run_id = match fx.start(&fx.sign(receipt)) {
            Ok(run_id) => run_id,
            Err(e) => {
                failures.push(format!("start {start}: {e}"));
                continue;
            }
        };
        let record = fx.manager.wait(&run_id, Duration::from_secs(60)).unwrap();
        let output = fx.output_of(&run_id);
        if record.state != RunState::Exited || output != format!("hello from start {start}\n") {
            failures.push(format!(
                "start {start}: {:?} {output:?} {}",
                record.state,
                fx.output_of(&format!("{run_id}:stderr"))
            ));
        }
        fx.assert_gone(&run_id);
    }
    assert!(
        failures.is_empty(),
        "{} of 100 starts failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// A test's bind mount of `source` at `target`, unmounted however the test ends.
struct BindMount(std::path::PathBuf);

impl BindMount {
    fn new(source: &Path, target: &Path) -> Self {
        nix::mount::mount(
            Some(source),
            target,
            None::<&str>,
            nix::mount::MsFlags::MS_BIND,
            None::<&str>,
        )
        .unwrap();
        Self(target.to_owned())
    }
}

impl Drop for BindMount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

fn assert_refused_for_wx(fx: &Fixture, receipt: pb::Receipt) {
    let signed = fx.sign(receipt);
    match fx.start(&signed) {
        Err(StartError::Grant { code, reason }) => {
            assert_eq!(code, "grant_wx", "{reason}");
            assert!(reason.contains("W^X"), "{reason}");
            assert!(!reason.contains('\n'), "{reason}");
        }
        other => panic!("expected a W^X refusal, got {other:?}"),
    }
    assert!(fx.manager.live_ids().is_empty(), "nothing started");
}

#[test]
fn a_write_grant_that_reaches_an_executable_grant_is_refused() {
    if !require_root() {
        return;
    }
    let fx = Fixture::new("agent-wx", 208_760);
    let base = fx.data.parent().unwrap().join("wx");
    let tools = base.join("tools");
    open_dir(&tools);
    compile_static(&tools, "hello");
    let executable = |receipt: &mut pb::Receipt| {
        receipt.fs.push(read_grant(&tools, "/opt/tools"));
        receipt.exec.push("/opt/tools/hello".into());
    };

    // By path: a gateway-only write grant above the executable one.
    let mut receipt = fx.receipt("/opt/tools/hello", 60);
    executable(&mut receipt);
    receipt.fs.push(write_grant(&base, ""));
    assert_refused_for_wx(&fx, receipt);

    // Through another name: the same directory bind-mounted elsewhere, granted writable.
    // The paths share nothing; the pinned files are the same.
    let alias = fx.data.parent().unwrap().join("alias");
    open_dir(&alias);
    let _unmount = BindMount::new(&tools, &alias);
    let mut receipt = fx.receipt("/opt/tools/hello", 60);
    executable(&mut receipt);
    receipt.fs.push(write_grant(&alias, "/out"));
    assert_refused_for_wx(&fx, receipt);

    // A write grant whose tree holds a mount of the executable grant's directory.
    let outer = fx.data.parent().unwrap().join("outer");
    let inner = outer.join("inner");
    open_dir(&inner);
    let _unmount_inner = BindMount::new(&tools, &inner);
    let mut receipt = fx.receipt("/opt/tools/hello", 60);
    executable(&mut receipt);
    receipt.fs.push(write_grant(&outer, ""));
    assert_refused_for_wx(&fx, receipt);

    // Beside it, the same receipt starts.
    let beside = fx.data.parent().unwrap().join("beside");
    open_dir(&beside);
    let mut receipt = fx.receipt("/opt/tools/hello", 60);
    executable(&mut receipt);
    receipt.fs.push(write_grant(&beside, "/out"));
    let (output, _) = run_to_end(&fx, receipt);
    assert_eq!(output, "hello from nobody\n");
}

/// `examples/run.toml` as shipped — minted through `tollgate mint --spec` by an operator whose
/// ceiling is `examples/ceiling.toml` as shipped (`tollgate operator add`), started on a real
/// supervisor — with only the host paths (`/home/me`, `/home/me/project`) replaced by a
/// project this test makes: `examples/python/summarize.py` as its agent.py and a virtualenv
/// of the host's Python beside it. The supervisor's routes are fake backends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_run_spec_runs_as_shipped() {
    if !require_root() {
        return;
    }
    use tollgate_tests::{bin_path, AuthorityProcess, SupervisorProcess};
    let dir = tempfile::tempdir().unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .canonicalize()
        .unwrap();
    // The project: the example agent, a README, its own virtualenv.
    let project = dir.path().join("project");
    open_dir(&project);
    std::fs::copy(
        examples.join("python/summarize.py"),
        project.join("agent.py"),
    )
    .unwrap();
    std::fs::write(project.join("README.md"), "# Demo\nA tiny project.\n").unwrap();
    let venv = std::process::Command::new("/usr/bin/python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(project.join(".venv"))
        .status()
        .unwrap();
    assert!(venv.success());
    let readable = std::process::Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(&project)
        .status()
        .unwrap();
    assert!(readable.success());

    let script = |text: &str| tollgate_tests::fake_models::Script {
        text: text.into(),
        prompt_tokens: 20,
        completion_tokens: 6,
        models: vec!["qwen".into(), "claude".into()],
        ..Default::default()
    };
    let local = tollgate_tests::fake_models::FakeBackend::start(script("A demo project.")).await;
    let cloud = tollgate_tests::fake_models::FakeBackend::start(script("unused")).await;
    let key = dir.path().join("claude.key");
    std::fs::write(&key, "sk-ant-api03-example-key-for-the-test-only\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let routes = dir.path().join("routes.toml");
    std::fs::write(
        &routes,
        format!(
            "[[route]]\nname = \"local\"\nkind = \"local\"\npreset = \"vllm\"\nendpoint = \"{}\"\nmodel = \"qwen\"\n\n\
             [[route]]\nname = \"claude\"\nkind = \"cloud\"\napi = \"anthropic\"\nendpoint = \"{}\"\nmodel = \"claude\"\nkey_secret = \"file:{}\"\n",
            local.endpoint,
            cloud.endpoint,
            key.display()
        ),
    )
    .unwrap();

    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let supervisor = SupervisorProcess::start_with_flags(
        &dir.path().join("supervisor"),
        authority.addr(),
        "example-run",
        208_780,
        vec!["--routes".into(), routes.display().to_string()],
    );
    let spec = std::fs::read_to_string(examples.join("run.toml"))
        .unwrap()
        .replace("/home/me/project", project.to_str().unwrap());
    let spec_file = dir.path().join("run.toml");
    std::fs::write(&spec_file, spec).unwrap();
    let ceiling = std::fs::read_to_string(examples.join("ceiling.toml"))
        .unwrap()
        .replace("/home/me", dir.path().to_str().unwrap());
    let ceiling_file = dir.path().join("ceiling.toml");
    std::fs::write(&ceiling_file, ceiling).unwrap();
    let operator_token = dir.path().join("example.token");
    let cli = |token: &Path, args: &[&str]| {
        std::process::Command::new(bin_path("tollgate"))
            .args(["--authority", authority.addr()])
            .arg("--token-file")
            .arg(token)
            .args(args)
            .output()
            .unwrap()
    };
    let added = cli(
        &authority.data_dir().join("admin.token"),
        &[
            "operator",
            "add",
            "example",
            "--ceiling",
            ceiling_file.to_str().unwrap(),
            "--token-out",
            operator_token.to_str().unwrap(),
        ],
    );
    assert!(added.status.success(), "{added:?}");
    let minted = cli(
        &operator_token,
        &["mint", "--spec", spec_file.to_str().unwrap()],
    );
    assert!(minted.status.success(), "{minted:?}");
    let text = String::from_utf8(minted.stdout).unwrap().trim().to_owned();
    let run_id = supervisor.start_run(text).await;
    let run = supervisor
        .wait_ended(&run_id, Duration::from_secs(60))
        .await;
    let output = supervisor.output(&run_id).await;
    let report = run.report.unwrap();
    assert_eq!(report.exit_code, Some(0), "{output}{}", supervisor.log());
    let agent_lines = std::fs::read_to_string(project.join("agent.py"))
        .unwrap()
        .lines()
        .count();
    assert_eq!(
        output,
        format!("python: /project/.venv\nlines: README.md:2, agent.py:{agent_lines}\nsummary: A demo project.\n"),
    );
}

#[test]
fn an_agent_sees_its_own_powers_and_what_is_left() {
    if !require_root() {
        return;
    }
    let fx = Fixture::new("agent-powers", 208_800);
    let docs = fx.data.parent().unwrap().join("docs");
    open_dir(&docs);
    let mut receipt = fx.receipt(
        &format!(
            "tollgate-shim tool list {} >/dev/null && tollgate-shim receipt --json && tollgate-shim receipt",
            docs.display()
        ),
        60,
    );
    receipt.fs.push(read_grant(&docs, ""));
    let run_id = receipt.receipt_id.clone();
    let (output, errors) = run_to_end(&fx, receipt);
    let (json, text) = output.split_once('\n').unwrap();
    let powers: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(powers["run_id"], run_id.as_str(), "{errors}");
    assert_eq!(powers["fs"][0]["path"], docs.display().to_string());
    assert_eq!(powers["fs"][0]["access"], "read");
    assert_eq!(powers["exec"][0], "/bin/sh");
    // One call made (the list) of the ten; asking for the receipt is not a call.
    assert_eq!(powers["left"]["tool_calls"], 9);
    assert_eq!(powers["limits"]["memory_bytes"], 128 << 20);
    let seconds = powers["seconds_left"].as_i64().unwrap();
    assert!((1..=60).contains(&seconds), "{seconds}");
    assert!(
        text.contains(&format!("{} read through the gateway only", docs.display())),
        "{text}"
    );
    assert!(text.contains("left      9 of 10 tool calls"), "{text}");
}

#[test]
fn a_private_home_directory_is_the_agents_own_and_new_files_are_the_owners() {
    if !require_root() {
        return;
    }
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let fx = Fixture::new("agent-home", 208_820);
    // A home-style directory: owned by an unprivileged user, 0700, a private file in it, and
    // another user's file the agent must not get.
    let home = fx.data.parent().unwrap().join("home");
    std::fs::create_dir(&home).unwrap();
    std::fs::write(home.join("notes.txt"), "my notes\n").unwrap();
    std::fs::write(home.join("theirs.txt"), "not yours\n").unwrap();
    let owner = |path: &Path, id: u32, mode: u32| {
        nix::unistd::chown(
            path,
            Some(nix::unistd::Uid::from_raw(id)),
            Some(nix::unistd::Gid::from_raw(id)),
        )
        .unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    owner(&home, 4321, 0o700);
    owner(&home.join("notes.txt"), 4321, 0o600);
    owner(&home.join("theirs.txt"), 4444, 0o600);
    let mut receipt = fx.receipt(
        &format!(
            "cat /home/me/notes.txt; stat -c '%u %a' /home/me/notes.txt; \
             cat /home/me/theirs.txt 2>/dev/null || echo theirs refused; \
             echo made > /home/me/new.txt && mkdir /home/me/sub && echo sub > /home/me/sub/x; \
             printf gw | tollgate-shim tool write {}/gw.txt --create >/dev/null && echo gateway wrote; \
             grep ^agent: /etc/passwd | cut -d: -f6",
            home.display()
        ),
        60,
    );
    receipt.fs.push(write_grant(&home, "/home/me"));
    // Programs that look their user up (ssh, getpwuid) find the same home as HOME.
    receipt.home = "/home/me".into();
    receipt.exec.extend(
        [
            "/usr/bin/cat",
            "/usr/bin/stat",
            "/usr/bin/mkdir",
            "/usr/bin/grep",
            "/usr/bin/cut",
        ]
        .map(String::from),
    );
    let (output, errors) = run_to_end(&fx, receipt);
    assert_eq!(
        output, "my notes\n1000 600\ntheirs refused\ngateway wrote\n/home/me\n",
        "{errors}"
    );
    // The host sees the owner's ids on everything new, the agent's and the gateway's.
    for made in ["new.txt", "sub", "sub/x", "gw.txt"] {
        let meta = std::fs::metadata(home.join(made)).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (4321, 4321), "{made}");
    }
    assert_eq!(
        std::fs::read_to_string(home.join("new.txt")).unwrap(),
        "made\n"
    );
}

#[test]
fn the_sandbox_has_an_etc_of_its_own_not_the_hosts() {
    if !require_root() {
        return;
    }
    let fx = Fixture::new("agent-etc", 208_840);
    let mut receipt = fx.receipt(
        "id -un; grep -c . /etc/passwd; grep tollgate /etc/hosts | cut -f2; \
         test -e /etc/shadow || echo no shadow; test -e /etc/pip.conf || echo no pip.conf; \
         test -e /etc/machine-id || echo no machine-id; \
         test -s /etc/ssl/certs/ca-certificates.crt && echo certificates; \
         test -r /etc/ld.so.cache && echo loader cache; \
         touch /etc/x 2>/dev/null || echo read-only",
        60,
    );
    receipt.exec.extend(
        [
            "/usr/bin/id",
            "/usr/bin/grep",
            "/usr/bin/cut",
            "/usr/bin/test",
            "/usr/bin/touch",
        ]
        .map(String::from),
    );
    let (output, errors) = run_to_end(&fx, receipt);
    assert_eq!(
        output,
        "agent\n3\ntollgate\nno shadow\nno pip.conf\nno machine-id\ncertificates\nloader cache\nread-only\n",
        "{errors}"
    );
}

/// The Debian trixie userland scripts/test makes once with debootstrap.
fn test_rootfs() -> std::path::PathBuf {
    let dir = std::env::var_os("TOLLGATE_TEST_ROOTFS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/var/cache/tollgate-test/rootfs-trixie".into());
    assert!(
        dir.join(".complete").exists(),
        "{} is missing: scripts/test makes it with debootstrap (or set TOLLGATE_TEST_ROOTFS)",
        dir.display()
    );
    dir
}

#[test]
fn a_run_on_a_debootstrap_rootfs_sees_that_userland() {
    if !require_root() {
        return;
    }
    let rootfs = test_rootfs();
    let fx = Fixture::new("agent-rootfs", 208_860);
    let script = "grep VERSION_CODENAME /etc/os-release; \
                  python3 -c 'import sys; print(\"python %d.%d\" % sys.version_info[:2])'; \
                  id -un; grep -c tollgate /etc/hosts; \
                  touch /usr/x 2>/dev/null || echo read-only";
    let on = |rootfs: &str| {
        let mut receipt = fx.receipt(script, 60);
        receipt.rootfs = rootfs.into();
        receipt.exec.extend(
            [
                "/usr/bin/grep",
                "/usr/bin/python3",
                "/usr/bin/id",
                "/usr/bin/touch",
            ]
            .map(String::from),
        );
        receipt.limits.as_mut().unwrap().memory_bytes = 256 << 20;
        receipt
    };
    let expected = "VERSION_CODENAME=trixie\npython 3.13\nagent\n1\nread-only\n";
    // By path.
    let (output, errors) = run_to_end(&fx, on(rootfs.to_str().unwrap()));
    assert_eq!(output, expected, "{errors}");
    // By a name registered under the supervisor's rootfs directory.
    let registered = fx.data.join("rootfs/trixie");
    std::fs::create_dir_all(&registered).unwrap();
    let _bound = BindMount::new(&rootfs, &registered);
    let (output, errors) = run_to_end(&fx, on("trixie"));
    assert_eq!(output, expected, "{errors}");
    // A name nobody registered is refused before the receipt is spent.
    let signed = fx.sign(on("bookworm"));
    match fx.start(&signed) {
        Err(StartError::Grant { code, reason }) => {
            assert_eq!(code, "rootfs");
            assert!(
                reason.contains("tollgate rootfs import bookworm"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    // A write grant over the root file system breaks W^X.
    let mut receipt = on(rootfs.to_str().unwrap());
    receipt.fs.push(write_grant(&rootfs.join("usr/local"), ""));
    let signed = fx.sign(receipt);
    assert!(matches!(
        fx.start(&signed),
        Err(StartError::Grant {
            code: "rootfs" | "grant_wx",
            ..
        })
    ));
}

/// `tollgate rootfs import` as from `docker export`: a tar of a tiny userland (a static
/// program, an os-release, a set-uid file, a FIFO), imported by name, then run on.
#[test]
fn an_imported_rootfs_is_cleaned_on_the_way_in_and_runs() {
    if !require_root() {
        return;
    }
    use std::os::unix::fs::PermissionsExt as _;
    let fx = Fixture::new("agent-import", 208_880);
    let image = fx.data.parent().unwrap().join("image");
    std::fs::create_dir_all(image.join("usr/bin")).unwrap();
    std::fs::create_dir_all(image.join("etc")).unwrap();
    compile_static(&image.join("usr/bin"), "hello");
    std::fs::write(
        image.join("etc/os-release"),
        "PRETTY_NAME=\"Tiny Linux\"\nID=tiny\n",
    )
    .unwrap();
    std::fs::set_permissions(
        image.join("usr/bin/hello"),
        std::fs::Permissions::from_mode(0o4755),
    )
    .unwrap();
    nix::unistd::mkfifo(&image.join("etc/initctl"), nix::sys::stat::Mode::S_IRUSR).unwrap();
    let tar = fx.data.parent().unwrap().join("image.tar");
    let packed = std::process::Command::new("tar")
        .arg("-C")
        .arg(&image)
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()
        .unwrap();
    assert!(packed.success());
    let imported = std::process::Command::new(tollgate_tests::bin_path("tollgate"))
        .args(["rootfs", "import", "tiny"])
        .arg(&tar)
        .arg("--data-dir")
        .arg(&fx.data)
        .arg("--json")
        .output()
        .unwrap();
    assert!(imported.status.success(), "{imported:?}");
    let report: serde_json::Value = serde_json::from_slice(&imported.stdout).unwrap();
    assert_eq!(report["devices_skipped"], 1, "{report}");
    assert_eq!(report["set_id_cleared"], 1, "{report}");
    let hello = fx.data.join("rootfs/tiny/usr/bin/hello");
    assert_eq!(
        std::fs::metadata(&hello).unwrap().permissions().mode() & 0o7777,
        0o755
    );
    assert!(!fx.data.join("rootfs/tiny/etc/initctl").exists());

    let mut receipt = fx.receipt("", 60);
    receipt.rootfs = "tiny".into();
    receipt.exec = vec!["/usr/bin/hello".into()];
    receipt.agent = Some(pb::AgentSpec {
        argv: vec!["/usr/bin/hello".into(), "an imported userland".into()],
        ..Default::default()
    });
    let (output, errors) = run_to_end(&fx, receipt);
    assert_eq!(output, "hello from an imported userland\n", "{errors}");

    let listed = std::process::Command::new(tollgate_tests::bin_path("tollgate"))
        .args(["rootfs", "list", "--data-dir"])
        .arg(&fx.data)
        .output()
        .unwrap();
    let listed = String::from_utf8(listed.stdout).unwrap();
    assert!(
        listed.starts_with("tiny") && listed.contains("Tiny Linux"),
        "{listed}"
    );
}

/// A merged-/usr image, as `docker export` gives one: `/bin`, `/sbin` and `/lib` are links
/// into `/usr`, and `/lib32`, `/libx32` and `/lib64` are links to directories the image does
/// not have (as in Ubuntu's images). It imports, and a run on it starts and runs its program
/// by either name.
#[test]
fn an_imported_rootfs_with_linked_top_level_directories_runs() {
    if !require_root() {
        return;
    }
    let fx = Fixture::new("agent-import-links", 208_920);
    let image = fx.data.parent().unwrap().join("image");
    for dir in ["usr/bin", "usr/sbin", "usr/lib", "etc"] {
        std::fs::create_dir_all(image.join(dir)).unwrap();
    }
    for (link, target) in [
        ("bin", "usr/bin"),
        ("sbin", "usr/sbin"),
        ("lib", "usr/lib"),
        ("lib32", "usr/lib32"),
        ("libx32", "usr/libx32"),
        ("lib64", "/usr/lib64"),
    ] {
        std::os::unix::fs::symlink(target, image.join(link)).unwrap();
    }
    compile_static(&image.join("usr/bin"), "hello");
    std::fs::write(image.join("etc/os-release"), "ID=merged\n").unwrap();
    let tar = fx.data.parent().unwrap().join("image.tar");
    let packed = std::process::Command::new("tar")
        .arg("-C")
        .arg(&image)
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()
        .unwrap();
    assert!(packed.success());
    let imported = std::process::Command::new(tollgate_tests::bin_path("tollgate"))
        .args(["rootfs", "import", "merged"])
        .arg(&tar)
        .arg("--data-dir")
        .arg(&fx.data)
        .output()
        .unwrap();
    assert!(imported.status.success(), "{imported:?}");
    for program in ["/usr/bin/hello", "/bin/hello"] {
        let mut receipt = fx.receipt("", 60);
        receipt.rootfs = "merged".into();
        receipt.exec = vec![program.into()];
        receipt.agent = Some(pb::AgentSpec {
            argv: vec![program.into(), program.into()],
            ..Default::default()
        });
        let (output, errors) = run_to_end(&fx, receipt);
        assert_eq!(output, format!("hello from {program}\n"), "{errors}");
    }
}

/// A real authority and supervisor in a temporary directory, for the tests that use the CLI.
struct Daemons {
    dir: tempfile::TempDir,
    authority: tollgate_tests::AuthorityProcess,
    supervisor: tollgate_tests::SupervisorProcess,
}

impl Daemons {
    fn start(test: &str, host_id_base: u32) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let authority = tollgate_tests::AuthorityProcess::start(&dir.path().join("authority"));
        let supervisor = tollgate_tests::SupervisorProcess::start(
            &dir.path().join("supervisor"),
            authority.addr(),
            test,
            host_id_base,
        );
        Self {
            dir,
            authority,
            supervisor,
        }
    }

    /// Mints `request` as the admin; the receipt's text.
    async fn mint(&self, request: pb::MintReceiptRequest) -> String {
        self.authority
            .client()
            .await
            .mint_receipt(tollgate_tests::authed(
                &self.authority.admin_token(),
                request,
            ))
            .await
            .unwrap()
            .into_inner()
            .text
    }

    /// A receipt for the supervisor running `argv` with these programs allowed.
    fn request(argv: &[&str], exec: &[&str]) -> pb::MintReceiptRequest {
        pb::MintReceiptRequest {
            subject: "agent".into(),
            ttl_seconds: 60,
            audience: vec!["workstation".into()],
            agent: Some(pb::AgentSpec {
                argv: argv.iter().map(|a| (*a).to_owned()).collect(),
                ..Default::default()
            }),
            exec: exec.iter().map(|e| (*e).to_owned()).collect(),
            ..Default::default()
        }
    }

    /// `tollgate` against the supervisor, with its token.
    fn tollgate(&self) -> std::process::Command {
        let mut command = std::process::Command::new(tollgate_tests::bin_path("tollgate"));
        command
            .args(["--supervisor", self.supervisor.addr()])
            .arg("--token-file")
            .arg(self.supervisor.token_file());
        command
    }
}

/// `tollgate cp` out of a live run (files, a directory, the agent's link kept as a link and
/// never followed) and out of a workspace kept after the run ended; `tollgate rm` removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_is_copied_out_of_a_live_run_and_out_of_a_kept_workspace() {
    if !require_root() {
        return;
    }
    let daemons = Daemons::start("agent-cp", 209_000);
    let (dir, supervisor) = (&daemons.dir, &daemons.supervisor);
    let exec = [
        "/bin/sh",
        "/usr/bin/mkdir",
        "/usr/bin/ln",
        "/usr/bin/sleep",
        "/usr/bin/touch",
    ];
    let mint = |script: &str, keep: u64| {
        daemons.mint(pb::MintReceiptRequest {
            workspace_keep_seconds: keep,
            ..Daemons::request(&["/bin/sh", "-c", script], &exec)
        })
    };
    let tollgate = |args: &[&str]| daemons.tollgate().args(args).output().unwrap();

    // A live run.
    let text = mint(
        "mkdir -p /work/out/sub && echo report > /work/out/report.md && \
         echo deep > /work/out/sub/x && ln -s /etc/hostname /work/out/link && \
         touch /work/ready && sleep 60",
        0,
    )
    .await;
    let live = supervisor.start_run(text).await;
    let ready = supervisor
        .data_dir()
        .join("runs")
        .join(&live)
        .join("work/ready");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !ready.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent never got ready"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let dest = dir.path().join("copies");
    std::fs::create_dir(&dest).unwrap();
    let out = tollgate(&["cp", &format!("{live}:/work/out"), dest.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        std::fs::read_to_string(dest.join("out/report.md")).unwrap(),
        "report\n"
    );
    assert_eq!(
        std::fs::read_to_string(dest.join("out/sub/x")).unwrap(),
        "deep\n"
    );
    assert_eq!(
        std::fs::read_link(dest.join("out/link")).unwrap(),
        Path::new("/etc/hostname")
    );
    // A single file to a new name; a path outside /work; a missing one.
    let one = dest.join("renamed.md");
    let out = tollgate(&[
        "cp",
        &format!("{live}:/work/out/report.md"),
        one.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(std::fs::read_to_string(&one).unwrap(), "report\n");
    let out = tollgate(&["cp", &format!("{live}:/work/../etc/shadow"), "-"]);
    assert!(!out.status.success());
    let out = tollgate(&[
        "cp",
        &format!("{live}:/work/missing"),
        dest.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(66), "{out:?}");
    // Into the live run: the agent's own files, in its /work.
    let local = dir.path().join("inputs");
    std::fs::create_dir_all(local.join("nested")).unwrap();
    std::fs::write(local.join("nested/data.csv"), "a,b\n").unwrap();
    let out = tollgate(&["cp", local.to_str().unwrap(), &format!("{live}:/work/out")]);
    assert!(out.status.success(), "{out:?}");
    let work = supervisor.data_dir().join("runs").join(&live).join("work");
    let landed = work.join("out/inputs/nested/data.csv");
    assert_eq!(std::fs::read_to_string(&landed).unwrap(), "a,b\n");
    use std::os::unix::fs::MetadataExt as _;
    let agent = std::fs::metadata(&work).unwrap().uid();
    for made in [
        "out/inputs",
        "out/inputs/nested",
        "out/inputs/nested/data.csv",
    ] {
        assert_eq!(
            std::fs::metadata(work.join(made)).unwrap().uid(),
            agent,
            "{made}"
        );
    }

    // A run whose receipt keeps its workspace for an hour.
    let text = mint("echo result > /work/result.txt", 3600).await;
    let kept = supervisor.start_run(text).await;
    let run = supervisor.wait_ended(&kept, Duration::from_secs(30)).await;
    let report = run.report.unwrap();
    assert!(!report.workspace.is_empty(), "{report:?}");
    let now = tollgate_receipt::unix_now() as u64;
    assert!((now + 3500..=now + 3600).contains(&report.workspace_kept_until));
    let result = dir.path().join("result.txt");
    let out = tollgate(&[
        "cp",
        &format!("{kept}:/work/result.txt"),
        result.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(std::fs::read_to_string(&result).unwrap(), "result\n");
    let out = tollgate(&["rm", &kept]);
    assert!(out.status.success(), "{out:?}");
    assert!(!Path::new(&report.workspace).exists());
    let out = tollgate(&["cp", &format!("{kept}:/work/result.txt"), "-"]);
    assert_eq!(out.status.code(), Some(66), "{out:?}");
    // Nothing goes into an ended run.
    let out = tollgate(&["cp", local.to_str().unwrap(), &format!("{kept}:/work")]);
    assert_eq!(out.status.code(), Some(66), "{out:?}");
    // The ended run without keep has nothing to copy.
    supervisor
        .client()
        .await
        .stop_run(tollgate_tests::authed(
            &supervisor.token(),
            pb::StopRunRequest {
                run_id: live.clone(),
                reason: "done".into(),
            },
        ))
        .await
        .unwrap();
    let out = tollgate(&["cp", &format!("{live}:/work/out"), "-"]);
    assert_eq!(out.status.code(), Some(66), "{out:?}");
}

/// `tollgate run -t` under a terminal: the agent gets a terminal of that size, shows a prompt
/// and reads what is typed, follows a resize, and Ctrl-C reaches it as SIGINT; the command
/// exits with the agent's code. The test plays the person: it holds the master of the
/// terminal `tollgate` runs on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_run_prompts_resizes_and_takes_ctrl_c() {
    if !require_root() {
        return;
    }
    use std::io::{Read as _, Write as _};
    use std::sync::{Arc, Mutex};
    let daemons = Daemons::start("agent-tty", 209_100);
    let script = "trap 'echo; echo got-INT; exit 3' INT; \
                  echo \"size $(stty size)\"; printf 'prompt> '; read line; \
                  echo \"you said $line\"; \
                  while [ \"$(stty size)\" = '24 80' ]; do sleep 0.05; done; \
                  echo \"resized $(stty size)\"; echo waiting; sleep 30 & wait";
    let text = daemons
        .mint(Daemons::request(
            &["/bin/sh", "-c", script],
            &["/bin/sh", "/usr/bin/stty", "/usr/bin/sleep"],
        ))
        .await;
    let receipt = daemons.dir.path().join("repl.tgr");
    std::fs::write(&receipt, text).unwrap();

    // The person's terminal: 24 x 80, tollgate as its session's controlling process.
    let pty = nix::pty::openpty(
        Some(&nix::pty::Winsize {
            ws_row: 24,
            ws_col: 80,
            ws_xpixel: 0,
            ws_ypixel: 0,
        }),
        None,
    )
    .unwrap();
    let slave_path = nix::unistd::ttyname(&pty.slave).unwrap();
    let stdio = || std::process::Stdio::from(pty.slave.try_clone().unwrap());
    let template = daemons.tollgate();
    let mut tollgate = std::process::Command::new("setsid")
        .arg("--ctty")
        .arg(template.get_program())
        .args(template.get_args())
        .args(["run", "-t", "--receipt"])
        .arg(&receipt)
        .stdin(stdio())
        .stdout(stdio())
        .stderr(stdio())
        .spawn()
        .unwrap();
    drop(pty.slave);
    let screen = Arc::new(Mutex::new(String::new()));
    let mut master = std::fs::File::from(pty.master);
    {
        let (screen, mut reader) = (screen.clone(), master.try_clone().unwrap());
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            while let Ok(n @ 1..) = reader.read(&mut buffer) {
                screen
                    .lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buffer[..n]));
            }
        });
    }
    let wait_for = |text: &str| {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !screen.lock().unwrap().contains(text) {
            assert!(
                std::time::Instant::now() < deadline,
                "no {text:?} on the screen: {:?}",
                screen.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_for("prompt> ");
    assert!(screen.lock().unwrap().contains("size 24 80"));
    master.write_all(b"hello\r").unwrap();
    wait_for("you said hello");
    // The person resizes their terminal: tollgate gets SIGWINCH and passes it on.
    let resized = std::process::Command::new("stty")
        .arg("-F")
        .arg(&slave_path)
        .args(["rows", "40", "cols", "100"])
        .status()
        .unwrap();
    assert!(resized.success());
    wait_for("resized 40 100");
    wait_for("waiting");
    // Ctrl-C: a byte in raw mode, SIGINT in the agent's terminal.
    master.write_all(b"\x03").unwrap();
    wait_for("got-INT");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = tollgate.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "tollgate did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(3), "{:?}", screen.lock().unwrap());
}

/// `tollgate run -i`: piped stdin reaches the agent, its end is the agent's end of input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn piped_stdin_reaches_the_agent() {
    if !require_root() {
        return;
    }
    use std::io::Write as _;
    let daemons = Daemons::start("agent-stdin", 209_200);
    let text = daemons
        .mint(Daemons::request(&["/usr/bin/wc", "-l"], &["/usr/bin/wc"]))
        .await;
    let receipt = daemons.dir.path().join("filter.tgr");
    std::fs::write(&receipt, &text).unwrap();
    let mut tollgate = daemons
        .tollgate()
        .args(["run", "-i", "--receipt"])
        .arg(&receipt)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines = "a\n".repeat(100_000);
    let mut stdin = tollgate.stdin.take().unwrap();
    let feeder = std::thread::spawn(move || {
        stdin.write_all(lines.as_bytes()).unwrap();
    });
    let output = tollgate.wait_with_output().unwrap();
    feeder.join().unwrap();
    assert!(output.status.success(), "{output:?}");
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "100000");
}
