//! The `tollgate-supervisor` daemon, in the same shape as the authority's:
//! [`Supervisor::open`] (blocking: the data directory, its lock ([`lock_data_dir`], taken
//! before anything in the directory is written or removed), its claim on the host's
//! cgroup parent and host ids ([`host`]), the admin token, the audit
//! log and the run manager with its crash recovery), [`Supervisor::run`] (serves on a bound
//! listener until `shutdown`, then tears every run down), and [`serve`] (trust, open, bind,
//! the readiness file, run) for `main.rs`. Tests start the real binary on port 0 and wait
//! for its readiness file.

mod config;
mod error;
mod reload;
mod trust;

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tollgate_daemon::files::{write_atomic, write_readiness, DataDirLock};
use tollgate_daemon::{RequestLimits, ServeLimits};
use tollgate_proto::v1 as pb;
use tollgate_proto::v1::supervisor_server::SupervisorServer;
use tollgate_receipt::KeySet;

pub use config::{
    read_key_file, AuthorityLink, SupervisorConfig, SupervisorFile, Trust, ADDR_FILE, TOKEN_FILE,
};
pub use error::DaemonError;
/// A supervisor's claim on its host (in `tollgate-daemon`, which `tollgate doctor` reads too).
pub use tollgate_daemon::host;

use crate::callers::CallerCheck;
use crate::cgroup::CgroupMode;
use crate::runs::RunManager;
use crate::service::SupervisorService;
use crate::COMPONENT;

/// Where `--metrics-listen`'s bound address is written (for port 0).
pub const METRICS_ADDR_FILE: &str = "metrics.addr";

/// The supervisor's one call anyone may make without a token.
const PUBLIC_CALL: &str = "/tollgate.v1.Supervisor/GetSupervisorInfo";

/// How long a restarted supervisor waits for the authority's revocation stream to catch up
/// before it refuses to start.
const CATCH_UP: Duration = Duration::from_secs(15);

/// An opened supervisor, ready to serve.
#[derive(Debug)]
pub struct Supervisor {
    _lock: DataDirLock,
    _claim: host::HostRegistration,
    config: SupervisorConfig,
    manager: Arc<RunManager>,
    token_hash: [u8; 32],
    key_ids: Vec<String>,
    /// The last revocation applied (kept current by the authority link).
    last_revocation_seq: Arc<AtomicU64>,
}

impl Supervisor {
    /// Opens the data directory (0700, locked for this process), reads or creates the admin
    /// token, opens the audit log and the run manager trusting `keys` (runs left by a crash
    /// are marked lost and their cgroups swept), and gives it the model routes and the
    /// delegation link. Blocking.
    pub fn open(config: SupervisorConfig, keys: KeySet) -> Result<Self, DaemonError> {
        let lock = lock_data_dir(&config.runs.data_dir)?;
        Self::open_locked(config, keys, lock)
    }

    /// [`Self::open`] with the data directory's lock already taken ([`lock_data_dir`]).
    pub fn open_locked(
        config: SupervisorConfig,
        keys: KeySet,
        lock: DataDirLock,
    ) -> Result<Self, DaemonError> {
        let data_dir = config.runs.data_dir.clone();
        // Before the run manager sweeps the parent: it must be this supervisor's alone.
        let claim = host::HostRegistration::register(
            &config.run_dir,
            &host::Claim {
                id: config.runs.supervisor_id.clone(),
                data_dir: data_dir.clone(),
                pid: std::process::id(),
                cgroup_parent: config.runs.cgroup_parent.clone(),
                host_ids: config.runs.host_ids.clone(),
            },
        )?;
        let token_hash = admin_token(&data_dir)?;
        let key_ids = keys.key_ids().map(str::to_owned).collect();
        let mut audit = tollgate_audit::component_config(&data_dir, COMPONENT)?;
        audit.key = config.audit_key.clone();
        let redactor = tollgate_router::SecretRedactor::with_defaults()
            .map_err(|e| DaemonError::Redaction(e.to_string()))?;
        audit.redactor = Some(Arc::new(move |text: &str| redactor.redact(text)));
        let audit = tollgate_audit::AuditLog::open(audit)?;
        audit.observe_appends(Arc::new(|took: Duration| {
            crate::metrics::get()
                .audit_append_seconds
                .observe(took.as_secs_f64());
        }));
        let (manager, recovered) = RunManager::open(config.runs.clone(), keys, audit)?;
        if !recovered.is_empty() {
            tracing::warn!(
                count = recovered.len(),
                "runs from before a crash were marked lost"
            );
        }
        if let Some(models) = &config.models {
            manager.set_model_routes(models.clone());
        }
        // Opened on a blocking thread of the daemon's runtime: its handle serves the fetches.
        if let (Trust::Authority(url), Ok(runtime)) =
            (&config.trust, tokio::runtime::Handle::try_current())
        {
            manager.set_key_refresh(trust::key_refresh(url.clone(), runtime));
        }
        match (&config.trust, &config.delegation_token) {
            (Trust::Authority(url), Some(token)) => {
                manager.set_delegator(Arc::new(crate::gateway::Delegator::new(
                    url.clone(),
                    config.runs.supervisor_id.clone(),
                    token.clone(),
                )));
            }
            (Trust::KeyFile(_), Some(_)) => return Err(DaemonError::DelegationNeedsAuthority),
            (_, None) => {}
        }
        Ok(Self {
            _lock: lock,
            _claim: claim,
            config,
            manager,
            token_hash,
            key_ids,
            last_revocation_seq: Arc::new(AtomicU64::new(0)),
        })
    }

    /// The run manager.
    pub fn manager(&self) -> &Arc<RunManager> {
        &self.manager
    }

    /// Follows the authority of a [`Trust::Authority`] supervisor (key set, revocations) and
    /// waits until every revocation that exists is known: a restarted supervisor must not
    /// admit a receipt revoked while it was down. A key-file supervisor returns at once.
    pub async fn follow_authority(&self) -> Result<(), DaemonError> {
        let Trust::Authority(url) = &self.config.trust else {
            return Ok(());
        };
        let (caught_up_tx, mut caught_up) = tokio::sync::watch::channel(false);
        let freshness = Arc::new(crate::link::RevocationFreshness::new(
            self.config.max_staleness,
        ));
        self.manager.set_revocation_freshness(freshness.clone());
        tokio::spawn(trust::follow_authority(
            url.clone(),
            self.config.runs.supervisor_id.clone(),
            self.manager.clone(),
            self.last_revocation_seq.clone(),
            caught_up_tx,
            freshness,
        ));
        let waited =
            tokio::time::timeout(CATCH_UP, caught_up.wait_for(|caught_up| *caught_up)).await;
        if matches!(waited, Ok(Ok(_))) {
            Ok(())
        } else {
            Err(DaemonError::Authority {
                url: url.url.clone(),
                detail: "the revocation stream did not catch up within 15 s".into(),
            })
        }
    }

    /// Serves the supervisor's API (with health and reflection) on `listener` until
    /// `shutdown` completes; then tears down every live run (which also ends every
    /// `WatchRun` stream), gives the server a short grace, and removes the emptied parent
    /// cgroup. No run outlives this, whatever ended the server.
    pub async fn run(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), DaemonError> {
        let service = SupervisorService::new(
            self.manager.clone(),
            self.info(),
            self.last_revocation_seq.clone(),
        );
        let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
        let teardown_manager = self.manager.clone();
        let signal = async move {
            shutdown.await;
            // Tear the runs down first: that also ends every WatchRun stream, so the server's
            // graceful shutdown does not wait on them.
            tracing::info!(
                "shutting down: live runs end (or, with --live-restore, are left running)"
            );
            let _ = tokio::task::spawn_blocking(move || teardown_manager.shutdown()).await;
            let _ = stop_tx.send(true);
        };
        let server = serve_api(service, self.callers(), &self.config.tls, listener, signal);
        let grace = async move {
            let _ = stop_rx.wait_for(|stop| *stop).await;
            tokio::time::sleep(Duration::from_secs(5)).await;
        };
        let served = tokio::select! {
            served = server => served,
            () = grace => Ok(()),
        };
        let parent = self.config.runs.cgroup_parent.clone();
        let manager = self.manager.clone();
        let _ = tokio::task::spawn_blocking(move || {
            manager.shutdown();
            // Runs left running detached (live restore) keep their cgroups under the parent.
            if !manager.left_detached() {
                if let Err(e) = crate::cgroup::sweep(&parent, true) {
                    tracing::warn!(error = %e, "could not remove the parent cgroup");
                }
            }
        })
        .await;
        served
    }

    /// Who may call: the admin token, operator certificates, and (following an authority)
    /// the operator tokens it issued.
    fn callers(&self) -> CallerCheck {
        let authority = match &self.config.trust {
            Trust::Authority(link) => Some(link),
            Trust::KeyFile(_) => None,
        };
        CallerCheck::new(self.token_hash, authority)
    }

    /// What `GetSupervisorInfo` answers.
    fn info(&self) -> pb::SupervisorInfo {
        pb::SupervisorInfo {
            supervisor_id: self.config.runs.supervisor_id.clone(),
            trusted_key_ids: self.key_ids.clone(),
            version: env!("CARGO_PKG_VERSION").into(),
            last_revocation_seq: 0,
            cgroup_mode: match CgroupMode::detect() {
                CgroupMode::Unified => "unified",
                CgroupMode::Legacy => "legacy",
                CgroupMode::Hybrid => "hybrid",
            }
            .into(),
        }
    }
}

/// Serves the supervisor's API, `service`, on `listener` until `signal` completes, as the daemon
/// does: with health and reflection, the daemon's connection and request bounds, callers
/// resolved by `callers` from each request's headers (and TLS certificate), TLS as `tls` says.
/// Public for a program that builds its own run manager and serves it (the scale bench times
/// `tollgate ps` against one).
pub async fn serve_api(
    service: SupervisorService,
    callers: CallerCheck,
    tls: &tollgate_daemon::tls::ServerTls,
    listener: TcpListener,
    signal: impl Future<Output = ()> + Send + 'static,
) -> Result<(), DaemonError> {
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<SupervisorServer<SupervisorService>>()
        .await;
    let (reflection, reflection_v1alpha) =
        tollgate_daemon::reflection::services("tollgate.v1.Supervisor")
            .map_err(|e| DaemonError::Reflection(e.to_string()))?;
    let bounds = ServeLimits::DAEMON;
    let incoming = tollgate_daemon::incoming(listener, bounds.connections);
    tollgate_daemon::tls::serve_tls(bounds.server(), tls)
        .map_err(DaemonError::Tls)?
        .layer(request_limits(callers))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        // No message larger than the largest request (StartRun, 256 KiB): Attach's input
        // stream is capped per message, not in total.
        .add_service(SupervisorServer::new(service).max_decoding_message_size(256 << 10))
        .serve_with_incoming_shutdown(incoming, signal)
        .await
        .map_err(DaemonError::from)
}

/// The supervisor API's request bounds. The caller is resolved from the headers (and the
/// connection's certificate) before any body is read: an unauthenticated peer cannot make the
/// daemon hold a request (health, reflection and `GetSupervisorInfo` stay open; the public
/// call's request is empty).
fn request_limits(callers: CallerCheck) -> RequestLimits {
    RequestLimits::builder(64 << 10, 16 << 20, Duration::from_secs(30))
        .cap("/tollgate.v1.Supervisor/StartRun", 256 << 10)
        // A run's input for as long as it runs; each message at most the service's
        // decoding limit.
        .stream("/tollgate.v1.Supervisor/Attach")
        // Spooled to disk as it comes, bounded by the handler (256 MiB).
        .stream("/tollgate.v1.Supervisor/CopyIn")
        .cap(PUBLIC_CALL, 1 << 10)
        .authenticate(move |path, headers, connection| {
            if !path.starts_with("/tollgate.v1.Supervisor/") || path == PUBLIC_CALL {
                return Box::pin(std::future::ready(Ok(http::Extensions::new())));
            }
            callers.authenticate(headers, connection)
        })
        .build()
}

/// Takes the data directory (made 0700 if missing: receipts, run records and the audit log
/// are in it; refused with the chmod if others may enter it) for this process. Nothing in it
/// is written or removed before this: a supervisor refused here leaves a live one's files
/// (its `supervisor.addr`) alone.
pub fn lock_data_dir(data_dir: &Path) -> Result<DataDirLock, DaemonError> {
    tollgate_audit::ensure_private_dir(data_dir).map_err(DaemonError::DataDir)?;
    Ok(DataDirLock::acquire(data_dir)?)
}

/// Reads or (on first start) creates the admin token (0600); returns its hash.
fn admin_token(data_dir: &Path) -> Result<[u8; 32], DaemonError> {
    let path = data_dir.join(TOKEN_FILE);
    let error = |action, source| DaemonError::AdminToken {
        action,
        path: path.clone(),
        source,
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(tollgate_daemon::token::hash(text.trim())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let token = tollgate_daemon::token::generate();
            write_atomic(&path, format!("{}\n", token.expose()).as_bytes(), 0o600)
                .map_err(|e| error("write", e))?;
            Ok(tollgate_daemon::token::hash(token.expose()))
        }
        Err(e) => Err(error("read", e)),
    }
}

/// The whole daemon: trust (the key file, or the authority's key set), open, follow the
/// authority's revocations until caught up, bind, write the readiness file
/// (`<data-dir>/supervisor.addr`, atomically), serve until `shutdown`, remove the readiness
/// file.
pub async fn serve(
    config: SupervisorConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), DaemonError> {
    let addr_path = config.runs.data_dir.join(ADDR_FILE);
    // A key file is a setting: checked before the data directory is touched.
    let pinned = match &config.trust {
        Trust::KeyFile(path) => Some(read_key_file(path)?),
        Trust::Authority(_) => None,
    };
    // The lock before anything in the directory is written or removed: a second supervisor
    // started on it must leave the live one's files alone.
    let data_dir = config.runs.data_dir.clone();
    let lock = tokio::task::spawn_blocking(move || lock_data_dir(&data_dir)).await??;
    // Ours now, so any address file is a stale one from a crashed run: it must never be
    // mistaken for readiness while trust is fetched.
    let _ = std::fs::remove_file(&addr_path);
    let keys = match (pinned, &config.trust) {
        (Some(keys), _) => keys,
        (None, Trust::KeyFile(path)) => read_key_file(path)?,
        (None, Trust::Authority(url)) => trust::initial_keys(url).await?,
    };
    let listen = config.listen.clone();
    let supervisor =
        tokio::task::spawn_blocking(move || Supervisor::open_locked(config, keys, lock)).await??;
    supervisor.follow_authority().await?;
    // Before readiness: from the moment clients may connect, a SIGHUP reloads, never kills.
    reload::on_hangup(
        supervisor.manager.clone(),
        supervisor.config.routes_file.clone(),
        supervisor.config.route_probe_timeout,
        supervisor.config.config_file.clone(),
    )
    .map_err(DaemonError::Signals)?;
    let listener = TcpListener::bind(&listen)
        .await
        .map_err(|source| DaemonError::Listen {
            addr: listen.clone(),
            source,
        })?;
    let bound: SocketAddr = listener
        .local_addr()
        .map_err(|source| DaemonError::Listen {
            addr: listen,
            source,
        })?;
    tollgate_daemon::tls::check_listen(
        bound,
        supervisor.config.tls.enabled(),
        supervisor.config.insecure_plaintext,
    )
    .map_err(DaemonError::Tls)?;
    if let Some(metrics_listen) = &supervisor.config.metrics_listen {
        let metrics =
            TcpListener::bind(metrics_listen)
                .await
                .map_err(|source| DaemonError::Listen {
                    addr: metrics_listen.clone(),
                    source,
                })?;
        let bound = metrics.local_addr().map_err(|source| DaemonError::Listen {
            addr: metrics_listen.clone(),
            source,
        })?;
        let path = supervisor.config.runs.data_dir.join(METRICS_ADDR_FILE);
        write_readiness(&path, &bound.to_string())
            .map_err(|source| DaemonError::Readiness { path, source })?;
        tollgate_daemon::metrics::serve(metrics, Arc::new(|| crate::metrics::get().encode()));
        tracing::info!(addr = %bound, "metrics at /metrics");
    }
    if let Some(health_listen) = &supervisor.config.health_listen {
        let listen_error = |source| DaemonError::Listen {
            addr: health_listen.clone(),
            source,
        };
        let health = TcpListener::bind(health_listen)
            .await
            .map_err(listen_error)?;
        let bound = health.local_addr().map_err(listen_error)?;
        let path = supervisor.config.runs.data_dir.join("health.addr");
        write_readiness(&path, &bound.to_string())
            .map_err(|source| DaemonError::Readiness { path, source })?;
        tollgate_daemon::health::serve(health, "tollgate.v1.Supervisor").await;
        tracing::info!(addr = %bound, "gRPC health service (plaintext, for probes)");
    }
    // The socket is listening, so connections queue from here on: the daemon is ready.
    write_readiness(&addr_path, &bound.to_string()).map_err(|source| DaemonError::Readiness {
        path: addr_path.clone(),
        source,
    })?;
    // The open-file limit (raised at start as far as the kernel allows) bounds the live runs.
    let open_files = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(0, |(soft, _)| soft);
    tracing::info!(
        addr = %bound,
        id = %supervisor.config.runs.supervisor_id,
        open_files,
        live_runs_by_open_files = open_files / crate::host_limits::FDS_PER_RUN,
        "supervisor listening"
    );
    tollgate_daemon::systemd::ready(&format!("listening on {bound}"));
    let data_dir = supervisor.config.runs.data_dir.clone();
    let result = supervisor.run(listener, shutdown).await;
    tollgate_daemon::systemd::stopping();
    let _ = std::fs::remove_file(&addr_path);
    // Every readiness file goes on a clean stop: none may be mistaken for a live listener.
    let _ = std::fs::remove_file(data_dir.join(METRICS_ADDR_FILE));
    let _ = std::fs::remove_file(data_dir.join("health.addr"));
    result
}
