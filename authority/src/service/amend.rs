//! `AmendReceipt`: a signed widening of one live run (more gateway-only fs grants, a bigger
//! tool-call budget, a later expiry; for its future children too only when asked), for the
//! receipt's owner or an admin, within the caller's
//! ceiling as a mint would be (the whole lifetime, from the receipt's `not_before` to the new
//! expiry, within the ceiling's `max_ttl`). An extension counts from the receipt's expiry, or
//! from now when that has passed (the run lives on by an earlier amendment). Audited
//! (`receipt_amended`) before it is handed out.

use tollgate_audit::{Decision, EntryDraft, EntryKind};
use tollgate_proto::v1 as pb;
use tollgate_receipt::amendment::check_added_grants;
use tollgate_receipt::{timestamp_from_unix, unix_now};
use tonic::Request;

use super::receipts::{check_owner, check_receipt_id};
use super::state::{blocking, AuthorityService, Refusal};
use crate::ceiling::CeilingCheck;
use crate::entries::COMPONENT;
use crate::error::CallError;

/// What a refused `AmendReceipt` asked for, by whom.
pub(super) fn asked_amend(
    request: &pb::AmendReceiptRequest,
    caller: String,
) -> impl FnOnce() -> EntryDraft {
    super::revocation::asked_about_receipt(EntryKind::ReceiptAmended, &request.receipt_id, caller)
}

impl AuthorityService {
    pub(super) async fn amend(
        &self,
        request: Request<pb::AmendReceiptRequest>,
    ) -> Result<pb::AmendReceiptResponse, Refusal> {
        let operator = self.operator(request.metadata())?;
        let request = request.into_inner();
        check_receipt_id(&request.receipt_id)?;
        check_added_grants(&request.add_fs)
            .map_err(|e| CallError::invalid("add_fs", e.to_string()))?;
        if request.add_fs.is_empty()
            && request.add_gateway_exec.is_empty()
            && [
                request.tool_calls,
                request.tokens,
                request.output_bytes,
                request.egress_bytes,
                request.extend_seconds,
            ]
            .iter()
            .all(|n| *n == 0)
        {
            return Err(CallError::invalid(
                "add_fs",
                "an amendment must add something: add_fs, add_gateway_exec, a budget (tool_calls, tokens, output_bytes, egress_bytes) or extend_seconds",
            )
            .into());
        }
        let store = self.store.clone();
        let id = request.receipt_id.clone();
        let stored = blocking(move || store.receipt(&id))
            .await?
            .ok_or_else(|| CallError::NotFound(format!("no receipt {}", request.receipt_id)))?;
        check_owner(&operator, &stored.receipt)?;
        let receipt = stored.receipt;
        tollgate_receipt::amendment::check_amendable(&receipt)
            .map_err(|e| CallError::FailedPrecondition(e.to_string()))?;
        tollgate_receipt::amendment::check_amended_grants(&receipt, &request.add_fs)
            .map_err(|e| CallError::invalid("add_fs", e.to_string()))?;
        tollgate_receipt::amendment::check_added_programs(&receipt, &request.add_gateway_exec)
            .map_err(|e| match e {
                tollgate_receipt::amendment::AmendmentError::NotAWidening { field, reason } => {
                    CallError::invalid(field, reason)
                }
                other => CallError::invalid("add_gateway_exec", other.to_string()),
            })?;
        if stored.revocation.is_some() {
            return Err(CallError::FailedPrecondition(format!(
                "receipt {} is revoked: nothing widens a revoked run",
                receipt.receipt_id
            ))
            .into());
        }
        let now = unix_now();
        // A run may already live past its receipt's expiry (an earlier amendment): an
        // extension counts from now then. Whether the run is still alive is the supervisor's
        // to say when it applies the amendment (it refuses one for a run that has ended).
        let expires_at = receipt
            .expires_at
            .as_ref()
            .map_or(0, |t| t.seconds)
            .max(now);
        let limits = receipt.limits.unwrap_or_default();
        for (field, asked, budget) in [
            ("tool_calls", request.tool_calls, limits.tool_calls),
            ("tokens", request.tokens, limits.tokens),
            ("output_bytes", request.output_bytes, limits.output_bytes),
            (
                "egress_bytes",
                request.egress_bytes,
                tollgate_proto::effective_egress(&limits).1,
            ),
        ] {
            if asked != 0 && asked <= budget {
                return Err(CallError::invalid(
                    field,
                    format!("must be above the receipt's {budget}: lowering needs no signature (Supervisor.AmendRun narrow)"),
                )
                .into());
            }
        }
        let not_before = receipt.not_before.as_ref().map_or(now, |t| t.seconds);
        let extended =
            expires_at.saturating_add(i64::try_from(request.extend_seconds).unwrap_or(i64::MAX));
        // The run as widened must still be one the caller could have minted: its grants, its
        // budget and its whole lifetime within the ceiling.
        let policy = self.mint_policy();
        let check = CeilingCheck {
            operator: &operator.name,
            ceiling: &operator.ceiling,
            defaults: &policy.default_limits,
        };
        let shape = pb::MintReceiptRequest {
            subject: receipt.subject.clone(),
            ttl_seconds: u64::try_from(extended - not_before).unwrap_or(u64::MAX),
            audience: receipt.audience.clone(),
            fs: request.add_fs.clone(),
            gateway_exec: request.add_gateway_exec.clone(),
            limits: Some(pb::Limits {
                tool_calls: request.tool_calls,
                tokens: request.tokens,
                output_bytes: request.output_bytes,
                egress_bytes: request.egress_bytes,
                ..Default::default()
            }),
            ..Default::default()
        };
        if let Some(first) = check.violations(&shape, now).into_iter().next() {
            return Err(CallError::PermissionDenied(format!(
                "above operator {:?}'s ceiling: {first}",
                operator.name
            ))
            .into());
        }
        let mut amendment = pb::Amendment {
            amendment_id: uuid::Uuid::now_v7().hyphenated().to_string(),
            receipt_id: receipt.receipt_id.clone(),
            issuer: self.config.issuer.clone(),
            key_id: String::new(), // set by the signer
            owner: receipt.owner.clone(),
            issued_at: Some(timestamp_from_unix(now)),
            add_fs: request.add_fs,
            tool_calls: request.tool_calls,
            expires_at: (request.extend_seconds > 0).then(|| timestamp_from_unix(extended)),
            amended_by: operator.name.clone(),
            for_children: request.for_children,
            tokens: request.tokens,
            output_bytes: request.output_bytes,
            egress_bytes: request.egress_bytes,
            add_gateway_exec: request.add_gateway_exec,
        };
        let signed = self.keys.active().sign_amendment(&mut amendment);
        let entry = EntryDraft::new(COMPONENT, EntryKind::ReceiptAmended)
            .receipt(receipt.receipt_id.as_str())
            .decision(Decision::Allow)
            .meta("by", operator.name.as_str())
            .meta("amendment_id", amendment.amendment_id.as_str())
            .meta(
                "add_fs",
                amendment
                    .add_fs
                    .iter()
                    .map(|g| g.path.clone())
                    .collect::<Vec<_>>(),
            )
            .meta(
                "tool_calls",
                i64::try_from(amendment.tool_calls).unwrap_or(i64::MAX),
            )
            .meta(
                "expires_at",
                amendment.expires_at.as_ref().map_or(0, |t| t.seconds),
            )
            .meta("for_children", amendment.for_children)
            .meta(
                "add_gateway_exec",
                amendment
                    .add_gateway_exec
                    .iter()
                    .map(|g| g.program.clone())
                    .collect::<Vec<_>>(),
            )
            .meta(
                "tokens",
                i64::try_from(amendment.tokens).unwrap_or(i64::MAX),
            )
            .meta(
                "output_bytes",
                i64::try_from(amendment.output_bytes).unwrap_or(i64::MAX),
            )
            .meta(
                "egress_bytes",
                i64::try_from(amendment.egress_bytes).unwrap_or(i64::MAX),
            );
        // On disk before the signed amendment leaves the authority.
        self.commit_audited(entry, || Ok(())).await?;
        tracing::info!(receipt_id = %amendment.receipt_id, amendment_id = %amendment.amendment_id, by = %operator.name, "amended receipt");
        Ok(pb::AmendReceiptResponse {
            signed: Some(signed),
            amendment: Some(amendment),
        })
    }
}
