//! One run's gateway, assembled: the call gate and the tool families that share it.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tollgate_audit::AuditLog;
use tollgate_files::snapshot::SnapshotStore;
use tollgate_proto::v1 as pb;

use super::approval::RunApprovals;
use super::children::{ChildState, Children};
use super::egress::{EgressCalls, EgressSetup};
use super::exec::ExecTools;
use super::fs::{FsGrant, FsTools, GrantOrigin, LiveGrants};
use super::gate::{AuditUse, CallGate};
use super::models::{ModelCalls, RunModels};
use crate::exec::ExecSandbox;

/// What a run's gateway is built from.
pub struct RunGatewayConfig {
    /// The run (= receipt) id.
    pub run_id: String,
    /// The run's host uid/gid: the only peer allowed on the socket.
    pub host_id: u32,
    /// The receipt, for `GetRunReceipt` and the grants.
    pub receipt: pb::Receipt,
    /// Unix seconds; no call is served at or after it.
    pub expires_at: i64,
    /// The receipt's fs grants, pinned before the agent existed.
    pub grants: Vec<FsGrant>,
    /// The receipt's tool-call budget.
    pub max_calls: u64,
    /// Set when the run is being torn down: no call is served from then on.
    pub closing: Arc<AtomicBool>,
    /// Whether the receipt has been revoked (asked on every call).
    pub is_revoked: Arc<dyn Fn(&str) -> bool + Send + Sync>,
    /// Where every call is recorded.
    pub audit: AuditLog,
    /// Where `fs.write` and `fs.delete` keep what they change.
    pub snapshots: SnapshotStore,
    /// How `exec` reaches the sandbox; `None`: no exec.
    pub exec: Option<Arc<ExecSandbox>>,
    /// The run's model calls (its token budget); `None`: the supervisor has no routes.
    pub models: Option<Arc<RunModels>>,
    /// Delegation: the run's envelope, the supervisor link, child budgets and receipts.
    pub children: ChildState,
    /// What outbound connections are served with: the administrator's settings, the run's
    /// certificate authority, the classifier.
    pub egress: EgressSetup,
    /// Where calls under a grant that asks wait for an operator.
    pub approvals: Arc<crate::approvals::ApprovalBoard>,
    /// The run's output budget in all, as amended (shared with the run's relay).
    pub output_limit: Arc<AtomicU64>,
}

/// What the gateway of one run knows and counts: one call gate, and each tool family
/// (files, commands, model calls, children) holding it.
#[derive(Debug)]
pub struct RunGateway {
    /// The run's host uid/gid: the only peer allowed on the socket.
    pub host_id: u32,
    /// What every call is checked and counted against.
    pub gate: Arc<CallGate>,
    /// The file tools.
    pub fs: FsTools,
    /// The `exec` tool.
    pub exec: ExecTools,
    /// `Complete`.
    pub models: ModelCalls,
    /// Delegation.
    pub children: Arc<Children>,
    /// Outbound connections.
    pub egress: Arc<EgressCalls>,
    /// Calls waiting for an operator's approval.
    pub approvals: RunApprovals,
    /// Changes to the live run are made one at a time (check, audit, apply under this lock),
    /// and each signed amendment applies once: the ids of those applied.
    pub amendments: Mutex<std::collections::HashSet<String>>,
    /// The run's output budget in all, as amended (shared with the run's relay).
    pub output_limit: Arc<AtomicU64>,
}

impl RunGateway {
    /// The gateway `config` describes, with nothing counted yet.
    pub fn new(config: RunGatewayConfig) -> Self {
        let gate = Arc::new(CallGate {
            run_id: config.run_id,
            receipt: config.receipt,
            expires_at: AtomicI64::new(config.expires_at),
            max_calls: AtomicU64::new(config.max_calls),
            closing: config.closing,
            is_revoked: config.is_revoked,
            audit: config.audit,
            calls: AtomicU64::new(0),
            last_call: Mutex::new(None),
            audit_use: AuditUse::default(),
            fs_granted: !config.grants.is_empty(),
            streams_end: tokio::sync::watch::Sender::new(false),
        });
        let grants = Arc::new(LiveGrants::new(config.grants));
        // Receipts minted before approvals existed say 0: the default.
        let timeout = match gate.receipt.approval_timeout_seconds {
            0 => tollgate_receipt::spec::DEFAULT_APPROVAL_TIMEOUT,
            seconds => std::time::Duration::from_secs(seconds),
        };
        let approvals = RunApprovals {
            gate: gate.clone(),
            board: config.approvals,
            timeout,
        };
        // Shared by the exec tool and delegation (children get only programs still in force).
        let programs = Arc::new(std::sync::RwLock::new(gate.receipt.gateway_exec.clone()));
        Self {
            output_limit: config.output_limit,
            amendments: Mutex::default(),
            approvals: approvals.clone(),
            host_id: config.host_id,
            fs: FsTools {
                gate: gate.clone(),
                grants: grants.clone(),
                snapshots: config.snapshots,
            },
            exec: ExecTools {
                gate: gate.clone(),
                sandbox: config.exec,
                approvals: approvals.clone(),
                gateway_only: programs.clone(),
            },
            models: ModelCalls {
                gate: gate.clone(),
                models: config.models.clone(),
                approvals: approvals.clone(),
                refused: Default::default(),
            },
            egress: Arc::new(EgressCalls::new(
                gate.clone(),
                config.egress,
                approvals.clone(),
            )),
            children: Arc::new(Children {
                gate: gate.clone(),
                grants,
                programs,
                models: config.models,
                state: config.children,
                approvals: approvals.clone(),
            }),
            gate,
        }
    }

    /// The run (= receipt) id.
    pub fn run_id(&self) -> &str {
        &self.gate.run_id
    }

    /// The run's receipt as its powers stand now, for `GetRunReceipt`: the signed one with
    /// every narrowing and amendment since applied — the fs grants and gateway-only programs
    /// in force, the expiry, and the tool-call, token, output and outbound-byte budgets. Read
    /// from what the gateway checks calls against, so it is never staler than the checks
    /// (a live restore puts those back before the gateway serves again).
    pub fn receipt_in_force(&self) -> pb::Receipt {
        let mut receipt = self.gate.receipt.clone();
        let signed = std::mem::take(&mut receipt.fs);
        receipt.fs = self
            .fs
            .grants
            .current()
            .iter()
            .map(|grant| {
                // The receipt's own grant as signed (its mount); an amendment's has none.
                signed
                    .iter()
                    .find(|r| r.path == grant.path && grant.origin == GrantOrigin::Receipt)
                    .cloned()
                    .unwrap_or_else(|| pb::FsGrant {
                        path: grant.path.clone(),
                        access: if grant.writable {
                            pb::FsAccess::Write as i32
                        } else {
                            pb::FsAccess::Read as i32
                        },
                        ask: grant.ask,
                        ask_reads: grant.ask_reads,
                        ..Default::default()
                    })
            })
            .collect();
        receipt.gateway_exec = self.exec.programs();
        receipt.expires_at = Some(tollgate_receipt::timestamp_from_unix(
            self.gate.expires_at(),
        ));
        let limits = receipt.limits.get_or_insert_with(Default::default);
        limits.tool_calls = self.gate.max_calls();
        if let Some(models) = &self.models.models {
            limits.tokens = models.token_limit();
        }
        limits.output_bytes = self.output_limit.load(Ordering::SeqCst);
        limits.egress_bytes = self.egress.max_bytes();
        receipt
    }
}
