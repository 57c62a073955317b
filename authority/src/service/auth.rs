//! Who is calling: an operator (by bearer token), an admin, or an enrolled supervisor (by its
//! delegation token).

use std::sync::Arc;

use tollgate_daemon::token::bearer;
use tonic::metadata::MetadataMap;

use super::state::AuthorityService;
use crate::error::CallError;
use crate::store::{Operator, Supervisor};

impl AuthorityService {
    /// Who is calling, if its token is valid (for auditing refused calls): an operator's
    /// name, or `supervisor:<id>` for a delegation token.
    pub(super) fn caller(&self, request_metadata: &MetadataMap) -> String {
        let Ok(token) = bearer(request_metadata) else {
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
    pub(super) fn operator(&self, metadata: &MetadataMap) -> Result<Arc<Operator>, CallError> {
        let token = bearer(metadata)?;
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
    pub(super) fn admin(&self, metadata: &MetadataMap) -> Result<Arc<Operator>, CallError> {
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
    pub(super) fn supervisor(&self, metadata: &MetadataMap) -> Result<Arc<Supervisor>, CallError> {
        let token = bearer(metadata)?;
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
}
