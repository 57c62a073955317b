//! Who calls the supervisor's API, and whose runs they may touch.
//!
//! Three credentials are accepted, each checked on the request's headers before any of its
//! body is read:
//! - the supervisor's own admin token (`<data dir>/admin.token`): root on this host, sees
//!   every run;
//! - an operator token the authority issued: the supervisor asks the authority whose it is
//!   (`WhoAmI`, over the same TLS link as the key set and the revocations) and keeps the
//!   answer for [`TOKEN_CACHE_TTL`]; an authority admin sees every run, any other operator
//!   only the runs whose receipt it owns;
//! - a client certificate of the fleet's CA naming `tollgate://operator/NAME` (when the
//!   supervisor requires client certificates): operator NAME, never an admin (admin rights come
//!   with the authority's token). A token presented over a certificate naming another operator
//!   is refused: one caller, one identity.
//!
//! What a lookup can make the daemon hold is bounded: at most [`MAX_CACHED`] answers, at most
//! [`MAX_LOOKUPS`] lookups in flight (a flood of made-up tokens waits its turn, then is
//! refused), each given up after [`LOOKUP_TIMEOUT`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate_daemon::serve::AuthenticateFuture;
use tollgate_daemon::tls::{FleetIdentity, PeerCertificate};
use tollgate_daemon::token;
use tollgate_proto::v1 as pb;
use tonic::metadata::MetadataMap;
use tonic::Status;

use crate::link::AuthorityLink;

/// How long an operator token's answer from the authority is kept: a token the authority
/// stops honouring keeps working here at most this long.
pub const TOKEN_CACHE_TTL: Duration = Duration::from_secs(30);
/// Most operator tokens remembered at once.
pub const MAX_CACHED: usize = 1024;
/// Most lookups at the authority in flight at once.
pub const MAX_LOOKUPS: usize = 16;
/// How long one lookup (waiting for a turn included) may take.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// The caller of one request, resolved before its body was read (in the request's
/// extensions for the handler).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// The holder of this supervisor's admin token.
    Admin,
    /// An operator of the authority.
    Operator(OperatorIdentity),
}

/// An operator, as the authority or its certificate says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorIdentity {
    /// The operator's name (a receipt's `owner`).
    pub name: String,
    /// Whether the authority made it an admin (sees every run).
    pub admin: bool,
}

impl Caller {
    /// Whether this caller may touch every run (no ownership check).
    pub fn sees_all(&self) -> bool {
        match self {
            Caller::Admin => true,
            Caller::Operator(operator) => operator.admin,
        }
    }

    /// Whether this caller may touch a run whose receipt `owner` owns.
    pub fn may_touch(&self, owner: &str) -> bool {
        match self {
            Caller::Admin => true,
            Caller::Operator(operator) => operator.admin || operator.name == owner,
        }
    }

    /// The operator behind the call, for the audit; `None` for the supervisor's admin token
    /// (root on this host, whose calls are audited by what they do).
    pub fn operator(&self) -> Option<&OperatorIdentity> {
        match self {
            Caller::Admin => None,
            Caller::Operator(operator) => Some(operator),
        }
    }

    /// The caller of `request` (the layer put it there); `UNAUTHENTICATED` if it is missing.
    #[allow(clippy::result_large_err)]
    pub fn of<T>(request: &tonic::Request<T>) -> Result<Caller, Status> {
        request
            .extensions()
            .get::<Caller>()
            .cloned()
            .ok_or_else(|| Status::unauthenticated("the call was not authenticated"))
    }
}

/// Resolves each request's caller (a tower-layer check: see [`Self::authenticate`]).
#[derive(Debug, Clone)]
pub struct CallerCheck {
    admin_hash: [u8; 32],
    /// Present when the supervisor follows an authority: operator tokens are looked up there.
    operators: Option<Arc<OperatorTokens>>,
}

impl CallerCheck {
    /// Accepts the admin token hashing to `admin_hash`, operator certificates, and — when
    /// `authority` is given — the operator tokens it issued.
    pub fn new(admin_hash: [u8; 32], authority: Option<&AuthorityLink>) -> Self {
        Self {
            admin_hash,
            operators: authority.map(|link| Arc::new(OperatorTokens::new(link.clone()))),
        }
    }

    /// The caller of a request with these headers over a connection with these extensions
    /// (the peer's certificate), as extensions to add to the request; `Err` refuses it.
    pub fn authenticate(
        &self,
        headers: &http::HeaderMap,
        connection: &http::Extensions,
    ) -> AuthenticateFuture {
        let peer = tollgate_daemon::tls::peer_certificate_in(connection);
        let metadata = MetadataMap::from_headers(headers.clone());
        let token = match token::bearer(&metadata) {
            Ok(token) => token.to_owned(),
            Err(token::BearerError::Missing) => {
                // A certificate naming an operator is a credential of its own.
                let resolved = match peer {
                    PeerCertificate::Names(FleetIdentity::Operator(name)) => {
                        Ok(Caller::Operator(OperatorIdentity { name, admin: false }))
                    }
                    _ => Err(crate::status::no_token(token::BearerError::Missing)),
                };
                return ready(resolved);
            }
            Err(error) => return ready(Err(crate::status::no_token(error))),
        };
        if token::matches(&token, &self.admin_hash) {
            return ready(Ok(Caller::Admin));
        }
        let Some(operators) = self.operators.clone() else {
            return ready(Err(crate::status::wrong_token()));
        };
        if !token::looks_like_token(&token) {
            return ready(Err(crate::status::unknown_token()));
        }
        let hash = token::hash(&token);
        if let Some(operator) = operators.cached(&hash) {
            return ready(bound_to_certificate(operator, &peer));
        }
        Box::pin(async move {
            let operator = operators.look_up(hash, token).await?;
            let caller = bound_to_certificate(operator, &peer)?;
            Ok(extensions_with(caller))
        })
    }
}

/// An operator's token over a certificate naming another operator is refused.
#[allow(clippy::result_large_err)]
fn bound_to_certificate(
    operator: OperatorIdentity,
    peer: &PeerCertificate,
) -> Result<Caller, Status> {
    match peer {
        PeerCertificate::Names(FleetIdentity::Operator(name)) if *name != operator.name => {
            Err(Status::unauthenticated(format!(
                "the token is operator {:?}'s but the client certificate names operator {name:?}: present your own token with your own certificate",
                operator.name
            )))
        }
        _ => Ok(Caller::Operator(operator)),
    }
}

fn extensions_with(caller: Caller) -> http::Extensions {
    let mut extensions = http::Extensions::new();
    extensions.insert(caller);
    extensions
}

fn ready(resolved: Result<Caller, Status>) -> AuthenticateFuture {
    Box::pin(std::future::ready(resolved.map(extensions_with)))
}

/// Operator tokens looked up at the authority, and the answers kept for a while.
#[derive(Debug)]
struct OperatorTokens {
    link: AuthorityLink,
    /// One connection for every lookup, made on first use.
    channel: tokio::sync::OnceCell<tonic::transport::Channel>,
    cache: Mutex<HashMap<[u8; 32], (OperatorIdentity, Instant)>>,
    lookups: tokio::sync::Semaphore,
}

impl OperatorTokens {
    fn new(link: AuthorityLink) -> Self {
        Self {
            link,
            channel: tokio::sync::OnceCell::new(),
            cache: Mutex::new(HashMap::new()),
            lookups: tokio::sync::Semaphore::new(MAX_LOOKUPS),
        }
    }

    /// A fresh answer for the token hashing to `hash`.
    fn cached(&self, hash: &[u8; 32]) -> Option<OperatorIdentity> {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache
            .get(hash)
            .filter(|(_, at)| at.elapsed() < TOKEN_CACHE_TTL)
            .map(|(operator, _)| operator.clone())
    }

    /// Keeps an answer; a full cache first drops what has expired, then (still full)
    /// everything: it is a cache, and the authority answers again.
    fn remember(&self, hash: [u8; 32], operator: OperatorIdentity) {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= MAX_CACHED && !cache.contains_key(&hash) {
            cache.retain(|_, (_, at)| at.elapsed() < TOKEN_CACHE_TTL);
            if cache.len() >= MAX_CACHED {
                cache.clear();
            }
        }
        cache.insert(hash, (operator, Instant::now()));
    }

    /// Asks the authority whose `token` is (within [`LOOKUP_TIMEOUT`], at most
    /// [`MAX_LOOKUPS`] at once).
    async fn look_up(&self, hash: [u8; 32], token: String) -> Result<OperatorIdentity, Status> {
        let asked = tokio::time::timeout(LOOKUP_TIMEOUT, async {
            let _turn = self
                .lookups
                .acquire()
                .await
                .map_err(|_| Status::unavailable("the supervisor is shutting down"))?;
            // Another call may have asked for the same token while this one waited.
            if let Some(operator) = self.cached(&hash) {
                return Ok(operator);
            }
            self.ask(&token).await
        })
        .await;
        let operator = match asked {
            Ok(answer) => answer?,
            Err(_) => {
                return Err(Status::unavailable(format!(
                    "could not check the operator token with the authority at {} within {} s; retry, or use this supervisor's admin token",
                    self.link,
                    LOOKUP_TIMEOUT.as_secs()
                )))
            }
        };
        self.remember(hash, operator.clone());
        Ok(operator)
    }

    async fn ask(&self, token: &str) -> Result<OperatorIdentity, Status> {
        let unreachable = |detail: String| {
            Status::unavailable(format!(
                "could not check the operator token with the authority at {}: {detail}",
                self.link
            ))
        };
        let channel = self
            .channel
            .get_or_try_init(|| async {
                self.link
                    .endpoint()
                    .map(|endpoint| endpoint.connect_lazy())
                    .map_err(|e| unreachable(tollgate_daemon::error_chain(&e)))
            })
            .await?
            .clone();
        let mut client = pb::authority_client::AuthorityClient::new(channel);
        let mut request = tonic::Request::new(pb::WhoAmIRequest {});
        let header = format!("Bearer {token}")
            .parse()
            .map_err(|_| crate::status::unknown_token())?;
        request.metadata_mut().insert("authorization", header);
        match client.who_am_i(request).await {
            Ok(info) => {
                let info = info.into_inner();
                Ok(OperatorIdentity {
                    name: info.name,
                    admin: info.admin,
                })
            }
            Err(status) if status.code() == tonic::Code::Unauthenticated => {
                Err(crate::status::unknown_token())
            }
            Err(status) => Err(unreachable(status.message().to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn operator(name: &str, admin: bool) -> OperatorIdentity {
        OperatorIdentity {
            name: name.into(),
            admin,
        }
    }

    #[test]
    fn operators_touch_their_own_runs_and_admins_every_run() {
        let alice = Caller::Operator(operator("alice", false));
        assert!(alice.may_touch("alice"));
        assert!(!alice.may_touch("bob"));
        assert!(!alice.sees_all());
        let boss = Caller::Operator(operator("boss", true));
        assert!(boss.may_touch("bob") && boss.sees_all());
        assert!(Caller::Admin.may_touch("anyone") && Caller::Admin.operator().is_none());
    }

    #[test]
    fn a_token_over_another_operators_certificate_is_refused() {
        let named = |name: &str| PeerCertificate::Names(FleetIdentity::Operator(name.into()));
        let refused = bound_to_certificate(operator("alice", false), &named("bob")).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated);
        assert!(refused.message().contains("\"bob\""), "{refused:?}");
        assert!(bound_to_certificate(operator("alice", false), &named("alice")).is_ok());
        assert!(bound_to_certificate(operator("alice", false), &PeerCertificate::None).is_ok());
    }

    #[tokio::test]
    async fn the_cache_is_bounded_and_answers_expire() {
        let tokens = OperatorTokens::new(AuthorityLink::new("http://127.0.0.1:1", None));
        for i in 0..(MAX_CACHED + 10) {
            let mut hash = [0u8; 32];
            hash[..8].copy_from_slice(&(i as u64).to_le_bytes());
            tokens.remember(hash, operator("alice", false));
            assert!(tokens.cache.lock().unwrap().len() <= MAX_CACHED);
        }
        let hash = [7u8; 32];
        tokens.remember(hash, operator("bob", false));
        assert_eq!(tokens.cached(&hash), Some(operator("bob", false)));
        tokens.cache.lock().unwrap().get_mut(&hash).unwrap().1 = Instant::now() - TOKEN_CACHE_TTL;
        assert_eq!(
            tokens.cached(&hash),
            None,
            "an expired answer is asked again"
        );
    }

    #[tokio::test]
    async fn an_unreachable_authority_is_unavailable_not_a_pass() {
        // Nothing listens on port 1: the lookup fails, and the call with it.
        let check = CallerCheck::new(
            [0u8; 32],
            Some(&AuthorityLink::new("http://127.0.0.1:1", None)),
        );
        let mut headers = http::HeaderMap::new();
        let token = token::generate();
        headers.insert(
            "authorization",
            format!("Bearer {}", token.expose()).parse().unwrap(),
        );
        let refused = check
            .authenticate(&headers, &http::Extensions::new())
            .await
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
        // Without a token and without a certificate: no caller.
        let refused = check
            .authenticate(&http::HeaderMap::new(), &http::Extensions::new())
            .await
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    }
}
