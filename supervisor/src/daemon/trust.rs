//! The supervisor's link to the authority: the key set at start (retried with back-off)
//! and the revocation stream it follows for as long as it runs.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_stream::StreamExt as _;
use tollgate_proto::v1 as pb;
use tollgate_proto::v1::authority_client::AuthorityClient;
use tollgate_receipt::KeySet;

use tonic::transport::Channel;

use super::error::DaemonError;
use crate::link::{AuthorityLink, RevocationFreshness};
use crate::runs::{KeyRefresh, RunManager};

/// A client of the authority over a new connection.
async fn connect(link: &AuthorityLink) -> Result<AuthorityClient<Channel>, String> {
    let channel = link
        .endpoint()
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| tollgate_daemon::error_chain(&e))?;
    Ok(AuthorityClient::new(channel))
}

async fn fetch_keys(link: &AuthorityLink) -> Result<KeySet, String> {
    let mut client = connect(link).await?;
    let set = client
        .get_key_set(pb::GetKeySetRequest {})
        .await
        .map_err(|e| e.message().to_owned())?
        .into_inner();
    KeySet::from_proto(&set).map_err(|e| e.to_string())
}

/// Least time between two fetches of the key set for receipts signed by unknown keys: a
/// flood of receipts with made-up key ids costs the authority at most one call a second.
const MIN_REFRESH: Duration = Duration::from_secs(1);

/// How long such a fetch may take before the receipt is refused as it stands.
const REFRESH_TIMEOUT: Duration = Duration::from_secs(2);

/// A [`KeyRefresh`] over the authority at `url`: one fetch in flight (others wait for it and
/// then use its result), at most one per [`MIN_REFRESH`]. Called from blocking threads and
/// from the gateway's async tasks alike.
pub(super) fn key_refresh(link: AuthorityLink, runtime: tokio::runtime::Handle) -> KeyRefresh {
    let last = Mutex::new(None::<Instant>);
    Arc::new(move || {
        let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|at| at.elapsed() < MIN_REFRESH) {
            return None;
        }
        *last = Some(Instant::now());
        let fetch = tokio::time::timeout(REFRESH_TIMEOUT, fetch_keys(&link));
        let fetched = match tokio::runtime::Handle::try_current() {
            // On a runtime's thread: let it move its other work away while this waits.
            Ok(_) => tokio::task::block_in_place(|| runtime.block_on(fetch)),
            Err(_) => runtime.block_on(fetch),
        };
        match fetched {
            Ok(Ok(keys)) => Some(keys),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "could not refresh the key set");
                None
            }
            Err(_) => {
                tracing::warn!("the authority did not send its key set in time");
                None
            }
        }
    })
}

/// Fetches the key set, retrying with backoff for up to ~15 s.
pub(super) async fn initial_keys(link: &AuthorityLink) -> Result<KeySet, DaemonError> {
    let mut pause = Duration::from_millis(100);
    let mut last = String::new();
    for _ in 0..8 {
        match fetch_keys(link).await {
            Ok(keys) => return Ok(keys),
            Err(e) => last = e,
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(4));
    }
    Err(DaemonError::Authority {
        url: link.url.clone(),
        detail: last,
    })
}

/// Follows the authority's revocations forever, reconnecting with backoff; refreshes the key
/// set on every reconnect (a rotation adds keys).
pub(super) async fn follow_authority(
    link: AuthorityLink,
    supervisor_id: String,
    manager: Arc<RunManager>,
    last_seq: Arc<std::sync::atomic::AtomicU64>,
    caught_up: tokio::sync::watch::Sender<bool>,
    freshness: Arc<RevocationFreshness>,
) {
    let mut after = 0u64;
    // The authority's revocation history: a new one (a restored database) is read again
    // from the start.
    let mut history: Option<String> = None;
    let mut pause = Duration::from_millis(200);
    // Set once a stream was lost: the next one to catch up says it is back.
    let mut lost = false;
    loop {
        if let Ok(keys) = fetch_keys(&link).await {
            manager.set_keys(keys);
        }
        let stream = async {
            let mut client = connect(&link).await?;
            let mut stream = client
                .watch_revocations(pb::WatchRevocationsRequest {
                    after_seq: after,
                    supervisor_id: supervisor_id.clone(),
                })
                .await
                .map_err(|e| e.to_string())?
                .into_inner();
            while let Some(event) = stream.next().await {
                match event.map_err(|e| e.to_string())?.event {
                    Some(pb::revocation_event::Event::Revoked(revocation)) => {
                        after = after.max(revocation.seq);
                        tracing::info!(receipt_id = %revocation.receipt_id, "revocation received");
                        let manager = manager.clone();
                        let (id, reason) = (revocation.receipt_id, revocation.reason);
                        // Recorded before the seq is published, so a client that sees the
                        // seq can rely on the refusal.
                        let _ =
                            tokio::task::spawn_blocking(move || manager.revoke(&id, &reason)).await;
                        last_seq.fetch_max(after, std::sync::atomic::Ordering::Relaxed);
                    }
                    Some(pb::revocation_event::Event::KeySetChanged(changed)) => {
                        match changed.key_set.as_ref().map(KeySet::from_proto) {
                            Some(Ok(keys)) => {
                                tracing::info!(keys = keys.key_ids().count(), "the authority's key set changed");
                                manager.set_keys(keys);
                            }
                            _ => tracing::warn!("the authority announced a key set this supervisor cannot read; keeping the one it has"),
                        }
                    }
                    Some(pb::revocation_event::Event::CaughtUp(marker)) => {
                        if history.as_ref().is_some_and(|seen| *seen != marker.history) {
                            tracing::warn!(
                                "the authority's revocation history changed (its database was restored from a backup); reading it again from the start"
                            );
                            history = Some(marker.history);
                            after = 0;
                            return Err("the revocation history changed".to_owned());
                        }
                        history = Some(marker.history);
                        // Everything revoked while the link was down is applied by now.
                        freshness.caught_up();
                        let _ = caught_up.send(true);
                        crate::metrics::get().revocation_stream_up.set(1);
                        if lost {
                            tracing::info!(
                                after_seq = after,
                                "revocation stream reconnected and caught up"
                            );
                            lost = false;
                        }
                        // Reconnect promptly next time: this link worked.
                        pause = Duration::from_millis(200);
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
        lost = true;
        freshness.lost();
        crate::metrics::get().revocation_stream_up.set(0);
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(10));
    }
}
