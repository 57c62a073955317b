//! The architecture's promises about dependencies, checked on the real dependency graph.

use std::process::Command;

/// `cargo tree -p package -e normal --prefix none` with `extra` arguments: the crates one
/// per line, each line starting with the crate's name and a space.
fn cargo_tree(package: &str, extra: &[&str]) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let tree = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "tree",
            "--locked",
            "--offline",
            "-p",
            package,
            "-e",
            "normal",
        ])
        .args(extra)
        .args(["--prefix", "none"])
        .output()
        .expect("cargo tree runs");
    assert!(tree.status.success(), "{tree:?}");
    String::from_utf8_lossy(&tree.stdout).into_owned()
}

/// `tollgate`, the operator's CLI, links no sandbox or storage code: restoring a snapshot
/// needs only the files crate.
#[test]
fn the_cli_links_no_sandbox_or_storage_code() {
    let tree = normal_dependencies("tollgate-cli");
    assert!(tree.contains("tollgate-files"), "{tree}");
    for crate_name in [
        "tollgate-supervisor ",
        "cgroups-rs ",
        "landlock ",
        "seccompiler ",
        "rusqlite ",
    ] {
        assert!(
            !tree.lines().any(|line| line.starts_with(crate_name)),
            "tollgate links {crate_name}"
        );
    }
}

/// The normal (non-dev, non-build) dependencies of `package`, one crate per line, each line
/// starting with the crate's name and a space.
fn normal_dependencies(package: &str) -> String {
    cargo_tree(package, &[])
}

/// The authority and the audit log redact secrets with the classifier crate alone: neither
/// links model routing.
#[test]
fn the_authority_and_audit_link_no_model_routing() {
    let authority = normal_dependencies("tollgate-authority");
    assert!(
        authority
            .lines()
            .any(|line| line.starts_with("tollgate-classify ")),
        "{authority}"
    );
    for package in ["tollgate-authority", "tollgate-audit"] {
        let tree = normal_dependencies(package);
        assert!(
            !tree
                .lines()
                .any(|line| line.starts_with("tollgate-router ")),
            "{package} links tollgate-router"
        );
    }
}

/// The supervisor shares only the plan and the control-socket messages with the shim (the
/// protocol crate); it runs `tollgate-shim` as a binary and links none of its sandboxing code.
#[test]
fn the_supervisor_links_only_the_shim_protocol() {
    let tree = normal_dependencies("tollgate-supervisor");
    assert!(
        tree.lines()
            .any(|line| line.starts_with("tollgate-shim-protocol ")),
        "{tree}"
    );
    assert!(
        !tree
            .lines()
            .any(|line| line.starts_with("tollgate-agent-shim ")),
        "tollgate-supervisor links tollgate-agent-shim"
    );
}

/// The crates in `package`'s normal dependencies that depend on `crate_name` directly, one
/// per line, each starting with its name and a space.
fn direct_dependents(package: &str, crate_name: &str) -> Vec<String> {
    // The first line is the crate itself; the rest depend on it.
    cargo_tree(package, &["-i", crate_name, "--depth", "1"])
        .lines()
        .skip(1)
        .map(str::to_owned)
        .collect()
}

/// Model routes have one owner for their I/O: the supervisor reaches the HTTP client to model
/// servers (hyper with rustls) only through `tollgate-router-backends`, and the router itself
/// (decisions, routes file, wire formats) links no HTTP client. The supervisor's own egress
/// relay verifies upstreams with the Web PKI roots too, so it may link them directly.
#[test]
fn the_supervisor_reaches_model_backends_only_through_the_router() {
    for crate_name in ["hyper-rustls", "webpki-roots"] {
        let dependents = direct_dependents("tollgate-supervisor", crate_name);
        assert!(
            dependents.iter().all(|line| {
                line.starts_with("tollgate-router-backends ")
                    || line.starts_with("hyper-rustls ")
                    // The Web PKI roots also verify inspected egress upstreams
                    // (`egress::config`); the HTTP client to model servers stays the router's.
                    || (crate_name == "webpki-roots" && line.starts_with("tollgate-supervisor "))
            }),
            "{crate_name} is reached by {dependents:?}"
        );
        assert!(
            dependents
                .iter()
                .any(|line| line.starts_with("tollgate-router-backends ")),
            "{dependents:?}"
        );
    }
    let router = normal_dependencies("tollgate-router");
    for crate_name in ["hyper-rustls ", "rustls ", "webpki-roots "] {
        assert!(
            !router.lines().any(|line| line.starts_with(crate_name)),
            "tollgate-router links {crate_name}"
        );
    }
}

/// Runs `scripts/check-module-cycles` on `root`.
fn check_module_cycles(root: &std::path::Path) -> std::process::Output {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("scripts/check-module-cycles");
    Command::new("python3")
        .arg(script)
        .arg(root)
        .output()
        .expect("python3 runs scripts/check-module-cycles")
}

/// A crate whose modules `lib.rs` declares as `files` (path under `src`, text).
fn fixture(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("demo/src")).unwrap();
    std::fs::write(
        dir.path().join("demo/Cargo.toml"),
        "[package]\nname = \"demo\"\n",
    )
    .unwrap();
    for (name, text) in files {
        let path = dir.path().join("demo/src").join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir
}

/// The cycle check sees a cycle through `crate::`, `super::` and a child module's own name,
/// sees through `pub use` re-exports, and passes one-way modules.
#[test]
fn the_module_cycle_check_finds_cycles_and_passes_one_way_modules() {
    let cyclic = fixture(&[
        ("lib.rs", "mod gate;\nmod fs;\npub use fs::Tools;\n"),
        ("gate.rs", "use crate::Tools;\npub struct Gate(Tools);\n"),
        (
            "fs.rs",
            "use super::gate::Gate;\npub struct Tools;\nfn f(_: Gate) {}\n",
        ),
    ]);
    let found = check_module_cycles(cyclic.path());
    let out = String::from_utf8_lossy(&found.stdout);
    assert_eq!(found.status.code(), Some(1), "{out}");
    assert!(out.contains("crate::gate -> crate::fs"), "{out}");
    assert!(out.contains("crate::fs -> crate::gate"), "{out}");

    let one_way = fixture(&[
        ("lib.rs", "mod gate;\nmod fs;\npub use fs::Tools;\n"),
        (
            "gate.rs",
            "pub struct Gate;\n#[cfg(test)]\nmod tests {\n    use crate::fs::Tools;\n}\n",
        ),
        ("fs.rs", "use super::gate::Gate;\npub struct Tools(Gate);\n"),
    ]);
    let passed = check_module_cycles(one_way.path());
    assert!(passed.status.success(), "{passed:?}");

    // And the repository itself, as CI checks it.
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let ours = check_module_cycles(&repo);
    assert!(
        ours.status.success(),
        "{}",
        String::from_utf8_lossy(&ours.stdout)
    );
}

/// A module that names an item inside another module's subtree depends on that whole
/// subtree: `error` naming `crate::cmd::rootfs::RootfsError` (a type path in an
/// attribute-marked field, as a `thiserror` `#[from]`) while `cmd` uses `error` is a cycle
/// between `error` and `cmd`, even though `cmd::rootfs` itself names nothing of `error`. So
/// is one through a type path in an expression, through a module a `use` brought into scope,
/// and through a module file found by `#[path]`; a test-only module file may look at anything.
#[test]
fn the_module_cycle_check_sees_dependencies_into_a_subtree() {
    let through_attribute = fixture(&[
        ("lib.rs", "mod cmd;\nmod error;\n"),
        (
            "error.rs",
            "pub enum CliError {\n    Rootfs(#[from] crate::cmd::rootfs::RootfsError),\n}\n",
        ),
        (
            "cmd.rs",
            "mod rootfs;\nuse crate::error::CliError;\npub fn run() -> Result<(), CliError> { Ok(()) }\n",
        ),
        ("cmd/rootfs.rs", "pub struct RootfsError;\n"),
    ]);
    let found = check_module_cycles(through_attribute.path());
    let out = String::from_utf8_lossy(&found.stdout);
    assert_eq!(found.status.code(), Some(1), "{out}");
    assert!(
        out.contains("crate::error -> crate::cmd, by crate::error -> crate::cmd::rootfs"),
        "{out}"
    );
    assert!(out.contains("crate::cmd -> crate::error"), "{out}");

    let through_expression_and_use = fixture(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        (
            "a.rs",
            "use crate::b;\npub fn f() -> u32 { b::deep::G + b::deep::inner::H }\npub const A: u32 = 1;\n",
        ),
        ("b.rs", "pub mod deep;\n"),
        ("b/deep.rs", "pub mod inner;\npub const G: u32 = 1;\n"),
        (
            "b/deep/inner.rs",
            "pub const H: u32 = [0u32; 2].len() as u32 * super::super::super::a::A;\n",
        ),
    ]);
    let found = check_module_cycles(through_expression_and_use.path());
    let out = String::from_utf8_lossy(&found.stdout);
    assert_eq!(found.status.code(), Some(1), "{out}");
    assert!(
        out.contains("crate::a -> crate::b::deep::inner"),
        "a module a `use` brought into scope is followed: {out}"
    );
    assert!(
        out.contains("crate::b -> crate::a, by crate::b::deep::inner -> crate::a"),
        "{out}"
    );

    let through_path_attribute = fixture(&[
        (
            "lib.rs",
            "#[path = \"elsewhere/store_impl.rs\"]\nmod store;\nmod api;\n",
        ),
        (
            "elsewhere/store_impl.rs",
            "pub fn put() { crate::api::hook() }\n",
        ),
        (
            "api.rs",
            "pub fn hook() {}\npub fn call() { crate::store::put() }\n",
        ),
    ]);
    let found = check_module_cycles(through_path_attribute.path());
    let out = String::from_utf8_lossy(&found.stdout);
    assert_eq!(found.status.code(), Some(1), "{out}");
    assert!(out.contains("crate::store -> crate::api"), "{out}");

    // Counted, `cmd::tests` naming `user` would close a cycle with `user` naming `cmd`.
    let test_file_looks_anywhere = fixture(&[
        ("lib.rs", "mod cmd;\nmod user;\n"),
        ("user.rs", "pub fn go() { crate::cmd::run() }\n"),
        (
            "cmd.rs",
            "mod rootfs;\n#[cfg(test)]\nmod tests;\npub fn run() {}\n",
        ),
        ("cmd/rootfs.rs", "pub struct RootfsError;\n"),
        ("cmd/tests.rs", "use crate::user::go;\n"),
    ]);
    let passed = check_module_cycles(test_file_looks_anywhere.path());
    assert!(
        passed.status.success(),
        "{}",
        String::from_utf8_lossy(&passed.stdout)
    );
}

/// The systemd units in the repository are valid units for these binaries
/// (`systemd-analyze verify`, with ExecStart pointed at the built binaries; skipped where
/// systemd-analyze is not installed).
#[test]
fn the_systemd_units_verify() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("systemd-analyze is not installed: units not verified");
        return;
    }
    let bin = tollgate_tests::bin_path("tollgate-authority");
    let bin_dir = bin.parent().unwrap();
    let dir = tempfile::tempdir().unwrap();
    for unit in [
        "authority/systemd/tollgate-authority.service",
        "supervisor/systemd/tollgate-supervisor.service",
    ] {
        let text = std::fs::read_to_string(repo.join(unit)).unwrap();
        assert!(text.contains("Type=notify"), "{unit}");
        let local = dir
            .path()
            .join(std::path::Path::new(unit).file_name().unwrap());
        std::fs::write(
            &local,
            text.replace("/usr/local/bin/", &format!("{}/", bin_dir.display())),
        )
        .unwrap();
        let verified = Command::new("systemd-analyze")
            .arg("verify")
            .arg(&local)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&verified.stderr);
        assert!(
            verified.status.success() && stderr.trim().is_empty(),
            "{unit}: {stderr}"
        );
    }
}

/// The table under `header` in the workspace's Cargo.toml: its `key = value`
/// lines (read line by line; the file keeps one key per line).
fn cargo_toml_table(header: &str) -> Option<Vec<(String, String)>> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut lines = text
        .lines()
        .map(str::trim)
        .skip_while(|line| *line != header);
    lines.next()?;
    Some(
        lines
            .take_while(|line| !line.starts_with('['))
            .filter_map(|line| line.split_once('='))
            .map(|(key, value)| (key.trim().to_owned(), value.trim().to_owned()))
            .collect(),
    )
}

/// Release binaries a user can copy: line tables (a panic's backtrace names file:line) for
/// the workspace's own crates, no debug info for dependencies — whose full DWARF, and the
/// C code `cc` builds for them with `-g` (SQLite, ring), made the binaries 35–133 MB.
#[test]
fn the_release_profile_keeps_line_tables_for_our_crates_only() {
    let release = cargo_toml_table("[profile.release]").expect("a [profile.release] table");
    assert!(
        release.contains(&("debug".to_owned(), "\"line-tables-only\"".to_owned())),
        "{release:?}"
    );
    assert!(
        !release.iter().any(|(key, _)| key == "strip"),
        "stripping debug info would drop file:line from backtraces: {release:?}"
    );
    let dependencies = cargo_toml_table("[profile.release.package.\"*\"]")
        .expect("a [profile.release.package.\"*\"] table for the dependencies");
    assert_eq!(
        dependencies,
        [("debug".to_owned(), "false".to_owned())],
        "no debug info for dependencies"
    );
}
