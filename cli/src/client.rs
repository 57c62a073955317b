//! Connecting to the authority and authenticating calls.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tollgate_daemon::error_chain;
use tollgate_daemon::tls::ClientTls;
use tollgate_proto::v1::authority_client::AuthorityClient;
use tollgate_proto::v1::supervisor_client::SupervisorClient;
use tonic::transport::{Channel, Endpoint};

use crate::error::{CliError, Daemon};

/// Default authority address.
pub const DEFAULT_AUTHORITY: &str = "127.0.0.1:7700";
/// Default supervisor address.
pub const DEFAULT_SUPERVISOR: &str = "127.0.0.1:7701";

/// Turns `host:port`, `http://host:port` or the path of a daemon's `.addr` readiness file
/// into a URL.
pub fn authority_url(addr: &str) -> Result<String, CliError> {
    tollgate_daemon::address::url(addr).map_err(CliError::Input)
}

/// Connects to the authority (5 s timeout), with TLS when `tls` names a CA.
pub async fn connect(addr: &str, tls: &ClientTls) -> Result<AuthorityClient<Channel>, CliError> {
    Ok(AuthorityClient::new(channel(addr, tls, "authority").await?))
}

/// Connects to the supervisor (5 s timeout), with TLS when `tls` names a CA.
pub async fn connect_supervisor(
    addr: &str,
    tls: &ClientTls,
) -> Result<SupervisorClient<Channel>, CliError> {
    Ok(SupervisorClient::new(
        channel(addr, tls, "supervisor").await?,
    ))
}

async fn channel(addr: &str, tls: &ClientTls, daemon: &'static str) -> Result<Channel, CliError> {
    let config = tls.config().map_err(|e| CliError::Input(e.to_string()))?;
    let url = tollgate_daemon::tls::url_for(&authority_url(addr)?, config.is_some());
    let mut endpoint = Endpoint::from_shared(url.clone())
        .map_err(|e| CliError::Input(format!("--{daemon} {addr:?} is not an address: {e}")))?
        .connect_timeout(Duration::from_secs(5));
    if let Some(config) = config {
        endpoint = endpoint
            .tls_config(config)
            .map_err(|e| CliError::Input(format!("--ca/--cert/--key: {}", error_chain(&e))))?;
    }
    endpoint.connect().await.map_err(|e| CliError::Unreachable {
        daemon,
        addr: url,
        detail: error_chain(&e),
    })
}

/// Where the operator token comes from.
#[derive(Debug, Clone, Default)]
pub struct TokenSource {
    /// `--authority-token-file` / `--supervisor-token-file`, else `--token-file`.
    pub file: Option<PathBuf>,
    /// `TOLLGATE_TOKEN`.
    pub value: Option<String>,
    /// Whose token it is.
    pub daemon: Daemon,
    /// A client certificate is presented (`--cert`): a supervisor takes an operator's
    /// certificate as its credential, so no token is needed.
    pub certificate: bool,
}

impl TokenSource {
    /// Reads the token (the file wins over the variable); empty when there is none but a
    /// supervisor is shown a certificate ([`authed`] then sends no header).
    pub fn token(&self) -> Result<String, CliError> {
        if let Some(path) = &self.file {
            return read_token(path);
        }
        match &self.value {
            Some(token) if !token.trim().is_empty() => Ok(token.trim().to_owned()),
            _ if self.certificate && self.daemon == Daemon::Supervisor => Ok(String::new()),
            _ => Err(CliError::NoToken(self.daemon)),
        }
    }
}

/// Reads a token file.
pub fn read_token(path: &Path) -> Result<String, CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::Input(format!("cannot read token file {}: {e}", path.display())))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(CliError::Input(format!(
            "token file {} is empty",
            path.display()
        )));
    }
    Ok(token.to_owned())
}

/// Wraps a message with the `authorization: Bearer` header (none for an empty token: the
/// client certificate is the credential).
pub fn authed<T>(token: &str, message: T) -> Result<tonic::Request<T>, CliError> {
    let mut request = tonic::Request::new(message);
    if token.is_empty() {
        return Ok(request);
    }
    let value = format!("Bearer {token}").parse().map_err(|_| {
        CliError::Input("the token contains characters not allowed in a header".into())
    })?;
    request.metadata_mut().insert("authorization", value);
    Ok(request)
}
