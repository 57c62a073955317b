//! What a supervisor is started with: its settings, where its trust comes from, and the
//! pinned key file for hosts without an authority link.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tollgate_daemon::Secret;
use tollgate_receipt::{public_key_from_bytes, KeySet};

use super::error::DaemonError;
use crate::runs::RunSettings;

/// Readiness file name.
pub const ADDR_FILE: &str = "supervisor.addr";
/// Admin token file name.
pub const TOKEN_FILE: &str = "admin.token";

/// Where the supervisor's trusted keys come from.
#[derive(Debug, Clone)]
pub enum Trust {
    /// Fetch the key set from this authority and follow its revocations.
    Authority(AuthorityLink),
    /// A pinned key file (the JSON `tollgate keys --json` prints), for hosts without an
    /// authority link.
    KeyFile(PathBuf),
}

pub use crate::link::AuthorityLink;

/// Daemon settings.
#[derive(Debug, Clone)]
pub struct SupervisorConfig {
    /// The run manager's settings (data dir, id, shim, cgroup parent, host ids, skew).
    pub runs: RunSettings,
    /// Listen address.
    pub listen: String,
    /// TLS to serve with (`--tls-cert`, `--tls-key`, `--tls-client-ca`); none: plaintext.
    pub tls: tollgate_daemon::tls::ServerTls,
    /// `--insecure-plaintext`: plaintext on an address that is not loopback is meant.
    pub insecure_plaintext: bool,
    /// Where to serve the plaintext gRPC health service for probes (`--health-listen`).
    pub health_listen: Option<String>,
    /// Where to serve `/metrics` (Prometheus); `None`: no metrics endpoint.
    pub metrics_listen: Option<String>,
    /// Where live supervisors register their cgroup parent and host ids
    /// (`/run/tollgate`).
    pub run_dir: PathBuf,
    /// Trust source.
    pub trust: Trust,
    /// How long new runs may still start after the authority's revocation stream was lost
    /// (`--max-staleness`).
    pub max_staleness: std::time::Duration,
    /// Key for HMAC audit hashes; none: plain SHA-256.
    pub audit_key: Option<tollgate_audit::AuditKey>,
    /// Model routes (keys loaded); none: `Complete` is refused as unavailable.
    pub models: Option<Arc<tollgate_router_backends::ModelRoutes>>,
    /// The routes file `models` came from, read again on SIGHUP.
    pub routes_file: Option<PathBuf>,
    /// How long a reload may wait for a local route's probe.
    pub route_probe_timeout: std::time::Duration,
    /// The `--config` file, read again on SIGHUP for its `log_level`.
    pub config_file: Option<PathBuf>,
    /// The delegation token (`tgt_…`), used with the authority of `trust`; none: runs
    /// cannot delegate.
    pub delegation_token: Option<Secret>,
}

/// The supervisor's configuration file (`--config FILE`, TOML). Every key is optional and
/// named as its flag without the dashes (`data_dir`, `cgroup_parent`, `host_id_base`…); a
/// flag, or its environment variable, given to the daemon wins over the file. Unknown keys
/// are refused, so a misspelt one is never silently ignored.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SupervisorFile {
    /// `--data-dir`.
    pub data_dir: Option<PathBuf>,
    /// `--id`.
    pub id: Option<String>,
    /// `--listen`.
    pub listen: Option<String>,
    /// `--authority`.
    pub authority: Option<String>,
    /// `--trust-keys`.
    pub trust_keys: Option<PathBuf>,
    /// `--authority-ca`.
    pub authority_ca: Option<PathBuf>,
    /// `--tls-cert`.
    pub tls_cert: Option<PathBuf>,
    /// `--tls-key`.
    pub tls_key: Option<PathBuf>,
    /// `--tls-client-ca`.
    pub tls_client_ca: Option<PathBuf>,
    /// `--insecure-plaintext`.
    pub insecure_plaintext: Option<bool>,
    /// `--max-staleness` (seconds).
    pub max_staleness: Option<u64>,
    /// `--health-listen`.
    pub health_listen: Option<String>,
    /// `--clock-skew` (seconds).
    pub clock_skew: Option<u64>,
    /// `--shim`.
    pub shim: Option<PathBuf>,
    /// `--cgroup-parent`.
    pub cgroup_parent: Option<String>,
    /// `--run-dir`.
    pub run_dir: Option<PathBuf>,
    /// `--host-id-base`.
    pub host_id_base: Option<u32>,
    /// `--host-id-count`.
    pub host_id_count: Option<u32>,
    /// `--warm-sandboxes`.
    pub warm_sandboxes: Option<usize>,
    /// `--live-restore`.
    pub live_restore: Option<bool>,
    /// `--live-restore-window` (seconds).
    pub live_restore_window: Option<u64>,
    /// `--audit-key-file`.
    pub audit_key_file: Option<PathBuf>,
    /// `--rootfs-dir`.
    pub rootfs_dir: Option<PathBuf>,
    /// `--routes`.
    pub routes: Option<PathBuf>,
    /// `--egress-hosts`.
    pub egress_hosts: Option<PathBuf>,
    /// `--egress-secrets`.
    pub egress_secrets: Option<PathBuf>,
    /// `--egress-extra-roots`.
    pub egress_extra_roots: Option<PathBuf>,
    /// `--egress-inspect-budget`.
    pub egress_inspect_budget: Option<usize>,
    /// `--route-probe-timeout` (seconds).
    pub route_probe_timeout: Option<u64>,
    /// `--delegation-token-file`.
    pub delegation_token_file: Option<PathBuf>,
    /// `--log-format` (`text` or `json`).
    pub log_format: Option<String>,
    /// `--metrics-listen`.
    pub metrics_listen: Option<String>,
    /// `--log-level`; applied anew on SIGHUP.
    pub log_level: Option<String>,
}

impl SupervisorFile {
    /// Reads and parses `path`.
    pub fn load(path: &Path) -> Result<Self, DaemonError> {
        let problem = |problem: String| DaemonError::ConfigFile {
            path: path.to_owned(),
            problem,
        };
        let text = std::fs::read_to_string(path).map_err(|e| problem(e.to_string()))?;
        tollgate_receipt::spec::parse_toml(&text).map_err(|e| problem(e.located()))
    }
}

/// Reads a pinned key file: `{"keys": [{"key_id": "...", "public_key_hex": "..."}]}`.
pub fn read_key_file(path: &Path) -> Result<KeySet, DaemonError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        DaemonError::KeyFile(format!("cannot read --trust-keys {}: {e}", path.display()))
    })?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| DaemonError::KeyFile(format!("{}: not JSON: {e}", path.display())))?;
    let mut keys = KeySet::new();
    for entry in json["keys"].as_array().into_iter().flatten() {
        let bad = |what: &str| DaemonError::KeyFile(format!("{}: {what}", path.display()));
        let hex_key = entry["public_key_hex"]
            .as_str()
            .ok_or_else(|| bad("a key lacks public_key_hex"))?;
        let bytes = hex::decode(hex_key).map_err(|_| bad("public_key_hex is not hex"))?;
        let key = public_key_from_bytes(&bytes).map_err(|e| bad(&e.to_string()))?;
        let id = keys.insert(key);
        if let Some(listed) = entry["key_id"].as_str() {
            if listed != id {
                return Err(bad(&format!(
                    "key_id {listed} does not match its key ({id})"
                )));
            }
        }
    }
    if keys.is_empty() {
        return Err(DaemonError::KeyFile(format!(
            "{}: no keys; write it with `tollgate keys --json > FILE`",
            path.display()
        )));
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_key_files_are_checked() {
        let dir = std::env::temp_dir().join(format!("tollgate-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let signer = tollgate_receipt::ReceiptSigner::generate();
        let file = dir.join("keys.json");
        let entry = |id: &str| {
            serde_json::json!({"issuer": "a", "keys": [{
                "key_id": id,
                "public_key_hex": hex::encode(signer.public_key().as_bytes()),
            }]})
            .to_string()
        };
        std::fs::write(&file, entry(signer.key_id())).unwrap();
        let keys = read_key_file(&file).unwrap();
        assert!(keys.get(signer.key_id()).is_some());
        std::fs::write(&file, entry("0000000000000000")).unwrap();
        assert!(read_key_file(&file)
            .unwrap_err()
            .to_string()
            .contains("does not match"));
        std::fs::write(&file, "{\"keys\": []}").unwrap();
        assert!(read_key_file(&file)
            .unwrap_err()
            .to_string()
            .contains("no keys"));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
