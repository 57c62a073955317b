//! The service's shared state and what every call does with it: blocking storage work, and
//! auditing a call's decision before (or instead of) its effect.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{broadcast, watch};
use tollgate_audit::{AuditLog, EntryDraft};
use tollgate_proto::v1 as pb;
use tonic::Request;

use crate::config::AuthorityConfig;
use crate::entries::{refused, undone_entry};
use crate::error::{AuthorityError, CallError};
use crate::keys::KeyRing;
use crate::minting::MintCommitter;
use crate::operators::{OperatorRegistry, SupervisorRegistry};
use crate::store::Store;

/// Shared state behind the service.
#[derive(Debug)]
pub struct AuthorityService {
    pub(crate) config: AuthorityConfig,
    pub(crate) store: Arc<Store>,
    pub(crate) keys: Arc<KeyRing>,
    pub(crate) operators: Arc<OperatorRegistry>,
    pub(crate) supervisors: Arc<SupervisorRegistry>,
    pub(crate) audit: AuditLog,
    pub(crate) minting: MintCommitter,
    pub(crate) revocations: broadcast::Sender<pb::Revocation>,
    /// The mint policy now (SIGHUP replaces it from the config file).
    pub(crate) policy: Arc<std::sync::RwLock<crate::config::MintPolicy>>,
    /// Bumped on every key-set change; each revocation stream announces it.
    pub(crate) key_set_version: watch::Sender<u64>,
    pub(crate) shutdown: watch::Receiver<bool>,
}

impl AuthorityService {
    /// The mint policy in force now.
    pub(crate) fn mint_policy(&self) -> crate::config::MintPolicy {
        self.policy
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Runs blocking storage work off the async threads (`tollgate_daemon::blocking`), as a call's
/// error.
pub(super) async fn blocking<T, F>(work: F) -> Result<T, CallError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, AuthorityError> + Send + 'static,
{
    tollgate_daemon::blocking(work)
        .await
        .map_err(AuthorityError::task)?
        .map_err(CallError::from)
}

/// How a call that changes state failed.
#[derive(Debug)]
pub(super) enum Refusal {
    /// Refused before anything was done (not yet audited).
    Decided(CallError),
    /// Failed at or after its audited commit (the log already says so).
    Audited(CallError),
}

impl From<CallError> for Refusal {
    fn from(error: CallError) -> Self {
        Self::Decided(error)
    }
}

impl From<AuthorityError> for Refusal {
    fn from(error: AuthorityError) -> Self {
        Self::Decided(error.into())
    }
}

impl AuthorityService {
    /// Appends `draft` to the audit log and waits until it is on disk. A call whose decision
    /// cannot be audited fails: nothing is done unaudited.
    pub(super) async fn record(&self, draft: EntryDraft) -> Result<(), CallError> {
        let audit = self.audit.clone();
        blocking(move || {
            audit
                .append(draft)
                .map(|_| ())
                .map_err(AuthorityError::from)
        })
        .await
    }

    /// Commits a decided action together with its audit entry. The entry is on disk before the
    /// action takes effect, and both run on a blocking thread that a cancelled call (a client
    /// hanging up, a shutdown) cannot interrupt. If the action then fails, a second entry
    /// records that it did not take effect, and why.
    pub(super) async fn commit_audited<T, F>(&self, entry: EntryDraft, act: F) -> Result<T, Refusal>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T, CallError> + Send + 'static,
    {
        let audit = self.audit.clone();
        tollgate_daemon::blocking(move || {
            audit
                .append(entry.clone())
                .map_err(|e| Refusal::Audited(CallError::Internal(e.into())))?;
            act().map_err(|error| {
                let undone = refused(entry, &error);
                let undone = undone_entry(undone, &error.to_string());
                if let Err(e) = audit.append(undone) {
                    tracing::error!(error = %e, "could not audit a failed action");
                }
                Refusal::Audited(error)
            })
        })
        .await
        .map_err(|e| Refusal::Audited(AuthorityError::task(e).into()))?
    }

    /// Finishes a call: a refusal decided before anything was done is audited here (what was
    /// asked, by whom, why not); everything else already is.
    pub(super) async fn finish<T>(
        &self,
        result: Result<T, Refusal>,
        asked: impl FnOnce() -> EntryDraft,
    ) -> Result<T, CallError> {
        match result {
            Ok(value) => Ok(value),
            Err(Refusal::Audited(error)) => Err(error),
            Err(Refusal::Decided(error)) => {
                self.record(refused(asked(), &error)).await?;
                Err(error)
            }
        }
    }

    /// Runs a call that changes state, auditing a refusal decided before anything was done
    /// (what was asked, by whom, why not); everything else its call audits itself. `asked`
    /// takes what the record needs from the request before `call` consumes it; the record is
    /// built only on refusal.
    pub(super) async fn audited<R, T, D, Fut>(
        &self,
        request: Request<R>,
        asked: impl FnOnce(&R, String) -> D,
        call: impl FnOnce(Request<R>) -> Fut,
    ) -> Result<T, CallError>
    where
        D: FnOnce() -> EntryDraft,
        Fut: Future<Output = Result<T, Refusal>>,
    {
        let caller = self.caller(request.metadata());
        let asked = asked(request.get_ref(), caller);
        let result = call(request).await;
        self.finish(result, asked).await
    }
}
