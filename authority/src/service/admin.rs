//! Operators and signing keys: adding and listing operators, rotating the key.

use tollgate_audit::{Decision, EntryDraft, EntryKind};
use tollgate_daemon::token;
use tollgate_proto::v1 as pb;
use tollgate_receipt::{timestamp_from_unix, unix_now};
use tonic::Request;

use super::state::{blocking, AuthorityService, Refusal};
use crate::ceiling::{normalised_egress, validate_ceiling};
use crate::entries::{clip, COMPONENT};
use crate::error::CallError;
use crate::operators::valid_operator_name;
use crate::store::Operator;

/// What a refused `AddOperator` asked for, by whom.
pub(super) fn asked_add_operator(
    request: &pb::AddOperatorRequest,
    caller: String,
) -> impl FnOnce() -> EntryDraft {
    let name = clip(&request.name, 64);
    let admin = request.admin;
    move || {
        EntryDraft::new(COMPONENT, EntryKind::OperatorAdded)
            .meta("operator", name)
            .meta("admin", admin)
            .meta("by", caller)
    }
}

/// What a refused `RotateKey` asked for, by whom.
pub(super) fn asked_rotate(
    _request: &pb::RotateKeyRequest,
    caller: String,
) -> impl FnOnce() -> EntryDraft {
    || EntryDraft::new(COMPONENT, EntryKind::KeyRotated).meta("by", caller)
}

impl AuthorityService {
    pub(super) async fn add_operator(
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
        let mut ceiling = request
            .ceiling
            .ok_or_else(|| CallError::invalid("ceiling", "is required"))?;
        validate_ceiling(&ceiling)?;
        ceiling.egress = normalised_egress(&ceiling.egress, "ceiling.", true)?;
        let token = token::generate();
        let hash = token::hash(token.expose());
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
            token: token.expose().to_owned(),
        })
    }

    /// The calling operator, as [`pb::OperatorInfo`].
    pub(super) fn who_am_i(
        &self,
        request: &Request<pb::WhoAmIRequest>,
    ) -> Result<pb::OperatorInfo, CallError> {
        let operator = self.operator(request.metadata())?;
        Ok(operator_info(operator.as_ref().clone()))
    }

    pub(super) async fn list_operators(
        &self,
        request: Request<pb::ListOperatorsRequest>,
    ) -> Result<pb::ListOperatorsResponse, CallError> {
        self.admin(request.metadata())?;
        let store = self.store.clone();
        let operators = blocking(move || store.operators())
            .await?
            .into_iter()
            .map(|(_, op)| operator_info(op))
            .collect();
        Ok(pb::ListOperatorsResponse { operators })
    }

    pub(super) async fn rotate(
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
        // Every following supervisor hears of the new key now, not at its next reconnect.
        self.key_set_version.send_modify(|version| *version += 1);
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

/// An operator as the API shows it (never its token).
fn operator_info(op: Operator) -> pb::OperatorInfo {
    pb::OperatorInfo {
        name: op.name,
        ceiling: Some(op.ceiling),
        admin: op.admin,
        created_at: Some(timestamp_from_unix(op.created_at)),
        created_by: op.created_by,
    }
}
