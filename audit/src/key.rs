//! The optional audit key that turns entry hashes into HMACs.

use std::path::Path;

use hmac::{Hmac, Mac as _};
use sha2::Sha256;

use crate::error::AuditError;

/// The environment variable the daemons and `tollgate audit` read the audit key from when no
/// key file is given.
pub const AUDIT_KEY_ENV: &str = "TOLLGATE_AUDIT_KEY";

/// A secret key for HMAC-SHA-256 entry hashes: at least 32 bytes, never written to the log.
///
/// Its text form (file contents or environment variable) is either hex (one trailing newline
/// allowed) or the raw bytes; text made only of hex digits is always read as hex.
#[derive(Clone)]
pub struct AuditKey {
    bytes: Vec<u8>,
}

impl AuditKey {
    /// The shortest key accepted, in bytes.
    pub const MIN_LEN: usize = 32;

    /// The key made of exactly these bytes (no hex decoding).
    pub fn from_bytes(bytes: impl Into<Vec<u8>>) -> Result<Self, AuditError> {
        Self::checked(bytes.into(), "the given bytes".into())
    }

    /// Reads a key file (hex or raw). Warns if other users can read it.
    pub fn from_file(path: &Path) -> Result<Self, AuditError> {
        use std::os::unix::fs::PermissionsExt as _;
        let bytes = std::fs::read(path).map_err(|source| AuditError::KeyFile {
            path: path.to_owned(),
            source,
        })?;
        if let Ok(meta) = std::fs::metadata(path) {
            if meta.permissions().mode() & 0o077 != 0 {
                tracing::warn!(path = %path.display(), "audit key file is accessible to other users; chmod 600 it");
            }
        }
        Self::parse(bytes, format!("key file {}", path.display()))
    }

    /// The configured key: read from `file` when given, else from [`AUDIT_KEY_ENV`] when it is
    /// set, else none (plain SHA-256 hashes).
    pub fn configured(file: Option<&Path>) -> Result<Option<Self>, AuditError> {
        match file {
            Some(file) => Self::from_file(file).map(Some),
            None if std::env::var_os(AUDIT_KEY_ENV).is_some() => {
                Self::from_env(AUDIT_KEY_ENV).map(Some)
            }
            None => Ok(None),
        }
    }

    /// Reads the key from environment variable `name` (hex or raw).
    pub fn from_env(name: &str) -> Result<Self, AuditError> {
        use std::os::unix::ffi::OsStringExt as _;
        let value = std::env::var_os(name).ok_or_else(|| AuditError::KeyEnvMissing {
            name: name.to_owned(),
        })?;
        Self::parse(value.into_vec(), format!("environment variable {name}"))
    }

    fn parse(bytes: Vec<u8>, origin: String) -> Result<Self, AuditError> {
        let text = bytes
            .strip_suffix(b"\r\n")
            .or_else(|| bytes.strip_suffix(b"\n"))
            .unwrap_or(&bytes);
        let is_hex = !text.is_empty()
            && text.len().is_multiple_of(2)
            && text.iter().all(u8::is_ascii_hexdigit);
        if is_hex {
            let decoded = hex::decode(text).map_err(|_| AuditError::KeyTooShort {
                origin: origin.clone(),
                len: 0,
            })?;
            Self::checked(decoded, origin)
        } else {
            Self::checked(bytes, origin)
        }
    }

    fn checked(bytes: Vec<u8>, origin: String) -> Result<Self, AuditError> {
        if bytes.len() < Self::MIN_LEN {
            return Err(AuditError::KeyTooShort {
                origin,
                len: bytes.len(),
            });
        }
        Ok(Self { bytes })
    }

    /// A fresh HMAC-SHA-256 instance under this key.
    pub(crate) fn mac(&self) -> Hmac<Sha256> {
        Hmac::<Sha256>::new_from_slice(&self.bytes).expect("HMAC takes keys of any length")
    }
}

impl std::fmt::Debug for AuditKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret, nor anything derived from it.
        f.write_str("AuditKey(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_and_raw_forms() {
        let hex_text = format!("{}\n", "ab".repeat(32));
        let key = AuditKey::parse(hex_text.into_bytes(), "test".into()).unwrap();
        assert_eq!(key.bytes, vec![0xab; 32]);
        let raw = vec![0xffu8; 40];
        assert_eq!(
            AuditKey::parse(raw.clone(), "test".into()).unwrap().bytes,
            raw
        );
        // 40 hex digits are read as hex: 20 bytes, too short, and the error says so.
        let short = AuditKey::parse("ab".repeat(20).into_bytes(), "test".into()).unwrap_err();
        assert!(short.to_string().contains("20 bytes"), "{short}");
    }

    #[test]
    fn debug_prints_nothing_secret() {
        let key =
            AuditKey::from_bytes(b"0123456789abcdef0123456789abcdef-secret".to_vec()).unwrap();
        let shown = format!("{key:?}");
        assert!(
            !shown.contains("secret") && !shown.contains("0123"),
            "{shown}"
        );
    }

    #[test]
    fn from_file_and_env() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.key");
        std::fs::write(&path, "cd".repeat(32)).unwrap();
        assert_eq!(AuditKey::from_file(&path).unwrap().bytes, vec![0xcd; 32]);
        assert!(matches!(
            AuditKey::from_env("TOLLGATE_AUDIT_TEST_SURELY_UNSET"),
            Err(AuditError::KeyEnvMissing { .. })
        ));
    }
}
