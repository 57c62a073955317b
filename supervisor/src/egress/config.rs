//! What the supervisor's administrator configures for runs' outbound connections: the names
//! it resolves itself (`--egress-hosts`), the secrets it injects into requests to inspected
//! hosts (`--egress-secrets`), and the certificate authorities upstream servers are verified
//! against (the Web PKI roots, this host's bundle, and `--egress-extra-roots`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hyper::header::{HeaderName, HeaderValue, AUTHORIZATION};
use serde::Deserialize;
use tollgate_router::config::KeySource;

use super::resolve::{EgressHosts, EgressHostsError};

/// The host's own certificate bundle (Debian's `ca-certificates`), trusted for upstreams
/// besides the Web PKI roots when present.
pub const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Why the egress configuration cannot be used. Never carries a secret's value.
#[derive(Debug, thiserror::Error)]
pub enum EgressConfigError {
    /// The `--egress-hosts` file.
    #[error("{0}")]
    Hosts(#[from] EgressHostsError),
    /// The `--egress-secrets` file, or a secret it names.
    #[error("egress secrets file {path}: {problem}")]
    Secrets {
        /// The file.
        path: PathBuf,
        /// What is wrong, in one line.
        problem: String,
    },
    /// A certificate bundle (`--egress-extra-roots`).
    #[error("egress roots {path}: {problem}")]
    Roots {
        /// The file.
        path: PathBuf,
        /// What is wrong, in one line.
        problem: String,
    },
}

/// A header the supervisor adds to each request to an inspected host whose grant names this
/// secret. Its value is marked sensitive and is never logged, audited or shown.
#[derive(Clone)]
pub struct InjectedHeader {
    /// The header (`authorization`, or the one the secret names).
    pub name: HeaderName,
    /// Its value (`Bearer …`, or the secret itself).
    pub value: HeaderValue,
}

impl std::fmt::Debug for InjectedHeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "InjectedHeader({}: [secret])", self.name)
    }
}

/// One `[[secret]]` of the secrets file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SecretEntry {
    /// The name receipts use (`inject = "github"`).
    name: String,
    /// Where the value is: `env:VARIABLE` or `file:/absolute/path` (never the value).
    value: String,
    /// The header; default `Authorization`.
    header: Option<String>,
    /// Written before the value with a space; default `Bearer` for `Authorization`, none
    /// for any other header. `""` for none.
    scheme: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SecretsFile {
    #[serde(default)]
    secret: Vec<SecretEntry>,
}

/// The administrator's egress settings, shared by every run of a supervisor.
#[derive(Debug, Clone)]
pub struct EgressConfig {
    /// Names resolved before the system resolver is asked.
    pub hosts: EgressHosts,
    /// Injected headers by secret name.
    pub secrets: HashMap<String, InjectedHeader>,
    /// What upstream certificates of inspected connections are verified against.
    pub roots: Arc<rustls::RootCertStore>,
    /// The TLS client of inspected connections, verifying against `roots`.
    pub upstream_tls: Arc<rustls::ClientConfig>,
    /// The memory all inspected connections hold together (`--egress-inspect-budget`).
    pub inspect_budget: Arc<super::budget::InspectBudget>,
}

/// A TLS client trusting `roots`, speaking HTTP/1.1 (the supervisor relays requests one by
/// one).
fn upstream_tls(roots: Arc<rustls::RootCertStore>) -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

impl Default for EgressConfig {
    /// The system resolver, no secrets, the Web PKI roots and this host's bundle.
    fn default() -> Self {
        let roots = Arc::new(default_roots());
        Self {
            hosts: EgressHosts::system(),
            secrets: HashMap::new(),
            upstream_tls: upstream_tls(roots.clone()),
            roots,
            inspect_budget: super::budget::InspectBudget::new(
                super::budget::DEFAULT_INSPECT_BUDGET,
            ),
        }
    }
}

/// The Web PKI roots and, when present, the host's bundle (certificates it cannot parse are
/// skipped: a distribution bundle may hold some rustls does not take).
fn default_roots() -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Ok(certificates) = read_pem_certificates(Path::new(SYSTEM_BUNDLE)) {
        roots.add_parsable_certificates(certificates);
    }
    roots
}

fn read_pem_certificates(
    path: &Path,
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, String> {
    use rustls::pki_types::pem::PemObject as _;
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    rustls::pki_types::CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not a PEM certificate bundle: {e}"))
}

impl EgressConfig {
    /// Reads the files the flags name (each optional).
    pub fn load(
        hosts: Option<&Path>,
        secrets: Option<&Path>,
        extra_roots: Option<&Path>,
    ) -> Result<Self, EgressConfigError> {
        let mut config = Self::default();
        if let Some(path) = hosts {
            config.hosts = EgressHosts::load(path)?;
        }
        if let Some(path) = secrets {
            config.secrets = load_secrets(path)?;
        }
        if let Some(path) = extra_roots {
            let certificates =
                read_pem_certificates(path).map_err(|problem| EgressConfigError::Roots {
                    path: path.to_owned(),
                    problem,
                })?;
            if certificates.is_empty() {
                return Err(EgressConfigError::Roots {
                    path: path.to_owned(),
                    problem: "holds no certificate".into(),
                });
            }
            let mut roots = (*config.roots).clone();
            let (_, refused) = roots.add_parsable_certificates(certificates);
            if refused > 0 {
                return Err(EgressConfigError::Roots {
                    path: path.to_owned(),
                    problem: format!("{refused} certificate(s) are not usable roots"),
                });
            }
            config.roots = Arc::new(roots);
            config.upstream_tls = upstream_tls(config.roots.clone());
        }
        Ok(config)
    }
}

fn load_secrets(path: &Path) -> Result<HashMap<String, InjectedHeader>, EgressConfigError> {
    let problem = |problem: String| EgressConfigError::Secrets {
        path: path.to_owned(),
        problem,
    };
    let text = std::fs::read_to_string(path).map_err(|e| problem(e.to_string()))?;
    let file: SecretsFile =
        tollgate_receipt::spec::parse_toml(&text).map_err(|e| problem(e.located()))?;
    let mut secrets = HashMap::new();
    for entry in file.secret {
        if !tollgate_receipt::egress::is_secret_name(&entry.name) {
            return Err(problem(format!(
                "secret {:?}: a name is letters, digits, '.', '_' and '-', 1 to 64 characters",
                entry.name
            )));
        }
        let source = KeySource::parse(&entry.value)
            .map_err(|why| problem(format!("secret {}: value: {why}", entry.name)))?;
        let value = tollgate_router_backends::backends::load_key(&source)
            .map_err(|why| problem(format!("secret {}: {why}", entry.name)))?;
        let name = match &entry.header {
            Some(header) => HeaderName::from_bytes(header.as_bytes()).map_err(|_| {
                problem(format!(
                    "secret {}: {header:?} is not a header name",
                    entry.name
                ))
            })?,
            None => AUTHORIZATION,
        };
        let scheme = entry.scheme.clone().unwrap_or_else(|| {
            if name == AUTHORIZATION {
                "Bearer".into()
            } else {
                String::new()
            }
        });
        let text = if scheme.is_empty() {
            value.expose().to_owned()
        } else {
            format!("{scheme} {}", value.expose())
        };
        let mut value = HeaderValue::from_str(&text).map_err(|_| {
            problem(format!(
                "secret {}: its value cannot be sent in a header (control characters?)",
                entry.name
            ))
        })?;
        value.set_sensitive(true);
        if secrets
            .insert(entry.name.clone(), InjectedHeader { name, value })
            .is_some()
        {
            return Err(problem(format!("secret {} is defined twice", entry.name)));
        }
    }
    Ok(secrets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_load_from_files_and_never_show_their_value() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "s3cr3t-value\n").unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
        let file = dir.path().join("secrets.toml");
        std::fs::write(
            &file,
            format!(
                "[[secret]]\nname = \"api\"\nvalue = \"file:{}\"\n\n[[secret]]\nname = \"key\"\nvalue = \"file:{}\"\nheader = \"X-Api-Key\"\n",
                token.display(),
                token.display()
            ),
        )
        .unwrap();
        let config = EgressConfig::load(None, Some(&file), None).unwrap();
        assert_eq!(
            config.secrets["api"].value.to_str().unwrap(),
            "Bearer s3cr3t-value"
        );
        assert_eq!(config.secrets["key"].name.as_str(), "x-api-key");
        assert_eq!(
            config.secrets["key"].value.to_str().unwrap(),
            "s3cr3t-value"
        );
        assert!(config.secrets["api"].value.is_sensitive());
        assert!(!format!("{config:?}").contains("s3cr3t"));

        std::fs::write(
            &file,
            "[[secret]]\nname = \"api\"\nvalue = \"s3cr3t-value\"\n",
        )
        .unwrap();
        let error = EgressConfig::load(None, Some(&file), None)
            .unwrap_err()
            .to_string();
        assert!(error.contains("env:VARIABLE or file:"), "{error}");
        assert!(!error.contains("s3cr3t"), "{error}");
    }
}
