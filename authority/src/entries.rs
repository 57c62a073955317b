//! The audit entries the authority writes about its calls: a refusal, a change that did not
//! take effect, a minted receipt. A leaf, so the minting thread and the service share them.

use tollgate_audit::{Decision, EntryDraft, EntryKind};
use tollgate_proto::v1 as pb;
use tollgate_receipt::spec::access_name;

use crate::error::CallError;

/// This component's name in audit entries.
pub const COMPONENT: &str = "authority";

/// Longest client-given field copied into an audit entry.
pub(crate) const MAX_FIELD: usize = 256;
/// Longest reason copied into an audit entry.
pub(crate) const MAX_REASON: usize = 1024;

/// At most `max` bytes of `text` (on a character boundary), marked when cut: audit entries
/// never carry unbounded client input.
pub(crate) fn clip(text: &str, max: usize) -> String {
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
pub(crate) fn minted_entry(receipt: &pb::Receipt, delegated_by: Option<&str>) -> EntryDraft {
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
                .map(|g| {
                    // A write grant with exec lifts W^X: the audit says so.
                    let exec = if g.is_writable_executable() {
                        ":exec"
                    } else {
                        ""
                    };
                    format!("{}:{}{exec}", g.path, access_name(g.access))
                })
                .collect::<Vec<_>>(),
        )
        .meta("workspace_exec", receipt.workspace_exec)
        .meta("home", receipt.home.as_str())
        .meta(
            "routes",
            receipt
                .routes
                .iter()
                .map(|r| r.name.clone())
                .collect::<Vec<_>>(),
        )
}

/// The gRPC code name of a failed call, for audit entries.
fn code_name(error: &CallError) -> &'static str {
    match error {
        CallError::Unauthenticated(_) => "unauthenticated",
        CallError::PermissionDenied(_) => "permission_denied",
        CallError::InvalidArgument { .. } => "invalid_argument",
        CallError::NotFound(_) => "not_found",
        CallError::FailedPrecondition(_) => "failed_precondition",
        CallError::AlreadyExists(_) => "already_exists",
        CallError::Internal(_) => "internal",
    }
}
