//! What an entry records ([`EntryKind`]) and the decision it carries ([`Decision`]).

use std::fmt;

use serde::de::{self, Deserializer};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};

// One line per kind: the variant and the name written in the log. Adding a kind is adding a line.
macro_rules! entry_kinds {
    ($($(#[doc = $doc:literal])+ $variant:ident => $name:literal,)+) => {
        /// What an entry records. Written as its snake_case name.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum EntryKind {
            $($(#[doc = $doc])+ $variant,)+
        }

        impl EntryKind {
            /// Every kind, in declaration order.
            pub const ALL: &'static [EntryKind] = &[$(EntryKind::$variant,)+];

            /// The name written in the log.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(EntryKind::$variant => $name,)+
                }
            }

            /// The kind written as `name`, if this build knows it.
            pub fn from_name(name: &str) -> Option<Self> {
                match name {
                    $($name => Some(EntryKind::$variant),)+
                    _ => None,
                }
            }
        }
    };
}

entry_kinds! {
    /// The authority minted a receipt.
    ReceiptMinted => "receipt_minted",
    /// The authority revoked a receipt.
    ReceiptRevoked => "receipt_revoked",
    /// The authority refused to mint a receipt.
    ReceiptRefused => "receipt_refused",
    /// The supervisor accepted a receipt and is starting its run.
    RunAdmitted => "run_admitted",
    /// The supervisor refused to start a run.
    RunRefused => "run_refused",
    /// A sandbox was built.
    SandboxCreated => "sandbox_created",
    /// A clean stop with live restore left a run running detached for the next supervisor.
    RunDetached => "run_detached",
    /// A supervisor took over a run a previous one left running detached.
    RunReattached => "run_reattached",
    /// A gateway tool call was decided.
    ToolCall => "tool_call",
    /// A model route was chosen or refused.
    RouteDecision => "route_decision",
    /// A run hit one of its limits.
    LimitHit => "limit_hit",
    /// A run was torn down.
    Teardown => "teardown",
    /// A component started.
    ComponentStarted => "component_started",
    /// A component stopped cleanly.
    ComponentStopped => "component_stopped",
    /// A component recovered from a crash (swept leftovers, reconciled state).
    ComponentRecovered => "component_recovered",
    /// The audit log itself recovered a torn final line when it was opened.
    LogRecovered => "log_recovered",
    /// An operator was added.
    OperatorAdded => "operator_added",
    /// A signing key was rotated.
    KeyRotated => "key_rotated",
    /// A supervisor was enrolled for delegation (given a delegation token).
    SupervisorEnrolled => "supervisor_enrolled",
    /// An enrolled supervisor was removed (its delegation token revoked).
    SupervisorRemoved => "supervisor_removed",
    /// Files were copied out of a run's workspace (`tollgate cp`), or a kept workspace was
    /// removed.
    WorkspaceAccess => "workspace_access",
    /// The authority signed an amendment widening a live run (or refused to).
    ReceiptAmended => "receipt_amended",
    /// A supervisor changed a live run's powers: narrowed, or widened by a signed amendment.
    RunAmended => "run_amended",
    /// A gateway call under a grant that asks began to wait for an operator's approval
    /// (tool, path, sizes, deadline; never data).
    ApprovalPending => "approval_pending",
    /// A wait for approval ended: approved or denied (by whom, why), timed out, cancelled by
    /// the agent, or its run ended.
    ApprovalDecided => "approval_decided",
    /// An operator's call to a supervisor about a run (list, get, watch, attach, copy, stop,
    /// start), allowed or refused by who owns the run.
    OperatorCall => "operator_call",
    /// An outbound connection of a run (egress) was decided (`phase` `open`) or ended
    /// (`phase` `closed`).
    Egress => "egress",
}

impl fmt::Display for EntryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for EntryKind {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for EntryKind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        EntryKind::from_name(&name).ok_or_else(|| {
            de::Error::custom(format!(
                "unknown entry kind {name:?} (written by a newer Tollgate? upgrade the verifier)"
            ))
        })
    }
}

/// The outcome of a decision an entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    /// Allowed.
    Allow,
    /// Denied.
    Deny,
}

impl Decision {
    /// `"allow"` or `"deny"`, as in the log.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Deny => "deny",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_by_name() {
        for kind in EntryKind::ALL {
            assert_eq!(EntryKind::from_name(kind.as_str()), Some(*kind));
            let json = serde_json::to_string(kind).unwrap();
            assert_eq!(serde_json::from_str::<EntryKind>(&json).unwrap(), *kind);
        }
        assert!(serde_json::from_str::<EntryKind>("\"made_up\"").is_err());
    }
}
