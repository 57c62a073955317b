//! The supervisor's link to the authority for delegation: its id and delegation token, and
//! how the authority's refusals reach the agent.

use std::time::Duration;

use tokio::sync::OnceCell;
use tollgate_daemon::Secret;
use tollgate_proto::v1 as pb;
use tollgate_receipt::SignedReceipt;
use tonic::{Code, Status};

use crate::gateway::gate::Refusal;
use crate::link::AuthorityLink;

/// How long a `DelegateReceipt` call to the authority may take.
const AUTHORITY_TIMEOUT: Duration = Duration::from_secs(10);

/// The supervisor's link to the authority for delegation: its id and delegation token.
pub struct Delegator {
    authority: AuthorityLink,
    supervisor_id: String,
    token: Secret,
    channel: OnceCell<tonic::transport::Channel>,
}

impl std::fmt::Debug for Delegator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("Delegator")
            .field("authority", &self.authority)
            .field("supervisor_id", &self.supervisor_id)
            .finish_non_exhaustive()
    }
}

impl Delegator {
    /// Delegates through the authority `authority` links to as `supervisor_id`, with the
    /// delegation token `token` (from `tollgate supervisor add`).
    pub fn new(authority: AuthorityLink, supervisor_id: String, token: Secret) -> Self {
        Self {
            authority,
            supervisor_id,
            token,
            channel: OnceCell::new(),
        }
    }

    /// Asks the authority for a child of `parent` (as the signed `amendments` for its children
    /// widen it); its status passes through unchanged.
    pub(super) async fn delegate(
        &self,
        parent: &SignedReceipt,
        amendments: Vec<pb::SignedAmendment>,
        child: pb::ChildSpec,
    ) -> Result<SignedReceipt, Status> {
        let channel = self
            .channel
            .get_or_try_init(|| async {
                self.authority
                    .endpoint()
                    .map(|endpoint| {
                        endpoint
                            .connect_timeout(AUTHORITY_TIMEOUT)
                            .timeout(AUTHORITY_TIMEOUT)
                            .connect_lazy()
                    })
                    .map_err(|e| {
                        Status::unavailable(format!("bad authority URL {}: {e}", self.authority))
                    })
            })
            .await?
            .clone();
        let mut request = tonic::Request::new(pb::DelegateReceiptRequest {
            supervisor_id: self.supervisor_id.clone(),
            parent: Some(parent.clone()),
            child: Some(child),
            amendments,
        });
        let mut header: tonic::metadata::MetadataValue<_> =
            format!("Bearer {}", self.token.expose())
                .parse()
                .map_err(|_| {
                    Status::internal("the delegation token is not a valid header value")
                })?;
        // Kept out of any debug output of the request.
        header.set_sensitive(true);
        request.metadata_mut().insert("authorization", header);
        let minted = pb::authority_client::AuthorityClient::new(channel)
            .delegate_receipt(request)
            .await?
            .into_inner();
        minted
            .signed
            .ok_or_else(|| Status::internal("the authority answered without a receipt"))
    }
}

/// The refusal an agent gets when the authority did not mint its child. The authority's
/// refusals (wider grants, depth, expiry) pass through; a refused delegation token is this
/// supervisor's problem, not the agent's: unavailable, and logged here.
pub(super) fn authority_refusal(run_id: &str, status: Status) -> Refusal {
    let reason = status.message().to_owned();
    let code = match status.code() {
        Code::Unauthenticated => {
            tracing::error!(error = %reason, "the authority refused this supervisor's delegation token");
            return Refusal::with(
                Status::unavailable,
                "delegation is unavailable: the authority refused this supervisor's delegation token (an admin must enrol it again)".into(),
            );
        }
        Code::Unavailable | Code::DeadlineExceeded | Code::Unknown => Code::Unavailable,
        code => code,
    };
    Refusal::new(
        Status::new(code, format!("receipt {run_id}: {reason}")),
        reason,
    )
}
