//! Durable state of the authority in SQLite: keys, operators, enrolled supervisors, receipts
//! (with their delegation links) and revocations.
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

mod receipts;
mod revocations;

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
    // 2: delegation. Receipts record their depth and the supervisor that asked for them (the
    // parent link was written from the start); supervisors hold delegation tokens (hashes).
    "ALTER TABLE receipts ADD COLUMN depth INTEGER NOT NULL DEFAULT 0;
     ALTER TABLE receipts ADD COLUMN delegated_by TEXT;
     CREATE INDEX receipts_parent ON receipts(parent_receipt_id)
        WHERE parent_receipt_id IS NOT NULL;
     CREATE TABLE supervisors (
        supervisor_id TEXT PRIMARY KEY,
        token_hash    BLOB NOT NULL UNIQUE,
        created_at    INTEGER NOT NULL,
        created_by    TEXT NOT NULL
     );",
    // 3: restore. A restored database withdraws the keys it held (their receipts, some
    // minted after the backup and unknown to it, stop verifying) and starts a new
    // revocation history, so supervisors read it again from the start.
    "ALTER TABLE keys ADD COLUMN withdrawn_at INTEGER;
     CREATE TABLE history (id TEXT NOT NULL, since INTEGER NOT NULL);
     INSERT INTO history (id, since) VALUES (lower(hex(randomblob(16))), strftime('%s', 'now'));",
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

/// A supervisor enrolled for delegation (its token only as a hash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Supervisor {
    /// Its id, as in receipt audiences.
    pub supervisor_id: String,
    /// Unix seconds.
    pub created_at: i64,
    /// The admin that enrolled it.
    pub created_by: String,
}

/// One receipt to store.
#[derive(Debug, Clone, Copy)]
pub struct NewReceipt<'a> {
    /// The receipt as signed.
    pub receipt: &'a pb::Receipt,
    /// Its envelope.
    pub signed: &'a pb::SignedReceipt,
    /// For a child receipt, the supervisor that asked for it.
    pub delegated_by: Option<&'a str>,
}

/// What became of one receipt given to [`Store::insert_receipts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inserted {
    /// Stored.
    Stored,
    /// Not stored: it is a child and its parent is revoked (or gone). Checked in the same
    /// transaction as the insert, so no child of a revoked parent ever exists.
    ParentRevoked,
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
    /// When a restore withdrew it: it verifies nothing from then on.
    pub withdrawn_at: Option<i64>,
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

/// The outcome of [`Store::revoke_tree`].
#[derive(Debug, Clone, PartialEq)]
pub struct RevokedTree {
    /// The receipt's revocation (the earlier one when it already was revoked).
    pub revocation: pb::Revocation,
    /// Whether it already was revoked before.
    pub already_revoked: bool,
    /// Descendants revoked now, in seq order (breadth first).
    pub cascaded: Vec<pb::Revocation>,
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
                    (SELECT MAX(expires_at) FROM receipts r WHERE r.key_id = k.key_id),
                    k.withdrawn_at
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
                withdrawn_at: row.get(6)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The id of this database's revocation history (new after a restore).
    pub fn history_id(&self) -> Result<String, AuthorityError> {
        Ok(self
            .conn()
            .query_row("SELECT id FROM history", [], |row| row.get(0))?)
    }

    /// Makes a database restored from a backup safe to serve, in one transaction: every key
    /// it holds is withdrawn (no longer active, out of the key set: the receipts they signed,
    /// including any minted after the backup that this database never saw, stop verifying,
    /// and the next start generates a new key), and its revocation history gets a new id.
    /// Returns the withdrawn keys' ids.
    pub fn prepare_restored(&self, now: i64) -> Result<Vec<String>, AuthorityError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let withdrawn = {
            let mut stmt = tx.prepare("SELECT key_id FROM keys WHERE withdrawn_at IS NULL")?;
            let ids = stmt.query_map([], |row| row.get::<_, String>(0))?;
            ids.collect::<Result<Vec<_>, _>>()?
        };
        tx.execute(
            "UPDATE keys SET active = 0, retired_at = COALESCE(retired_at, ?1), withdrawn_at = ?1
             WHERE withdrawn_at IS NULL",
            [now],
        )?;
        tx.execute(
            "UPDATE history SET id = lower(hex(randomblob(16))), since = ?1",
            [now],
        )?;
        tx.commit()?;
        // Into the database file itself: the restore moves only that file into place.
        conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")?;
        Ok(withdrawn)
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

    /// Every enrolled supervisor with its token hash.
    pub fn supervisors(&self) -> Result<Vec<([u8; 32], Supervisor)>, AuthorityError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT token_hash, supervisor_id, created_at, created_by
             FROM supervisors ORDER BY supervisor_id",
        )?;
        let rows = stmt.query_map([], |row| {
            Ok((
                row.get::<_, Vec<u8>>(0)?,
                Supervisor {
                    supervisor_id: row.get(1)?,
                    created_at: row.get(2)?,
                    created_by: row.get(3)?,
                },
            ))
        })?;
        let mut supervisors = Vec::new();
        for row in rows {
            let (hash, supervisor) = row?;
            let hash: [u8; 32] = hash
                .try_into()
                .map_err(|_| AuthorityError::DatabaseCorrupt {
                    path: self.path.clone(),
                    detail: format!(
                        "supervisor {}: token hash is not 32 bytes",
                        supervisor.supervisor_id
                    ),
                })?;
            supervisors.push((hash, supervisor));
        }
        Ok(supervisors)
    }

    /// Removes an enrolled supervisor. Returns `false` when it was not enrolled.
    pub fn delete_supervisor(&self, supervisor_id: &str) -> Result<bool, AuthorityError> {
        let deleted = self.conn().execute(
            "DELETE FROM supervisors WHERE supervisor_id = ?1",
            params![supervisor_id],
        )?;
        Ok(deleted == 1)
    }

    /// Enrols a supervisor. Returns `false` (and changes nothing) when the id is taken.
    pub fn insert_supervisor(
        &self,
        token_hash: &[u8; 32],
        supervisor: &Supervisor,
    ) -> Result<bool, AuthorityError> {
        let inserted = self.conn().execute(
            "INSERT OR IGNORE INTO supervisors (supervisor_id, token_hash, created_at, created_by)
             VALUES (?1, ?2, ?3, ?4)",
            params![
                supervisor.supervisor_id,
                token_hash.as_slice(),
                supervisor.created_at,
                supervisor.created_by
            ],
        )?;
        Ok(inserted == 1)
    }
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

    /// A stored receipt `id` (child of `parent` when given), signed by a dummy key.
    fn put(store: &Store, id: &str, parent: Option<&str>, depth: u32) -> Vec<Inserted> {
        let receipt = pb::Receipt {
            receipt_id: id.into(),
            owner: "alice".into(),
            key_id: "k".into(),
            issued_at: Some(timestamp_from_unix(100)),
            expires_at: Some(timestamp_from_unix(10_000)),
            parent_receipt_id: parent.unwrap_or_default().into(),
            depth,
            ..Default::default()
        };
        let signed = pb::SignedReceipt {
            receipt: receipt.encode_to_vec(),
            key_id: "k".into(),
            signature: vec![0; 64],
        };
        store
            .insert_receipts(&[NewReceipt {
                receipt: &receipt,
                signed: &signed,
                delegated_by: parent.map(|_| "ws"),
            }])
            .unwrap()
    }

    fn store_with_key(dir: &Path) -> Store {
        let store = Store::open(&dir.join("authority.db")).unwrap();
        store.activate_key("k", &[1; 32], 0).unwrap();
        store
    }

    #[test]
    fn revoke_tree_revokes_descendants_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_with_key(dir.path());
        // p ── c1 ── g1
        //   └─ c2 ── g2 ── gg
        // plus an unrelated root and a child revoked on its own before.
        put(&store, "p", None, 0);
        put(&store, "c2", Some("p"), 1);
        put(&store, "c1", Some("p"), 1);
        put(&store, "g2", Some("c2"), 2);
        put(&store, "g1", Some("c1"), 2);
        put(&store, "gg", Some("g2"), 3);
        put(&store, "other", None, 0);
        put(&store, "c3", Some("p"), 1);
        let early = store
            .revoke_tree::<AuthorityError>("c3", "own", "bob", 5, |c| {
                assert!(c.is_empty());
                Ok(())
            })
            .unwrap()
            .unwrap();
        let mut seen = Vec::new();
        let tree = store
            .revoke_tree::<AuthorityError>("p", "leak", "alice", 7, |cascaded| {
                seen = cascaded.to_vec();
                Ok(())
            })
            .unwrap()
            .unwrap();
        assert!(!tree.already_revoked);
        assert_eq!(tree.revocation.receipt_id, "p");
        assert_eq!(tree.revocation.seq, early.revocation.seq + 1);
        let ids: Vec<&str> = tree
            .cascaded
            .iter()
            .map(|r| r.receipt_id.as_str())
            .collect();
        // Breadth first (depth, then id); c3 was already revoked and keeps its own entry.
        assert_eq!(ids, ["c1", "c2", "g1", "g2", "gg"]);
        assert_eq!(seen, tree.cascaded, "before_commit sees what is committed");
        for (i, r) in tree.cascaded.iter().enumerate() {
            assert_eq!(
                r.seq,
                tree.revocation.seq + 1 + i as u64,
                "one seq each, rising"
            );
            assert_eq!(r.reason, "ancestor p revoked: leak");
            assert_eq!(r.revoked_by, "alice");
        }
        let log = store.revocations_after(0).unwrap();
        let order: Vec<&str> = log.iter().map(|r| r.receipt_id.as_str()).collect();
        assert_eq!(order, ["c3", "p", "c1", "c2", "g1", "g2", "gg"]);
        assert_eq!(
            store
                .receipt("c3")
                .unwrap()
                .unwrap()
                .revocation
                .unwrap()
                .reason,
            "own"
        );
        assert!(store
            .receipt("other")
            .unwrap()
            .unwrap()
            .revocation
            .is_none());
        // Again: nothing new, the first revocation stands.
        let again = store
            .revoke_tree::<AuthorityError>("p", "again", "alice", 9, |_| Ok(()))
            .unwrap()
            .unwrap();
        assert!(again.already_revoked && again.cascaded.is_empty());
        assert_eq!(again.revocation.reason, "leak");
        assert_eq!(store.revocations_after(0).unwrap().len(), 7);
    }

    #[test]
    fn a_failed_before_commit_revokes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_with_key(dir.path());
        put(&store, "p", None, 0);
        put(&store, "c", Some("p"), 1);
        let result = store.revoke_tree("p", "x", "alice", 1, |cascaded| {
            assert_eq!(cascaded.len(), 1);
            Err(AuthorityError::Task("audit down".into()))
        });
        assert!(matches!(result, Err(AuthorityError::Task(_))));
        assert!(store.revocations_after(0).unwrap().is_empty());
        assert!(store
            .revoke_tree::<AuthorityError>("nope", "x", "alice", 1, |_| Ok(()))
            .unwrap()
            .is_none());
    }

    #[test]
    fn a_child_of_a_revoked_parent_is_not_inserted() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_with_key(dir.path());
        put(&store, "p", None, 0);
        assert_eq!(put(&store, "c", Some("p"), 1), [Inserted::Stored]);
        store
            .revoke_tree::<AuthorityError>("p", "x", "alice", 1, |_| Ok(()))
            .unwrap();
        assert_eq!(put(&store, "late", Some("p"), 1), [Inserted::ParentRevoked]);
        assert!(store.receipt("late").unwrap().is_none());
        // Nor a child of an unknown parent; roots are stored as ever.
        assert_eq!(
            put(&store, "orphan", Some("ghost"), 1),
            [Inserted::ParentRevoked]
        );
        assert_eq!(put(&store, "root", None, 0), [Inserted::Stored]);
        let conn = store.conn();
        let (depth, by): (u32, Option<String>) = conn
            .query_row(
                "SELECT depth, delegated_by FROM receipts WHERE receipt_id = 'c'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((depth, by.as_deref()), (1, Some("ws")));
    }

    #[test]
    fn supervisors_are_stored_once_by_id() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_with_key(dir.path());
        let ws = Supervisor {
            supervisor_id: "ws".into(),
            created_at: 3,
            created_by: "admin".into(),
        };
        assert!(store.insert_supervisor(&[7; 32], &ws).unwrap());
        assert!(!store.insert_supervisor(&[8; 32], &ws).unwrap(), "id taken");
        assert_eq!(store.supervisors().unwrap(), vec![([7; 32], ws)]);
    }

    #[test]
    fn migration_2_keeps_v1_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("authority.db");
        {
            // A database as version 1 wrote it, with a receipt and a revocation.
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(MIGRATIONS[0]).unwrap();
            conn.pragma_update(None, "user_version", 1).unwrap();
            conn.execute_batch(
                "INSERT INTO keys (key_id, public_key, created_at, active) VALUES ('k', x'01', 0, 1);
                 INSERT INTO receipts (receipt_id, owner, key_id, issued_at, expires_at, signed)
                    VALUES ('old', 'alice', 'k', 1, 99999, x'');
                 INSERT INTO revocations (receipt_id, revoked_at, reason, revoked_by, receipt_expires_at)
                    VALUES ('old', 2, 'why', 'alice', 99999);",
            )
            .unwrap();
        }
        let store = Store::open(&path).unwrap();
        let conn = store.conn();
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        let (owner, depth, by): (String, u32, Option<String>) = conn
            .query_row(
                "SELECT owner, depth, delegated_by FROM receipts WHERE receipt_id = 'old'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        assert_eq!((owner.as_str(), depth, by), ("alice", 0, None));
        drop(conn);
        let revocations = store.revocations_after(0).unwrap();
        assert_eq!(revocations.len(), 1);
        assert_eq!(revocations[0].reason, "why");
        assert!(store.supervisors().unwrap().is_empty());
        // Migration 3: no key withdrawn, a revocation history of its own.
        assert!(store
            .keys()
            .unwrap()
            .iter()
            .all(|k| k.withdrawn_at.is_none()));
        assert_eq!(store.history_id().unwrap().len(), 32);
    }

    #[test]
    fn a_restored_database_withdraws_every_key_and_renews_its_history() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("authority.db")).unwrap();
        store.activate_key("k1", &[1; 32], 100).unwrap();
        store.activate_key("k2", &[2; 32], 200).unwrap();
        let history = store.history_id().unwrap();
        let withdrawn = store.prepare_restored(300).unwrap();
        assert_eq!(withdrawn.len(), 2, "{withdrawn:?}");
        assert_ne!(store.history_id().unwrap(), history);
        let keys = store.keys().unwrap();
        assert!(
            keys.iter()
                .all(|k| !k.active && k.withdrawn_at == Some(300)),
            "{keys:?}"
        );
        let set = crate::keys::key_set(&store, "issuer", 300).unwrap();
        assert!(
            set.keys.is_empty(),
            "withdrawn keys verify nothing: {set:?}"
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
