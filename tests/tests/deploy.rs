//! The Kubernetes manifests in `deploy/kubernetes` validate strictly against the Kubernetes
//! schemas (the `kubernetes-validate` package `scripts/test` installs into the test Python),
//! and the validator is live: a manifest with a misspelt field fails it.

use std::path::PathBuf;
use std::process::Command;

fn python() -> String {
    std::env::var("TOLLGATE_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn manifests() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    files
}

/// Runs the validator on `files`: its exit status and what it said.
fn validate(files: &[PathBuf]) -> (bool, String) {
    let output = Command::new(python())
        .args(["-m", "kubernetes_validate", "--strict", "--no-warn"])
        .args(["--kubernetes-version", "1.31.0"])
        .args(files)
        .output()
        .expect("run python");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        !said.contains("No module named kubernetes_validate"),
        "{} lacks kubernetes-validate: run scripts/test (it installs tests/python/requirements.txt) or set TOLLGATE_PYTHON",
        python()
    );
    (output.status.success(), said)
}

#[test]
fn the_kubernetes_manifests_validate_against_the_schemas() {
    let files = manifests();
    let names: Vec<_> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        ["authority.yaml", "namespace.yaml", "supervisor.yaml"],
        "the manifests this test knows"
    );
    let (passed, said) = validate(&files);
    assert!(passed, "{said}");
    for resource in [
        "statefulset/tollgate-authority",
        "service/tollgate-authority",
        "daemonset/tollgate-supervisor",
        "namespace/tollgate",
    ] {
        assert!(
            said.contains(&format!("passed for resource {resource}")),
            "{said}"
        );
    }

    // The same DaemonSet with one field misspelt: refused.
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("supervisor.yaml");
    let text = std::fs::read_to_string(&files[2]).unwrap();
    std::fs::write(
        &broken,
        text.replacen("readinessProbe:", "readynessProbe:", 1),
    )
    .unwrap();
    let (passed, said) = validate(&[broken]);
    assert!(!passed, "a misspelt field passed: {said}");
}
