//! A receipt minted by the real daemon verifies in an independent Python program that knows
//! only DESIGN.md's signing rule and the public key from GetKeySet (grpcio + cryptography).

use std::path::PathBuf;
use std::process::Command;

use tollgate_tests::AuthorityProcess;

fn python() -> String {
    std::env::var("TOLLGATE_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn python_verifier_accepts_a_daemon_minted_receipt() {
    let probe = Command::new(python())
        .args([
            "-c",
            "import grpc, grpc_tools, cryptography, google.protobuf",
        ])
        .status()
        .expect("run python");
    assert!(
        probe.success(),
        "{} lacks grpcio/grpcio-tools/cryptography: run `pip install -r tests/python/requirements.txt` \
         or set TOLLGATE_PYTHON to a venv's python (scripts/test does both)",
        python()
    );
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let output = Command::new(python())
        .arg(repo_root().join("tests/python/verify_receipt.py"))
        .args(["--addr", authority.addr()])
        .arg("--token-file")
        .arg(authority.data_dir().join("admin.token"))
        .arg("--proto-root")
        .arg(repo_root().join("proto"))
        .output()
        .expect("run verify_receipt.py");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "python verifier failed: {stderr}{stdout}"
    );
    let summary: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    assert_eq!(summary["ok"], true);
    let checks: Vec<_> = summary["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c.as_str())
        .collect();
    for required in [
        "signature",
        "key_id_rule",
        "reject_tampered_receipt",
        "reject_tampered_signature",
        "reject_unknown_key",
    ] {
        assert!(
            checks.contains(&required),
            "missing check {required}: {checks:?}"
        );
    }
}
