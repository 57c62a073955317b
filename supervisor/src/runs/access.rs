//! The audit of operators' calls about runs: who asked, for what, on which run, and whether
//! the run was theirs to touch.

use tollgate_audit::{Decision, EntryDraft, EntryKind};

use super::workspace::valid_id;
use super::RunManager;
use crate::COMPONENT;

/// One operator's call about a run (or about all of its runs: `ListRuns`).
#[derive(Debug, Clone, Copy)]
pub struct OperatorCall<'a> {
    /// The operator's name.
    pub operator: &'a str,
    /// Whether the authority made it an admin.
    pub admin: bool,
    /// The API method (`StopRun`, …).
    pub method: &'a str,
    /// The run it was about, if one.
    pub run_id: Option<&'a str>,
}

impl RunManager {
    /// Audits `call`: allowed, or refused with why (another operator's run).
    pub fn audit_operator_call(&self, call: OperatorCall<'_>, refused: Option<&str>) {
        let mut draft = EntryDraft::new(COMPONENT, EntryKind::OperatorCall)
            .meta("operator", call.operator)
            .meta("admin", call.admin)
            .meta("method", call.method);
        if let Some(run_id) = call.run_id.filter(|id| valid_id(id)) {
            draft = draft.run(run_id).receipt(run_id);
        }
        draft = match refused {
            None => draft.decision(Decision::Allow),
            Some(reason) => draft.decision(Decision::Deny).reason(reason),
        };
        if let Err(e) = self.audit.append(draft) {
            tracing::error!(operator = call.operator, method = call.method, error = %e, "could not audit an operator's call");
        }
    }
}
