//! The signing key ring: one active Ed25519 key on disk (0600), older public keys in SQLite.
//!
//! Rotation writes the new private key file first, then switches the active key in one
//! database transaction, then deletes the old private key: a crash at any point leaves either
//! the old or the new key active, and a retired key's file is swept at the next start.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use tollgate_daemon::files::write_atomic;
use tollgate_proto::v1 as pb;
use tollgate_receipt::{unix_now, ReceiptSigner};
use zeroize::Zeroizing;

use crate::error::AuthorityError;
use crate::files::ensure_private_dir;
use crate::store::Store;

/// The active signing key, replaceable by rotation.
#[derive(Debug)]
pub struct KeyRing {
    dir: PathBuf,
    active: RwLock<Arc<ReceiptSigner>>,
    // Serialises rotations (each is a file write plus a transaction).
    rotation: std::sync::Mutex<()>,
}

fn key_path(dir: &Path, key_id: &str) -> PathBuf {
    dir.join(format!("{key_id}.key"))
}

fn read_key(dir: &Path, key_id: &str) -> Result<ReceiptSigner, AuthorityError> {
    let path = key_path(dir, key_id);
    let error = |detail: String| AuthorityError::KeyFile {
        path: path.clone(),
        detail,
    };
    let text = Zeroizing::new(std::fs::read_to_string(&path).map_err(|e| {
        error(format!(
            "{e}; the database says key {key_id} is active, so its private key must be here"
        ))
    })?);
    let mut seed = Zeroizing::new([0u8; 32]);
    hex::decode_to_slice(text.trim(), seed.as_mut_slice())
        .map_err(|_| error("is not 64 hex characters".into()))?;
    let signer = ReceiptSigner::from_seed(&seed);
    if signer.key_id() != key_id {
        return Err(error(format!(
            "holds key {} instead of {key_id}",
            signer.key_id()
        )));
    }
    Ok(signer)
}

fn write_key(dir: &Path, signer: &ReceiptSigner) -> Result<(), AuthorityError> {
    let text = Zeroizing::new(format!("{}\n", hex::encode(signer.seed().as_slice())));
    let path = key_path(dir, signer.key_id());
    write_atomic(&path, text.as_bytes(), 0o600).map_err(AuthorityError::write_file(&path))
}

/// Removes `*.key` files other than the active key's: private keys that will never sign again
/// must not linger on disk.
fn sweep_inactive_key_files(dir: &Path, active_key_id: &str) -> Result<(), AuthorityError> {
    let error = |path: &Path, e: std::io::Error| AuthorityError::KeyFile {
        path: path.to_owned(),
        detail: format!("cannot remove inactive key: {e}"),
    };
    let entries = std::fs::read_dir(dir).map_err(|e| error(dir, e))?;
    for entry in entries {
        let path = entry.map_err(|e| error(dir, e))?.path();
        let is_key = path.extension().is_some_and(|ext| ext == "key");
        let is_active = path.file_stem().is_some_and(|stem| stem == active_key_id);
        if is_key && !is_active {
            std::fs::remove_file(&path).map_err(|e| error(&path, e))?;
            tracing::info!(path = %path.display(), "removed inactive private key");
        }
    }
    Ok(())
}

impl KeyRing {
    /// Loads the active key from `dir`, generating the first key on a fresh authority, and
    /// deletes every other private key file (retired keys, or a key whose rotation crashed
    /// before it became active).
    pub fn load(dir: PathBuf, store: &Store) -> Result<Self, AuthorityError> {
        ensure_private_dir(&dir)?;
        let keys = store.keys()?;
        let signer = match keys.iter().find(|k| k.active) {
            Some(active) => read_key(&dir, &active.key_id)?,
            None => {
                let signer = ReceiptSigner::generate();
                write_key(&dir, &signer)?;
                store.activate_key(signer.key_id(), signer.public_key().as_bytes(), unix_now())?;
                tracing::info!(key_id = signer.key_id(), "generated the first signing key");
                signer
            }
        };
        sweep_inactive_key_files(&dir, signer.key_id())?;
        Ok(Self {
            dir,
            active: RwLock::new(Arc::new(signer)),
            rotation: std::sync::Mutex::new(()),
        })
    }

    /// The key that signs new receipts.
    pub fn active(&self) -> Arc<ReceiptSigner> {
        self.active
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Generates a new active key and retires the current one. Blocking (file + database).
    pub fn rotate(&self, store: &Store) -> Result<(String, String), AuthorityError> {
        let _guard = self.rotation.lock().unwrap_or_else(|p| p.into_inner());
        let old = self.active();
        let new = ReceiptSigner::generate();
        write_key(&self.dir, &new)?;
        store.activate_key(new.key_id(), new.public_key().as_bytes(), unix_now())?;
        let new_id = new.key_id().to_owned();
        *self.active.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(new);
        // The old private key never signs again; its public key stays in the key set.
        let old_path = key_path(&self.dir, old.key_id());
        if let Err(e) = std::fs::remove_file(&old_path) {
            tracing::warn!(path = %old_path.display(), error = %e, "could not delete retired private key; it is swept at next start");
        }
        tracing::info!(new_key_id = %new_id, retired_key_id = old.key_id(), "rotated signing key");
        Ok((new_id, old.key_id().to_owned()))
    }
}

/// How long a retired key stays published after its last receipt expired, so verifiers whose
/// clocks lag (within their skew) still find it.
pub const RETIRED_KEY_GRACE_SECS: i64 = 300;

/// The public key set: the active key plus retired keys whose receipts have not all expired.
pub fn key_set(store: &Store, issuer: &str, now: i64) -> Result<pb::KeySet, AuthorityError> {
    let keys = store
        .keys()?
        .into_iter()
        .filter(|k| {
            // A key withdrawn by a restore verifies nothing, whatever it signed.
            k.withdrawn_at.is_none()
                && (k.active
                    || k.last_expiry
                        .is_some_and(|expiry| expiry.saturating_add(RETIRED_KEY_GRACE_SECS) > now))
        })
        .map(|k| k.to_proto())
        .collect();
    Ok(pb::KeySet {
        issuer: issuer.to_owned(),
        keys,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reload_keeps_the_active_key_and_sweeps_others() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("a.db")).unwrap();
        let keys_dir = dir.path().join("keys");
        let first = KeyRing::load(keys_dir.clone(), &store).unwrap();
        let active = first.active().key_id().to_owned();
        // A key written by a rotation that crashed before it was activated.
        let orphan = ReceiptSigner::generate();
        write_key(&keys_dir, &orphan).unwrap();
        let again = KeyRing::load(keys_dir.clone(), &store).unwrap();
        assert_eq!(again.active().key_id(), active);
        assert!(!key_path(&keys_dir, orphan.key_id()).exists());
        assert!(key_path(&keys_dir, &active).exists());

        let (new, old) = again.rotate(&store).unwrap();
        assert_eq!(old, active);
        assert!(!key_path(&keys_dir, &old).exists());
        assert_eq!(
            KeyRing::load(keys_dir, &store).unwrap().active().key_id(),
            new
        );
        let set = key_set(&store, "test", unix_now()).unwrap();
        assert_eq!(
            set.keys.len(),
            1,
            "a retired key that signed nothing is not published"
        );
    }
}
