//! Strict verification of signed receipts, with one typed reason per failure.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use ed25519_dalek::{Signature, VerifyingKey};
use prost::Message as _;
use tollgate_proto::v1 as pb;

use crate::{key_id, public_key_from_bytes, signing_message, Receipt, SignedReceipt};

/// Why a receipt was rejected. Each variant is one kind of failure a caller can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// The bytes or text are not a well-formed signed receipt.
    #[error("malformed receipt: {reason}")]
    Malformed {
        /// What was wrong.
        reason: String,
    },
    /// The signing key id is not in the trusted key set.
    #[error("unknown signing key {key_id}: not in the trusted key set (fetch the authority's current key set)")]
    UnknownKey {
        /// The key id the envelope names.
        key_id: String,
    },
    /// The signature does not verify (strictly) over the domain prefix and receipt bytes.
    #[error("bad signature: the receipt was altered or not signed by key {key_id}")]
    BadSignature {
        /// The key id the envelope names.
        key_id: String,
    },
    /// `not_before` is still in the future (beyond the clock skew).
    #[error("receipt {receipt_id} is not valid until {} (now {})", crate::rfc3339(*not_before), crate::rfc3339(*now))]
    NotYetValid {
        /// The receipt's id.
        receipt_id: String,
        /// Its `not_before`, Unix seconds.
        not_before: i64,
        /// The verifier's clock, Unix seconds.
        now: i64,
    },
    /// `expires_at` has passed (beyond the clock skew).
    #[error("receipt {receipt_id} expired at {} (now {})", crate::rfc3339(*expires_at), crate::rfc3339(*now))]
    Expired {
        /// The receipt's id.
        receipt_id: String,
        /// Its `expires_at`, Unix seconds.
        expires_at: i64,
        /// The verifier's clock, Unix seconds.
        now: i64,
    },
    /// The verifier's id is not in the receipt's audience.
    #[error("receipt {receipt_id} is not for {expected:?}; its audience is {audience:?}")]
    WrongAudience {
        /// The receipt's id.
        receipt_id: String,
        /// The verifier's own id.
        expected: String,
        /// The receipt's audience.
        audience: Vec<String>,
    },
    /// The receipt has been revoked.
    #[error("receipt {receipt_id} has been revoked")]
    Revoked {
        /// The receipt's id.
        receipt_id: String,
    },
}

/// The kind of a [`VerifyError`], as a stable machine-readable code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VerifyFailure {
    /// See [`VerifyError::Malformed`].
    Malformed,
    /// See [`VerifyError::UnknownKey`].
    UnknownKey,
    /// See [`VerifyError::BadSignature`].
    BadSignature,
    /// See [`VerifyError::NotYetValid`].
    NotYetValid,
    /// See [`VerifyError::Expired`].
    Expired,
    /// See [`VerifyError::WrongAudience`].
    WrongAudience,
    /// See [`VerifyError::Revoked`].
    Revoked,
}

impl VerifyFailure {
    /// Snake-case code, used in JSON output and by clients in other languages.
    pub fn code(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::UnknownKey => "unknown_key",
            Self::BadSignature => "bad_signature",
            Self::NotYetValid => "not_yet_valid",
            Self::Expired => "expired",
            Self::WrongAudience => "wrong_audience",
            Self::Revoked => "revoked",
        }
    }
}

impl VerifyError {
    pub(crate) fn malformed(reason: impl Into<String>) -> Self {
        Self::Malformed {
            reason: reason.into(),
        }
    }

    /// The kind of failure.
    pub fn failure(&self) -> VerifyFailure {
        match self {
            Self::Malformed { .. } => VerifyFailure::Malformed,
            Self::UnknownKey { .. } => VerifyFailure::UnknownKey,
            Self::BadSignature { .. } => VerifyFailure::BadSignature,
            Self::NotYetValid { .. } => VerifyFailure::NotYetValid,
            Self::Expired { .. } => VerifyFailure::Expired,
            Self::WrongAudience { .. } => VerifyFailure::WrongAudience,
            Self::Revoked { .. } => VerifyFailure::Revoked,
        }
    }
}

/// A key set could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeySetError {
    /// A public key is not 32 bytes or not a valid curve point.
    #[error("bad public key: {0}")]
    BadKey(String),
    /// A listed key id does not match its public key.
    #[error("key id {listed} does not match its public key (which has id {computed})")]
    KeyIdMismatch {
        /// The id the key set claims.
        listed: String,
        /// The id computed from the key.
        computed: String,
    },
}

/// Strict Ed25519 verification of `signature` over `message` by the 32-byte `public_key`.
///
/// Rejects non-canonical encodings, small-order keys and malleable signatures (RFC 8032
/// strict rules as implemented by `ed25519-dalek`'s `verify_strict`). This is the primitive
/// every receipt check uses; it is tested against the Wycheproof vectors.
pub fn verify_ed25519_strict(public_key: &[u8], message: &[u8], signature: &[u8]) -> bool {
    match public_key_from_bytes(public_key) {
        Ok(key) => verify_with_key(&key, message, signature),
        Err(_) => false,
    }
}

fn verify_with_key(key: &VerifyingKey, message: &[u8], signature: &[u8]) -> bool {
    let Ok(signature) = Signature::from_slice(signature) else {
        return false;
    };
    key.verify_strict(message, &signature).is_ok()
}

/// The public keys a verifier trusts, by key id.
#[derive(Debug, Clone, Default)]
pub struct KeySet {
    keys: BTreeMap<String, VerifyingKey>,
}

impl KeySet {
    /// An empty key set (trusts nothing).
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts `key`; returns its key id.
    pub fn insert(&mut self, key: VerifyingKey) -> String {
        let id = key_id(&key);
        self.keys.insert(id.clone(), key);
        id
    }

    /// Builds a key set from an authority's `KeySet` message, checking every key id.
    pub fn from_proto(set: &pb::KeySet) -> Result<Self, KeySetError> {
        let mut keys = Self::new();
        for listed in &set.keys {
            let key = public_key_from_bytes(&listed.public_key)?;
            let computed = keys.insert(key);
            if computed != listed.key_id {
                return Err(KeySetError::KeyIdMismatch {
                    listed: listed.key_id.clone(),
                    computed,
                });
            }
        }
        Ok(keys)
    }

    /// The key with this id.
    pub fn get(&self, key_id: &str) -> Option<&VerifyingKey> {
        self.keys.get(key_id)
    }

    /// Trusted key ids, sorted.
    pub fn key_ids(&self) -> impl Iterator<Item = &str> {
        self.keys.keys().map(String::as_str)
    }

    /// Whether no key is trusted.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// Answers whether a receipt id has been revoked.
pub trait RevocationList {
    /// True when `receipt_id` is revoked.
    fn is_revoked(&self, receipt_id: &str) -> bool;
}

/// A revocation list with nothing in it, for checks that only concern signature and time.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoRevocations;

impl RevocationList for NoRevocations {
    fn is_revoked(&self, _receipt_id: &str) -> bool {
        false
    }
}

impl RevocationList for HashSet<String> {
    fn is_revoked(&self, receipt_id: &str) -> bool {
        self.contains(receipt_id)
    }
}

/// What a verification checks besides the signature.
pub struct VerifyContext<'a> {
    /// The verifier's clock, Unix seconds.
    pub now: i64,
    /// The verifier's own id; `None` skips the audience check (e.g. an operator inspecting).
    pub audience: Option<&'a str>,
    /// Where to look up revocations.
    pub revocations: &'a dyn RevocationList,
}

/// Verifies signed receipts against a trusted key set.
#[derive(Debug, Clone)]
pub struct ReceiptVerifier {
    keys: KeySet,
    clock_skew: Duration,
}

impl ReceiptVerifier {
    /// Default tolerance for clocks that disagree.
    pub const DEFAULT_CLOCK_SKEW: Duration = Duration::from_secs(30);

    /// A verifier trusting `keys`, with the default clock skew.
    pub fn new(keys: KeySet) -> Self {
        Self {
            keys,
            clock_skew: Self::DEFAULT_CLOCK_SKEW,
        }
    }

    /// Sets the tolerated clock skew.
    pub fn with_clock_skew(mut self, clock_skew: Duration) -> Self {
        self.clock_skew = clock_skew;
        self
    }

    /// The trusted keys.
    pub fn keys(&self) -> &KeySet {
        &self.keys
    }

    /// Checks the key id and signature, then decodes and structurally checks the receipt.
    /// Does not look at time, audience or revocation.
    pub fn verify_signature(&self, signed: &SignedReceipt) -> Result<Receipt, VerifyError> {
        let key = self
            .keys
            .get(&signed.key_id)
            .ok_or_else(|| VerifyError::UnknownKey {
                key_id: signed.key_id.clone(),
            })?;
        if !verify_with_key(key, &signing_message(&signed.receipt), &signed.signature) {
            return Err(VerifyError::BadSignature {
                key_id: signed.key_id.clone(),
            });
        }
        let receipt = Receipt::decode(signed.receipt.as_slice())
            .map_err(|e| VerifyError::malformed(format!("signed bytes are not a Receipt: {e}")))?;
        check_structure(&receipt, &signed.key_id)?;
        Ok(receipt)
    }

    /// Full verification: signature, validity window, audience and revocation, in that order.
    pub fn verify(
        &self,
        signed: &SignedReceipt,
        context: &VerifyContext<'_>,
    ) -> Result<Receipt, VerifyError> {
        let receipt = self.verify_signature(signed)?;
        let skew = i64::try_from(self.clock_skew.as_secs()).unwrap_or(i64::MAX);
        let not_before = receipt.not_before.as_ref().map_or(0, |t| t.seconds);
        let expires_at = receipt.expires_at.as_ref().map_or(0, |t| t.seconds);
        if context.now.saturating_add(skew) < not_before {
            return Err(VerifyError::NotYetValid {
                receipt_id: receipt.receipt_id,
                not_before,
                now: context.now,
            });
        }
        if context.now.saturating_sub(skew) >= expires_at {
            return Err(VerifyError::Expired {
                receipt_id: receipt.receipt_id,
                expires_at,
                now: context.now,
            });
        }
        if let Some(expected) = context.audience {
            if !receipt.audience.iter().any(|a| a == expected) {
                return Err(VerifyError::WrongAudience {
                    receipt_id: receipt.receipt_id,
                    expected: expected.to_owned(),
                    audience: receipt.audience,
                });
            }
        }
        if context.revocations.is_revoked(&receipt.receipt_id) {
            return Err(VerifyError::Revoked {
                receipt_id: receipt.receipt_id,
            });
        }
        Ok(receipt)
    }
}

/// Fields every genuine receipt has; a signed receipt without them is malformed, not valid.
fn check_structure(receipt: &Receipt, envelope_key_id: &str) -> Result<(), VerifyError> {
    if receipt.key_id != envelope_key_id {
        return Err(VerifyError::malformed(format!(
            "receipt names key {} but the envelope names {}",
            receipt.key_id, envelope_key_id
        )));
    }
    match uuid::Uuid::try_parse(&receipt.receipt_id) {
        Ok(id) if id.hyphenated().to_string() == receipt.receipt_id => {}
        _ => {
            return Err(VerifyError::malformed(format!(
                "receipt_id {:?} is not a lowercase hyphenated UUID",
                receipt.receipt_id
            )))
        }
    }
    let (Some(not_before), Some(expires_at)) = (&receipt.not_before, &receipt.expires_at) else {
        return Err(VerifyError::malformed(
            "receipt lacks not_before or expires_at",
        ));
    };
    if expires_at.seconds <= not_before.seconds {
        return Err(VerifyError::malformed("receipt expires before it is valid"));
    }
    if receipt.audience.is_empty() {
        return Err(VerifyError::malformed("receipt has an empty audience"));
    }
    Ok(())
}

#[cfg(test)]
mod date_tests {
    use super::*;

    #[test]
    fn validity_errors_show_dates_not_unix_seconds() {
        let expired = VerifyError::Expired {
            receipt_id: "r".into(),
            expires_at: 1_700_000_000,
            now: 1_700_000_060,
        }
        .to_string();
        assert_eq!(
            expired,
            "receipt r expired at 2023-11-14T22:13:20Z (now 2023-11-14T22:14:20Z)"
        );
        let early = VerifyError::NotYetValid {
            receipt_id: "r".into(),
            not_before: 1_700_000_060,
            now: 1_700_000_000,
        }
        .to_string();
        assert!(early.contains("until 2023-11-14T22:14:20Z"), "{early}");
        assert!(!early.contains("unix"), "{early}");
    }
}
