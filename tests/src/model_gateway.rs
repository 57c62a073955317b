//! One run's gateway served in this process for model-call tests: routes from a routes file
//! text, the run's route grants and token budget, an audit log of its own, and a client on
//! the run's socket. The tests that drive `Complete`, `CountTokens` and `ListModels` against
//! fake backends share it.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use tollgate_audit::{AuditConfig, AuditLog};
use tollgate_proto::v1 as pb;
use tollgate_router_backends::ModelRoutes;
use tollgate_supervisor::approvals::ApprovalBoard;
use tollgate_supervisor::gateway::{self, RunGateway, RunGatewayConfig, RunModels};
use tollgate_supervisor::snapshot::SnapshotStore;

/// What the served run is given.
pub struct ModelRun<'a> {
    /// The run's (and receipt's) id.
    pub run_id: &'a str,
    /// A routes file (`[[route]]` tables) naming the fake backends.
    pub routes: &'a str,
    /// The receipt's route grants.
    pub grants: Vec<pb::RouteGrant>,
    /// The run's model token budget.
    pub tokens: u64,
    /// Seed of the audit log's signing key, and the log's name for its checkpoints.
    pub audit_key: (u8, &'a str),
    /// The supervisor's approval board (routes that ask wait on it).
    pub approvals: Arc<ApprovalBoard>,
}

/// A served run's gateway.
pub struct ModelGateway {
    /// Where its audit log is.
    pub audit_dir: PathBuf,
    /// Its audit log.
    pub audit: AuditLog,
    /// A client on its socket.
    pub client: pb::gateway_client::GatewayClient<tonic::transport::Channel>,
    /// The run's gateway (to end it as a teardown would).
    pub run: Arc<RunGateway>,
    /// The served socket; serving stops when it is dropped.
    pub handle: gateway::GatewayHandle,
}

/// A route grant up to `sensitivity`; a name ending in `?` asks (the `?` left out).
pub fn grant(name: &str, sensitivity: pb::Sensitivity) -> pb::RouteGrant {
    pb::RouteGrant {
        name: name.trim_end_matches('?').into(),
        max_sensitivity: sensitivity as i32,
        ask: name.ends_with('?'),
    }
}

/// Serves `run`'s gateway on a socket in `dir` (its audit log under `dir/audit`) and connects
/// a client to it.
pub async fn serve(dir: &Path, run: ModelRun<'_>) -> ModelGateway {
    let routes = tollgate_router::config::Routes::parse(run.routes, "routes.toml").unwrap();
    let shared = Arc::new(ModelRoutes {
        backends: tollgate_router_backends::Backends::new(&routes).unwrap(),
        routes,
        classifier: tollgate_router::Classifier::new(&Default::default()).unwrap(),
    });
    let audit_dir = dir.join("audit");
    let audit = AuditLog::open(AuditConfig::new(
        &audit_dir,
        "supervisor",
        ed25519_dalek::SigningKey::from_bytes(&[run.audit_key.0; 32]),
        run.audit_key.1,
    ))
    .unwrap();
    let gateway = Arc::new(RunGateway::new(RunGatewayConfig {
        run_id: run.run_id.into(),
        host_id: nix::unistd::geteuid().as_raw(),
        receipt: pb::Receipt {
            receipt_id: run.run_id.into(),
            routes: run.grants,
            ..Default::default()
        },
        expires_at: tollgate_receipt::unix_now() + 3600,
        grants: vec![],
        max_calls: 100,
        closing: Arc::new(AtomicBool::new(false)),
        is_revoked: Arc::new(|_: &str| false),
        audit: audit.clone(),
        snapshots: SnapshotStore::new(dir),
        exec: None,
        models: Some(Arc::new(RunModels::new(shared, run.tokens))),
        children: Default::default(),
        egress: Default::default(),
        approvals: run.approvals,
        output_limit: Arc::default(),
    }));
    let handle = gateway::serve(&tokio::runtime::Handle::current(), dir, gateway.clone()).unwrap();
    let channel =
        tonic::transport::Endpoint::from_shared(format!("unix:{}", handle.socket.display()))
            .unwrap()
            .connect()
            .await
            .unwrap();
    ModelGateway {
        audit_dir,
        audit,
        client: pb::gateway_client::GatewayClient::new(channel),
        run: gateway,
        handle,
    }
}
