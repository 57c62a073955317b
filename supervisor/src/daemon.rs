//! The `tollgate-supervisor` daemon: trust (a pinned key file or the authority's key set and
//! revocation stream), the run manager, and the gRPC server with health and reflection.

use std::future::Future;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use rand_core::RngCore as _;
use sha2::Digest as _;
use tokio::net::TcpListener;
use tokio_stream::StreamExt as _;
use tollgate_daemon::{RequestLimits, ServeLimits};
use tollgate_proto::v1 as pb;
use tollgate_proto::v1::authority_client::AuthorityClient;
use tollgate_proto::v1::supervisor_server::SupervisorServer;
use tollgate_receipt::{public_key_from_bytes, KeySet};

use crate::cgroup::CgroupMode;
use crate::runs::{RunManager, RunSettings};
use crate::service::{SupervisorService, TokenCheck};
use crate::COMPONENT;

/// Readiness file name.
pub const ADDR_FILE: &str = "supervisor.addr";
/// Admin token file name.
pub const TOKEN_FILE: &str = "admin.token";

/// Where the supervisor's trusted keys come from.
#[derive(Debug, Clone)]
pub enum Trust {
    /// Fetch the key set from this authority and follow its revocations.
    Authority(String),
    /// A pinned key file (the JSON `tollgate keys --json` prints), for hosts without an
    /// authority link.
    KeyFile(PathBuf),
}

/// Daemon settings.
#[derive(Debug, Clone)]
pub struct SupervisorConfig {
    /// The run manager's settings (data dir, id, shim, cgroup parent, host ids, skew).
    pub runs: RunSettings,
    /// Listen address.
    pub listen: String,
    /// Trust source.
    pub trust: Trust,
    /// Key for HMAC audit hashes; none: plain SHA-256.
    pub audit_key: Option<tollgate_audit::AuditKey>,
    /// Model routes (keys loaded); none: `Complete` is refused as unavailable.
    pub models: Option<Arc<tollgate_router_backends::ModelRoutes>>,
    /// The delegation token (`tgt_…`), used with the authority of `trust`; none: runs
    /// cannot delegate.
    pub delegation_token: Option<tollgate_router::config::Secret>,
}

/// A fatal daemon error, with its exit code.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Bad flags or files.
    #[error("{0}")]
    Config(String),
    /// The data directory cannot be created, or other users can enter it.
    #[error("data directory: {0}")]
    DataDir(tollgate_audit::PrivateDirError),
    /// The authority could not be reached for the key set.
    #[error("cannot fetch the key set from the authority at {url}: {detail}; is it running? (or use --trust-keys FILE)")]
    Authority {
        /// Its URL.
        url: String,
        /// The last error.
        detail: String,
    },
    /// Opening the run manager failed (database, recovery sweep).
    #[error("{0}")]
    Runs(#[from] crate::error::StartError),
    /// The audit log could not be opened.
    #[error("audit log: {0}")]
    Audit(#[from] tollgate_audit::AuditError),
    /// Binding or serving failed.
    #[error("{0}")]
    Serve(String),
}

impl DaemonError {
    /// sysexits-style exit code.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Config(_) => 78,
            Self::DataDir(_) => 73,
            Self::Authority { .. } => 69,
            Self::Runs(_) => 70,
            Self::Audit(e) => u8::try_from(e.exit_code()).unwrap_or(70),
            Self::Serve(_) => 69,
        }
    }
}

/// The supervisor's one call anyone may make without a token.
const PUBLIC_CALL: &str = "/tollgate.v1.Supervisor/GetSupervisorInfo";

/// Reads a pinned key file: `{"keys": [{"key_id": "...", "public_key_hex": "..."}]}`.
pub fn read_key_file(path: &Path) -> Result<KeySet, DaemonError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        DaemonError::Config(format!("cannot read --trust-keys {}: {e}", path.display()))
    })?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| DaemonError::Config(format!("{}: not JSON: {e}", path.display())))?;
    let mut keys = KeySet::new();
    for entry in json["keys"].as_array().into_iter().flatten() {
        let bad = |what: &str| DaemonError::Config(format!("{}: {what}", path.display()));
        let hex_key = entry["public_key_hex"]
            .as_str()
            .ok_or_else(|| bad("a key lacks public_key_hex"))?;
        let bytes = hex::decode(hex_key).map_err(|_| bad("public_key_hex is not hex"))?;
        let key = public_key_from_bytes(&bytes).map_err(|e| bad(&e.to_string()))?;
        let id = keys.insert(key);
        if let Some(listed) = entry["key_id"].as_str() {
            if listed != id {
                return Err(bad(&format!(
                    "key_id {listed} does not match its key ({id})"
                )));
            }
        }
    }
    if keys.is_empty() {
        return Err(DaemonError::Config(format!(
            "{}: no keys; write it with `tollgate keys --json > FILE`",
            path.display()
        )));
    }
    Ok(keys)
}

async fn fetch_keys(url: &str) -> Result<KeySet, String> {
    let mut client = AuthorityClient::connect(url.to_owned())
        .await
        .map_err(|e| e.to_string())?;
    let set = client
        .get_key_set(pb::GetKeySetRequest {})
        .await
        .map_err(|e| e.message().to_owned())?
        .into_inner();
    KeySet::from_proto(&set).map_err(|e| e.to_string())
}

/// Fetches the key set, retrying with backoff for up to ~15 s.
async fn initial_keys(url: &str) -> Result<KeySet, DaemonError> {
    let mut pause = Duration::from_millis(100);
    let mut last = String::new();
    for _ in 0..8 {
        match fetch_keys(url).await {
            Ok(keys) => return Ok(keys),
            Err(e) => last = e,
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(4));
    }
    Err(DaemonError::Authority {
        url: url.to_owned(),
        detail: last,
    })
}

/// Follows the authority's revocations forever, reconnecting with backoff; refreshes the key
/// set on every reconnect (a rotation adds keys).
async fn follow_authority(
    url: String,
    manager: Arc<RunManager>,
    last_seq: Arc<std::sync::atomic::AtomicU64>,
    caught_up: tokio::sync::watch::Sender<bool>,
) {
    let mut after = 0u64;
    let mut pause = Duration::from_millis(200);
    loop {
        if let Ok(keys) = fetch_keys(&url).await {
            manager.set_keys(keys);
        }
        let stream = async {
            let mut client = AuthorityClient::connect(url.clone())
                .await
                .map_err(|e| e.to_string())?;
            let mut stream = client
                .watch_revocations(pb::WatchRevocationsRequest { after_seq: after })
                .await
                .map_err(|e| e.to_string())?
                .into_inner();
            while let Some(event) = stream.next().await {
                match event.map_err(|e| e.to_string())?.event {
                    Some(pb::revocation_event::Event::Revoked(revocation)) => {
                        after = after.max(revocation.seq);
                        tracing::info!(receipt_id = %revocation.receipt_id, "revocation received");
                        let manager = manager.clone();
                        let id = revocation.receipt_id;
                        // Recorded before the seq is published, so a client that sees the
                        // seq can rely on the refusal.
                        let _ = tokio::task::spawn_blocking(move || manager.revoke(&id)).await;
                        last_seq.fetch_max(after, std::sync::atomic::Ordering::Relaxed);
                    }
                    Some(pb::revocation_event::Event::CaughtUp(_)) => {
                        let _ = caught_up.send(true);
                    }
                    None => {}
                }
            }
            Ok::<(), String>(())
        };
        match stream.await {
            Ok(()) => tracing::warn!("the authority closed the revocation stream; reconnecting"),
            Err(e) => tracing::warn!(error = %e, "revocation stream lost; reconnecting"),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(10));
    }
}

/// Reads or (on first start) creates the admin token; returns its hash.
fn admin_token(data_dir: &Path) -> Result<[u8; 32], DaemonError> {
    let path = data_dir.join(TOKEN_FILE);
    let token = match std::fs::read_to_string(&path) {
        Ok(text) => text.trim().to_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut bytes = [0u8; 32];
            rand_core::OsRng.fill_bytes(&mut bytes);
            let token = format!(
                "tgt_{}",
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
            );
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| {
                    DaemonError::Config(format!("cannot write {}: {e}", path.display()))
                })?;
            std::io::Write::write_all(&mut file, format!("{token}\n").as_bytes())
                .and_then(|()| file.sync_all())
                .map_err(|e| {
                    DaemonError::Config(format!("cannot write {}: {e}", path.display()))
                })?;
            token
        }
        Err(e) => {
            return Err(DaemonError::Config(format!(
                "cannot read {}: {e}",
                path.display()
            )))
        }
    };
    Ok(sha2::Sha256::digest(token.as_bytes()).into())
}

/// The whole daemon: trust, recovery, bind, readiness file, serve until `shutdown`, tear down
/// every live run, remove the readiness file.
pub async fn serve(
    config: SupervisorConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), DaemonError> {
    let data_dir = config.runs.data_dir.clone();
    // Receipts, run records and the audit log are in it: 0700, or refused with the chmod.
    tollgate_audit::ensure_private_dir(&data_dir).map_err(DaemonError::DataDir)?;
    let addr_path = data_dir.join(ADDR_FILE);
    let _ = std::fs::remove_file(&addr_path);
    let token_hash = admin_token(&data_dir)?;
    let keys = match &config.trust {
        Trust::KeyFile(path) => read_key_file(path)?,
        Trust::Authority(url) => initial_keys(url).await?,
    };
    let key_ids: Vec<String> = keys.key_ids().map(str::to_owned).collect();
    let settings = config.runs.clone();
    let audit_key = config.audit_key.clone();
    let (manager, recovered) = tokio::task::spawn_blocking(move || {
        let mut audit = tollgate_audit::component_config(&settings.data_dir, COMPONENT)?;
        audit.key = audit_key;
        let redactor = tollgate_router::SecretRedactor::with_defaults()
            .map_err(|e| DaemonError::Config(format!("audit redaction: {e}")))?;
        audit.redactor = Some(Arc::new(move |text: &str| redactor.redact(text)));
        let audit = tollgate_audit::AuditLog::open(audit)?;
        RunManager::open(settings, keys, audit).map_err(DaemonError::from)
    })
    .await
    .map_err(|e| DaemonError::Serve(e.to_string()))??;
    if let Some(models) = &config.models {
        manager.set_model_routes(models.clone());
    }
    match (&config.trust, &config.delegation_token) {
        (Trust::Authority(url), Some(token)) => {
            manager.set_delegator(Arc::new(crate::gateway::Delegator::new(
                url.clone(),
                config.runs.supervisor_id.clone(),
                token.clone(),
            )));
        }
        (Trust::KeyFile(_), Some(_)) => {
            return Err(DaemonError::Config(
                "--delegation-token-file needs --authority (delegation asks the authority)".into(),
            ))
        }
        (_, None) => {}
    }
    if !recovered.is_empty() {
        tracing::warn!(
            count = recovered.len(),
            "runs from before a crash were marked lost"
        );
    }
    let last_revocation_seq = Arc::new(std::sync::atomic::AtomicU64::new(0));
    if let Trust::Authority(url) = &config.trust {
        let (caught_up_tx, mut caught_up) = tokio::sync::watch::channel(false);
        tokio::spawn(follow_authority(
            url.clone(),
            manager.clone(),
            last_revocation_seq.clone(),
            caught_up_tx,
        ));
        // Not ready until every revocation that exists is known: a restarted supervisor must
        // not admit a receipt revoked while it was down.
        let waited = tokio::time::timeout(
            Duration::from_secs(15),
            caught_up.wait_for(|caught_up| *caught_up),
        )
        .await;
        if !matches!(waited, Ok(Ok(_))) {
            return Err(DaemonError::Authority {
                url: url.clone(),
                detail: "the revocation stream did not catch up within 15 s".into(),
            });
        }
    }
    let info = pb::SupervisorInfo {
        supervisor_id: config.runs.supervisor_id.clone(),
        trusted_key_ids: key_ids,
        version: env!("CARGO_PKG_VERSION").into(),
        last_revocation_seq: 0,
        cgroup_mode: match CgroupMode::detect() {
            CgroupMode::Unified => "unified",
            CgroupMode::Legacy => "legacy",
            CgroupMode::Hybrid => "hybrid",
        }
        .into(),
    };
    let service = SupervisorService::new(
        manager.clone(),
        TokenCheck::new(token_hash),
        info,
        last_revocation_seq,
    );
    // The token is checked on the headers, before any body is read: an unauthenticated peer
    // cannot make the daemon hold a request (health, reflection and GetSupervisorInfo stay
    // open; the public call's request is empty).
    let header_check = TokenCheck::new(token_hash);
    let requests = RequestLimits::builder(64 << 10, 16 << 20, Duration::from_secs(30))
        .cap("/tollgate.v1.Supervisor/StartRun", 256 << 10)
        .cap(PUBLIC_CALL, 1 << 10)
        .check(move |path, headers| {
            if !path.starts_with("/tollgate.v1.Supervisor/") || path == PUBLIC_CALL {
                return Ok(());
            }
            header_check.check(&tonic::Request::from_parts(
                tonic::metadata::MetadataMap::from_headers(headers.clone()),
                tonic::Extensions::default(),
                (),
            ))
        })
        .build();
    let listener = TcpListener::bind(&config.listen)
        .await
        .map_err(|e| DaemonError::Serve(format!("cannot listen on {}: {e}", config.listen)))?;
    let bound: SocketAddr = listener
        .local_addr()
        .map_err(|e| DaemonError::Serve(e.to_string()))?;
    std::fs::write(&addr_path, format!("{bound}\n"))
        .map_err(|e| DaemonError::Serve(format!("cannot write {}: {e}", addr_path.display())))?;
    tracing::info!(addr = %bound, id = %config.runs.supervisor_id, "supervisor listening");

    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<SupervisorServer<SupervisorService>>()
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(tollgate_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| DaemonError::Serve(e.to_string()))?;
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let teardown_manager = manager.clone();
    let signal = async move {
        shutdown.await;
        // Tear the runs down first: that also ends every WatchRun stream, so the server's
        // graceful shutdown does not wait on them.
        tracing::info!("shutting down: tearing down live runs");
        let _ = tokio::task::spawn_blocking(move || teardown_manager.shutdown()).await;
        let _ = stop_tx.send(true);
    };
    let bounds = ServeLimits::DAEMON;
    let incoming = tollgate_daemon::incoming(listener, bounds.connections);
    let server = bounds
        .server()
        .layer(requests)
        .add_service(health_service)
        .add_service(reflection)
        .add_service(SupervisorServer::new(service))
        .serve_with_incoming_shutdown(incoming, signal);
    let grace = async move {
        let _ = stop_rx.wait_for(|stop| *stop).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
    };
    let served = tokio::select! {
        served = server => served.map_err(|e| DaemonError::Serve(e.to_string())),
        () = grace => Ok(()),
    };
    // Whatever ended the server, no run outlives it; the emptied parent cgroup goes too.
    let parent = config.runs.cgroup_parent.clone();
    let _ = tokio::task::spawn_blocking(move || {
        manager.shutdown();
        if let Err(e) = crate::cgroup::sweep(&parent, true) {
            tracing::warn!(error = %e, "could not remove the parent cgroup");
        }
    })
    .await;
    let _ = std::fs::remove_file(&addr_path);
    served
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_key_files_are_checked() {
        let dir = std::env::temp_dir().join(format!("tollgate-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let signer = tollgate_receipt::ReceiptSigner::generate();
        let file = dir.join("keys.json");
        let entry = |id: &str| {
            serde_json::json!({"issuer": "a", "keys": [{
                "key_id": id,
                "public_key_hex": hex::encode(signer.public_key().as_bytes()),
            }]})
            .to_string()
        };
        std::fs::write(&file, entry(signer.key_id())).unwrap();
        let keys = read_key_file(&file).unwrap();
        assert!(keys.get(signer.key_id()).is_some());
        std::fs::write(&file, entry("0000000000000000")).unwrap();
        assert!(read_key_file(&file)
            .unwrap_err()
            .to_string()
            .contains("does not match"));
        std::fs::write(&file, "{\"keys\": []}").unwrap();
        assert!(read_key_file(&file)
            .unwrap_err()
            .to_string()
            .contains("no keys"));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
