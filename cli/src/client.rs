//! Connecting to the authority and authenticating calls.

use std::path::{Path, PathBuf};
use std::time::Duration;

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

/// Connects to the authority (5 s timeout).
pub async fn connect(addr: &str) -> Result<AuthorityClient<Channel>, CliError> {
    Ok(AuthorityClient::new(channel(addr, "authority").await?))
}

/// Connects to the supervisor (5 s timeout).
pub async fn connect_supervisor(addr: &str) -> Result<SupervisorClient<Channel>, CliError> {
    Ok(SupervisorClient::new(channel(addr, "supervisor").await?))
}

async fn channel(addr: &str, daemon: &'static str) -> Result<Channel, CliError> {
    let url = authority_url(addr)?;
    let endpoint = Endpoint::from_shared(url.clone())
        .map_err(|e| CliError::Input(format!("--{daemon} {addr:?} is not an address: {e}")))?
        .connect_timeout(Duration::from_secs(5));
    endpoint.connect().await.map_err(|e| CliError::Unreachable {
        daemon,
        addr: url,
        detail: error_chain(&e),
    })
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
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
}

impl TokenSource {
    /// Reads the token (the file wins over the variable).
    pub fn token(&self) -> Result<String, CliError> {
        if let Some(path) = &self.file {
            return read_token(path);
        }
        match &self.value {
            Some(token) if !token.trim().is_empty() => Ok(token.trim().to_owned()),
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

/// Wraps a message with the `authorization: Bearer` header.
pub fn authed<T>(token: &str, message: T) -> Result<tonic::Request<T>, CliError> {
    let mut request = tonic::Request::new(message);
    let value = format!("Bearer {token}").parse().map_err(|_| {
        CliError::Input("the token contains characters not allowed in a header".into())
    })?;
    request.metadata_mut().insert("authorization", value);
    Ok(request)
}
