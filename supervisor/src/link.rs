//! How the supervisor reaches its authority: the address, and the TLS it trusts and presents
//! there (the authority's CA, and the supervisor's own certificate when the authority requires
//! one). One place builds every connection to it — the key set, the revocation stream,
//! delegation — so none of them can go out in clear when the others do not. Whether the
//! revocations that come over it are fresh enough to admit new runs is [`RevocationFreshness`].

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

    /// An endpoint for one connection to the authority: connecting gives up after 5 s, and
    /// a connection whose pings go unanswered for [`KEEPALIVE`] is dropped.
    pub fn endpoint(&self) -> Result<Endpoint, tonic::transport::Error> {
        let endpoint = Endpoint::from_shared(self.url.clone())?
            .connect_timeout(std::time::Duration::from_secs(5))
            .http2_keep_alive_interval(KEEPALIVE)
            .keep_alive_timeout(KEEPALIVE)
            .keep_alive_while_idle(true);
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

/// How long a link may stay silent before the supervisor takes it for lost: HTTP/2 pings go
/// out this often on every connection to the authority, and one unanswered for as long ends
/// the connection (a partition that leaves the TCP connection half-open is noticed, not
/// waited out).
pub const KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether the supervisor knows every revocation its authority has made. Live while its
/// revocation stream is open and has caught up; from the moment it is lost, new admissions
/// go on for `max_staleness` (a short outage costs nothing) and are then refused until the
/// stream is back and has caught up again — with every revocation and key-set change made
/// meanwhile — so a partitioned supervisor fails closed. Runs already live go on to their
/// expiry either way.
#[derive(Debug)]
pub struct RevocationFreshness {
    max_staleness: std::time::Duration,
    state: std::sync::Mutex<Freshness>,
}

#[derive(Debug, Clone, Copy)]
enum Freshness {
    /// Open and caught up.
    Live,
    /// Not caught up since this instant (start, or when the stream was lost).
    Stale(std::time::Instant),
}

impl RevocationFreshness {
    /// Not caught up yet; admissions are refused once `max_staleness` passes without it.
    pub fn new(max_staleness: std::time::Duration) -> Self {
        Self {
            max_staleness,
            state: std::sync::Mutex::new(Freshness::Stale(std::time::Instant::now())),
        }
    }

    /// The stream is open and has delivered everything up to now.
    pub fn caught_up(&self) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = Freshness::Live;
    }

    /// The stream was lost (a stale state keeps the instant it began).
    pub fn lost(&self) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Freshness::Live = *state {
            *state = Freshness::Stale(std::time::Instant::now());
        }
    }

    /// `Err` with the one-line reason when new runs must wait for the authority.
    pub fn check(&self) -> Result<(), String> {
        let state = *self.state.lock().unwrap_or_else(|p| p.into_inner());
        match state {
            Freshness::Live => Ok(()),
            Freshness::Stale(since) if since.elapsed() <= self.max_staleness => Ok(()),
            Freshness::Stale(since) => Err(format!(
                "this supervisor has not had its authority's revocations for {} s (--max-staleness {} s): it starts nothing new until the link is back and has caught up",
                since.elapsed().as_secs(),
                self.max_staleness.as_secs()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn admissions_wait_only_past_the_bound_and_resume_once_caught_up() {
        let freshness = RevocationFreshness::new(Duration::from_millis(50));
        assert!(freshness.check().is_ok(), "within the bound from the start");
        std::thread::sleep(Duration::from_millis(80));
        let refused = freshness.check().unwrap_err();
        assert!(refused.contains("--max-staleness 0 s"), "{refused}");
        freshness.caught_up();
        assert!(freshness.check().is_ok());
        freshness.lost();
        assert!(freshness.check().is_ok(), "a short outage costs nothing");
        freshness.lost();
        std::thread::sleep(Duration::from_millis(80));
        assert!(
            freshness.check().is_err(),
            "a second loss keeps the first instant"
        );
        freshness.caught_up();
        assert!(freshness.check().is_ok());
    }
}
