//! The Tollgate authority: mints Ed25519-signed run receipts within each operator's ceiling,
//! revokes them, and publishes its key set and a revocation stream over gRPC.
//!
//! [`Authority::open`] loads (or initialises) a data directory; [`Authority::run`] serves on a
//! bound listener until a shutdown future completes; [`serve`] is the whole daemon (bind,
//! readiness file, run) used by the `tollgate-authority` binary.
//!
//! Data directory layout:
//!
//! | path | what |
//! | --- | --- |
//! | `authority.db` | SQLite: keys (public), operators and enrolled supervisors (token hashes), receipts (with delegation links), revocations |
//! | `keys/<key_id>.key` | the active private key, hex seed, 0600 |
//! | `admin.token` | the bootstrap admin's bearer token, 0600, written on first start |
//! | `authority.addr` | the bound `host:port`, written once the daemon accepts connections |
//! | `audit/` | the tamper-evident audit log (`tollgate-audit`): every mint, refusal, revocation, operator and key change |
//! | `audit-checkpoint.key` | the Ed25519 key that signs the audit log's checkpoints, 0600 |
#![forbid(unsafe_code)]

pub mod backup;
pub mod ceiling;
pub mod config;
mod entries;
pub mod error;
pub mod files;
pub mod keys;
pub mod metrics;
pub mod minting;
pub mod operators;
pub mod service;
mod status;
pub mod store;

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{broadcast, watch};
use tollgate_audit::{AuditLog, EntryDraft, EntryKind};
use tollgate_classify::SecretRedactor;
use tollgate_daemon::files::{write_atomic, write_readiness, DataDirLock};
use tollgate_daemon::{token, RequestLimits, ServeLimits};
use tollgate_proto::v1 as pb;
use tollgate_proto::v1::authority_server::AuthorityServer;
use zeroize::Zeroizing;

pub use config::AuthorityConfig;
pub use entries::COMPONENT;
pub use error::{AuthorityError, CallError};

use crate::files::ensure_private_dir;
use crate::keys::KeyRing;
use crate::operators::{OperatorRegistry, SupervisorRegistry};
use crate::service::AuthorityService;
use crate::store::{Operator, Store};

/// File name of the readiness file in the data directory.
pub const ADDR_FILE: &str = "authority.addr";
/// File name of the bootstrap admin token in the data directory.
pub const ADMIN_TOKEN_FILE: &str = "admin.token";
/// File name of the database in the data directory.
pub const DATABASE_FILE: &str = "authority.db";
/// How long shutdown waits for clients to close their connections.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Name of the bootstrap admin operator.
pub const BOOTSTRAP_ADMIN: &str = "admin";

/// An opened authority, ready to serve.
#[derive(Debug)]
pub struct Authority {
    _lock: DataDirLock,
    audit: AuditLog,
    config: AuthorityConfig,
    store: Arc<Store>,
    keys: Arc<KeyRing>,
    operators: OperatorRegistry,
    supervisors: SupervisorRegistry,
    policy: Arc<std::sync::RwLock<config::MintPolicy>>,
}

impl Authority {
    /// Opens the data directory: checks and migrates the database, loads (or generates) the
    /// signing key, and on first start creates the bootstrap admin and `admin.token`.
    /// Blocking.
    pub fn open(config: AuthorityConfig) -> Result<Self, AuthorityError> {
        ensure_private_dir(&config.data_dir)?;
        let lock = DataDirLock::acquire(&config.data_dir)?;
        let database = config.data_dir.join(DATABASE_FILE);
        if !database.exists() && was_initialised(&config.data_dir) {
            return Err(AuthorityError::DatabaseMissing { path: database });
        }
        let store = Arc::new(Store::open(&database)?);
        let keys = Arc::new(KeyRing::load(config.data_dir.join("keys"), &store)?);
        let mut audit_config = tollgate_audit::component_config(&config.data_dir, COMPONENT)?;
        audit_config.key = config.audit_key.clone();
        let redactor = SecretRedactor::with_defaults()
            .map_err(|e| AuthorityError::Config(format!("audit redaction: {e}")))?;
        audit_config.redactor = Some(Arc::new(move |text: &str| redactor.redact(text)));
        let audit = AuditLog::open(audit_config)?;
        audit.observe_appends(Arc::new(|took: Duration| {
            metrics::get()
                .audit_append_seconds
                .observe(took.as_secs_f64());
        }));
        let mut operators = store.operators()?;
        // A bootstrap admin stored before receipts could grant egress has no egress ceiling;
        // its ceiling is the built-in one, so it gets egress as a fresh one does.
        for (_, operator) in &mut operators {
            if operator.admin
                && operator.name == BOOTSTRAP_ADMIN
                && operator.ceiling.egress.is_empty()
            {
                operator.ceiling.egress = admin_egress();
            }
        }
        let supervisors = store.supervisors()?;
        if operators.is_empty() {
            let (hash, admin) = bootstrap_admin(&config, &store)?;
            audit.append(
                EntryDraft::new(COMPONENT, EntryKind::OperatorAdded)
                    .decision(tollgate_audit::Decision::Allow)
                    .meta("operator", admin.name.as_str())
                    .meta("admin", true)
                    .meta("bootstrap", true),
            )?;
            operators.push((hash, admin));
        }
        audit.append(
            EntryDraft::new(COMPONENT, EntryKind::ComponentStarted)
                .meta("version", env!("CARGO_PKG_VERSION"))
                .meta("issuer", config.issuer.as_str())
                .meta("active_key_id", keys.active().key_id())
                .meta(
                    "operators",
                    i64::try_from(operators.len()).unwrap_or(i64::MAX),
                )
                .meta(
                    "supervisors",
                    i64::try_from(supervisors.len()).unwrap_or(i64::MAX),
                ),
        )?;
        tracing::info!(
            data_dir = %config.data_dir.display(),
            key_id = keys.active().key_id(),
            operators = operators.len(),
            supervisors = supervisors.len(),
            "authority opened"
        );
        Ok(Self {
            _lock: lock,
            audit,
            store,
            keys,
            operators: OperatorRegistry::new(operators),
            supervisors: SupervisorRegistry::new(supervisors),
            policy: Arc::new(std::sync::RwLock::new(config.mint_policy())),
            config,
        })
    }

    /// The resolved configuration.
    pub fn config(&self) -> &AuthorityConfig {
        &self.config
    }

    /// Serves the Authority, health and reflection services on `listener` until `shutdown`
    /// completes; open revocation streams are then closed so shutdown does not hang.
    pub async fn run(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), AuthorityError> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut grace_rx = stop_rx.clone();
        let (revocations, _) = broadcast::channel(1024);
        let minting = minting::MintCommitter::start(self.store.clone(), self.audit.clone())?;
        let operators = Arc::new(self.operators);
        let supervisors = Arc::new(self.supervisors);
        let requests = request_limits(operators.clone(), supervisors.clone());
        let service = AuthorityService {
            config: self.config,
            minting,
            store: self.store,
            keys: self.keys,
            operators,
            supervisors,
            audit: self.audit.clone(),
            revocations,
            policy: self.policy,
            key_set_version: watch::channel(0).0,
            shutdown: stop_rx,
        };
        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        health_reporter
            .set_serving::<AuthorityServer<AuthorityService>>()
            .await;
        let (reflection, reflection_v1alpha) =
            tollgate_daemon::reflection::services("tollgate.v1.Authority")
                .map_err(|e| AuthorityError::Config(format!("reflection: {e}")))?;
        let signal = async move {
            shutdown.await;
            tracing::info!("shutting down");
            let _ = stop_tx.send(true);
        };
        let bounds = ServeLimits::DAEMON;
        let server = tollgate_daemon::tls::serve_tls(bounds.server(), &service.config.tls)
            .map_err(AuthorityError::Config)?
            .layer(requests)
            .add_service(health_service)
            .add_service(reflection)
            .add_service(reflection_v1alpha)
            .add_service(AuthorityServer::new(service))
            .serve_with_incoming_shutdown(
                tollgate_daemon::incoming(listener, bounds.connections),
                signal,
            );
        // Graceful shutdown waits for clients to close their connections; a client that
        // never does must not keep the daemon alive, so the wait is bounded.
        let grace = async move {
            let _ = grace_rx.wait_for(|stop| *stop).await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        };
        let served = tokio::select! {
            served = server => served,
            () = grace => {
                tracing::warn!(
                    grace_seconds = SHUTDOWN_GRACE.as_secs(),
                    "clients still connected after the shutdown grace period; closing them"
                );
                Ok(())
            }
        };
        // A clean stop ends the log with an entry and a signed checkpoint.
        let audit = self.audit;
        let closed = tollgate_daemon::blocking(move || {
            audit.append(EntryDraft::new(COMPONENT, EntryKind::ComponentStopped))?;
            audit.close()
        })
        .await
        .map_err(AuthorityError::task)?;
        served?;
        closed?;
        Ok(())
    }
}

/// Calls anyone may make without a token: the public key set and the revocation stream.
const PUBLIC_CALLS: [&str; 2] = [
    "/tollgate.v1.Authority/GetKeySet",
    "/tollgate.v1.Authority/WatchRevocations",
];

/// What a peer can make the authority hold: a token known to be an operator's or a
/// supervisor's is required on the headers of every other call, before its body is read;
/// a receipt is well under 64 KiB, so no request is larger than that (the public calls'
/// requests are empty: 1 KiB).
fn request_limits(
    operators: Arc<OperatorRegistry>,
    supervisors: Arc<SupervisorRegistry>,
) -> RequestLimits {
    let mut limits = RequestLimits::builder(64 << 10, 16 << 20, Duration::from_secs(30))
        // A delegation carries the parent's whole envelope and the child's spec.
        .cap("/tollgate.v1.Authority/DelegateReceipt", 128 << 10);
    for public in PUBLIC_CALLS {
        limits = limits.cap(public, 1 << 10);
    }
    limits
        .check(move |path, headers| {
            if !path.starts_with("/tollgate.v1.Authority/") || PUBLIC_CALLS.contains(&path) {
                return Ok(());
            }
            let metadata = tonic::metadata::MetadataMap::from_headers(headers.clone());
            let token =
                token::bearer(&metadata).map_err(|e| tonic::Status::from(CallError::from(e)))?;
            if operators.by_token(token).is_some() || supervisors.by_token(token).is_some() {
                Ok(())
            } else {
                Err(tonic::Status::unauthenticated(
                    "unknown or revoked operator token",
                ))
            }
        })
        .build()
}

/// Whether an earlier start left keys or the admin token here.
fn was_initialised(data_dir: &Path) -> bool {
    let has_key = std::fs::read_dir(data_dir.join("keys")).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.path().extension().is_some_and(|ext| ext == "key"))
    });
    has_key || data_dir.join(ADMIN_TOKEN_FILE).exists()
}

/// The bootstrap admin's egress ceiling: any host, any port, any secret, anything sent,
/// opaque or inspected.
fn admin_egress() -> Vec<pb::EgressGrant> {
    vec![pb::EgressGrant {
        host: "*".into(),
        ports: Vec::new(),
        max_sensitivity: pb::Sensitivity::High as i32,
        inject: "*".into(),
        ..Default::default()
    }]
}

fn bootstrap_admin(
    config: &AuthorityConfig,
    store: &Store,
) -> Result<([u8; 32], Operator), AuthorityError> {
    let token = token::generate();
    // Token file first: if we crash before the database insert, the next start simply makes
    // a new token; the reverse order could leave an admin nobody can authenticate as.
    let path = config.data_dir.join(ADMIN_TOKEN_FILE);
    let line = Zeroizing::new(format!("{}\n", token.expose()));
    write_atomic(&path, line.as_bytes(), 0o600).map_err(AuthorityError::write_file(&path))?;
    let operator = Operator {
        name: BOOTSTRAP_ADMIN.into(),
        admin: true,
        ceiling: pb::Ceiling {
            fs: vec![pb::FsGrant {
                path: "/".into(),
                access: pb::FsAccess::Write as i32,
                mount: String::new(),
                exec: false,
                ask: false,
                ask_reads: false,
            }],
            exec: vec!["/".into()],
            routes: vec![pb::RouteGrant {
                name: "*".into(),
                max_sensitivity: pb::Sensitivity::High as i32,
                ask: false,
            }],
            limits: Some(pb::Limits::default()),
            max_ttl_seconds: config.admin_max_ttl.as_secs(),
            audience: Vec::new(),
            max_delegate_depth: config.admin_max_delegate_depth,
            egress: admin_egress(),
            delegate_ask: false,
            exec_ask: Vec::new(),
        },
        created_at: tollgate_receipt::unix_now(),
        created_by: String::new(),
    };
    let hash = token::hash(token.expose());
    store.insert_operator(&hash, &operator)?;
    tracing::info!(path = %path.display(), "created bootstrap admin token");
    Ok((hash, operator))
}

/// Path of the readiness file for a data directory.
pub fn addr_file(data_dir: &Path) -> PathBuf {
    data_dir.join(ADDR_FILE)
}

/// SIGHUP: the config file's mint policy, read again; a file that does not load changes
/// nothing.
fn reload_mint_policy(
    policy: &std::sync::RwLock<config::MintPolicy>,
    file: Option<&Path>,
    data_dir: &Path,
) {
    let Some(file) = file else {
        tracing::info!("SIGHUP: nothing to reload (started without --config; operators, ceilings and keys change through the API)");
        return;
    };
    match AuthorityConfig::load(Some(file), Some(data_dir.to_owned()), None) {
        Ok(config) => {
            let fresh = config.mint_policy();
            tracing::info!(policy_version = %fresh.policy_version, file = %file.display(), "SIGHUP: mint policy reloaded; receipts minted from now on use it");
            *policy.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        }
        Err(e) => {
            tracing::warn!(error = %e, "SIGHUP: config file not reloaded; the mint policy in use stays")
        }
    }
}

/// The whole daemon: open the data directory, bind, write `authority.addr`, serve until
/// `shutdown`, then remove `authority.addr`.
pub async fn serve(
    config: AuthorityConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), AuthorityError> {
    let addr_path = addr_file(&config.data_dir);
    let opened = tollgate_daemon::blocking(move || Authority::open(config))
        .await
        .map_err(AuthorityError::task)??;
    // We hold the directory lock now, so any address file is a stale one from a crashed
    // run: it must never be mistaken for readiness.
    match std::fs::remove_file(&addr_path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(AuthorityError::write_file(&addr_path)(source)),
    }
    let listen = opened.config.listen.clone();
    let listener = TcpListener::bind(&listen)
        .await
        .map_err(|source| AuthorityError::Bind {
            addr: listen.clone(),
            source,
        })?;
    let bound: SocketAddr = listener
        .local_addr()
        .map_err(|source| AuthorityError::Bind {
            addr: listen,
            source,
        })?;
    tollgate_daemon::tls::check_listen(
        bound,
        opened.config.tls.enabled(),
        opened.config.insecure_plaintext,
    )
    .map_err(AuthorityError::Config)?;
    if let Some(metrics_listen) = opened.config.metrics_listen.clone() {
        let bind_error = |source| AuthorityError::Bind {
            addr: metrics_listen.clone(),
            source,
        };
        let metrics = TcpListener::bind(&metrics_listen)
            .await
            .map_err(bind_error)?;
        let bound = metrics.local_addr().map_err(bind_error)?;
        write_readiness(
            &opened.config.data_dir.join("metrics.addr"),
            &bound.to_string(),
        )
        .map_err(|source| AuthorityError::WriteFile {
            path: opened.config.data_dir.join("metrics.addr"),
            source,
        })?;
        tollgate_daemon::metrics::serve(metrics, Arc::new(|| metrics::get().encode()));
        tracing::info!(addr = %bound, "metrics at /metrics");
    }
    if let Some(health_listen) = opened.config.health_listen.clone() {
        let bind_error = |source| AuthorityError::Bind {
            addr: health_listen.clone(),
            source,
        };
        let health = TcpListener::bind(&health_listen)
            .await
            .map_err(bind_error)?;
        let bound = health.local_addr().map_err(bind_error)?;
        let path = opened.config.data_dir.join("health.addr");
        write_readiness(&path, &bound.to_string()).map_err(AuthorityError::write_file(&path))?;
        tollgate_daemon::health::serve(health, "tollgate.v1.Authority").await;
        tracing::info!(addr = %bound, "gRPC health service (plaintext, for probes)");
    }
    // A SIGHUP (a terminal closing, an operator's reload habit) never stops the daemon: it
    // reads the config file's mint policy again (policy version, default limits); the rest of
    // the file is read at start, and operators, ceilings and keys change through the API.
    let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| AuthorityError::Config(format!("cannot handle SIGHUP: {e}")))?;
    let (policy, config_file, data_dir) = (
        opened.policy.clone(),
        opened.config.config_file.clone(),
        opened.config.data_dir.clone(),
    );
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            reload_mint_policy(&policy, config_file.as_deref(), &data_dir);
        }
    });
    // The socket is listening, so connections queue from here on: the daemon is ready.
    write_readiness(&addr_path, &bound.to_string())
        .map_err(AuthorityError::write_file(&addr_path))?;
    tracing::info!(addr = %bound, "authority listening");
    tollgate_daemon::systemd::ready(&format!("listening on {bound}"));
    let data_dir = opened.config.data_dir.clone();
    let result = opened.run(listener, shutdown).await;
    tollgate_daemon::systemd::stopping();
    let _ = std::fs::remove_file(&addr_path);
    // Every readiness file goes on a clean stop: none may be mistaken for a live listener.
    let _ = std::fs::remove_file(data_dir.join("metrics.addr"));
    let _ = std::fs::remove_file(data_dir.join("health.addr"));
    result
}
