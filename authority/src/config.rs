//! Daemon configuration: flags over an optional TOML file over defaults.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use tollgate_proto::v1 as pb;
use tollgate_receipt::spec::{parse_duration, LimitsSpec};

use crate::ceiling::default_limits;
use crate::error::AuthorityError;

/// Default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7700";

/// The optional TOML configuration file (`--config`). Every key is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Data directory (overridden by `--data-dir`).
    pub data_dir: Option<PathBuf>,
    /// Listen address (overridden by `--listen`).
    pub listen: Option<String>,
    /// Issuer name written into receipts. Default `tollgate-authority`.
    pub issuer: Option<String>,
    /// Policy version written into receipts. Default `1`.
    pub policy_version: Option<String>,
    /// Longest ttl of the bootstrap admin's ceiling. Default `7d`.
    pub admin_max_ttl: Option<String>,
    /// Delegation depth of the bootstrap admin's ceiling. Default 4.
    pub admin_max_delegate_depth: Option<u32>,
    /// Limits for fields a mint request leaves unset (still capped by ceilings).
    pub defaults: Option<LimitsSpec>,
}

/// The resolved configuration of one authority.
#[derive(Debug, Clone)]
pub struct AuthorityConfig {
    /// Where the database, keys, token and address file live.
    pub data_dir: PathBuf,
    /// Address to listen on (`host:port`).
    pub listen: String,
    /// Where to serve `/metrics` (Prometheus); `None`: no metrics endpoint.
    pub metrics_listen: Option<String>,
    /// The `--config` file it was loaded from, read again on SIGHUP for the mint policy.
    pub config_file: Option<PathBuf>,
    /// Issuer name.
    pub issuer: String,
    /// Policy version.
    pub policy_version: String,
    /// Bootstrap admin's max ttl.
    pub admin_max_ttl: Duration,
    /// Bootstrap admin's max delegation depth.
    pub admin_max_delegate_depth: u32,
    /// Default limits.
    pub default_limits: pb::Limits,
    /// Key for HMAC audit hashes (`--audit-key-file` or `TOLLGATE_AUDIT_KEY`); none: SHA-256.
    pub audit_key: Option<tollgate_audit::AuditKey>,
    /// TLS to serve with (`--tls-cert`, `--tls-key`, `--tls-client-ca`); none: plaintext.
    pub tls: tollgate_daemon::tls::ServerTls,
    /// `--insecure-plaintext`: plaintext on an address that is not loopback is meant.
    pub insecure_plaintext: bool,
    /// Where to serve the plaintext gRPC health service for probes (`--health-listen`).
    pub health_listen: Option<String>,
}

impl AuthorityConfig {
    /// Defaults for a data directory.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            metrics_listen: None,
            config_file: None,
            listen: DEFAULT_LISTEN.into(),
            issuer: "tollgate-authority".into(),
            policy_version: "1".into(),
            admin_max_ttl: Duration::from_secs(7 * 24 * 3600),
            admin_max_delegate_depth: 4,
            default_limits: default_limits(),
            audit_key: None,
            tls: Default::default(),
            insecure_plaintext: false,
            health_listen: None,
        }
    }

    /// Resolves flags (`Some` wins), then the config file, then defaults.
    pub fn load(
        file: Option<&Path>,
        data_dir: Option<PathBuf>,
        listen: Option<String>,
    ) -> Result<Self, AuthorityError> {
        let parsed: ConfigFile = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    AuthorityError::Config(format!("cannot read {}: {e}", path.display()))
                })?;
                tollgate_receipt::spec::parse_toml(&text).map_err(|problem| {
                    AuthorityError::Config(problem.in_file(&path.display().to_string()))
                })?
            }
            None => ConfigFile::default(),
        };
        let data_dir = data_dir.or(parsed.data_dir).ok_or_else(|| {
            AuthorityError::Config(
                "no data directory: pass --data-dir DIR (or set data_dir in the config file)"
                    .into(),
            )
        })?;
        let mut config = Self::new(data_dir);
        config.config_file = file.map(Path::to_owned);
        if let Some(listen) = listen.or(parsed.listen) {
            config.listen = normalize_listen(&listen)?;
        }
        if let Some(issuer) = parsed.issuer {
            if issuer.trim().is_empty() {
                return Err(AuthorityError::Config("issuer must not be empty".into()));
            }
            config.issuer = issuer;
        }
        if let Some(version) = parsed.policy_version {
            config.policy_version = version;
        }
        if let Some(ttl) = parsed.admin_max_ttl {
            config.admin_max_ttl = parse_duration("admin_max_ttl", &ttl)
                .map_err(|e| AuthorityError::Config(e.to_string()))?;
            if config.admin_max_ttl.as_secs() > crate::ceiling::MAX_TTL_SECONDS {
                return Err(AuthorityError::Config(
                    "admin_max_ttl: must be at most 366 days".into(),
                ));
            }
        }
        if let Some(depth) = parsed.admin_max_delegate_depth {
            config.admin_max_delegate_depth = depth;
        }
        if let Some(defaults) = parsed.defaults {
            let given = defaults
                .to_proto()
                .map_err(|e| AuthorityError::Config(format!("defaults.{e}")))?;
            let base = default_limits();
            let pick = |given: u64, base: u64| if given == 0 { base } else { given };
            config.default_limits = pb::Limits {
                memory_bytes: pick(given.memory_bytes, base.memory_bytes),
                pids: pick(given.pids.into(), base.pids.into()) as u32,
                cpu_millicores: pick(given.cpu_millicores.into(), base.cpu_millicores.into())
                    as u32,
                output_bytes: pick(given.output_bytes, base.output_bytes),
                tmpfs_bytes: pick(given.tmpfs_bytes, base.tmpfs_bytes),
                tool_calls: pick(given.tool_calls, base.tool_calls),
                tokens: pick(given.tokens, base.tokens),
                files: pick(given.files.into(), base.files.into()) as u32,
                egress_connections: pick(
                    given.egress_connections.into(),
                    base.egress_connections.into(),
                ) as u32,
                egress_bytes: pick(given.egress_bytes, base.egress_bytes),
                egress_idle_seconds: pick(
                    given.egress_idle_seconds.into(),
                    base.egress_idle_seconds.into(),
                ) as u32,
            };
        }
        Ok(config)
    }
}

/// What a mint takes from the configuration and a SIGHUP may change while the authority
/// runs: the policy version written into receipts and the limits unset fields get.
#[derive(Debug, Clone, PartialEq)]
pub struct MintPolicy {
    /// Written into every receipt minted from now on.
    pub policy_version: String,
    /// Limits for fields a mint request leaves unset (still capped by ceilings).
    pub default_limits: pb::Limits,
}

impl AuthorityConfig {
    /// Its mint policy.
    pub fn mint_policy(&self) -> MintPolicy {
        MintPolicy {
            policy_version: self.policy_version.clone(),
            default_limits: self.default_limits,
        }
    }
}

/// Accepts `host:port`, `[v6]:port` or `:port` (meaning `127.0.0.1:port`).
pub fn normalize_listen(listen: &str) -> Result<String, AuthorityError> {
    let candidate = match listen.strip_prefix(':') {
        Some(port) => format!("127.0.0.1:{port}"),
        None => listen.to_owned(),
    };
    candidate
        .parse::<std::net::SocketAddr>()
        .map(|addr| addr.to_string())
        .map_err(|_| {
            AuthorityError::Config(format!(
                "--listen {listen:?} is not an address like 127.0.0.1:7700 (use port 0 for a free port)"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_forms() {
        assert_eq!(normalize_listen(":0").unwrap(), "127.0.0.1:0");
        assert_eq!(normalize_listen("[::1]:7").unwrap(), "[::1]:7");
        assert!(normalize_listen("localhost").is_err());
    }

    #[test]
    fn file_values_and_flag_precedence() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("authority.toml");
        std::fs::write(
            &file,
            "issuer = 'corp'\nlisten = '127.0.0.1:9'\n[defaults]\nmemory = '1GiB'\n",
        )
        .unwrap();
        let config = AuthorityConfig::load(Some(&file), Some("/d".into()), None).unwrap();
        assert_eq!(config.issuer, "corp");
        assert_eq!(config.listen, "127.0.0.1:9");
        assert_eq!(config.default_limits.memory_bytes, 1 << 30);
        assert_eq!(config.default_limits.pids, 64);
        let config =
            AuthorityConfig::load(Some(&file), Some("/d".into()), Some(":0".into())).unwrap();
        assert_eq!(config.listen, "127.0.0.1:0");
        std::fs::write(&file, "isuer = 'typo'\n").unwrap();
        let error = AuthorityConfig::load(Some(&file), Some("/d".into()), None).unwrap_err();
        assert!(error.to_string().contains("isuer"), "{error}");
        assert!(AuthorityConfig::load(None, None, None).is_err());
    }
}
