//! Revocations: one receipt's, revoking a receipt with its descendants, and the ordered
//! list the revocation stream replays.

use rusqlite::{params, OptionalExtension as _, Transaction};
use tollgate_proto::v1 as pb;
use tollgate_receipt::timestamp_from_unix;

use super::{RevokedTree, Store};
use crate::error::AuthorityError;

impl Store {
    pub(super) fn revocation(
        &self,
        receipt_id: &str,
    ) -> Result<Option<pb::Revocation>, AuthorityError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT seq, receipt_id, revoked_at, reason, revoked_by, receipt_expires_at
                 FROM revocations WHERE receipt_id = ?1",
                params![receipt_id],
                revocation_from_row,
            )
            .optional()?)
    }

    /// Revokes `receipt_id` and every descendant not yet revoked, in one transaction:
    /// the receipt first (unless it already was), then its descendants breadth first (by
    /// depth, then id), one seq each, with the reason `ancestor <receipt_id> revoked:
    /// <reason>` (the receipt's recorded reason when it already was revoked). `before_commit`
    /// sees the descendants' new revocations and runs before anything is committed: an error
    /// from it rolls everything back (the audit entries go there, so none of it exists
    /// unaudited). `None` when there is no such receipt.
    pub fn revoke_tree<E>(
        &self,
        receipt_id: &str,
        reason: &str,
        revoked_by: &str,
        now: i64,
        before_commit: impl FnOnce(&[pb::Revocation]) -> Result<(), E>,
    ) -> Result<Option<RevokedTree>, E>
    where
        E: From<AuthorityError>,
    {
        let sql = |e: rusqlite::Error| E::from(AuthorityError::from(e));
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(sql)?;
        let expires_at: Option<i64> = tx
            .query_row(
                "SELECT expires_at FROM receipts WHERE receipt_id = ?1",
                params![receipt_id],
                |row| row.get(0),
            )
            .optional()
            .map_err(sql)?;
        let Some(expires_at) = expires_at else {
            return Ok(None);
        };
        let existing: Option<i64> = tx
            .query_row(
                "SELECT seq FROM revocations WHERE receipt_id = ?1",
                params![receipt_id],
                |row| row.get(0),
            )
            .optional()
            .map_err(sql)?;
        // Insert only when new: an ignored insert would still consume a seq number.
        if existing.is_none() {
            tx.execute(
                "INSERT INTO revocations (receipt_id, revoked_at, reason, revoked_by, receipt_expires_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![receipt_id, now, reason, revoked_by, expires_at],
            )
            .map_err(sql)?;
        }
        let revocation = tx
            .query_row(
                "SELECT seq, receipt_id, revoked_at, reason, revoked_by, receipt_expires_at
                 FROM revocations WHERE receipt_id = ?1",
                params![receipt_id],
                revocation_from_row,
            )
            .map_err(sql)?;
        // Every descendant still unrevoked. Also after a repeated revocation: a tree is
        // normally revoked whole, but this keeps it so whatever happened before.
        let descendants = unrevoked_descendants(&tx, receipt_id).map_err(sql)?;
        let cascade_reason = format!("ancestor {receipt_id} revoked: {}", revocation.reason);
        let mut cascaded = Vec::with_capacity(descendants.len());
        for (id, expires_at) in descendants {
            tx.execute(
                "INSERT INTO revocations (receipt_id, revoked_at, reason, revoked_by, receipt_expires_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![id, now, cascade_reason, revoked_by, expires_at],
            )
            .map_err(sql)?;
            cascaded.push(pb::Revocation {
                seq: tx.last_insert_rowid().max(0) as u64,
                receipt_id: id,
                revoked_at: Some(timestamp_from_unix(now)),
                reason: cascade_reason.clone(),
                revoked_by: revoked_by.to_owned(),
                receipt_expires_at: Some(timestamp_from_unix(expires_at)),
            });
        }
        before_commit(&cascaded)?;
        tx.commit().map_err(sql)?;
        Ok(Some(RevokedTree {
            revocation,
            already_revoked: existing.is_some(),
            cascaded,
        }))
    }

    /// Revocations with `seq > after_seq`, in order.
    pub fn revocations_after(&self, after_seq: u64) -> Result<Vec<pb::Revocation>, AuthorityError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT seq, receipt_id, revoked_at, reason, revoked_by, receipt_expires_at
             FROM revocations WHERE seq > ?1 ORDER BY seq",
        )?;
        let after = i64::try_from(after_seq).unwrap_or(i64::MAX);
        let rows = stmt.query_map(params![after], revocation_from_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

fn revocation_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<pb::Revocation> {
    Ok(pb::Revocation {
        seq: row.get::<_, i64>(0)?.max(0) as u64,
        receipt_id: row.get(1)?,
        revoked_at: Some(timestamp_from_unix(row.get(2)?)),
        reason: row.get(3)?,
        revoked_by: row.get(4)?,
        receipt_expires_at: Some(timestamp_from_unix(row.get(5)?)),
    })
}

/// The descendants of `receipt_id` not yet revoked, with their expiry, breadth first (by
/// depth, then id).
fn unrevoked_descendants(
    tx: &Transaction<'_>,
    receipt_id: &str,
) -> rusqlite::Result<Vec<(String, i64)>> {
    let mut stmt = tx.prepare(
        "WITH RECURSIVE tree(receipt_id, level) AS (
            SELECT receipt_id, 1 FROM receipts WHERE parent_receipt_id = ?1
            UNION
            SELECT r.receipt_id, t.level + 1
            FROM receipts r JOIN tree t ON r.parent_receipt_id = t.receipt_id
            -- No cycle can be stored (a parent exists before its child), but
            -- a damaged database must not loop while the store is locked.
            WHERE t.level < 1024
         )
         SELECT t.receipt_id, r.expires_at
         FROM tree t JOIN receipts r ON r.receipt_id = t.receipt_id
         WHERE NOT EXISTS (SELECT 1 FROM revocations v WHERE v.receipt_id = t.receipt_id)
         ORDER BY t.level, t.receipt_id",
    )?;
    let rows = stmt.query_map(params![receipt_id], |row| Ok((row.get(0)?, row.get(1)?)))?;
    rows.collect()
}
