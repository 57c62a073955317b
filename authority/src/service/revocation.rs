//! Revoking receipts (with their descendants) and the revocation stream.

use std::pin::Pin;

use tokio::sync::{broadcast, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tollgate_audit::{AuditLog, Decision, EntryDraft, EntryKind};
use tollgate_proto::v1 as pb;
use tollgate_receipt::unix_now;
use tonic::{Request, Status};

use super::receipts::{check_owner, check_receipt_id};
use super::state::{blocking, AuthorityService, Refusal};
use crate::entries::{clip, refused, undone_entry, COMPONENT, MAX_REASON};
use crate::error::CallError;
use crate::keys::key_set;
use crate::store::{RevokedTree, Store};

/// The stream `WatchRevocations` answers with.
pub(super) type RevocationStream =
    Pin<Box<dyn Stream<Item = Result<pb::RevocationEvent, Status>> + Send>>;

fn revoked_event(revocation: pb::Revocation) -> pb::RevocationEvent {
    pb::RevocationEvent {
        event: Some(pb::revocation_event::Event::Revoked(revocation)),
    }
}

/// Completes once shutdown has been signalled.
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    // The guard wait_for returns is not Send; drop it here, inside this future.
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// Revokes `receipt_id` and its descendants ([`Store::revoke_tree`]), each descendant's
/// `receipt_revoked` entry (with `cascade_from` and its seq) on disk before the transaction
/// commits. If it then does not commit, each of those entries is followed by a "not done" one
/// (the caller writes the root's).
fn revoke_tree_audited(
    store: &Store,
    audit: &AuditLog,
    receipt_id: &str,
    reason: &str,
    by: &str,
) -> Result<RevokedTree, CallError> {
    let mut written: Vec<EntryDraft> = Vec::new();
    let result = store.revoke_tree(receipt_id, reason, by, unix_now(), |cascaded| {
        let drafts: Vec<EntryDraft> = cascaded
            .iter()
            .map(|revocation| {
                EntryDraft::new(COMPONENT, EntryKind::ReceiptRevoked)
                    .receipt(revocation.receipt_id.as_str())
                    .decision(Decision::Allow)
                    .reason(clip(&revocation.reason, MAX_REASON))
                    .meta("by", by)
                    .meta("cascade_from", receipt_id)
                    .meta("seq", i64::try_from(revocation.seq).unwrap_or(i64::MAX))
            })
            .collect();
        // Handed over together, so the audit writer commits them with one fsync.
        let pending: Vec<_> = drafts.iter().map(|d| audit.submit(d.clone())).collect();
        let mut failure = None;
        for (draft, entry) in drafts.into_iter().zip(pending) {
            match entry.and_then(tollgate_audit::PendingEntry::wait) {
                Ok(_) => written.push(draft),
                Err(e) => {
                    failure.get_or_insert(e);
                }
            }
        }
        match failure {
            None => Ok(()),
            Some(e) => Err(CallError::Internal(e.into())),
        }
    });
    let error = match result {
        Ok(Some(tree)) => return Ok(tree),
        Ok(None) => CallError::NotFound(format!("no receipt {receipt_id} (it vanished)")),
        Err(error) => error,
    };
    for draft in written {
        let undone = undone_entry(refused(draft, &error), &error.to_string());
        if let Err(e) = audit.append(undone) {
            tracing::error!(error = %e, "could not audit a cascade that was not done");
        }
    }
    Err(error)
}

/// What a refused `RevokeReceipt` asked for, by whom.
pub(super) fn asked_revoke(
    request: &pb::RevokeReceiptRequest,
    caller: String,
) -> impl FnOnce() -> EntryDraft {
    asked_about_receipt(EntryKind::ReceiptRevoked, &request.receipt_id, caller)
}

/// What a refused call about one receipt asked for, by whom: an entry of `kind` naming the
/// receipt (only a well-formed id goes in the never-redacted id field; anything else is kept,
/// clipped, as what was claimed).
pub(super) fn asked_about_receipt(
    kind: EntryKind,
    receipt_id: &str,
    caller: String,
) -> impl FnOnce() -> EntryDraft {
    let claimed = receipt_id.to_owned();
    move || {
        let draft = EntryDraft::new(COMPONENT, kind).meta("by", caller);
        if check_receipt_id(&claimed).is_ok() {
            draft.receipt(claimed)
        } else {
            draft.meta("claimed_receipt_id", clip(&claimed, 64))
        }
    }
}

impl AuthorityService {
    pub(super) async fn revoke(
        &self,
        request: Request<pb::RevokeReceiptRequest>,
    ) -> Result<pb::RevokeReceiptResponse, Refusal> {
        let operator = self.operator(request.metadata())?;
        let request = request.into_inner();
        check_receipt_id(&request.receipt_id)?;
        if request.reason.len() > 1024 {
            return Err(CallError::invalid("reason", "must be at most 1024 bytes").into());
        }
        let store = self.store.clone();
        let id = request.receipt_id.clone();
        let stored = blocking(move || store.receipt(&id))
            .await?
            .ok_or_else(|| CallError::NotFound(format!("no receipt {}", request.receipt_id)))?;
        check_owner(&operator, &stored.receipt)?;
        let store = self.store.clone();
        let audit = self.audit.clone();
        let by = operator.name.clone();
        // Every revocation request that passed the checks is recorded, also a repeated one.
        // It covers the receipt's descendants too (each then gets its own entry).
        let entry = EntryDraft::new(COMPONENT, EntryKind::ReceiptRevoked)
            .receipt(request.receipt_id.as_str())
            .decision(Decision::Allow)
            .reason(request.reason.as_str())
            .meta("by", by.as_str())
            .meta("cascade", true);
        let tree = self
            .commit_audited(entry, move || {
                revoke_tree_audited(&store, &audit, &request.receipt_id, &request.reason, &by)
            })
            .await?;
        if !tree.already_revoked {
            tracing::info!(receipt_id = %tree.revocation.receipt_id, seq = tree.revocation.seq, by = %operator.name, "revoked receipt");
            // No subscribers is fine: the revocation is durable and replayed on connect.
            let _ = self.revocations.send(tree.revocation.clone());
        }
        // In seq order, after the root's: watchers pass them on in that order.
        for revocation in &tree.cascaded {
            tracing::info!(receipt_id = %revocation.receipt_id, seq = revocation.seq, ancestor = %tree.revocation.receipt_id, "revoked descendant receipt");
            let _ = self.revocations.send(revocation.clone());
        }
        Ok(pb::RevokeReceiptResponse {
            revocation: Some(tree.revocation),
            already_revoked: tree.already_revoked,
            cascaded: tree
                .cascaded
                .into_iter()
                .map(|revocation| revocation.receipt_id)
                .collect(),
        })
    }

    pub(super) fn watch(&self, after_seq: u64) -> RevocationStream {
        let (tx, rx) = mpsc::channel(64);
        // Subscribe before reading the snapshot so nothing revoked in between is missed;
        // duplicates are dropped by seq.
        let mut live = self.revocations.subscribe();
        let mut key_sets = self.key_set_version.subscribe();
        let issuer = self.config.issuer.clone();
        let store = self.store.clone();
        let mut shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            // Counted while the stream is open, whichever way it ends.
            let metrics = crate::metrics::get();
            metrics.revocation_watchers.inc();
            let _open = WatcherGauge(metrics.revocation_watchers.clone());
            let mut last = after_seq;
            let replay = |after: u64| {
                let store = store.clone();
                blocking(move || store.revocations_after(after))
            };
            let snapshot = match replay(last).await {
                Ok(list) => list,
                Err(e) => {
                    let _ = tx.send(Err(Status::from(e))).await;
                    return;
                }
            };
            for revocation in snapshot {
                last = last.max(revocation.seq);
                if tx.send(Ok(revoked_event(revocation))).await.is_err() {
                    return;
                }
            }
            let history = {
                let store = store.clone();
                match blocking(move || store.history_id()).await {
                    Ok(history) => history,
                    Err(e) => {
                        let _ = tx.send(Err(Status::from(e))).await;
                        return;
                    }
                }
            };
            let caught_up = pb::RevocationEvent {
                event: Some(pb::revocation_event::Event::CaughtUp(pb::CaughtUp {
                    last_seq: last,
                    history,
                })),
            };
            if tx.send(Ok(caught_up)).await.is_err() {
                return;
            }
            loop {
                let pending = tokio::select! {
                    _ = stopped(&mut shutdown) => return,
                    _ = tx.closed() => return,
                    changed = key_sets.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        let (store, issuer) = (store.clone(), issuer.clone());
                        let event = match blocking(move || key_set(&store, &issuer, unix_now())).await {
                            Ok(key_set) => pb::RevocationEvent {
                                event: Some(pb::revocation_event::Event::KeySetChanged(
                                    pb::KeySetChanged { key_set: Some(key_set) },
                                )),
                            },
                            Err(e) => {
                                let _ = tx.send(Err(Status::from(e))).await;
                                return;
                            }
                        };
                        if tx.send(Ok(event)).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    message = live.recv() => match message {
                        // The next one in order: send it as it is.
                        Ok(revocation) if revocation.seq == last + 1 => vec![revocation],
                        // Already sent (it arrived in a replay).
                        Ok(revocation) if revocation.seq <= last => continue,
                        // A gap (concurrent revokes broadcast out of commit order) or a
                        // lagged receiver: the store is the truth, replay from it.
                        Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {
                            match replay(last).await {
                                Ok(list) => list,
                                Err(e) => {
                                    let _ = tx.send(Err(Status::from(e))).await;
                                    return;
                                }
                            }
                        }
                        Err(broadcast::error::RecvError::Closed) => return,
                    },
                };
                for revocation in pending {
                    if revocation.seq <= last {
                        continue;
                    }
                    last = revocation.seq;
                    if tx.send(Ok(revoked_event(revocation))).await.is_err() {
                        return;
                    }
                }
            }
        });
        Box::pin(ReceiverStream::new(rx))
    }
}

/// Takes one open stream off the watchers gauge when dropped.
struct WatcherGauge(prometheus_client::metrics::gauge::Gauge);

impl Drop for WatcherGauge {
    fn drop(&mut self) {
        self.0.dec();
    }
}
