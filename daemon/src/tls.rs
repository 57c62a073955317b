//! TLS on the daemons' gRPC links, the same way for both daemons and their clients: a daemon
//! serves TLS with a certificate and key (`--tls-cert`, `--tls-key`) and requires client
//! certificates signed by a CA when given one (`--tls-client-ca`, mutual TLS); a client trusts
//! a CA (`--ca`) and may present its own certificate (`--cert`, `--key`). Certificates name
//! who holds them ([`FleetIdentity`], written by `tollgate pki issue`). Without TLS a daemon
//! listens on loopback only, unless told that plaintext is meant ([`check_listen`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A certificate or key file could not be read.
    #[error("cannot read {what} {path}: {source}")]
    Read {
        /// Which file it is (`--tls-cert`, ...).
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// Half of a pair was given.
    #[error("{given} needs {missing} too")]
    Incomplete {
        /// The flag given.
        given: &'static str,
        /// The flag missing.
        missing: &'static str,
    },
    /// A client certificate CA without a server certificate: mutual TLS needs TLS.
    #[error("--tls-client-ca needs --tls-cert and --tls-key: client certificates are asked for over TLS")]
    ClientCaWithoutTls,
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })
}

/// The identity a certificate and key file pair makes (`flags` name them in errors); `None`
/// when neither is given, an error naming the missing one when only one is.
fn identity(
    cert: &Option<PathBuf>,
    key: &Option<PathBuf>,
    (cert_flag, key_flag): (&'static str, &'static str),
) -> Result<Option<Identity>, TlsError> {
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some(Identity::from_pem(
            read(cert_flag, cert)?,
            read(key_flag, key)?,
        ))),
        (None, None) => Ok(None),
        (Some(_), None) => Err(TlsError::Incomplete {
            given: cert_flag,
            missing: key_flag,
        }),
        (None, Some(_)) => Err(TlsError::Incomplete {
            given: key_flag,
            missing: cert_flag,
        }),
    }
}

/// What a daemon serves TLS with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerTls {
    /// `--tls-cert`: its certificate (PEM; the chain may follow it).
    pub cert: Option<PathBuf>,
    /// `--tls-key`: its private key (PEM).
    pub key: Option<PathBuf>,
    /// `--tls-client-ca`: clients must present a certificate this CA signed.
    pub client_ca: Option<PathBuf>,
}

impl ServerTls {
    /// Whether TLS is asked for at all.
    pub fn enabled(&self) -> bool {
        self.cert.is_some() || self.key.is_some() || self.client_ca.is_some()
    }

    /// tonic's configuration, the files read now; `None` without TLS.
    pub fn config(&self) -> Result<Option<ServerTlsConfig>, TlsError> {
        let Some(identity) = identity(&self.cert, &self.key, ("--tls-cert", "--tls-key"))? else {
            return match self.client_ca {
                Some(_) => Err(TlsError::ClientCaWithoutTls),
                None => Ok(None),
            };
        };
        let mut config = ServerTlsConfig::new().identity(identity);
        if let Some(ca) = &self.client_ca {
            config = config
                .client_ca_root(Certificate::from_pem(read("--tls-client-ca", ca)?))
                .client_auth_optional(false);
        }
        Ok(Some(config))
    }
}

/// `server` serving TLS as `tls` says (unchanged without TLS).
pub fn serve_tls(
    server: tonic::transport::Server,
    tls: &ServerTls,
) -> Result<tonic::transport::Server, String> {
    match tls.config().map_err(|e| e.to_string())? {
        Some(config) => server
            .tls_config(config)
            .map_err(|e| format!("TLS: {}", crate::error_chain(&e))),
        None => Ok(server),
    }
}

/// What a client trusts and presents.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// `--ca`: the CA the daemon's certificate must chain to. Without it: plaintext.
    pub ca: Option<PathBuf>,
    /// `--cert`: this client's certificate, for a daemon that requires one.
    pub cert: Option<PathBuf>,
    /// `--key`: its private key.
    pub key: Option<PathBuf>,
}

impl ClientTls {
    /// tonic's configuration, the files read now; `None`: plaintext.
    pub fn config(&self) -> Result<Option<ClientTlsConfig>, TlsError> {
        let identity = identity(&self.cert, &self.key, ("--cert", "--key"))?;
        let Some(ca) = &self.ca else {
            return match identity {
                Some(_) => Err(TlsError::Incomplete {
                    given: "--cert",
                    missing: "--ca",
                }),
                None => Ok(None),
            };
        };
        let mut config =
            ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read("--ca", ca)?));
        if let Some(identity) = identity {
            config = config.identity(identity);
        }
        Ok(Some(config))
    }
}

/// `url` with the scheme a link with (`tls`) or without TLS takes: `http://` becomes
/// `https://` when TLS is on; anything else is left as it is.
pub fn url_for(url: &str, tls: bool) -> String {
    match url.strip_prefix("http://") {
        Some(rest) if tls => format!("https://{rest}"),
        _ => url.to_owned(),
    }
}

/// Who holds a certificate of the fleet's CA, as its URI subject alternative name says:
/// `tollgate://authority`, `tollgate://supervisor/ID`, `tollgate://operator/NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FleetIdentity {
    /// The authority.
    Authority,
    /// A supervisor, by its id (a receipt's audience names it).
    Supervisor(String),
    /// An operator, by name.
    Operator(String),
}

impl FleetIdentity {
    /// The URI a certificate carries for this identity.
    pub fn uri(&self) -> String {
        match self {
            FleetIdentity::Authority => "tollgate://authority".into(),
            FleetIdentity::Supervisor(id) => format!("tollgate://supervisor/{id}"),
            FleetIdentity::Operator(name) => format!("tollgate://operator/{name}"),
        }
    }

    /// The identity a URI names; `None` for anything else.
    pub fn from_uri(uri: &str) -> Option<Self> {
        let rest = uri.strip_prefix("tollgate://")?;
        match rest.split_once('/') {
            None if rest == "authority" => Some(FleetIdentity::Authority),
            Some(("supervisor", id)) if valid_name(id) => {
                Some(FleetIdentity::Supervisor(id.into()))
            }
            Some(("operator", name)) if valid_name(name) => {
                Some(FleetIdentity::Operator(name.into()))
            }
            _ => None,
        }
    }
}

impl std::fmt::Display for FleetIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FleetIdentity::Authority => f.write_str("the authority"),
            FleetIdentity::Supervisor(id) => write!(f, "supervisor {id}"),
            FleetIdentity::Operator(name) => write!(f, "operator {name}"),
        }
    }
}

/// The identity a certificate (DER) names in its URI subject alternative names; `None` when
/// it names none (or cannot be read).
pub fn certificate_identity(der: &[u8]) -> Option<FleetIdentity> {
    let (_, certificate) = x509_parser::parse_x509_certificate(der).ok()?;
    let names = certificate.subject_alternative_name().ok()??;
    names
        .value
        .general_names
        .iter()
        .find_map(|name| match name {
            x509_parser::extensions::GeneralName::URI(uri) => FleetIdentity::from_uri(uri),
            _ => None,
        })
}

/// The identity the first certificate of a PEM file names; `None` when it names none (or is
/// not PEM).
pub fn pem_certificate_identity(pem: &[u8]) -> Option<FleetIdentity> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem).ok()?;
    certificate_identity(&block.contents)
}

/// Whether the caller presented a TLS client certificate, and the identity it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerCertificate {
    /// No certificate: plaintext, or TLS without client certificates.
    None,
    /// A certificate naming this identity.
    Names(FleetIdentity),
    /// A certificate naming no Tollgate identity.
    Anonymous,
}

/// What the caller of `request` presented.
pub fn peer_certificate<T>(request: &tonic::Request<T>) -> PeerCertificate {
    match request.peer_certs() {
        None => PeerCertificate::None,
        Some(certificates) => first_identity(&certificates),
    }
}

/// What the client of a connection presented, from a request's HTTP extensions (for checks
/// that run before tonic has made a `Request` of it).
pub fn peer_certificate_in(extensions: &http::Extensions) -> PeerCertificate {
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
    match extensions
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(TlsConnectInfo::peer_certs)
    {
        None => PeerCertificate::None,
        Some(certificates) => first_identity(&certificates),
    }
}

fn first_identity(certificates: &[tonic::transport::CertificateDer<'static>]) -> PeerCertificate {
    match certificates.first() {
        None => PeerCertificate::None,
        Some(first) => certificate_identity(first.as_ref())
            .map_or(PeerCertificate::Anonymous, PeerCertificate::Names),
    }
}

/// A call made as supervisor `claimed`: a caller that presented a certificate must present
/// that supervisor's (a supervisor with another id's certificate, or an operator's, is
/// refused); one without a certificate is left to its token. `Err` is the one-line reason.
pub fn check_supervisor_claim<T>(request: &tonic::Request<T>, claimed: &str) -> Result<(), String> {
    match peer_certificate(request) {
        PeerCertificate::None => Ok(()),
        PeerCertificate::Names(FleetIdentity::Supervisor(id)) if id == claimed => Ok(()),
        PeerCertificate::Names(identity) => Err(format!(
            "the caller's certificate names {identity}, not supervisor {claimed:?}"
        )),
        PeerCertificate::Anonymous => Err(format!(
            "the caller's certificate names no Tollgate identity, not supervisor {claimed:?}"
        )),
    }
}

/// A supervisor id or operator name as a certificate may carry it: 1 to 64 of letters,
/// digits, `.`, `_` and `-`, not starting with `.` or `-`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with(['.', '-'])
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// A daemon about to listen on `address`: without TLS, only a loopback address, unless
/// `insecure_plaintext` says plaintext elsewhere is meant. `Err` is the one-line reason.
pub fn check_listen(
    address: SocketAddr,
    tls: bool,
    insecure_plaintext: bool,
) -> Result<(), String> {
    if tls || insecure_plaintext || address.ip().is_loopback() {
        return Ok(());
    }
    Err(format!(
        "refusing to listen on {address} without TLS: tokens and receipts would cross the network in clear; \
         give --tls-cert and --tls-key (tollgate pki issue makes them), listen on 127.0.0.1, \
         or pass --insecure-plaintext if a network you trust carries it"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_round_trip_and_strangers_are_none() {
        for identity in [
            FleetIdentity::Authority,
            FleetIdentity::Supervisor("host-1".into()),
            FleetIdentity::Operator("alice".into()),
        ] {
            assert_eq!(FleetIdentity::from_uri(&identity.uri()), Some(identity));
        }
        for stranger in [
            "https://authority",
            "tollgate://supervisor/",
            "tollgate://supervisor/a/b",
            "tollgate://operator/-x",
            "tollgate://admin/x",
            "tollgate://authority/x",
        ] {
            assert_eq!(FleetIdentity::from_uri(stranger), None, "{stranger}");
        }
    }

    #[test]
    fn plaintext_stays_on_loopback_unless_asked_for() {
        let public: SocketAddr = "0.0.0.0:7700".parse().unwrap();
        let loopback: SocketAddr = "127.0.0.1:7700".parse().unwrap();
        assert!(check_listen(loopback, false, false).is_ok());
        assert!(check_listen("[::1]:7700".parse().unwrap(), false, false).is_ok());
        assert!(check_listen(public, true, false).is_ok());
        assert!(check_listen(public, false, true).is_ok());
        let refused = check_listen(public, false, false).unwrap_err();
        assert!(
            refused.starts_with("refusing to listen on 0.0.0.0:7700 without TLS"),
            "{refused}"
        );
    }

    #[test]
    fn half_a_pair_is_named() {
        let server = ServerTls {
            cert: Some("/c".into()),
            ..Default::default()
        };
        assert_eq!(
            server.config().unwrap_err().to_string(),
            "--tls-cert needs --tls-key too"
        );
        let mutual_only = ServerTls {
            client_ca: Some("/ca".into()),
            ..Default::default()
        };
        assert!(matches!(
            mutual_only.config(),
            Err(TlsError::ClientCaWithoutTls)
        ));
        let client = ClientTls {
            cert: Some("/c".into()),
            key: Some("/k".into()),
            ca: None,
        };
        assert!(client.config().is_err());
        assert!(ClientTls::default().config().unwrap().is_none());
    }
}
