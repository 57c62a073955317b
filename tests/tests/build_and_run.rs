//! Coding agents at work, on real sandboxes (root): a write grant (or /work) that the receipt
//! makes executable runs what the agent builds there — a C program compiled with gcc, a
//! Python package with a compiled extension installed by pip, a Node.js native addon — and
//! nothing else does;
//! directory rules in `exec` run what lies beneath them; a home kept across runs carries one
//! run's state to the next.

use std::path::Path;
use std::time::Duration;

use tollgate_proto::v1 as pb;
use tollgate_supervisor::records::RunState;
use tollgate_tests::require_root;
use tollgate_tests::run_fixture::{own_dir, RunFixture as Fixture};

const HELLO_C: &str = r#"
#include <stdio.h>
int main(int argc, char **argv) { printf("hello from %s\n", argc > 1 ? argv[1] : "nobody"); return 0; }
"#;

/// A C extension module, `hello_ext.hi()`, as a package pip installs from its source.
const EXT_SETUP: &str = r#"
from setuptools import setup, Extension
setup(name="tollgate-hello-ext", version="1.0", ext_modules=[Extension("hello_ext", ["hello_ext.c"])])
"#;
const EXT_C: &str = r#"
#include <Python.h>
static PyObject *hi(PyObject *self, PyObject *args) { return PyUnicode_FromString("compiled hello"); }
static PyMethodDef methods[] = {{"hi", hi, METH_NOARGS, "hi"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "hello_ext", NULL, -1, methods};
PyMODINIT_FUNC PyInit_hello_ext(void) { return PyModule_Create(&module); }
"#;

fn write_grant(path: &Path, mount: &str, exec: bool) -> pb::FsGrant {
    pb::FsGrant {
        path: path.display().to_string(),
        access: pb::FsAccess::Write as i32,
        mount: mount.into(),
        exec,
        ask: false,
        ask_reads: false,
    }
}

/// A receipt running `script` with the whole of /usr/bin and gcc's own programs allowed, as
/// directories, and room for a compiler.
fn builder(fx: &Fixture, script: &str) -> pb::Receipt {
    let mut receipt = fx.receipt(script, 120);
    receipt.exec = vec![
        "/bin/sh".into(),
        "/usr/bin/".into(),
        "/usr/lib/gcc/".into(),
        "/usr/libexec/".into(),
    ];
    let limits = receipt.limits.as_mut().unwrap();
    limits.memory_bytes = 1 << 30;
    limits.pids = 128;
    limits.tmpfs_bytes = 64 << 20;
    receipt
}

/// Runs `receipt` to its end; (stdout, stderr), asserting it exited 0.
fn run_to_end(fx: &Fixture, receipt: pb::Receipt) -> (String, String) {
    let run_id = fx.start(&fx.sign(receipt)).unwrap();
    let record = fx.manager.wait(&run_id, Duration::from_secs(120)).unwrap();
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

#[test]
fn a_c_program_built_in_an_executable_write_grant_runs_and_without_exec_does_not() {
    if !require_root() {
        return;
    }
    let fx = Fixture::new("build-gcc", 340_000);
    let project = fx.data.parent().unwrap().join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("hello.c"), HELLO_C).unwrap();
    own_dir(&project);
    let script = "cd /proj && gcc hello.c -o hello && ./hello built || echo built refused; \
                  cp hello /work/copy && { /work/copy work 2>/dev/null || echo work refused; }";

    // exec = true on the write grant: W^X lifted there alone (/work stays noexec).
    let mut receipt = builder(&fx, script);
    receipt.fs.push(write_grant(&project, "/proj", true));
    let (output, errors) = run_to_end(&fx, receipt);
    assert_eq!(output, "hello from built\nwork refused\n", "{errors}");

    // Without it the program is built but never runs.
    std::fs::remove_file(project.join("hello")).unwrap();
    let mut receipt = builder(&fx, script);
    receipt.fs.push(write_grant(&project, "/proj", false));
    let (output, errors) = run_to_end(&fx, receipt);
    assert_eq!(output, "built refused\nwork refused\n", "{errors}");

    // Granting the built program by name beneath a noexec write mount is refused before the
    // run starts, naming the setting that would allow it.
    let mut receipt = builder(&fx, "/proj/hello");
    receipt.fs.push(write_grant(&project, "/proj", false));
    receipt.exec.push("/proj/hello".into());
    let refused = fx.start(&fx.sign(receipt)).unwrap_err().to_string();
    assert!(refused.contains("exec = true"), "{refused}");
    assert!(fx.manager.live_ids().is_empty());

    // With it, the built program may be the agent itself.
    let mut receipt = builder(&fx, "");
    receipt.fs.push(write_grant(&project, "/proj", true));
    receipt.exec = vec!["/proj/hello".into()];
    receipt.agent = Some(pb::AgentSpec {
        argv: vec!["/proj/hello".into(), "itself".into()],
        ..Default::default()
    });
    let (output, errors) = run_to_end(&fx, receipt);
    assert_eq!(output, "hello from itself\n", "{errors}");
}

#[test]
fn an_executable_workspace_runs_what_is_built_in_it() {
    if !require_root() {
        return;
    }
    let fx = Fixture::new("build-work", 340_100);
    let mut receipt = builder(
        &fx,
        &format!(
            "cd /work && printf '%s' '{HELLO_C}' > hello.c && gcc hello.c -o hello && ./hello work; \
             cp hello /tmp/copy && {{ /tmp/copy 2>/dev/null || echo tmp refused; }}"
        ),
    );
    receipt.workspace_exec = true;
    let (output, errors) = run_to_end(&fx, receipt);
    assert_eq!(output, "hello from work\ntmp refused\n", "{errors}");
}

#[test]
fn directory_rules_run_every_program_beneath_them_and_nothing_else() {
    if !require_root() {
        return;
    }
    let fx = Fixture::new("build-dirs", 340_200);
    let mut receipt = fx.receipt(
        "mkdir /work/made && ls -d /work/made && \
         { /usr/lib/git-core/git --version >/dev/null 2>&1 || echo git refused; }",
        60,
    );
    receipt.exec = vec!["/bin/sh".into(), "/usr/bin/".into()];
    let (output, errors) = run_to_end(&fx, receipt);
    assert_eq!(output, "/work/made\ngit refused\n", "{errors}");
}

/// `pip install`s the C extension package into `site` on the host (the sandbox has no
/// network), as the host's /usr/bin/python3 the sandbox runs.
fn pip_install(dir: &Path, site: &Path) {
    let package = dir.join("package");
    std::fs::create_dir_all(&package).unwrap();
    std::fs::write(package.join("setup.py"), EXT_SETUP).unwrap();
    std::fs::write(package.join("hello_ext.c"), EXT_C).unwrap();
    let output = std::process::Command::new("/usr/bin/python3")
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-index",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "--target",
        ])
        .arg(site)
        .arg(&package)
        .output()
        .expect("/usr/bin/python3 with pip");
    assert!(
        output.status.success(),
        "pip install: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn a_pip_installed_compiled_extension_loads_only_from_an_executable_grant() {
    if !require_root() {
        return;
    }
    let fx = Fixture::new("build-pip", 340_300);
    let project = fx.data.parent().unwrap().join("project");
    pip_install(fx.data.parent().unwrap(), &project.join("site"));
    own_dir(&project);
    let script = "/usr/bin/python3 -c 'import sys; sys.path.insert(0, \"/proj/site\"); \
                  import hello_ext; print(hello_ext.hi())' 2>&1; \
                  /run/tollgate/bin/tollgate-shim receipt | grep '^fs' | cut -d'(' -f2";
    let mut receipt = builder(&fx, script);
    receipt.fs.push(write_grant(&project, "/proj", true));
    let (output, errors) = run_to_end(&fx, receipt);
    assert_eq!(
        output, "compiled hello\nwritable and executable: you may run what you build there)\n",
        "{errors}"
    );

    // Without exec = true the import fails, and the agent's own receipt names the setting.
    let mut receipt = builder(&fx, script);
    receipt.fs.push(write_grant(&project, "/proj", false));
    let (output, errors) = run_to_end(&fx, receipt);
    assert!(
        output.contains("failed to map segment from shared object"),
        "{output}{errors}"
    );
    assert!(
        output.ends_with(
            "\nnoexec: nothing built here runs or loads without exec = true on this grant in the run spec)\n"
        ),
        "{output}{errors}"
    );
}

/// A Node.js native addon (Node-API), `require("hello").hi()`, laid out as npm installs one.
const ADDON_C: &str = r#"
#include <node_api.h>
static napi_value hi(napi_env env, napi_callback_info info) {
    napi_value text;
    napi_create_string_utf8(env, "native hello", NAPI_AUTO_LENGTH, &text);
    return text;
}
static napi_value init(napi_env env, napi_value exports) {
    napi_value fn;
    napi_create_function(env, "hi", NAPI_AUTO_LENGTH, hi, NULL, &fn);
    napi_set_named_property(env, exports, "hi", fn);
    return exports;
}
NAPI_MODULE(hello, init)
"#;

/// The addon is built in the sandbox, in the project, with the host's Node.js headers (the
/// `libnode-dev` package), and loaded by `node`: only where the grant is executable.
#[test]
fn a_node_native_addon_built_in_an_executable_grant_loads_and_without_exec_does_not() {
    if !require_root() {
        return;
    }
    assert!(
        Path::new("/usr/include/node/node_api.h").exists(),
        "Node.js headers are missing: apt-get install libnode-dev (scripts/test installs it)"
    );
    let fx = Fixture::new("build-addon", 340_600);
    let project = fx.data.parent().unwrap().join("project");
    let package = project.join("node_modules/hello");
    std::fs::create_dir_all(&package).unwrap();
    std::fs::write(package.join("hello.c"), ADDON_C).unwrap();
    std::fs::write(
        package.join("package.json"),
        r#"{"name": "hello", "version": "1.0.0", "main": "build/Release/hello.node"}"#,
    )
    .unwrap();
    own_dir(&project);
    let script = "cd /proj/node_modules/hello && mkdir -p build/Release && \
                  gcc -shared -fPIC -I/usr/include/node -o build/Release/hello.node hello.c && \
                  cd /proj && /usr/bin/node -e 'console.log(require(\"hello\").hi())' 2>&1 | \
                  grep -o 'native hello\\|failed to map segment from shared object'";
    let mut receipt = builder(&fx, script);
    receipt.fs.push(write_grant(&project, "/proj", true));
    let (output, errors) = run_to_end(&fx, receipt);
    assert_eq!(output, "native hello\n", "{errors}");

    let mut receipt = builder(&fx, script);
    receipt.fs.push(write_grant(&project, "/proj", false));
    let (output, errors) = run_to_end(&fx, receipt);
    assert_eq!(
        output, "failed to map segment from shared object\n",
        "{errors}"
    );
}

#[test]
fn a_home_keeps_one_runs_state_for_the_next_and_stays_noexec() {
    if !require_root() {
        return;
    }
    let fx = Fixture::new("build-home", 340_400);
    let home = fx.data.parent().unwrap().join("agent-home");
    own_dir(&home);
    let with_home = |script: &str| {
        let mut receipt = builder(&fx, script);
        receipt.fs.push(write_grant(&home, "/home/agent", false));
        receipt.home = "/home/agent".into();
        receipt
    };
    let (output, errors) = run_to_end(
        &fx,
        with_home(
            "echo HOME=$HOME && mkdir -p ~/.config/agent && echo onboarded > ~/.config/agent/state && \
             cp /usr/bin/true ~/true && { ~/true 2>/dev/null || echo home noexec; }",
        ),
    );
    assert_eq!(output, "HOME=/home/agent\nhome noexec\n", "{errors}");
    // A new run, a new /work: the home is the same.
    let (output, errors) = run_to_end(
        &fx,
        with_home("cat ~/.config/agent/state; ls /work | wc -l"),
    );
    assert_eq!(output, "onboarded\n0\n", "{errors}");
    assert_eq!(
        std::fs::read_to_string(home.join(".config/agent/state")).unwrap(),
        "onboarded\n"
    );
}

/// A directory outside /tmp (a mount may not be there), removed however the test ends.
struct OutsideTmp(std::path::PathBuf);

impl Drop for OutsideTmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_venv_interpreter_outside_the_grant_is_refused_at_mint_or_followed_when_asked() {
    if !require_root() {
        return;
    }
    use std::os::unix::fs::PermissionsExt as _;
    let fx = Fixture::new("build-interp", 340_500);
    // An interpreter installed outside the project, as pyenv, uv or conda do, and a
    // virtualenv in the project whose bin/python links to it.
    let outside = OutsideTmp(std::path::PathBuf::from(format!(
        "/var/tmp/tollgate-interp-{}",
        std::process::id()
    )));
    let install = outside.0.join("python");
    std::fs::create_dir_all(install.join("bin")).unwrap();
    for dir in [&outside.0, &install, &install.join("bin")] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let interpreter = install.join("bin/python3.11");
    std::fs::copy("/usr/bin/python3", &interpreter).unwrap();
    let project = fx.data.parent().unwrap().join("project");
    std::fs::create_dir_all(project.join(".venv/bin")).unwrap();
    std::os::unix::fs::symlink(&interpreter, project.join(".venv/bin/python")).unwrap();
    own_dir(&project);
    let spec = format!(
        r#"
subject = "venv"
ttl = "1m"
audience = ["workstation"]
[agent]
argv = ["/proj/.venv/bin/python", "-c", "import sys; print('python', sys.version_info[0])"]
[[fs]]
path = "{}"
access = "read"
mount = "/proj"
[exec]
allow = ["/proj/.venv/bin/python"]
"#,
        project.display()
    );
    let refused = tollgate_receipt::spec::RunSpec::parse(&spec)
        .unwrap()
        .to_request_for(None)
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains(&format!(
            "/proj/.venv/bin/python is a link to {}",
            interpreter.display()
        )) && refused.contains("interpreters = \"follow\""),
        "{refused}"
    );
    let request = tollgate_receipt::spec::RunSpec::parse(
        &spec.replace("[exec]", "[exec]\ninterpreters = \"follow\""),
    )
    .unwrap()
    .to_request_for(None)
    .unwrap();
    // The installation is granted read-only and executable at its own path, and says so.
    let followed = request.fs.last().unwrap();
    assert_eq!(followed.path, install.display().to_string());
    assert_eq!(followed.mount, followed.path);
    assert!(followed.exec && followed.access == pb::FsAccess::Read as i32);
    let mut receipt = fx.receipt("", 60);
    receipt.fs = request.fs;
    receipt.exec = request.exec;
    receipt.agent = request.agent;
    let (output, errors) = run_to_end(&fx, receipt);
    assert_eq!(output, "python 3\n", "{errors}");
}
