//! Storing, reading and listing receipts.

use prost::Message as _;
use rusqlite::{params, OptionalExtension as _};
use tollgate_proto::v1 as pb;

use super::{Inserted, NewReceipt, ReceiptFilter, Store, StoredReceipt};
use crate::error::AuthorityError;

impl Store {
    /// Stores several receipts in one transaction (one fsync): all or none, except that a child
    /// whose parent is revoked (or missing) is skipped, checked in that transaction. Returns one
    /// outcome per receipt, in order.
    pub fn insert_receipts(
        &self,
        receipts: &[NewReceipt<'_>],
    ) -> Result<Vec<Inserted>, AuthorityError> {
        let seconds = |t: &Option<prost_types::Timestamp>| t.as_ref().map_or(0, |t| t.seconds);
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let mut outcomes = Vec::with_capacity(receipts.len());
        for new in receipts {
            let receipt = new.receipt;
            if !receipt.parent_receipt_id.is_empty() {
                // Revocation cascades to every stored descendant in one transaction; this check
                // closes the other order (a child committed after its parent's revocation).
                let parent_live: bool = tx.query_row(
                    "SELECT EXISTS (SELECT 1 FROM receipts WHERE receipt_id = ?1)
                        AND NOT EXISTS (SELECT 1 FROM revocations WHERE receipt_id = ?1)",
                    params![receipt.parent_receipt_id],
                    |row| row.get(0),
                )?;
                if !parent_live {
                    outcomes.push(Inserted::ParentRevoked);
                    continue;
                }
            }
            tx.execute(
                "INSERT INTO receipts (receipt_id, owner, key_id, issued_at, expires_at,
                                       parent_receipt_id, signed, depth, delegated_by)
                 VALUES (?1, ?2, ?3, ?4, ?5, NULLIF(?6, ''), ?7, ?8, ?9)",
                params![
                    receipt.receipt_id,
                    receipt.owner,
                    receipt.key_id,
                    seconds(&receipt.issued_at),
                    seconds(&receipt.expires_at),
                    receipt.parent_receipt_id,
                    new.signed.encode_to_vec(),
                    receipt.depth,
                    new.delegated_by,
                ],
            )?;
            outcomes.push(Inserted::Stored);
        }
        tx.commit()?;
        Ok(outcomes)
    }

    pub(super) fn decode_signed(
        &self,
        bytes: &[u8],
    ) -> Result<(pb::SignedReceipt, pb::Receipt), AuthorityError> {
        let corrupt = |detail: String| AuthorityError::DatabaseCorrupt {
            path: self.path.clone(),
            detail,
        };
        let signed = pb::SignedReceipt::decode(bytes)
            .map_err(|e| corrupt(format!("stored receipt envelope: {e}")))?;
        let receipt = pb::Receipt::decode(signed.receipt.as_slice())
            .map_err(|e| corrupt(format!("stored receipt: {e}")))?;
        Ok((signed, receipt))
    }

    /// One receipt and its revocation.
    pub fn receipt(&self, receipt_id: &str) -> Result<Option<StoredReceipt>, AuthorityError> {
        let row: Option<Vec<u8>> = self
            .conn()
            .query_row(
                "SELECT signed FROM receipts WHERE receipt_id = ?1",
                params![receipt_id],
                |row| row.get(0),
            )
            .optional()?;
        let Some(bytes) = row else { return Ok(None) };
        let (signed, receipt) = self.decode_signed(&bytes)?;
        let revocation = self.revocation(receipt_id)?;
        Ok(Some(StoredReceipt {
            signed,
            receipt,
            revocation,
        }))
    }

    /// Receipts matching `filter`, newest first, with their revocation state.
    pub fn list_receipts(
        &self,
        filter: &ReceiptFilter,
    ) -> Result<Vec<(pb::Receipt, bool)>, AuthorityError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT r.signed, EXISTS (SELECT 1 FROM revocations v WHERE v.receipt_id = r.receipt_id)
             FROM receipts r
             WHERE (?1 IS NULL OR r.owner = ?1)
               AND (?2 IS NULL OR r.receipt_id < ?2)
               AND (?3 OR r.expires_at > ?4)
             ORDER BY r.receipt_id DESC
             LIMIT ?5",
        )?;
        let rows = stmt.query_map(
            params![
                filter.owner,
                filter.before_id,
                filter.include_expired,
                filter.now,
                filter.limit
            ],
            |row| Ok((row.get::<_, Vec<u8>>(0)?, row.get::<_, bool>(1)?)),
        )?;
        let mut out = Vec::new();
        for row in rows {
            let (bytes, revoked) = row?;
            out.push((self.decode_signed(&bytes)?.1, revoked));
        }
        Ok(out)
    }
}
