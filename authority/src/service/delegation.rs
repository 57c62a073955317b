//! Delegation: enrolling and removing supervisors, and minting a child receipt within its
//! parent for an enrolled supervisor.

use prost::Message as _;
use tollgate_audit::{Decision, EntryDraft, EntryKind, MetaValue};
use tollgate_daemon::token;
use tollgate_proto::v1 as pb;
use tollgate_receipt::amendment::{verify_amendment, widened_for_children, MAX_CHILD_AMENDMENTS};
use tollgate_receipt::delegation::check_within;
use tollgate_receipt::KeySet;
use tollgate_receipt::{timestamp_from_unix, to_text, unix_now};
use tonic::Request;

use super::receipts::check_receipt_id;
use super::state::{blocking, AuthorityService, Refusal};
use crate::ceiling::{normalised_egress, validate_mint};
use crate::entries::{clip, minted_entry, COMPONENT, MAX_FIELD};
use crate::error::CallError;
use crate::operators::valid_supervisor_id;
use crate::store::Supervisor;

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
        egress_connections: pick32(child.egress_connections, parent.egress_connections),
        egress_bytes: pick(child.egress_bytes, parent.egress_bytes),
        egress_idle_seconds: pick32(child.egress_idle_seconds, parent.egress_idle_seconds),
    }
}

/// RFC 3339 (UTC, seconds) of Unix seconds, for messages.
fn rfc3339(seconds: i64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(seconds.max(0).unsigned_abs());
    humantime::format_rfc3339_seconds(at).to_string()
}

/// A parent may have children now only while it is valid, is for this supervisor and allows
/// delegation.
fn check_parent_may_delegate(
    parent: &pb::Receipt,
    supervisor_id: &str,
    now: i64,
) -> Result<(), CallError> {
    let parent_id = parent.receipt_id.as_str();
    let parent_expiry = parent.expires_at.as_ref().map_or(0, |t| t.seconds);
    if parent_expiry <= now {
        return Err(CallError::PermissionDenied(format!(
            "parent receipt {parent_id} expired at {}",
            rfc3339(parent_expiry)
        )));
    }
    // A child starts now: a parent not valid yet would give a child valid before it.
    let parent_start = parent.not_before.as_ref().map_or(0, |t| t.seconds);
    if parent_start > now {
        return Err(CallError::PermissionDenied(format!(
            "parent receipt {parent_id} is not valid until {}",
            rfc3339(parent_start)
        )));
    }
    if !parent.audience.iter().any(|id| id == supervisor_id) {
        return Err(CallError::PermissionDenied(format!(
            "parent receipt {parent_id} is not for supervisor {:?}",
            supervisor_id
        )));
    }
    if parent.delegate.as_ref().map_or(0, |d| d.max_depth) == 0 {
        return Err(CallError::PermissionDenied(format!(
            "parent receipt {parent_id} may not delegate (delegate.max_depth = 0)"
        )));
    }
    Ok(())
}

/// What a refused `DelegateReceipt` asked for, by whom.
pub(super) fn asked_delegate(
    request: &pb::DelegateReceiptRequest,
    caller: String,
) -> impl FnOnce() -> EntryDraft {
    let subject = clip(
        request.child.as_ref().map_or("", |c| c.subject.as_str()),
        MAX_FIELD,
    );
    // What the envelope claims, for the record; only a well-formed id goes in.
    let parent_id = request
        .parent
        .as_ref()
        .and_then(|p| pb::Receipt::decode(p.receipt.as_slice()).ok())
        .map(|r| r.receipt_id)
        .filter(|id| check_receipt_id(id).is_ok());
    || {
        EntryDraft::new(COMPONENT, EntryKind::ReceiptRefused)
            .meta("operator", caller)
            .meta("subject", subject)
            .meta(
                "parent_receipt_id",
                parent_id.map_or(MetaValue::Null, MetaValue::from),
            )
    }
}

/// What a refused `AddSupervisor` asked for, by whom.
pub(super) fn asked_add_supervisor(
    request: &pb::AddSupervisorRequest,
    caller: String,
) -> impl FnOnce() -> EntryDraft {
    let supervisor_id = clip(&request.supervisor_id, 64);
    || {
        EntryDraft::new(COMPONENT, EntryKind::SupervisorEnrolled)
            .meta("supervisor_id", supervisor_id)
            .meta("by", caller)
    }
}

/// What a refused `RemoveSupervisor` asked for, by whom.
pub(super) fn asked_remove_supervisor(
    request: &pb::RemoveSupervisorRequest,
    caller: String,
) -> impl FnOnce() -> EntryDraft {
    let supervisor_id = clip(&request.supervisor_id, 64);
    || {
        EntryDraft::new(COMPONENT, EntryKind::SupervisorRemoved)
            .meta("supervisor_id", supervisor_id)
            .meta("by", caller)
    }
}

impl AuthorityService {
    /// `DelegateReceipt`: the checks of docs/plans/delegation.md §4, in that order (token,
    /// parent, resolution, shape, `check_within`), then sign and commit like a mint.
    pub(super) async fn delegate(
        &self,
        request: Request<pb::DelegateReceiptRequest>,
    ) -> Result<pb::MintReceiptResponse, Refusal> {
        // Only the supervisor its certificate names (when it presents one) delegates as it.
        tollgate_daemon::tls::check_supervisor_claim(&request, &request.get_ref().supervisor_id)
            .map_err(CallError::PermissionDenied)?;
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
        let parent = self.minted_parent(envelope).await?;
        let now = unix_now();
        // The parent as its amendments for children widen it: what the child is checked
        // against. Without them, the receipt as signed.
        let amendments = self
            .amendments_for_children(&parent, &request.amendments, now)
            .await?;
        let parent = widened_for_children(&parent, &amendments);
        check_parent_may_delegate(&parent, &supervisor.supervisor_id, now)?;
        let mut receipt = self.child_receipt(&parent, spec, &supervisor.supervisor_id, now)?;
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

    /// The parent's amendments for children that `signed` carries, each verified with this
    /// authority's keys and bound to `parent`; any other is refused, naming it.
    async fn amendments_for_children(
        &self,
        parent: &pb::Receipt,
        signed: &[pb::SignedAmendment],
        now: i64,
    ) -> Result<Vec<pb::Amendment>, Refusal> {
        if signed.is_empty() {
            return Ok(Vec::new());
        }
        if signed.len() > MAX_CHILD_AMENDMENTS {
            return Err(CallError::invalid(
                "amendments",
                format!("at most {MAX_CHILD_AMENDMENTS} amendments for children"),
            )
            .into());
        }
        let store = self.store.clone();
        let issuer = self.config.issuer.clone();
        let set = blocking(move || crate::keys::key_set(&store, &issuer, now)).await?;
        let keys = KeySet::from_proto(&set).map_err(|e| CallError::Internal(e.into()))?;
        signed
            .iter()
            .enumerate()
            .map(|(i, signed)| {
                let amendment = verify_amendment(&keys, signed).map_err(|e| {
                    CallError::PermissionDenied(format!("amendments[{i}]: {e}"))
                })?;
                if amendment.receipt_id != parent.receipt_id || !amendment.for_children {
                    return Err(CallError::PermissionDenied(format!(
                        "amendments[{i}]: amendment {} is not one of parent receipt {} for its children",
                        amendment.amendment_id, parent.receipt_id
                    ))
                    .into());
                }
                Ok(amendment)
            })
            .collect()
    }

    /// The parent receipt the envelope carries, if this authority minted it byte for byte
    /// and has not revoked it.
    async fn minted_parent(&self, envelope: pb::SignedReceipt) -> Result<pb::Receipt, Refusal> {
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
        if stored.revocation.is_some() {
            return Err(CallError::PermissionDenied(format!(
                "parent receipt {} is revoked",
                stored.receipt.receipt_id
            ))
            .into());
        }
        Ok(stored.receipt)
    }

    /// The child of `parent` that `spec` asks for, resolved (it starts now, ends by the
    /// parent's end, and takes the parent's value for every limit left at 0), checked like a
    /// mint's request and within its parent; not yet signed.
    fn child_receipt(
        &self,
        parent: &pb::Receipt,
        spec: pb::ChildSpec,
        supervisor_id: &str,
        now: i64,
    ) -> Result<pb::Receipt, CallError> {
        let parent_id = parent.receipt_id.as_str();
        let parent_expiry = parent.expires_at.as_ref().map_or(0, |t| t.seconds);
        // Resolve: the child starts now, ends by the parent's end, and takes the parent's
        // value for every limit left at 0.
        let remaining = u64::try_from(parent_expiry - now).unwrap_or(0);
        let ttl = match spec.ttl_seconds {
            0 => remaining,
            ttl if ttl > remaining => {
                return Err(CallError::PermissionDenied(format!(
                    "ttl_seconds = {ttl} is longer than parent receipt {parent_id}'s remaining {remaining} s"
                )));
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
            audience: vec![supervisor_id.to_owned()],
            agent: spec.agent,
            limits: Some(limits),
            fs: spec.fs,
            exec: spec.exec,
            routes: spec.routes,
            delegate: spec.delegate,
            not_before: None,
            rootfs: parent.rootfs.clone(),
            // A child's workspace goes with it; its parent copies out what it needs.
            workspace_keep_seconds: 0,
            egress: spec.egress,
            // A child waits for approval as long as its parent does.
            approval_timeout_seconds: parent.approval_timeout_seconds,
            gateway_exec: spec.gateway_exec,
            // A child's /work is its own and not executable, and it has no home: neither is
            // in a ChildSpec.
            workspace_exec: false,
            home: String::new(),
        };
        // The mount, exec and argv rules of a mint apply unchanged; errors name the field.
        validate_mint(&shape)?;
        let egress = normalised_egress(&shape.egress, "", false)?;
        // Bounded by the parent's expiry, so this cannot overflow.
        let expires_at = now.saturating_add(i64::try_from(ttl).unwrap_or(i64::MAX));
        let receipt = pb::Receipt {
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
            // A child runs on its parent's userland.
            rootfs: parent.rootfs.clone(),
            workspace_keep_seconds: 0,
            workspace_exec: false,
            home: String::new(),
            egress,
            approval_timeout_seconds: super::receipts::approval_timeout(
                shape.approval_timeout_seconds,
                ttl,
            ),
            gateway_exec: shape.gateway_exec,
        };
        // Ceilings are not re-checked: child within parent within ceiling, and ceilings never
        // change.
        check_within(parent, &receipt)
            .map_err(|wider| CallError::PermissionDenied(wider.to_string()))?;
        Ok(receipt)
    }

    pub(super) async fn add_supervisor(
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
        let token = token::generate();
        let hash = token::hash(token.expose());
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
            token: token.expose().to_owned(),
        })
    }

    pub(super) async fn remove_supervisor(
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
}
