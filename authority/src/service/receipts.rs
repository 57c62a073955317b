//! Minting, reading and listing receipts.

use tollgate_audit::{EntryDraft, EntryKind};
use tollgate_proto::v1 as pb;
use tollgate_receipt::{timestamp_from_unix, to_text, unix_now};
use tonic::Request;

use super::state::{blocking, AuthorityService, Refusal};
use crate::ceiling::{normalised_egress, validate_mint, CeilingCheck};
use crate::entries::{clip, minted_entry, COMPONENT, MAX_FIELD};
use crate::error::CallError;
use crate::store::{Operator, ReceiptFilter};

/// Most receipts one ListReceipts page may hold.
pub const MAX_PAGE: u32 = 1000;

pub(super) fn check_receipt_id(receipt_id: &str) -> Result<(), CallError> {
    match uuid::Uuid::try_parse(receipt_id) {
        Ok(id) if id.hyphenated().to_string() == receipt_id => Ok(()),
        _ => Err(CallError::invalid(
            "receipt_id",
            format!("{receipt_id:?} is not a receipt id (a lowercase hyphenated UUID)"),
        )),
    }
}

pub(super) fn check_owner(operator: &Operator, receipt: &pb::Receipt) -> Result<(), CallError> {
    if operator.admin || operator.name == receipt.owner {
        Ok(())
    } else {
        Err(CallError::PermissionDenied(format!(
            "receipt {} belongs to operator {:?}, not {:?}",
            receipt.receipt_id, receipt.owner, operator.name
        )))
    }
}

/// What a refused `MintReceipt` asked for, by whom.
pub(super) fn asked_mint(
    request: &pb::MintReceiptRequest,
    caller: String,
) -> impl FnOnce() -> EntryDraft {
    let subject = clip(&request.subject, MAX_FIELD);
    || {
        EntryDraft::new(COMPONENT, EntryKind::ReceiptRefused)
            .meta("operator", caller)
            .meta("subject", subject)
    }
}

impl AuthorityService {
    pub(super) async fn mint(
        &self,
        request: Request<pb::MintReceiptRequest>,
    ) -> Result<pb::MintReceiptResponse, Refusal> {
        let operator = self.operator(request.metadata())?;
        let mut request = request.into_inner();
        validate_mint(&request)?;
        request.egress = normalised_egress(&request.egress, "", false)?;
        let policy = self.mint_policy();
        let check = CeilingCheck {
            operator: &operator.name,
            ceiling: &operator.ceiling,
            defaults: &policy.default_limits,
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
            policy_version: policy.policy_version.clone(),
            parent_receipt_id: String::new(),
            depth: 0,
            agent: request.agent,
            limits: Some(limits),
            fs: request.fs,
            exec: request.exec,
            routes: request.routes,
            network: pb::NetworkAccess::LoopbackOnly as i32,
            delegate: request.delegate,
            rootfs: request.rootfs,
            workspace_keep_seconds: request.workspace_keep_seconds,
            egress: request.egress,
            approval_timeout_seconds: approval_timeout(
                request.approval_timeout_seconds,
                request.ttl_seconds,
            ),
            gateway_exec: request.gateway_exec,
            workspace_exec: request.workspace_exec,
            home: request.home,
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

    /// `CheckMint`: everything a mint would be refused for by the caller's ceiling, at once;
    /// nothing is minted, stored or audited.
    pub(super) fn check_mint(
        &self,
        request: &Request<pb::MintReceiptRequest>,
    ) -> Result<pb::CheckMintResponse, CallError> {
        let operator = self.operator(request.metadata())?;
        let request = request.get_ref();
        validate_mint(request)?;
        let policy = self.mint_policy();
        let check = CeilingCheck {
            operator: &operator.name,
            ceiling: &operator.ceiling,
            defaults: &policy.default_limits,
        };
        let violations = check.violations(request, unix_now());
        let limits = if violations.is_empty() {
            Some(check.resolve_limits(request.limits.as_ref())?)
        } else {
            None
        };
        Ok(pb::CheckMintResponse { violations, limits })
    }

    pub(super) async fn get(
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

    pub(super) async fn list(
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
}

/// How long a call of the receipt waits for approval: the request's (0: the default), never
/// longer than the receipt lives.
pub(super) fn approval_timeout(requested: u64, ttl_seconds: u64) -> u64 {
    let timeout = match requested {
        0 => tollgate_receipt::spec::DEFAULT_APPROVAL_TIMEOUT.as_secs(),
        requested => requested,
    };
    timeout.min(ttl_seconds)
}
