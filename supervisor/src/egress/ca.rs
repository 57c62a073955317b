//! A run's own certificate authority, for the outbound connections the supervisor inspects:
//! the supervisor terminates the sandbox's TLS to an inspected host with a certificate this
//! authority signs for that host, so it can read, check and add to each request. Only the
//! run's sandbox trusts it (its certificate is shown at `/run/tollgate/egress/ca.pem`, and the
//! usual variables point there), it is valid for the receipt's lifetime only, and its name
//! constraints permit only the hosts the receipt inspects: even copied out of the sandbox it
//! vouches for nothing else. Its key stays in the run's directory on the host (0600), read
//! again only by a supervisor that re-adopts the run.

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, GeneralSubtree, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, NameConstraints,
};
use tollgate_proto::v1 as pb;
use tollgate_receipt::egress::{Host, HostPattern};

use super::config::SYSTEM_BUNDLE;

/// The CA certificate, in the run's egress directory.
pub const CA_FILE: &str = "ca.pem";
/// The host's bundle followed by the run's CA: what `SSL_CERT_FILE` and the like point at.
pub const BUNDLE_FILE: &str = "bundle.pem";
/// The CA's key, beside the directory the sandbox sees (never inside it).
pub const KEY_FILE: &str = "egress-ca.key";

/// Why a run's CA could not be made or read.
#[derive(Debug, thiserror::Error)]
pub enum RunCaError {
    /// rcgen refused the parameters or a key.
    #[error("the run's egress certificate authority: {0}")]
    Certificate(#[from] rcgen::Error),
    /// rustls refused the certificate it was given.
    #[error("the run's egress certificate authority: {0}")]
    Tls(#[from] rustls::Error),
    /// A file could not be written or read.
    #[error("the run's egress certificate authority, {path}: {source}")]
    File {
        /// The file.
        path: std::path::PathBuf,
        /// The failure.
        source: std::io::Error,
    },
}

/// A run's certificate authority and the server configurations it has made.
pub struct RunCa {
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate, PEM.
    pub pem: String,
    not_after: time::OffsetDateTime,
    servers: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
}

impl std::fmt::Debug for RunCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RunCa")
    }
}

/// Whether `receipt` has a grant the supervisor inspects (and so needs a run CA).
pub fn needs_ca(receipt: &pb::Receipt) -> bool {
    receipt.egress.iter().any(pb::EgressGrant::is_inspected)
}

/// Writes `bytes` to `path` with exactly `mode`, whatever the daemon's umask (the sandbox's
/// own user must read the certificate, nobody but root the key), atomically and durably.
fn write_private(path: &Path, bytes: &[u8], mode: u32) -> Result<(), RunCaError> {
    tollgate_daemon::files::write_atomic(path, bytes, mode).map_err(|source| RunCaError::File {
        path: path.to_owned(),
        source,
    })
}

impl RunCa {
    /// A new CA for `receipt` (its inspected grants, its expiry): the key written to
    /// `<run_dir>/egress-ca.key` (0600), the certificate and bundle to `<egress_dir>` (0644,
    /// the directory the sandbox is shown). A supervisor re-adopting the run reads the key
    /// back ([`RunCa::load`]).
    pub fn create(
        receipt: &pb::Receipt,
        run_dir: &Path,
        egress_dir: &Path,
    ) -> Result<Self, RunCaError> {
        let key = KeyPair::generate()?;
        write_private(
            &run_dir.join(KEY_FILE),
            key.serialize_pem().as_bytes(),
            0o600,
        )?;
        let ca = Self::with_key(receipt, key)?;
        let dir_error = |source| RunCaError::File {
            path: egress_dir.to_owned(),
            source,
        };
        std::fs::create_dir_all(egress_dir).map_err(dir_error)?;
        std::fs::set_permissions(egress_dir, std::fs::Permissions::from_mode(0o755))
            .map_err(dir_error)?;
        write_private(&egress_dir.join(CA_FILE), ca.pem.as_bytes(), 0o644)?;
        let mut bundle = std::fs::read(SYSTEM_BUNDLE).unwrap_or_default();
        if !bundle.is_empty() && !bundle.ends_with(b"\n") {
            bundle.push(b'\n');
        }
        bundle.extend_from_slice(ca.pem.as_bytes());
        write_private(&egress_dir.join(BUNDLE_FILE), &bundle, 0o644)?;
        Ok(ca)
    }

    /// The CA of a run a previous supervisor started (its key from `<run_dir>`).
    pub fn load(receipt: &pb::Receipt, run_dir: &Path) -> Result<Self, RunCaError> {
        let path = run_dir.join(KEY_FILE);
        let pem = std::fs::read_to_string(&path).map_err(|source| RunCaError::File {
            path: path.clone(),
            source,
        })?;
        Self::with_key(receipt, KeyPair::from_pem(&pem)?)
    }

    fn with_key(receipt: &pb::Receipt, key: KeyPair) -> Result<Self, RunCaError> {
        let not_after = timestamp(receipt.expires_at.as_ref().map_or(0, |t| t.seconds) + 60);
        let mut params = CertificateParams::new(Vec::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.distinguished_name.push(
            DnType::CommonName,
            format!("Tollgate run {}", receipt.receipt_id),
        );
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.not_before = timestamp(receipt.issued_at.as_ref().map_or(0, |t| t.seconds) - 60);
        params.not_after = not_after;
        params.name_constraints = Some(NameConstraints {
            permitted_subtrees: permitted(receipt),
            excluded_subtrees: Vec::new(),
        });
        // The same key and parameters give the same certificate's identity after a restart;
        // the sandbox's trust is in the key.
        let pem = params.self_signed(&key)?.pem();
        Ok(Self {
            issuer: Issuer::new(params, key),
            pem,
            not_after,
            servers: Mutex::new(HashMap::new()),
        })
    }

    /// The TLS server configuration that answers the sandbox for `host`: a certificate for
    /// that name (or address) signed by this CA, made once per host.
    pub fn server_for(&self, host: &Host) -> Result<Arc<rustls::ServerConfig>, RunCaError> {
        let name = host.to_string();
        let mut servers = self.servers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(config) = servers.get(&name) {
            return Ok(config.clone());
        }
        let mut params = CertificateParams::new(vec![name.clone()])?;
        params
            .distinguished_name
            .push(DnType::CommonName, name.clone());
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.not_before = rcgen::date_time_ymd(2000, 1, 1);
        params.not_after = self.not_after;
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate()?;
        let certificate = params.signed_by(&key, &self.issuer)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(
                vec![certificate.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )?;
        // HTTP/1.1 only: the supervisor reads requests one by one.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        servers.insert(name, config.clone());
        Ok(config)
    }
}

/// The names and addresses the CA may vouch for: the receipt's inspected grants' hosts (a
/// suffix grant permits the names beneath it).
fn permitted(receipt: &pb::Receipt) -> Vec<GeneralSubtree> {
    receipt
        .egress
        .iter()
        .filter(|grant| grant.is_inspected())
        .filter_map(|grant| match HostPattern::parse(&grant.host, false).ok()? {
            HostPattern::Exact(name) | HostPattern::Suffix(name) => {
                Some(GeneralSubtree::DnsName(name))
            }
            HostPattern::Address(address) => Some(GeneralSubtree::IpAddress(
                rcgen::CidrSubnet::from_addr_prefix(address, full_prefix(address)),
            )),
            HostPattern::Any => None,
        })
        .collect()
}

fn full_prefix(address: IpAddr) -> u8 {
    match address {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

fn timestamp(seconds: i64) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(seconds).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receipt() -> pb::Receipt {
        pb::Receipt {
            receipt_id: "r1".into(),
            issued_at: Some(prost_types::Timestamp {
                seconds: tollgate_receipt::unix_now(),
                nanos: 0,
            }),
            expires_at: Some(prost_types::Timestamp {
                seconds: tollgate_receipt::unix_now() + 600,
                nanos: 0,
            }),
            egress: vec![
                pb::EgressGrant {
                    host: "api.example.test".into(),
                    ports: vec![443],
                    inspect: true,
                    ..Default::default()
                },
                pb::EgressGrant {
                    host: "pypi.org".into(),
                    ports: vec![443],
                    ..Default::default()
                },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn a_run_ca_signs_its_inspected_hosts_and_survives_a_restart() {
        let receipt = receipt();
        assert!(needs_ca(&receipt));
        let dir = tempfile::tempdir().unwrap();
        let egress = dir.path().join("egress");
        let ca = RunCa::create(&receipt, dir.path(), &egress).unwrap();
        assert!(ca.pem.starts_with("-----BEGIN CERTIFICATE-----"));
        let bundle = std::fs::read_to_string(egress.join(BUNDLE_FILE)).unwrap();
        assert!(bundle.ends_with(&ca.pem));
        use std::os::unix::fs::PermissionsExt as _;
        let key_mode = std::fs::metadata(dir.path().join(KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(key_mode & 0o777, 0o600);
        assert!(
            !egress.join(KEY_FILE).exists(),
            "the key is never in the sandbox's directory"
        );
        let host = Host::parse("api.example.test").unwrap();
        let first = ca.server_for(&host).unwrap();
        assert!(
            Arc::ptr_eq(&first, &ca.server_for(&host).unwrap()),
            "made once per host"
        );
        let again = RunCa::load(&receipt, dir.path()).unwrap();
        again.server_for(&host).unwrap();
        assert!(permitted(&receipt).len() == 1, "only the inspected host");
    }
}
