//! Durable state of the authority in SQLite: keys, operators, receipts and revocations.
//!
//! Opened with WAL and `synchronous=FULL`, so every committed mint or revocation survives a
//! crash or power loss; an integrity check runs on every open and a damaged database stops
//! the daemon instead of being reset. Schema changes are numbered migrations tracked in
//! `PRAGMA user_version`.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use prost::Message as _;
use rusqlite::{params, Connection, ErrorCode, OpenFlags, OptionalExtension as _};
use tollgate_proto::v1 as pb;
use tollgate_receipt::timestamp_from_unix;

use crate::error::AuthorityError;

/// Numbered schema migrations; index + 1 is the version each one produces.
const MIGRATIONS: &[&str] = &[
    // 1: initial schema.
    "CREATE TABLE keys (
        key_id      TEXT PRIMARY KEY,
        public_key  BLOB NOT NULL,
        created_at  INTEGER NOT NULL,
        retired_at  INTEGER,
        active      INTEGER NOT NULL DEFAULT 0
     );
     CREATE UNIQUE INDEX keys_one_active ON keys(active) WHERE active = 1;
     CREATE TABLE operators (
        name        TEXT PRIMARY KEY,
        token_hash  BLOB NOT NULL UNIQUE,
        admin       INTEGER NOT NULL,
        ceiling     BLOB NOT NULL,
        created_at  INTEGER NOT NULL,
        created_by  TEXT NOT NULL DEFAULT ''
     );
     CREATE TABLE receipts (
        receipt_id        TEXT PRIMARY KEY,
        owner             TEXT NOT NULL,
        key_id            TEXT NOT NULL REFERENCES keys(key_id),
        issued_at         INTEGER NOT NULL,
        expires_at        INTEGER NOT NULL,
        parent_receipt_id TEXT,
        signed            BLOB NOT NULL
     );
     CREATE INDEX receipts_owner ON receipts(owner, receipt_id);
     CREATE INDEX receipts_key_expiry ON receipts(key_id, expires_at);
     CREATE TABLE revocations (
        seq                INTEGER PRIMARY KEY AUTOINCREMENT,
        receipt_id         TEXT NOT NULL UNIQUE REFERENCES receipts(receipt_id),
        revoked_at         INTEGER NOT NULL,
        reason             TEXT NOT NULL,
        revoked_by         TEXT NOT NULL,
        receipt_expires_at INTEGER NOT NULL
     );",
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// An operator as stored (its token only as a hash).
#[derive(Debug, Clone, PartialEq)]
pub struct Operator {
    /// Unique name; the `owner` of its receipts.
    pub name: String,
    /// May administer the authority.
    pub admin: bool,
    /// The most it may grant.
    pub ceiling: pb::Ceiling,
    /// Unix seconds.
    pub created_at: i64,
    /// The admin that created it; empty for the bootstrap admin.
    pub created_by: String,
}

/// A signing key's public record.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredKey {
    /// Key id.
    pub key_id: String,
    /// 32-byte public key.
    pub public_key: Vec<u8>,
    /// Unix seconds.
    pub created_at: i64,
    /// When it stopped signing, for a retired key.
    pub retired_at: Option<i64>,
    /// Whether it signs new receipts.
    pub active: bool,
    /// Latest expiry among receipts it signed, if any.
    pub last_expiry: Option<i64>,
}

impl StoredKey {
    /// The protocol form.
    pub fn to_proto(&self) -> pb::PublicKey {
        pb::PublicKey {
            key_id: self.key_id.clone(),
            public_key: self.public_key.clone(),
            created_at: Some(timestamp_from_unix(self.created_at)),
            active: self.active,
            retired_at: self.retired_at.map(timestamp_from_unix),
            verify_until: if self.active {
                None
            } else {
                self.last_expiry.map(timestamp_from_unix)
            },
        }
    }
}

/// A stored receipt with its revocation, if any.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredReceipt {
    /// The envelope exactly as minted.
    pub signed: pb::SignedReceipt,
    /// The decoded receipt.
    pub receipt: pb::Receipt,
    /// Set when revoked.
    pub revocation: Option<pb::Revocation>,
}

/// Which receipts to list.
#[derive(Debug, Clone, Default)]
pub struct ReceiptFilter {
    /// Only this owner's.
    pub owner: Option<String>,
    /// Only receipts older than this id (paging, newest first).
    pub before_id: Option<String>,
    /// At most this many.
    pub limit: u32,
    /// Include receipts that expired before `now`.
    pub include_expired: bool,
    /// The clock, Unix seconds.
    pub now: i64,
}

/// The authority's SQLite database.
#[derive(Debug)]
pub struct Store {
    path: PathBuf,
    conn: Mutex<Connection>,
}

fn classify_open_error(path: &Path, error: rusqlite::Error) -> AuthorityError {
    match error.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) | Some(ErrorCode::DatabaseCorrupt) => {
            AuthorityError::DatabaseCorrupt {
                path: path.to_owned(),
                detail: error.to_string(),
            }
        }
        _ => AuthorityError::DatabaseUnreadable {
            path: path.to_owned(),
            detail: error.to_string(),
        },
    }
}

impl Store {
    /// Opens (creating if absent) the database, checks its integrity and migrates its schema.
    pub fn open(path: &Path) -> Result<Self, AuthorityError> {
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| classify_open_error(path, e))?;
        // The first statements are where SQLite notices a file that is not a database.
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
            .map_err(|e| classify_open_error(path, e))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(AuthorityError::DatabaseUnreadable {
                path: path.to_owned(),
                detail: format!("could not enable WAL journaling (got {mode})"),
            });
        }
        conn.execute_batch(
            "PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; PRAGMA busy_timeout = 5000;",
        )
        .map_err(|e| classify_open_error(path, e))?;
        let check: Vec<String> = conn
            .prepare("PRAGMA integrity_check")
            .and_then(|mut stmt| {
                stmt.query_map([], |row| row.get(0))?
                    .collect::<Result<_, _>>()
            })
            .map_err(|e| classify_open_error(path, e))?;
        if check.first().map(String::as_str) != Some("ok") {
            return Err(AuthorityError::DatabaseCorrupt {
                path: path.to_owned(),
                detail: check.into_iter().take(3).collect::<Vec<_>>().join("; "),
            });
        }
        let store = Self {
            path: path.to_owned(),
            conn: Mutex::new(conn),
        };
        store.migrate()?;
        Ok(store)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves SQLite consistent (open transactions roll
        // back on drop), so a poisoned lock is safe to reuse.
        self.conn
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn migrate(&self) -> Result<(), AuthorityError> {
        let mut conn = self.conn();
        let found: i64 = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
        if found > SCHEMA_VERSION {
            return Err(AuthorityError::SchemaTooNew {
                path: self.path.clone(),
                found,
                supported: SCHEMA_VERSION,
            });
        }
        for (index, sql) in MIGRATIONS.iter().enumerate().skip(found.max(0) as usize) {
            let version = index as i64 + 1;
            let tx = conn.transaction()?;
            tx.execute_batch(sql)?;
            tx.pragma_update(None, "user_version", version)?;
            tx.commit()?;
            tracing::info!(version, "applied schema migration");
        }
        Ok(())
    }

    /// Every key record, newest first, with the latest expiry of the receipts each signed.
    pub fn keys(&self) -> Result<Vec<StoredKey>, AuthorityError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT k.key_id, k.public_key, k.created_at, k.retired_at, k.active,
                    (SELECT MAX(expires_at) FROM receipts r WHERE r.key_id = k.key_id)
             FROM keys k ORDER BY k.created_at DESC, k.rowid DESC",
        )?;
        let rows = stmt.query_map([], |row| {
            Ok(StoredKey {
                key_id: row.get(0)?,
                public_key: row.get(1)?,
                created_at: row.get(2)?,
                retired_at: row.get(3)?,
                active: row.get(4)?,
                last_expiry: row.get(5)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Records `key_id` as the active signing key, retiring the previous one (if any) at
    /// `now`, in one transaction. Returns the retired key's id.
    pub fn activate_key(
        &self,
        key_id: &str,
        public_key: &[u8],
        now: i64,
    ) -> Result<Option<String>, AuthorityError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let previous: Option<String> = tx
            .query_row("SELECT key_id FROM keys WHERE active = 1", [], |row| {
                row.get(0)
            })
            .optional()?;
        tx.execute(
            "UPDATE keys SET active = 0, retired_at = ?1 WHERE active = 1",
            params![now],
        )?;
        tx.execute(
            "INSERT INTO keys (key_id, public_key, created_at, active) VALUES (?1, ?2, ?3, 1)",
            params![key_id, public_key, now],
        )?;
        tx.commit()?;
        Ok(previous)
    }

    /// All operators with their token hashes.
    pub fn operators(&self) -> Result<Vec<([u8; 32], Operator)>, AuthorityError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT token_hash, name, admin, ceiling, created_at, created_by
             FROM operators ORDER BY name",
        )?;
        let rows = stmt.query_map([], |row| {
            let hash: Vec<u8> = row.get(0)?;
            let ceiling: Vec<u8> = row.get(3)?;
            Ok((
                hash,
                row.get(1)?,
                row.get(2)?,
                ceiling,
                row.get(4)?,
                row.get(5)?,
            ))
        })?;
        let mut operators = Vec::new();
        for row in rows {
            let (hash, name, admin, ceiling, created_at, created_by) = row?;
            let corrupt = |what: &str| AuthorityError::DatabaseCorrupt {
                path: self.path.clone(),
                detail: format!("operator {name}: {what}"),
            };
            let hash: [u8; 32] = hash
                .try_into()
                .map_err(|_| corrupt("token hash is not 32 bytes"))?;
            let ceiling = pb::Ceiling::decode(ceiling.as_slice())
                .map_err(|_| corrupt("ceiling does not decode"))?;
            operators.push((
                hash,
                Operator {
                    name,
                    admin,
                    ceiling,
                    created_at,
                    created_by,
                },
            ));
        }
        Ok(operators)
    }

    /// Adds an operator. Returns `false` (and changes nothing) when the name is taken.
    pub fn insert_operator(
        &self,
        token_hash: &[u8; 32],
        operator: &Operator,
    ) -> Result<bool, AuthorityError> {
        let inserted = self.conn().execute(
            "INSERT OR IGNORE INTO operators (name, token_hash, admin, ceiling, created_at, created_by)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                operator.name,
                token_hash.as_slice(),
                operator.admin,
                operator.ceiling.encode_to_vec(),
                operator.created_at,
                operator.created_by
            ],
        )?;
        Ok(inserted == 1)
    }

    /// Stores several receipts in one transaction (one fsync): all or none.
    pub fn insert_receipts(
        &self,
        receipts: &[(&pb::Receipt, &pb::SignedReceipt)],
    ) -> Result<(), AuthorityError> {
        let seconds = |t: &Option<prost_types::Timestamp>| t.as_ref().map_or(0, |t| t.seconds);
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        for (receipt, signed) in receipts {
            tx.execute(
                "INSERT INTO receipts (receipt_id, owner, key_id, issued_at, expires_at, parent_receipt_id, signed)
                 VALUES (?1, ?2, ?3, ?4, ?5, NULLIF(?6, ''), ?7)",
                params![
                    receipt.receipt_id,
                    receipt.owner,
                    receipt.key_id,
                    seconds(&receipt.issued_at),
                    seconds(&receipt.expires_at),
                    receipt.parent_receipt_id,
                    signed.encode_to_vec()
                ],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    fn decode_signed(
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

    fn revocation(&self, receipt_id: &str) -> Result<Option<pb::Revocation>, AuthorityError> {
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

    /// Records a revocation. Returns the recorded revocation and whether it already existed.
    pub fn revoke(
        &self,
        receipt_id: &str,
        reason: &str,
        revoked_by: &str,
        now: i64,
    ) -> Result<Option<(pb::Revocation, bool)>, AuthorityError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let expires_at: Option<i64> = tx
            .query_row(
                "SELECT expires_at FROM receipts WHERE receipt_id = ?1",
                params![receipt_id],
                |row| row.get(0),
            )
            .optional()?;
        let Some(expires_at) = expires_at else {
            return Ok(None);
        };
        let existing: Option<i64> = tx
            .query_row(
                "SELECT seq FROM revocations WHERE receipt_id = ?1",
                params![receipt_id],
                |row| row.get(0),
            )
            .optional()?;
        // Insert only when new: an ignored insert would still consume a seq number.
        if existing.is_none() {
            tx.execute(
                "INSERT INTO revocations (receipt_id, revoked_at, reason, revoked_by, receipt_expires_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![receipt_id, now, reason, revoked_by, expires_at],
            )?;
        }
        let revocation = tx.query_row(
            "SELECT seq, receipt_id, revoked_at, reason, revoked_by, receipt_expires_at
             FROM revocations WHERE receipt_id = ?1",
            params![receipt_id],
            revocation_from_row,
        )?;
        tx.commit()?;
        Ok(Some((revocation, existing.is_some())))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_file_is_reported_corrupt_not_reset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("authority.db");
        std::fs::write(&path, vec![0x5a; 8192]).unwrap();
        let error = Store::open(&path).unwrap_err();
        assert!(
            matches!(error, AuthorityError::DatabaseCorrupt { .. }),
            "{error}"
        );
        // The file is untouched.
        assert_eq!(std::fs::read(&path).unwrap(), vec![0x5a; 8192]);
    }

    #[test]
    fn newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("authority.db");
        drop(Store::open(&path).unwrap());
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
        drop(conn);
        let error = Store::open(&path).unwrap_err();
        assert!(
            matches!(error, AuthorityError::SchemaTooNew { .. }),
            "{error}"
        );
    }

    #[test]
    fn reopen_keeps_schema_and_settings() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("authority.db");
        drop(Store::open(&path).unwrap());
        let store = Store::open(&path).unwrap();
        let conn = store.conn();
        let sync: i64 = conn
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .unwrap();
        assert_eq!(sync, 2, "synchronous must be FULL");
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
    }
}
