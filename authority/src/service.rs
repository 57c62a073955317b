//! The `tollgate.v1.Authority` gRPC service, one module per concern: receipts (mint, get,
//! list), revocation (revoke, the stream), delegation (supervisors and child receipts) and
//! admin (operators, key rotation), over shared state and auditing (`state`) and caller
//! authentication (`auth`). This module only maps each RPC onto them.

mod admin;
mod amend;
mod auth;
mod delegation;
mod receipts;
mod revocation;
mod state;

use tollgate_daemon::tls::{
    check_supervisor_claim, peer_certificate, FleetIdentity, PeerCertificate,
};
use tollgate_proto::v1 as pb;
use tollgate_proto::v1::authority_server::Authority;
use tollgate_receipt::unix_now;
use tonic::{Request, Response, Status};

pub use self::receipts::MAX_PAGE;
pub use self::state::AuthorityService;

use self::revocation::RevocationStream;
use self::state::blocking;
use crate::keys::key_set;

#[tonic::async_trait]
impl Authority for AuthorityService {
    async fn mint_receipt(
        &self,
        request: Request<pb::MintReceiptRequest>,
    ) -> Result<Response<pb::MintReceiptResponse>, Status> {
        let started = std::time::Instant::now();
        let minted = self
            .audited(request, receipts::asked_mint, |r| self.mint(r))
            .await
            .map_err(Status::from);
        let result = match &minted {
            Ok(_) => "ok".to_owned(),
            Err(status) => crate::metrics::code_label(status.code()),
        };
        crate::metrics::get().mint(&result, started.elapsed());
        Ok(Response::new(minted?))
    }

    async fn check_mint(
        &self,
        request: Request<pb::MintReceiptRequest>,
    ) -> Result<Response<pb::CheckMintResponse>, Status> {
        Ok(Response::new(self.check_mint(&request)?))
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
        let response = self
            .audited(request, revocation::asked_revoke, |r| self.revoke(r))
            .await?;
        if !response.already_revoked {
            crate::metrics::get()
                .revocations
                .inc_by(1 + response.cascaded.len() as u64);
        }
        Ok(Response::new(response))
    }

    async fn amend_receipt(
        &self,
        request: Request<pb::AmendReceiptRequest>,
    ) -> Result<Response<pb::AmendReceiptResponse>, Status> {
        let response = self
            .audited(request, amend::asked_amend, |r| self.amend(r))
            .await?;
        Ok(Response::new(response))
    }

    type WatchRevocationsStream = RevocationStream;

    async fn watch_revocations(
        &self,
        request: Request<pb::WatchRevocationsRequest>,
    ) -> Result<Response<Self::WatchRevocationsStream>, Status> {
        // A supervisor's certificate is its identity: a caller presenting one, or saying it
        // is a supervisor, must be exactly the supervisor its certificate names.
        let claimed = &request.get_ref().supervisor_id;
        let presents_supervisor = matches!(
            peer_certificate(&request),
            PeerCertificate::Names(FleetIdentity::Supervisor(_))
        );
        if presents_supervisor || !claimed.is_empty() {
            if let Err(why) = check_supervisor_claim(&request, claimed) {
                tracing::warn!(claimed = %claimed, reason = %why, "revocation stream refused");
                return Err(Status::permission_denied(why));
            }
        }
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
        let response = self
            .audited(request, admin::asked_add_operator, |r| {
                AuthorityService::add_operator(self, r)
            })
            .await?;
        Ok(Response::new(response))
    }

    async fn list_operators(
        &self,
        request: Request<pb::ListOperatorsRequest>,
    ) -> Result<Response<pb::ListOperatorsResponse>, Status> {
        Ok(Response::new(
            AuthorityService::list_operators(self, request).await?,
        ))
    }

    async fn who_am_i(
        &self,
        request: Request<pb::WhoAmIRequest>,
    ) -> Result<Response<pb::OperatorInfo>, Status> {
        Ok(Response::new(AuthorityService::who_am_i(self, &request)?))
    }

    async fn rotate_key(
        &self,
        request: Request<pb::RotateKeyRequest>,
    ) -> Result<Response<pb::RotateKeyResponse>, Status> {
        let response = self
            .audited(request, admin::asked_rotate, |r| self.rotate(r))
            .await?;
        crate::metrics::get().key_rotations.inc();
        Ok(Response::new(response))
    }

    async fn delegate_receipt(
        &self,
        request: Request<pb::DelegateReceiptRequest>,
    ) -> Result<Response<pb::MintReceiptResponse>, Status> {
        let response = self
            .audited(request, delegation::asked_delegate, |r| self.delegate(r))
            .await?;
        Ok(Response::new(response))
    }

    async fn add_supervisor(
        &self,
        request: Request<pb::AddSupervisorRequest>,
    ) -> Result<Response<pb::AddSupervisorResponse>, Status> {
        let response = self
            .audited(request, delegation::asked_add_supervisor, |r| {
                AuthorityService::add_supervisor(self, r)
            })
            .await?;
        Ok(Response::new(response))
    }

    async fn remove_supervisor(
        &self,
        request: Request<pb::RemoveSupervisorRequest>,
    ) -> Result<Response<pb::RemoveSupervisorResponse>, Status> {
        let response = self
            .audited(request, delegation::asked_remove_supervisor, |r| {
                AuthorityService::remove_supervisor(self, r)
            })
            .await?;
        Ok(Response::new(response))
    }
}
