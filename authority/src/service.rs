//! The `tollgate.v1.Authority` gRPC service.

use std::pin::Pin;
use std::sync::Arc;

use prost::Message as _;
use tokio::sync::{broadcast, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tollgate_audit::{AuditLog, Decision, EntryDraft, EntryKind, MetaValue};
use tollgate_proto::v1 as pb;
use tollgate_proto::v1::authority_server::Authority;
use tollgate_receipt::delegation::check_within;
use tollgate_receipt::spec::access_name;
use tollgate_receipt::{timestamp_from_unix, to_text, unix_now};
use tonic::{Request, Response, Status};

use crate::ceiling::{validate_ceiling, validate_mint, CeilingCheck};
use crate::config::AuthorityConfig;
use crate::error::{AuthorityError, CallError};
use crate::keys::{key_set, KeyRing};
use crate::minting::MintCommitter;
use crate::operators::{
    bearer_token, generate_token, token_hash, valid_operator_name, valid_supervisor_id,
    OperatorRegistry, SupervisorRegistry,
};
use crate::store::{Operator, ReceiptFilter, RevokedTree, Store, Supervisor};
use crate::COMPONENT;

/// Most receipts one ListReceipts page may hold.
pub const MAX_PAGE: u32 = 1000;

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
    pub(crate) shutdown: watch::Receiver<bool>,
}

/// Runs blocking storage work off the async threads.
async fn blocking<T, F>(work: F) -> Result<T, CallError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, AuthorityError> + Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| CallError::Internal(AuthorityError::Task(e.to_string())))?
        .map_err(CallError::from)
}

/// The gRPC code name of a failed call, for audit entries.
fn code_name(error: &CallError) -> &'static str {
    match error {
        CallError::Unauthenticated(_) => "unauthenticated",
        CallError::PermissionDenied(_) => "permission_denied",
        CallError::InvalidArgument { .. } => "invalid_argument",
        CallError::NotFound(_) => "not_found",
        CallError::AlreadyExists(_) => "already_exists",
        CallError::Internal(_) => "internal",
    }
}

/// How a call that changes state failed.
#[derive(Debug)]
enum Refusal {
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

/// Longest client-given field copied into an audit entry.
const MAX_FIELD: usize = 256;
/// Longest reason copied into an audit entry.
const MAX_REASON: usize = 1024;

/// At most `max` bytes of `text` (on a character boundary), marked when cut: audit entries
/// never carry unbounded client input.
fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &text[..end], text.len())
}

/// `draft` as the record of a refused call: the decision, the error and its code.
pub(crate) fn refused(draft: EntryDraft, error: &CallError) -> EntryDraft {
    draft
        .decision(Decision::Deny)
        .reason(clip(&error.to_string(), MAX_REASON))
        .meta("code", code_name(error))
}

/// `entry` turned into the record of a change that did not take effect, and why.
pub(crate) fn undone_entry(entry: EntryDraft, why: &str) -> EntryDraft {
    let mut undone = entry.decision(Decision::Deny);
    undone.reason = Some(clip(&format!("not done: {why}"), MAX_REASON));
    undone
}

/// The audit entry of a receipt about to be stored; a child's also names its parent, its
/// depth and the supervisor that asked for it.
fn minted_entry(receipt: &pb::Receipt, delegated_by: Option<&str>) -> EntryDraft {
    let entry = EntryDraft::new(COMPONENT, EntryKind::ReceiptMinted);
    let entry = match delegated_by {
        Some(supervisor) => entry
            .meta("parent_receipt_id", receipt.parent_receipt_id.as_str())
            .meta("depth", receipt.depth)
            .meta("delegated_by", supervisor),
        None => entry,
    };
    entry
        .receipt(receipt.receipt_id.as_str())
        .decision(Decision::Allow)
        .meta("issuer", receipt.issuer.as_str())
        .meta("owner", receipt.owner.as_str())
        .meta("subject", receipt.subject.as_str())
        .meta("audience", receipt.audience.clone())
        .meta("key_id", receipt.key_id.as_str())
        .meta("expires_at", receipt.expires_at.map_or(0, |t| t.seconds))
        .meta("exec", receipt.exec.clone())
        .meta(
            "fs",
            receipt
                .fs
                .iter()
                .map(|g| format!("{}:{}", g.path, access_name(g.access)))
                .collect::<Vec<_>>(),
        )
        .meta(
            "routes",
            receipt
                .routes
                .iter()
                .map(|r| r.name.clone())
                .collect::<Vec<_>>(),
        )
}

/// A child's limits: each one the child leaves at 0 takes the parent's value.
fn inherit_limits(child: pb::Limits, parent: pb::Limits) -> pb::Limits {
    let pick = |child: u64, parent: u64| if child == 0 { parent } else { child };
    let pick32 = |child: u32, parent: u32| if child == 0 { parent } else { child };
    pb::Limits {
        memory_bytes: pick(child.memory_bytes, parent.memory_bytes),
        pids: pick32(child.pids, parent.pids),
        cpu_millicores: pick32(child.cpu_millicores, parent.cpu_millicores),
        output_bytes: pick(child.output_bytes, parent.output_bytes),
        tmpfs_bytes: pick(child.tmpfs_bytes, parent.tmpfs_bytes),
        tool_calls: pick(child.tool_calls, parent.tool_calls),
        tokens: pick(child.tokens, parent.tokens),
        files: pick32(child.files, parent.files),
    }
}

/// RFC 3339 (UTC, seconds) of Unix seconds, for messages.
fn rfc3339(seconds: i64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(seconds.max(0).unsigned_abs());
    humantime::format_rfc3339_seconds(at).to_string()
}

fn check_receipt_id(receipt_id: &str) -> Result<(), CallError> {
    match uuid::Uuid::try_parse(receipt_id) {
        Ok(id) if id.hyphenated().to_string() == receipt_id => Ok(()),
        _ => Err(CallError::invalid(
            "receipt_id",
            format!("{receipt_id:?} is not a receipt id (a lowercase hyphenated UUID)"),
        )),
    }
}

fn check_owner(operator: &Operator, receipt: &pb::Receipt) -> Result<(), CallError> {
    if operator.admin || operator.name == receipt.owner {
        Ok(())
    } else {
        Err(CallError::PermissionDenied(format!(
            "receipt {} belongs to operator {:?}, not {:?}",
            receipt.receipt_id, receipt.owner, operator.name
        )))
    }
}

fn revoked_event(revocation: pb::Revocation) -> pb::RevocationEvent {
    pb::RevocationEvent {
        event: Some(pb::revocation_event::Event::Revoked(revocation)),
    }
}

/// Completes once shutdown has been signalled.
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    // The guard wait_for returns is not Send; drop it here, inside this future.
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// Revokes `receipt_id` and its descendants ([`Store::revoke_tree`]), each descendant's
/// `receipt_revoked` entry (with `cascade_from` and its seq) on disk before the transaction
/// commits. If it then does not commit, each of those entries is followed by a "not done" one
/// (the caller writes the root's).
fn revoke_tree_audited(
    store: &Store,
    audit: &AuditLog,
    receipt_id: &str,
    reason: &str,
    by: &str,
) -> Result<RevokedTree, CallError> {
    let mut written: Vec<EntryDraft> = Vec::new();
    let result = store.revoke_tree(receipt_id, reason, by, unix_now(), |cascaded| {
        let drafts: Vec<EntryDraft> = cascaded
            .iter()
            .map(|revocation| {
                EntryDraft::new(COMPONENT, EntryKind::ReceiptRevoked)
                    .receipt(revocation.receipt_id.as_str())
                    .decision(Decision::Allow)
                    .reason(clip(&revocation.reason, MAX_REASON))
                    .meta("by", by)
                    .meta("cascade_from", receipt_id)
                    .meta("seq", i64::try_from(revocation.seq).unwrap_or(i64::MAX))
            })
            .collect();
        // Handed over together, so the audit writer commits them with one fsync.
        let pending: Vec<_> = drafts.iter().map(|d| audit.submit(d.clone())).collect();
        let mut failure = None;
        for (draft, entry) in drafts.into_iter().zip(pending) {
            match entry.and_then(tollgate_audit::PendingEntry::wait) {
                Ok(_) => written.push(draft),
                Err(e) => {
                    failure.get_or_insert(e);
                }
            }
        }
        match failure {
            None => Ok(()),
            Some(e) => Err(CallError::Internal(e.into())),
        }
    });
    let error = match result {
        Ok(Some(tree)) => return Ok(tree),
        Ok(None) => CallError::NotFound(format!("no receipt {receipt_id} (it vanished)")),
        Err(error) => error,
    };
    for draft in written {
        let undone = undone_entry(refused(draft, &error), &error.to_string());
        if let Err(e) = audit.append(undone) {
            tracing::error!(error = %e, "could not audit a cascade that was not done");
        }
    }
    Err(error)
}

type RevocationStream = Pin<Box<dyn Stream<Item = Result<pb::RevocationEvent, Status>> + Send>>;

impl AuthorityService {
    /// Appends `draft` to the audit log and waits until it is on disk. A call whose decision
    /// cannot be audited fails: nothing is done unaudited.
    async fn record(&self, draft: EntryDraft) -> Result<(), CallError> {
        let audit = self.audit.clone();
        blocking(move || {
            audit
                .append(draft)
                .map(|_| ())
                .map_err(AuthorityError::from)
        })
        .await
    }

    /// Who is calling, if its token is valid (for auditing refused calls): an operator's
    /// name, or `supervisor:<id>` for a delegation token.
    fn caller(&self, request_metadata: &tonic::metadata::MetadataMap) -> String {
        let Ok(token) = bearer_token(request_metadata) else {
            return "(unauthenticated)".into();
        };
        if let Some(operator) = self.operators.by_token(token) {
            operator.name.clone()
        } else if let Some(supervisor) = self.supervisors.by_token(token) {
            format!("supervisor:{}", supervisor.supervisor_id)
        } else {
            "(unauthenticated)".into()
        }
    }

    /// The operator calling. A supervisor's delegation token is not an operator's, and is
    /// told so (`UNAUTHENTICATED`): it authenticates only `DelegateReceipt`.
    fn operator(
        &self,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<Arc<Operator>, CallError> {
        let token = bearer_token(metadata)?;
        if let Some(operator) = self.operators.by_token(token) {
            return Ok(operator);
        }
        if let Some(supervisor) = self.supervisors.by_token(token) {
            return Err(CallError::Unauthenticated(format!(
                "this is supervisor {:?}'s delegation token: it authenticates only DelegateReceipt; this call needs an operator token",
                supervisor.supervisor_id
            )));
        }
        Err(CallError::Unauthenticated(
            "unknown or revoked operator token".into(),
        ))
    }

    /// Like [`Self::operator`], and the operator must be an admin.
    fn admin(&self, metadata: &tonic::metadata::MetadataMap) -> Result<Arc<Operator>, CallError> {
        let operator = self.operator(metadata)?;
        if !operator.admin {
            return Err(CallError::PermissionDenied(format!(
                "operator {:?} is not an admin; this call needs the admin token",
                operator.name
            )));
        }
        Ok(operator)
    }

    /// The supervisor calling `DelegateReceipt`, by its delegation token. An operator token
    /// is refused (`PERMISSION_DENIED`): operators mint with `MintReceipt`.
    fn supervisor(
        &self,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<Arc<Supervisor>, CallError> {
        let token = bearer_token(metadata)?;
        if let Some(supervisor) = self.supervisors.by_token(token) {
            return Ok(supervisor);
        }
        if self.operators.by_token(token).is_some() {
            return Err(CallError::PermissionDenied(
                "DelegateReceipt needs a supervisor's delegation token (tollgate supervisor add); operators mint with MintReceipt".into(),
            ));
        }
        Err(CallError::Unauthenticated(
            "unknown delegation token; enrol the supervisor with `tollgate supervisor add ID` and pass the token it prints".into(),
        ))
    }

    /// Commits a decided action together with its audit entry. The entry is on disk before the
    /// action takes effect, and both run on a blocking thread that a cancelled call (a client
    /// hanging up, a shutdown) cannot interrupt. If the action then fails, a second entry
    /// records that it did not take effect, and why.
    async fn commit_audited<T, F>(&self, entry: EntryDraft, act: F) -> Result<T, Refusal>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T, CallError> + Send + 'static,
    {
        let audit = self.audit.clone();
        tokio::task::spawn_blocking(move || {
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
        .map_err(|e| Refusal::Audited(CallError::Internal(AuthorityError::Task(e.to_string()))))?
    }

    /// Finishes a call: a refusal decided before anything was done is audited here (what was
    /// asked, by whom, why not); everything else already is.
    async fn finish<T>(
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

    async fn audited_mint(
        &self,
        request: Request<pb::MintReceiptRequest>,
    ) -> Result<pb::MintReceiptResponse, CallError> {
        let caller = self.caller(request.metadata());
        let subject = clip(&request.get_ref().subject, MAX_FIELD);
        let result = self.mint(request).await;
        self.finish(result, || {
            EntryDraft::new(COMPONENT, EntryKind::ReceiptRefused)
                .meta("operator", caller)
                .meta("subject", subject)
        })
        .await
    }

    async fn audited_revoke(
        &self,
        request: Request<pb::RevokeReceiptRequest>,
    ) -> Result<pb::RevokeReceiptResponse, CallError> {
        let caller = self.caller(request.metadata());
        let claimed = request.get_ref().receipt_id.clone();
        let result = self.revoke(request).await;
        self.finish(result, || {
            let draft = EntryDraft::new(COMPONENT, EntryKind::ReceiptRevoked).meta("by", caller);
            // Only a well-formed id goes in the (never redacted) id field.
            if check_receipt_id(&claimed).is_ok() {
                draft.receipt(claimed)
            } else {
                draft.meta("claimed_receipt_id", clip(&claimed, 64))
            }
        })
        .await
    }

    async fn audited_add_operator(
        &self,
        request: Request<pb::AddOperatorRequest>,
    ) -> Result<pb::AddOperatorResponse, CallError> {
        let caller = self.caller(request.metadata());
        let name = clip(&request.get_ref().name, 64);
        let admin = request.get_ref().admin;
        let result = self.add_operator(request).await;
        self.finish(result, || {
            EntryDraft::new(COMPONENT, EntryKind::OperatorAdded)
                .meta("operator", name)
                .meta("admin", admin)
                .meta("by", caller)
        })
        .await
    }

    async fn audited_delegate(
        &self,
        request: Request<pb::DelegateReceiptRequest>,
    ) -> Result<pb::MintReceiptResponse, CallError> {
        let caller = self.caller(request.metadata());
        let asked = request.get_ref();
        let subject = clip(
            asked.child.as_ref().map_or("", |c| c.subject.as_str()),
            MAX_FIELD,
        );
        // What the envelope claims, for the record; only a well-formed id goes in.
        let parent_id = asked
            .parent
            .as_ref()
            .and_then(|p| pb::Receipt::decode(p.receipt.as_slice()).ok())
            .map(|r| r.receipt_id)
            .filter(|id| check_receipt_id(id).is_ok());
        let result = self.delegate(request).await;
        self.finish(result, || {
            EntryDraft::new(COMPONENT, EntryKind::ReceiptRefused)
                .meta("operator", caller)
                .meta("subject", subject)
                .meta(
                    "parent_receipt_id",
                    parent_id.map_or(MetaValue::Null, MetaValue::from),
                )
        })
        .await
    }

    async fn audited_add_supervisor(
        &self,
        request: Request<pb::AddSupervisorRequest>,
    ) -> Result<pb::AddSupervisorResponse, CallError> {
        let caller = self.caller(request.metadata());
        let supervisor_id = clip(&request.get_ref().supervisor_id, 64);
        let result = self.add_supervisor(request).await;
        self.finish(result, || {
            EntryDraft::new(COMPONENT, EntryKind::SupervisorEnrolled)
                .meta("supervisor_id", supervisor_id)
                .meta("by", caller)
        })
        .await
    }

    async fn audited_remove_supervisor(
        &self,
        request: Request<pb::RemoveSupervisorRequest>,
    ) -> Result<pb::RemoveSupervisorResponse, CallError> {
        let caller = self.caller(request.metadata());
        let supervisor_id = clip(&request.get_ref().supervisor_id, 64);
        let result = self.remove_supervisor(request).await;
        self.finish(result, || {
            EntryDraft::new(COMPONENT, EntryKind::SupervisorRemoved)
                .meta("supervisor_id", supervisor_id)
                .meta("by", caller)
        })
        .await
    }

    async fn audited_rotate(
        &self,
        request: Request<pb::RotateKeyRequest>,
    ) -> Result<pb::RotateKeyResponse, CallError> {
        let caller = self.caller(request.metadata());
        let result = self.rotate(request).await;
        self.finish(result, || {
            EntryDraft::new(COMPONENT, EntryKind::KeyRotated).meta("by", caller)
        })
        .await
    }

    async fn mint(
        &self,
        request: Request<pb::MintReceiptRequest>,
    ) -> Result<pb::MintReceiptResponse, Refusal> {
        let operator = self.operator(request.metadata())?;
        let request = request.into_inner();
        validate_mint(&request)?;
        let check = CeilingCheck {
            operator: &operator.name,
            ceiling: &operator.ceiling,
            defaults: &self.config.default_limits,
        };
        check.check_grants(&request)?;
        let limits = check.resolve_limits(request.limits.as_ref())?;

        let now = unix_now();
        let not_before = request.not_before.map_or(now, |t| t.seconds.max(now));
        let max_ttl = i64::try_from(operator.ceiling.max_ttl_seconds).unwrap_or(i64::MAX);
        if not_before - now > max_ttl {
            return Err(CallError::PermissionDenied(format!(
                "not_before more than {max_ttl}s ahead is above operator {:?}'s ceiling",
                operator.name
            ))
            .into());
        }
        // Both bounded by validation (366 days, year 9999), so this cannot overflow.
        let ttl = i64::try_from(request.ttl_seconds).unwrap_or(i64::MAX);
        let expires_at = not_before.checked_add(ttl).ok_or_else(|| {
            CallError::invalid("ttl_seconds", "not_before + ttl_seconds overflows")
        })?;
        let mut receipt = pb::Receipt {
            receipt_id: uuid::Uuid::now_v7().hyphenated().to_string(),
            issuer: self.config.issuer.clone(),
            key_id: String::new(), // set by the signer
            owner: operator.name.clone(),
            subject: request.subject,
            audience: request.audience,
            issued_at: Some(timestamp_from_unix(now)),
            not_before: Some(timestamp_from_unix(not_before)),
            expires_at: Some(timestamp_from_unix(expires_at)),
            policy_version: self.config.policy_version.clone(),
            parent_receipt_id: String::new(),
            depth: 0,
            agent: request.agent,
            limits: Some(limits),
            fs: request.fs,
            exec: request.exec,
            routes: request.routes,
            network: pb::NetworkAccess::LoopbackOnly as i32,
            delegate: request.delegate,
        };
        let signed = self.keys.active().sign(&mut receipt);
        self.minting
            .commit(
                receipt.clone(),
                signed.clone(),
                None,
                minted_entry(&receipt, None),
            )
            .await
            .map_err(Refusal::Audited)?;
        Ok(pb::MintReceiptResponse {
            text: to_text(&signed),
            signed: Some(signed),
            receipt: Some(receipt),
        })
    }

    /// `DelegateReceipt`: the checks of docs/plans/delegation.md §4, in that order (token,
    /// parent, resolution, shape, `check_within`), then sign and commit like a mint.
    async fn delegate(
        &self,
        request: Request<pb::DelegateReceiptRequest>,
    ) -> Result<pb::MintReceiptResponse, Refusal> {
        let supervisor = self.supervisor(request.metadata())?;
        let request = request.into_inner();
        if request.supervisor_id != supervisor.supervisor_id {
            return Err(CallError::PermissionDenied(format!(
                "this token is enrolled for supervisor {:?}, not {:?}",
                supervisor.supervisor_id,
                clip(&request.supervisor_id, 64)
            ))
            .into());
        }
        let envelope = request.parent.ok_or_else(|| {
            CallError::invalid("parent", "is required: the parent receipt's envelope")
        })?;
        let spec = request
            .child
            .ok_or_else(|| CallError::invalid("child", "is required"))?;
        let claimed = pb::Receipt::decode(envelope.receipt.as_slice())
            .map_err(|_| CallError::invalid("parent.receipt", "does not decode as a Receipt"))?;
        let not_ours = |id: &str| {
            CallError::PermissionDenied(format!(
                "parent receipt {id} is not one this authority minted"
            ))
        };
        // A claimed id that is no receipt id is quoted (it is client text), never trusted.
        check_receipt_id(&claimed.receipt_id)
            .map_err(|_| not_ours(&format!("{:?}", clip(&claimed.receipt_id, 64))))?;
        let store = self.store.clone();
        let id = claimed.receipt_id.clone();
        let stored = blocking(move || store.receipt(&id)).await?;
        // Byte for byte: the envelope is evidence of what was minted, nothing more.
        let stored = match stored {
            Some(stored) if stored.signed == envelope => stored,
            _ => return Err(not_ours(&claimed.receipt_id).into()),
        };
        let parent = stored.receipt;
        let parent_id = parent.receipt_id.as_str();
        if stored.revocation.is_some() {
            return Err(CallError::PermissionDenied(format!(
                "parent receipt {parent_id} is revoked"
            ))
            .into());
        }
        let now = unix_now();
        let parent_expiry = parent.expires_at.as_ref().map_or(0, |t| t.seconds);
        if parent_expiry <= now {
            return Err(CallError::PermissionDenied(format!(
                "parent receipt {parent_id} expired at {}",
                rfc3339(parent_expiry)
            ))
            .into());
        }
        // A child starts now: a parent not valid yet would give a child valid before it.
        let parent_start = parent.not_before.as_ref().map_or(0, |t| t.seconds);
        if parent_start > now {
            return Err(CallError::PermissionDenied(format!(
                "parent receipt {parent_id} is not valid until {}",
                rfc3339(parent_start)
            ))
            .into());
        }
        if !parent.audience.contains(&supervisor.supervisor_id) {
            return Err(CallError::PermissionDenied(format!(
                "parent receipt {parent_id} is not for supervisor {:?}",
                supervisor.supervisor_id
            ))
            .into());
        }
        if parent.delegate.as_ref().map_or(0, |d| d.max_depth) == 0 {
            return Err(CallError::PermissionDenied(format!(
                "parent receipt {parent_id} may not delegate (delegate.max_depth = 0)"
            ))
            .into());
        }
        // Resolve: the child starts now, ends by the parent's end, and takes the parent's
        // value for every limit left at 0.
        let remaining = u64::try_from(parent_expiry - now).unwrap_or(0);
        let ttl = match spec.ttl_seconds {
            0 => remaining,
            ttl if ttl > remaining => {
                return Err(CallError::PermissionDenied(format!(
                    "ttl_seconds = {ttl} is longer than parent receipt {parent_id}'s remaining {remaining} s"
                ))
                .into())
            }
            ttl => ttl,
        };
        let limits = inherit_limits(
            spec.limits.unwrap_or_default(),
            parent.limits.unwrap_or_default(),
        );
        let shape = pb::MintReceiptRequest {
            subject: spec.subject,
            ttl_seconds: ttl,
            audience: vec![supervisor.supervisor_id.clone()],
            agent: spec.agent,
            limits: Some(limits),
            fs: spec.fs,
            exec: spec.exec,
            routes: spec.routes,
            delegate: spec.delegate,
            not_before: None,
        };
        // The mount, exec and argv rules of a mint apply unchanged; errors name the field.
        validate_mint(&shape)?;
        // Bounded by the parent's expiry, so this cannot overflow.
        let expires_at = now.saturating_add(i64::try_from(ttl).unwrap_or(i64::MAX));
        let mut receipt = pb::Receipt {
            receipt_id: uuid::Uuid::now_v7().hyphenated().to_string(),
            issuer: self.config.issuer.clone(),
            key_id: String::new(), // set by the signer
            owner: parent.owner.clone(),
            subject: shape.subject,
            audience: shape.audience,
            issued_at: Some(timestamp_from_unix(now)),
            not_before: Some(timestamp_from_unix(now)),
            expires_at: Some(timestamp_from_unix(expires_at)),
            // The policy that produced the parent produced the child (no ceiling is applied
            // again: child ⊆ parent ⊆ ceiling).
            policy_version: parent.policy_version.clone(),
            parent_receipt_id: parent.receipt_id.clone(),
            depth: parent.depth.saturating_add(1),
            agent: shape.agent,
            limits: shape.limits,
            fs: shape.fs,
            exec: shape.exec,
            routes: shape.routes,
            network: pb::NetworkAccess::LoopbackOnly as i32,
            delegate: shape.delegate,
        };
        // Ceilings are not re-checked: child within parent within ceiling, and ceilings never
        // change.
        check_within(&parent, &receipt)
            .map_err(|wider| CallError::PermissionDenied(wider.to_string()))?;
        let signed = self.keys.active().sign(&mut receipt);
        let entry = minted_entry(&receipt, Some(&supervisor.supervisor_id));
        self.minting
            .commit(
                receipt.clone(),
                signed.clone(),
                Some(supervisor.supervisor_id.clone()),
                entry,
            )
            .await
            .map_err(Refusal::Audited)?;
        tracing::info!(
            receipt_id = %receipt.receipt_id,
            parent_receipt_id = %receipt.parent_receipt_id,
            depth = receipt.depth,
            supervisor_id = %supervisor.supervisor_id,
            "delegated receipt"
        );
        Ok(pb::MintReceiptResponse {
            text: to_text(&signed),
            signed: Some(signed),
            receipt: Some(receipt),
        })
    }

    async fn add_supervisor(
        &self,
        request: Request<pb::AddSupervisorRequest>,
    ) -> Result<pb::AddSupervisorResponse, Refusal> {
        let admin = self.admin(request.metadata())?;
        let supervisor_id = request.into_inner().supervisor_id;
        if !valid_supervisor_id(&supervisor_id) {
            return Err(CallError::invalid(
                "supervisor_id",
                "must be 1-64 letters, digits, '.', '_', '-' or '@'",
            )
            .into());
        }
        // Decided before anything is written, so a repeat is one refusal in the log; the
        // store's unique key still settles a race between two enrolments.
        if self.supervisors.contains_id(&supervisor_id) {
            return Err(CallError::AlreadyExists(format!(
                "supervisor {supervisor_id:?} is already enrolled"
            ))
            .into());
        }
        let token = generate_token();
        let hash = token_hash(&token);
        let supervisor = Supervisor {
            supervisor_id: supervisor_id.clone(),
            created_at: unix_now(),
            created_by: admin.name.clone(),
        };
        let store = self.store.clone();
        let stored = supervisor.clone();
        let id = supervisor_id.clone();
        let entry = EntryDraft::new(COMPONENT, EntryKind::SupervisorEnrolled)
            .decision(Decision::Allow)
            .meta("supervisor_id", supervisor_id.as_str())
            .meta("by", admin.name.as_str());
        self.commit_audited(entry, move || {
            if store.insert_supervisor(&hash, &stored)? {
                Ok(())
            } else {
                Err(CallError::AlreadyExists(format!(
                    "supervisor {id:?} is already enrolled"
                )))
            }
        })
        .await?;
        self.supervisors.insert(hash, supervisor);
        tracing::info!(supervisor_id = %supervisor_id, by = %admin.name, "enrolled supervisor");
        Ok(pb::AddSupervisorResponse {
            supervisor_id,
            token,
        })
    }

    async fn remove_supervisor(
        &self,
        request: Request<pb::RemoveSupervisorRequest>,
    ) -> Result<pb::RemoveSupervisorResponse, Refusal> {
        let admin = self.admin(request.metadata())?;
        let supervisor_id = request.into_inner().supervisor_id;
        let not_enrolled = |id: &str| {
            CallError::NotFound(format!(
                "no supervisor {:?} is enrolled (tollgate supervisor add enrols one)",
                clip(id, 64)
            ))
        };
        if !self.supervisors.contains_id(&supervisor_id) {
            return Err(not_enrolled(&supervisor_id).into());
        }
        let store = self.store.clone();
        let id = supervisor_id.clone();
        let entry = EntryDraft::new(COMPONENT, EntryKind::SupervisorRemoved)
            .decision(Decision::Allow)
            .meta("supervisor_id", supervisor_id.as_str())
            .meta("by", admin.name.as_str());
        self.commit_audited(entry, move || {
            if store.delete_supervisor(&id)? {
                Ok(())
            } else {
                Err(not_enrolled(&id))
            }
        })
        .await?;
        self.supervisors.remove_id(&supervisor_id);
        tracing::info!(supervisor_id = %supervisor_id, by = %admin.name, "removed supervisor");
        Ok(pb::RemoveSupervisorResponse { supervisor_id })
    }

    async fn get(
        &self,
        request: Request<pb::GetReceiptRequest>,
    ) -> Result<pb::GetReceiptResponse, CallError> {
        let operator = self.operator(request.metadata())?;
        let receipt_id = request.into_inner().receipt_id;
        check_receipt_id(&receipt_id)?;
        let store = self.store.clone();
        let id = receipt_id.clone();
        let stored = blocking(move || store.receipt(&id))
            .await?
            .ok_or_else(|| CallError::NotFound(format!("no receipt {receipt_id}")))?;
        check_owner(&operator, &stored.receipt)?;
        Ok(pb::GetReceiptResponse {
            text: to_text(&stored.signed),
            signed: Some(stored.signed),
            receipt: Some(stored.receipt),
            revocation: stored.revocation,
        })
    }

    async fn list(
        &self,
        request: Request<pb::ListReceiptsRequest>,
    ) -> Result<pb::ListReceiptsResponse, CallError> {
        let operator = self.operator(request.metadata())?;
        let request = request.into_inner();
        let owner = if operator.admin {
            (!request.owner.is_empty()).then_some(request.owner)
        } else if request.owner.is_empty() || request.owner == operator.name {
            Some(operator.name.clone())
        } else {
            return Err(CallError::PermissionDenied(format!(
                "operator {:?} may list only its own receipts, not {:?}'s",
                operator.name, request.owner
            )));
        };
        let limit = match request.limit {
            0 => 100,
            n if n > MAX_PAGE => {
                return Err(CallError::invalid(
                    "limit",
                    format!("must be at most {MAX_PAGE}"),
                ))
            }
            n => n,
        };
        let before_id = if request.page_token.is_empty() {
            None
        } else {
            check_receipt_id(&request.page_token).map_err(|_| {
                CallError::invalid("page_token", "is not a token from ListReceipts")
            })?;
            Some(request.page_token)
        };
        let filter = ReceiptFilter {
            owner,
            before_id,
            limit,
            include_expired: request.include_expired,
            now: unix_now(),
        };
        let store = self.store.clone();
        let rows = blocking(move || store.list_receipts(&filter)).await?;
        let next_page_token = if rows.len() == limit as usize {
            rows.last()
                .map(|(r, _)| r.receipt_id.clone())
                .unwrap_or_default()
        } else {
            String::new()
        };
        let receipts = rows
            .into_iter()
            .map(|(receipt, revoked)| pb::ReceiptSummary {
                receipt_id: receipt.receipt_id,
                owner: receipt.owner,
                subject: receipt.subject,
                issued_at: receipt.issued_at,
                expires_at: receipt.expires_at,
                revoked,
                audience: receipt.audience,
                parent_receipt_id: receipt.parent_receipt_id,
                depth: receipt.depth,
            })
            .collect();
        Ok(pb::ListReceiptsResponse {
            receipts,
            next_page_token,
        })
    }

    async fn revoke(
        &self,
        request: Request<pb::RevokeReceiptRequest>,
    ) -> Result<pb::RevokeReceiptResponse, Refusal> {
        let operator = self.operator(request.metadata())?;
        let request = request.into_inner();
        check_receipt_id(&request.receipt_id)?;
        if request.reason.len() > 1024 {
            return Err(CallError::invalid("reason", "must be at most 1024 bytes").into());
        }
        let store = self.store.clone();
        let id = request.receipt_id.clone();
        let stored = blocking(move || store.receipt(&id))
            .await?
            .ok_or_else(|| CallError::NotFound(format!("no receipt {}", request.receipt_id)))?;
        check_owner(&operator, &stored.receipt)?;
        let store = self.store.clone();
        let audit = self.audit.clone();
        let by = operator.name.clone();
        // Every revocation request that passed the checks is recorded, also a repeated one.
        // It covers the receipt's descendants too (each then gets its own entry).
        let entry = EntryDraft::new(COMPONENT, EntryKind::ReceiptRevoked)
            .receipt(request.receipt_id.as_str())
            .decision(Decision::Allow)
            .reason(request.reason.as_str())
            .meta("by", by.as_str())
            .meta("cascade", true);
        let tree = self
            .commit_audited(entry, move || {
                revoke_tree_audited(&store, &audit, &request.receipt_id, &request.reason, &by)
            })
            .await?;
        if !tree.already_revoked {
            tracing::info!(receipt_id = %tree.revocation.receipt_id, seq = tree.revocation.seq, by = %operator.name, "revoked receipt");
            // No subscribers is fine: the revocation is durable and replayed on connect.
            let _ = self.revocations.send(tree.revocation.clone());
        }
        // In seq order, after the root's: watchers pass them on in that order.
        for revocation in &tree.cascaded {
            tracing::info!(receipt_id = %revocation.receipt_id, seq = revocation.seq, ancestor = %tree.revocation.receipt_id, "revoked descendant receipt");
            let _ = self.revocations.send(revocation.clone());
        }
        Ok(pb::RevokeReceiptResponse {
            revocation: Some(tree.revocation),
            already_revoked: tree.already_revoked,
            cascaded: tree
                .cascaded
                .into_iter()
                .map(|revocation| revocation.receipt_id)
                .collect(),
        })
    }

    fn watch(&self, after_seq: u64) -> RevocationStream {
        let (tx, rx) = mpsc::channel(64);
        // Subscribe before reading the snapshot so nothing revoked in between is missed;
        // duplicates are dropped by seq.
        let mut live = self.revocations.subscribe();
        let store = self.store.clone();
        let mut shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            let mut last = after_seq;
            let replay = |after: u64| {
                let store = store.clone();
                blocking(move || store.revocations_after(after))
            };
            let snapshot = match replay(last).await {
                Ok(list) => list,
                Err(e) => {
                    let _ = tx.send(Err(Status::from(e))).await;
                    return;
                }
            };
            for revocation in snapshot {
                last = last.max(revocation.seq);
                if tx.send(Ok(revoked_event(revocation))).await.is_err() {
                    return;
                }
            }
            let caught_up = pb::RevocationEvent {
                event: Some(pb::revocation_event::Event::CaughtUp(pb::CaughtUp {
                    last_seq: last,
                })),
            };
            if tx.send(Ok(caught_up)).await.is_err() {
                return;
            }
            loop {
                let pending = tokio::select! {
                    _ = stopped(&mut shutdown) => return,
                    _ = tx.closed() => return,
                    message = live.recv() => match message {
                        // The next one in order: send it as it is.
                        Ok(revocation) if revocation.seq == last + 1 => vec![revocation],
                        // Already sent (it arrived in a replay).
                        Ok(revocation) if revocation.seq <= last => continue,
                        // A gap (concurrent revokes broadcast out of commit order) or a
                        // lagged receiver: the store is the truth, replay from it.
                        Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {
                            match replay(last).await {
                                Ok(list) => list,
                                Err(e) => {
                                    let _ = tx.send(Err(Status::from(e))).await;
                                    return;
                                }
                            }
                        }
                        Err(broadcast::error::RecvError::Closed) => return,
                    },
                };
                for revocation in pending {
                    if revocation.seq <= last {
                        continue;
                    }
                    last = revocation.seq;
                    if tx.send(Ok(revoked_event(revocation))).await.is_err() {
                        return;
                    }
                }
            }
        });
        Box::pin(ReceiverStream::new(rx))
    }

    async fn add_operator(
        &self,
        request: Request<pb::AddOperatorRequest>,
    ) -> Result<pb::AddOperatorResponse, Refusal> {
        let admin = self.admin(request.metadata())?;
        let request = request.into_inner();
        if !valid_operator_name(&request.name) {
            return Err(CallError::invalid(
                "name",
                "must be 1-64 letters, digits, '.', '_', '-' or '@'",
            )
            .into());
        }
        let ceiling = request
            .ceiling
            .ok_or_else(|| CallError::invalid("ceiling", "is required"))?;
        validate_ceiling(&ceiling)?;
        let token = generate_token();
        let hash = token_hash(&token);
        let operator = Operator {
            name: request.name.clone(),
            admin: request.admin,
            ceiling,
            created_at: unix_now(),
            created_by: admin.name.clone(),
        };
        let store = self.store.clone();
        let stored = operator.clone();
        let name = request.name.clone();
        let entry = EntryDraft::new(COMPONENT, EntryKind::OperatorAdded)
            .decision(Decision::Allow)
            .meta("operator", request.name.as_str())
            .meta("admin", request.admin)
            .meta("by", admin.name.as_str());
        self.commit_audited(entry, move || {
            if store.insert_operator(&hash, &stored)? {
                Ok(())
            } else {
                Err(CallError::AlreadyExists(format!(
                    "operator {name:?} already exists"
                )))
            }
        })
        .await?;
        self.operators.insert(hash, operator);
        tracing::info!(operator = %request.name, admin = request.admin, by = %admin.name, "added operator");
        Ok(pb::AddOperatorResponse {
            name: request.name,
            token,
        })
    }

    async fn list_operators(
        &self,
        request: Request<pb::ListOperatorsRequest>,
    ) -> Result<pb::ListOperatorsResponse, CallError> {
        self.admin(request.metadata())?;
        let store = self.store.clone();
        let operators = blocking(move || store.operators())
            .await?
            .into_iter()
            .map(|(_, op)| pb::OperatorInfo {
                name: op.name,
                ceiling: Some(op.ceiling),
                admin: op.admin,
                created_at: Some(timestamp_from_unix(op.created_at)),
                created_by: op.created_by,
            })
            .collect();
        Ok(pb::ListOperatorsResponse { operators })
    }

    async fn rotate(
        &self,
        request: Request<pb::RotateKeyRequest>,
    ) -> Result<pb::RotateKeyResponse, Refusal> {
        let admin = self.admin(request.metadata())?;
        let (store, keys) = (self.store.clone(), self.keys.clone());
        // The new key's id is in the key set (and in every receipt it signs).
        let entry = EntryDraft::new(COMPONENT, EntryKind::KeyRotated)
            .decision(Decision::Allow)
            .meta("by", admin.name.as_str())
            .meta("retiring_key_id", self.keys.active().key_id());
        let (active, retired, records) = self
            .commit_audited(entry, move || {
                let (active, retired) = keys.rotate(&store)?;
                Ok((active, retired, store.keys()?))
            })
            .await?;
        tracing::info!(by = %admin.name, new_key_id = %active, "key rotation requested");
        let find = |id: &str| {
            records
                .iter()
                .find(|k| k.key_id == id)
                .map(|k| k.to_proto())
        };
        Ok(pb::RotateKeyResponse {
            active: find(&active),
            retired: find(&retired),
        })
    }
}

#[tonic::async_trait]
impl Authority for AuthorityService {
    async fn mint_receipt(
        &self,
        request: Request<pb::MintReceiptRequest>,
    ) -> Result<Response<pb::MintReceiptResponse>, Status> {
        Ok(Response::new(self.audited_mint(request).await?))
    }

    async fn get_receipt(
        &self,
        request: Request<pb::GetReceiptRequest>,
    ) -> Result<Response<pb::GetReceiptResponse>, Status> {
        Ok(Response::new(self.get(request).await?))
    }

    async fn list_receipts(
        &self,
        request: Request<pb::ListReceiptsRequest>,
    ) -> Result<Response<pb::ListReceiptsResponse>, Status> {
        Ok(Response::new(self.list(request).await?))
    }

    async fn revoke_receipt(
        &self,
        request: Request<pb::RevokeReceiptRequest>,
    ) -> Result<Response<pb::RevokeReceiptResponse>, Status> {
        Ok(Response::new(self.audited_revoke(request).await?))
    }

    type WatchRevocationsStream = RevocationStream;

    async fn watch_revocations(
        &self,
        request: Request<pb::WatchRevocationsRequest>,
    ) -> Result<Response<Self::WatchRevocationsStream>, Status> {
        Ok(Response::new(self.watch(request.into_inner().after_seq)))
    }

    async fn get_key_set(
        &self,
        _request: Request<pb::GetKeySetRequest>,
    ) -> Result<Response<pb::KeySet>, Status> {
        let store = self.store.clone();
        let issuer = self.config.issuer.clone();
        let set = blocking(move || key_set(&store, &issuer, unix_now())).await?;
        Ok(Response::new(set))
    }

    async fn add_operator(
        &self,
        request: Request<pb::AddOperatorRequest>,
    ) -> Result<Response<pb::AddOperatorResponse>, Status> {
        Ok(Response::new(self.audited_add_operator(request).await?))
    }

    async fn list_operators(
        &self,
        request: Request<pb::ListOperatorsRequest>,
    ) -> Result<Response<pb::ListOperatorsResponse>, Status> {
        Ok(Response::new(
            AuthorityService::list_operators(self, request).await?,
        ))
    }

    async fn rotate_key(
        &self,
        request: Request<pb::RotateKeyRequest>,
    ) -> Result<Response<pb::RotateKeyResponse>, Status> {
        Ok(Response::new(self.audited_rotate(request).await?))
    }

    async fn delegate_receipt(
        &self,
        request: Request<pb::DelegateReceiptRequest>,
    ) -> Result<Response<pb::MintReceiptResponse>, Status> {
        Ok(Response::new(self.audited_delegate(request).await?))
    }

    async fn add_supervisor(
        &self,
        request: Request<pb::AddSupervisorRequest>,
    ) -> Result<Response<pb::AddSupervisorResponse>, Status> {
        Ok(Response::new(self.audited_add_supervisor(request).await?))
    }

    async fn remove_supervisor(
        &self,
        request: Request<pb::RemoveSupervisorRequest>,
    ) -> Result<Response<pb::RemoveSupervisorResponse>, Status> {
        Ok(Response::new(
            self.audited_remove_supervisor(request).await?,
        ))
    }
}
