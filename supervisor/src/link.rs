//! How the supervisor reaches its authority: the address, and the TLS it trusts and presents
//! there (the authority's CA, and the supervisor's own certificate when the authority requires
//! one). One place builds every connection to it — the key set, the revocation stream,
//! delegation — so none of them can go out in clear when the others do not.

use tonic::transport::{ClientTlsConfig, Endpoint};

/// The supervisor's link to its authority.
#[derive(Debug, Clone)]
pub struct AuthorityLink {
    /// The authority's URL (`https://` when `tls` is set).
    pub url: String,
    /// TLS to connect with; none: plaintext (loopback).
    pub tls: Option<ClientTlsConfig>,
}

impl AuthorityLink {
    /// A link to `url`, with TLS when `tls` is given (the URL's scheme follows).
    pub fn new(url: &str, tls: Option<ClientTlsConfig>) -> Self {
        Self {
            url: tollgate_daemon::tls::url_for(url, tls.is_some()),
            tls,
        }
    }

    /// An endpoint for one connection to the authority.
    pub fn endpoint(&self) -> Result<Endpoint, tonic::transport::Error> {
        let endpoint = Endpoint::from_shared(self.url.clone())?;
        match &self.tls {
            Some(tls) => endpoint.tls_config(tls.clone()),
            None => Ok(endpoint),
        }
    }
}

impl std::fmt::Display for AuthorityLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.url)
    }
}
