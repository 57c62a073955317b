//! Group commit of minted receipts: concurrent mints share one audit fsync and one SQLite
//! transaction.
//!
//! Every mint makes two durable writes: its `receipt_minted` audit entry (first: no receipt
//! may exist unaudited) and its row. Done one mint at a time, the two fsync streams alternate
//! on one disk and halve the mint rate. A committer thread takes every mint queued while the
//! previous batch was being written, appends all their entries (one fsync, group-committed
//! by the audit writer), then stores all their rows in one transaction (one fsync). A mint is
//! answered only after both. The thread owns each job once queued, so a client hanging up
//! cannot interrupt a commit half-way.

use std::sync::mpsc;
use std::sync::Arc;

use tokio::sync::oneshot;
use tollgate_audit::{AuditLog, EntryDraft};
use tollgate_proto::v1 as pb;

use crate::entries::{refused, undone_entry};
use crate::error::{AuthorityError, CallError};
use crate::store::{Inserted, NewReceipt, Store};

/// Most mints in one batch.
const MAX_BATCH: usize = 256;

struct MintJob {
    receipt: pb::Receipt,
    signed: pb::SignedReceipt,
    delegated_by: Option<String>,
    entry: EntryDraft,
    reply: oneshot::Sender<Result<(), CallError>>,
}

/// Hands minted receipts to the committer thread.
#[derive(Debug, Clone)]
pub struct MintCommitter {
    jobs: mpsc::Sender<MintJob>,
}

impl MintCommitter {
    /// Starts the committer thread over `store` and `audit`; it ends when every handle is
    /// dropped.
    pub fn start(store: Arc<Store>, audit: AuditLog) -> Result<Self, AuthorityError> {
        let (jobs, queue) = mpsc::channel();
        std::thread::Builder::new()
            .name("mint-commit".into())
            .spawn(move || run(&queue, &store, &audit))
            .map_err(|e| AuthorityError::Task(format!("starting the mint committer: {e}")))?;
        Ok(Self { jobs })
    }

    /// Audits (`entry`, on disk before anything is stored) and stores one minted receipt,
    /// batched with whatever else is being minted. If the row then cannot be stored, a second
    /// entry says the mint was not done; so does a child receipt (`delegated_by` is the
    /// supervisor that asked) whose parent turns out to be revoked when its row is inserted,
    /// which fails with `PERMISSION_DENIED`.
    pub async fn commit(
        &self,
        receipt: pb::Receipt,
        signed: pb::SignedReceipt,
        delegated_by: Option<String>,
        entry: EntryDraft,
    ) -> Result<(), CallError> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(MintJob {
                receipt,
                signed,
                delegated_by,
                entry,
                reply,
            })
            .map_err(|_| AuthorityError::Task("the mint committer stopped".into()))?;
        answer
            .await
            .map_err(|_| AuthorityError::Task("the mint committer dropped a mint".into()))?
    }
}

fn run(queue: &mpsc::Receiver<MintJob>, store: &Store, audit: &AuditLog) {
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        commit_batch(batch, store, audit);
    }
}

fn commit_batch(batch: Vec<MintJob>, store: &Store, audit: &AuditLog) {
    // 1. Every entry handed over, then waited for: the audit writer group-commits them.
    let submitted: Vec<_> = batch
        .iter()
        .map(|job| audit.submit(job.entry.clone()))
        .collect();
    let mut audited = Vec::with_capacity(batch.len());
    for (job, pending) in batch.into_iter().zip(submitted) {
        match pending.and_then(tollgate_audit::PendingEntry::wait) {
            Ok(_) => audited.push(job),
            // Not audited: not stored either.
            Err(e) => {
                let _ = job
                    .reply
                    .send(Err(CallError::Internal(AuthorityError::Audit(e))));
            }
        }
    }
    if audited.is_empty() {
        return;
    }
    // 2. Every row in one transaction.
    let rows: Vec<_> = audited
        .iter()
        .map(|job| NewReceipt {
            receipt: &job.receipt,
            signed: &job.signed,
            delegated_by: job.delegated_by.as_deref(),
        })
        .collect();
    match store.insert_receipts(&rows) {
        Ok(outcomes) => {
            for (job, outcome) in audited.into_iter().zip(outcomes) {
                match outcome {
                    Inserted::Stored => {
                        tracing::info!(
                            receipt_id = %job.receipt.receipt_id,
                            owner = %job.receipt.owner,
                            subject = %job.receipt.subject,
                            key_id = %job.receipt.key_id,
                            parent_receipt_id = %job.receipt.parent_receipt_id,
                            depth = job.receipt.depth,
                            "minted receipt"
                        );
                        let _ = job.reply.send(Ok(()));
                    }
                    Inserted::ParentRevoked => {
                        let error = CallError::PermissionDenied(format!(
                            "parent receipt {} was revoked",
                            job.receipt.parent_receipt_id
                        ));
                        let undone =
                            undone_entry(refused(job.entry.clone(), &error), &error.to_string());
                        if let Err(e) = audit.append(undone) {
                            tracing::error!(error = %e, "could not audit a child not stored");
                        }
                        tracing::info!(
                            receipt_id = %job.receipt.receipt_id,
                            parent_receipt_id = %job.receipt.parent_receipt_id,
                            "child receipt not stored: its parent was revoked"
                        );
                        let _ = job.reply.send(Err(error));
                    }
                }
            }
        }
        Err(error) => {
            let message = error.to_string();
            for job in audited {
                let undone = undone_entry(job.entry.clone(), &message);
                if let Err(e) = audit.append(undone) {
                    tracing::error!(error = %e, "could not audit a failed mint");
                }
                let _ = job.reply.send(Err(CallError::Internal(AuthorityError::Task(
                    message.clone(),
                ))));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use prost::Message as _;
    use tollgate_audit::{AuditLog, AuditReader, Decision, EntryDraft, EntryKind};
    use tollgate_receipt::timestamp_from_unix;

    use super::*;
    use crate::error::AuthorityError;

    fn receipt(id: &str, parent: &str, depth: u32) -> (pb::Receipt, pb::SignedReceipt) {
        let receipt = pb::Receipt {
            receipt_id: id.into(),
            owner: "alice".into(),
            key_id: "k".into(),
            issued_at: Some(timestamp_from_unix(100)),
            expires_at: Some(timestamp_from_unix(10_000)),
            parent_receipt_id: parent.into(),
            depth,
            ..Default::default()
        };
        let signed = pb::SignedReceipt {
            receipt: receipt.encode_to_vec(),
            key_id: "k".into(),
            signature: vec![0; 64],
        };
        (receipt, signed)
    }

    #[tokio::test]
    async fn a_child_whose_parent_was_revoked_meanwhile_is_refused_and_audited_as_not_done() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(&dir.path().join("authority.db")).unwrap());
        store.activate_key("k", &[1; 32], 0).unwrap();
        let (parent, parent_signed) = receipt("p", "", 0);
        store
            .insert_receipts(&[NewReceipt {
                receipt: &parent,
                signed: &parent_signed,
                delegated_by: None,
            }])
            .unwrap();
        // Revoked after the service's checks passed and before the child's row goes in.
        store
            .revoke_tree::<AuthorityError>("p", "x", "alice", 1, |_| Ok(()))
            .unwrap();
        let audit =
            AuditLog::open(tollgate_audit::component_config(dir.path(), "authority").unwrap())
                .unwrap();
        let committer = MintCommitter::start(store.clone(), audit.clone()).unwrap();
        let (child, child_signed) = receipt("c", "p", 1);
        let entry = EntryDraft::new("authority", EntryKind::ReceiptMinted)
            .receipt("c")
            .decision(Decision::Allow);
        let refused = committer
            .commit(child, child_signed, Some("ws".into()), entry)
            .await
            .unwrap_err();
        assert!(
            matches!(&refused, CallError::PermissionDenied(m) if m == "parent receipt p was revoked"),
            "{refused}"
        );
        assert!(store.receipt("c").unwrap().is_none(), "never stored");
        drop(committer);
        audit.close().unwrap();
        let entries: Vec<_> = AuditReader::open(&dir.path().join("audit"))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let about_child: Vec<_> = entries
            .iter()
            .filter(|e| e.receipt_id.as_deref() == Some("c"))
            .collect();
        assert_eq!(about_child.len(), 2, "{about_child:?}");
        assert_eq!(about_child[0].decision, Some(Decision::Allow));
        assert_eq!(about_child[1].decision, Some(Decision::Deny));
        let reason = about_child[1].reason.as_deref().unwrap_or_default();
        assert!(
            reason.contains("not done") && reason.contains("was revoked"),
            "{reason}"
        );
    }
}
