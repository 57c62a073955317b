//! How a Tollgate daemon sets up its audit log: `<data-dir>/audit/` for the log and
//! `<data-dir>/audit-checkpoint.key` for the key that signs its checkpoints.
//!
//! The checkpoint key is the component's own Ed25519 identity for auditing, generated on first
//! start (mode 0600). It lives beside the log directory, not in it, so the log can be copied
//! or shipped without the key that vouches for it.

use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use ed25519_dalek::SigningKey;
use sha2::{Digest as _, Sha256};

use crate::{AuditConfig, AuditError};

/// The log directory under a data directory.
pub fn log_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("audit")
}

/// The checkpoint key file under a data directory.
pub fn checkpoint_key_path(data_dir: &Path) -> PathBuf {
    data_dir.join("audit-checkpoint.key")
}

/// A short id for a checkpoint key: the first 8 bytes of the SHA-256 of its public key, hex.
pub fn checkpoint_key_id(key: &SigningKey) -> String {
    hex::encode(&Sha256::digest(key.verifying_key().as_bytes())[..8])
}

/// Loads the checkpoint key of `data_dir`, generating it (0600, written with `O_EXCL` and
/// fsynced) on first start.
pub fn load_or_create_checkpoint_key(data_dir: &Path) -> Result<SigningKey, AuditError> {
    let path = checkpoint_key_path(data_dir);
    match fs::read_to_string(&path) {
        Ok(text) => parse_key(&path, &text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = SigningKey::generate(&mut rand_core::OsRng);
            let mut file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(|source| AuditError::Write {
                    path: path.clone(),
                    source,
                })?;
            file.write_all(format!("{}\n", hex::encode(key.to_bytes())).as_bytes())
                .and_then(|()| file.sync_all())
                .map_err(|source| AuditError::Write {
                    path: path.clone(),
                    source,
                })?;
            Ok(key)
        }
        Err(source) => Err(AuditError::Read { path, source }),
    }
}

fn parse_key(path: &Path, text: &str) -> Result<SigningKey, AuditError> {
    let bytes: [u8; 32] = hex::decode(text.trim())
        .ok()
        .and_then(|bytes| bytes.try_into().ok())
        .ok_or_else(|| AuditError::CheckpointKeyFile {
            path: path.to_owned(),
        })?;
    Ok(SigningKey::from_bytes(&bytes))
}

/// The configuration of `component`'s log under `data_dir`, with its checkpoint key loaded
/// (or created). Callers add the audit key and the redactor.
pub fn component_config(data_dir: &Path, component: &str) -> Result<AuditConfig, AuditError> {
    let key = load_or_create_checkpoint_key(data_dir)?;
    let id = checkpoint_key_id(&key);
    Ok(AuditConfig::new(log_dir(data_dir), component, key, id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checkpoint_key_is_created_once_and_private() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create_checkpoint_key(dir.path()).unwrap();
        let again = load_or_create_checkpoint_key(dir.path()).unwrap();
        assert_eq!(first.to_bytes(), again.to_bytes());
        let mode = fs::metadata(checkpoint_key_path(dir.path()))
            .unwrap()
            .permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        assert_eq!(checkpoint_key_id(&first).len(), 16);
        fs::write(checkpoint_key_path(dir.path()), "not hex").unwrap();
        assert!(matches!(
            load_or_create_checkpoint_key(dir.path()),
            Err(AuditError::CheckpointKeyFile { .. })
        ));
    }
}
