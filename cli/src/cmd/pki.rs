//! `tollgate pki`: a small certificate authority for a small fleet. `init` makes the CA;
//! `issue` makes a certificate and key for the authority, a supervisor (by id) or an
//! operator (by name), signed by it, with the holder's identity in the certificate (a URI
//! subject alternative name, `tollgate://supervisor/ID`, which the daemons read). Keys are
//! written mode 0600 and never overwritten.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use tollgate_daemon::tls::{valid_name, FleetIdentity};

use crate::error::CliError;
use crate::files::write_private;

/// The CA's certificate and key in a PKI directory.
const CA_CERT: &str = "ca.pem";
const CA_KEY: &str = "ca.key";

fn pki_error(e: rcgen::Error) -> CliError {
    CliError::Input(format!("making the certificate: {e}"))
}

/// Refuses to overwrite `path` (a key lost by overwriting cannot be had back).
fn fresh(path: &Path) -> Result<(), CliError> {
    if path.exists() {
        return Err(CliError::Output {
            path: path.display().to_string(),
            detail:
                "it exists, and nothing was overwritten (remove it first, or choose another --dir)"
                    .into(),
        });
    }
    Ok(())
}

fn write_public(path: &Path, contents: &str) -> Result<(), CliError> {
    std::fs::write(path, contents).map_err(|e| CliError::Output {
        path: path.display().to_string(),
        detail: e.to_string(),
    })
}

fn validity(params: &mut CertificateParams, days: u32) {
    let now = std::time::SystemTime::now();
    // An hour back: a host whose clock is a little behind accepts it at once.
    params.not_before = (now - std::time::Duration::from_secs(3600)).into();
    params.not_after = (now + std::time::Duration::from_secs(u64::from(days) * 86_400)).into();
}

/// `tollgate pki init`: a new CA in `dir` (created 0700 if missing).
pub(crate) fn init(dir: &Path, name: &str, days: u32) -> Result<(), CliError> {
    std::fs::create_dir_all(dir).map_err(|e| CliError::Output {
        path: dir.display().to_string(),
        detail: e.to_string(),
    })?;
    let (cert_path, key_path) = (dir.join(CA_CERT), dir.join(CA_KEY));
    fresh(&key_path)?;
    fresh(&cert_path)?;
    let key = KeyPair::generate().map_err(pki_error)?;
    let mut params = CertificateParams::new(Vec::new()).map_err(pki_error)?;
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    validity(&mut params, days);
    let cert = params.self_signed(&key).map_err(pki_error)?;
    write_private(&key_path, &key.serialize_pem())?;
    write_public(&cert_path, &cert.pem())?;
    out!(
        "CA \"{name}\": {} (give it to every daemon and client as --tls-client-ca / --ca)",
        cert_path.display()
    )?;
    out!(
        "its key: {} (mode 0600; keep it off the fleet's hosts)",
        key_path.display()
    )?;
    Ok(())
}

/// Who a certificate is for, as `tollgate pki issue` is told.
#[derive(Debug, Clone)]
pub(crate) struct Holder {
    /// The identity.
    pub identity: FleetIdentity,
    /// Extra DNS names the holder's daemon is reached by.
    pub dns: Vec<String>,
    /// Extra addresses it is reached at.
    pub ips: Vec<IpAddr>,
}

impl Holder {
    /// The files' stem in the PKI directory: `authority`, `supervisor-ID`, `operator-NAME`.
    fn stem(&self) -> String {
        match &self.identity {
            FleetIdentity::Authority => "authority".into(),
            FleetIdentity::Supervisor(id) => format!("supervisor-{id}"),
            FleetIdentity::Operator(name) => format!("operator-{name}"),
        }
    }
}

/// Checks an id or name given for a certificate.
pub(crate) fn checked_name(kind: &str, name: &str) -> Result<String, CliError> {
    if valid_name(name) {
        Ok(name.to_owned())
    } else {
        Err(CliError::Input(format!(
            "{kind} {name:?}: use 1 to 64 letters, digits, '.', '_' or '-', not starting with '.' or '-'"
        )))
    }
}

/// `tollgate pki issue`: a certificate and key for `holder`, signed by the CA in `dir`;
/// returns the certificate's and the key's paths.
pub(crate) fn issue(
    dir: &Path,
    holder: &Holder,
    days: u32,
) -> Result<(PathBuf, PathBuf), CliError> {
    let read = |path: PathBuf| {
        std::fs::read_to_string(&path).map_err(|e| {
            CliError::Input(format!(
                "cannot read {}: {e} (make the CA first: tollgate pki init --dir {})",
                path.display(),
                dir.display()
            ))
        })
    };
    let ca_key = KeyPair::from_pem(&read(dir.join(CA_KEY))?).map_err(pki_error)?;
    let issuer = Issuer::from_ca_cert_pem(&read(dir.join(CA_CERT))?, ca_key).map_err(pki_error)?;
    let stem = holder.stem();
    let (cert_path, key_path) = (
        dir.join(format!("{stem}.pem")),
        dir.join(format!("{stem}.key")),
    );
    fresh(&key_path)?;
    fresh(&cert_path)?;

    let mut params = CertificateParams::new(Vec::new()).map_err(pki_error)?;
    params
        .distinguished_name
        .push(DnType::CommonName, holder.identity.to_string());
    let uri = holder.identity.uri().try_into().map_err(pki_error)?;
    params.subject_alt_names.push(SanType::URI(uri));
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    match holder.identity {
        // An operator only connects.
        FleetIdentity::Operator(_) => {
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        }
        // A daemon serves, and (a supervisor) connects to the authority with the same
        // certificate; it is reached on loopback and at the names and addresses given.
        FleetIdentity::Authority | FleetIdentity::Supervisor(_) => {
            params.extended_key_usages = vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ];
            for name in std::iter::once("localhost").chain(holder.dns.iter().map(String::as_str)) {
                let name = name.try_into().map_err(pki_error)?;
                params.subject_alt_names.push(SanType::DnsName(name));
            }
            let loopback: [IpAddr; 2] =
                [[127, 0, 0, 1].into(), std::net::Ipv6Addr::LOCALHOST.into()];
            for address in loopback.iter().chain(&holder.ips) {
                params.subject_alt_names.push(SanType::IpAddress(*address));
            }
        }
    }
    validity(&mut params, days);
    let key = KeyPair::generate().map_err(pki_error)?;
    let cert = params.signed_by(&key, &issuer).map_err(pki_error)?;
    write_private(&key_path, &key.serialize_pem())?;
    write_public(&cert_path, &cert.pem())?;
    out!(
        "{}: {} and its key {} (mode 0600)",
        holder.identity,
        cert_path.display(),
        key_path.display()
    )?;
    Ok((cert_path, key_path))
}
