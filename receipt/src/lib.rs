//! Tollgate run receipts: signing, verification and the `tgr1.` text form.
//!
//! This crate implements the contract in docs/receipts.md so that every Tollgate component
//! (and any reader of this code porting it to another language) agrees on one rule:
//!
//! * `signature = Ed25519(private_key, "tollgate.receipt.v1\n" || receipt_bytes)`, where
//!   `receipt_bytes` is the exact protobuf encoding carried in [`SignedReceipt::receipt`];
//!   verifiers never re-encode it.
//! * `key_id` is the lowercase hex of the first 8 bytes of SHA-256 over the 32-byte public key.
//! * Verification is strict Ed25519 (no malleable or small-order signatures), then the key id,
//!   validity window (with a clock skew), audience and revocation.
//! * The text form is `tgr1.` followed by unpadded base64url of the `SignedReceipt` bytes.
//!
//! [`spec`] parses the TOML run spec and operator ceiling files into protocol requests;
//! [`delegation`] checks that a child receipt is within its parent; [`egress`] holds the rules
//! of outbound connections.
#![forbid(unsafe_code)]

pub mod amendment;
pub mod delegation;
pub mod egress;
pub mod interpreters;
pub mod paths;
pub mod profile;
mod runnable;
pub mod spec;
mod time;
mod toml_problem;
mod verify;

pub use time::{rfc3339, timestamp_from_unix, timestamp_to_unix, unix_now};
pub use tollgate_proto::v1::{Receipt, SignedReceipt};
pub use verify::{
    verify_ed25519_strict, KeySet, KeySetError, NoRevocations, ReceiptVerifier, RevocationList,
    VerifyContext, VerifyError, VerifyFailure,
};

use base64::Engine as _;
use ed25519_dalek::{Signer as _, SigningKey, VerifyingKey};
use prost::Message as _;
use sha2::{Digest as _, Sha256};
use zeroize::Zeroizing;

/// Domain-separation prefix signed in front of every receipt's bytes.
pub const SIGNING_DOMAIN: &[u8] = b"tollgate.receipt.v1\n";

/// Prefix of the text form of a signed receipt.
pub const TEXT_PREFIX: &str = "tgr1.";

/// Length of an Ed25519 public key in bytes.
pub const PUBLIC_KEY_LEN: usize = 32;

/// The key id of a public key: lowercase hex of the first 8 bytes of its SHA-256.
pub fn key_id(public_key: &VerifyingKey) -> String {
    key_id_of_bytes(public_key.as_bytes())
}

/// [`key_id`] over raw public-key bytes (any length; real keys are 32 bytes).
pub fn key_id_of_bytes(public_key: &[u8]) -> String {
    let digest = Sha256::digest(public_key);
    hex::encode(&digest[..8])
}

/// The exact bytes an Ed25519 receipt signature covers: the domain prefix then the receipt.
pub fn signing_message(receipt_bytes: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(SIGNING_DOMAIN.len() + receipt_bytes.len());
    message.extend_from_slice(SIGNING_DOMAIN);
    message.extend_from_slice(receipt_bytes);
    message
}

/// An Ed25519 signing key that signs receipts, with its key id.
pub struct ReceiptSigner {
    key: SigningKey,
    key_id: String,
}

impl ReceiptSigner {
    /// A new key from the operating system's random source.
    pub fn generate() -> Self {
        Self::from_signing_key(SigningKey::generate(&mut rand_core::OsRng))
    }

    /// The key whose 32-byte secret seed is `seed`.
    pub fn from_seed(seed: &[u8; 32]) -> Self {
        Self::from_signing_key(SigningKey::from_bytes(seed))
    }

    fn from_signing_key(key: SigningKey) -> Self {
        let key_id = key_id(&key.verifying_key());
        Self { key, key_id }
    }

    /// The 32-byte secret seed, for storing the key. Zeroed when dropped.
    pub fn seed(&self) -> Zeroizing<[u8; 32]> {
        Zeroizing::new(self.key.to_bytes())
    }

    /// The public half.
    pub fn public_key(&self) -> VerifyingKey {
        self.key.verifying_key()
    }

    /// This key's id.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// The key itself, for the other things it signs (amendments), each under its own domain.
    pub(crate) fn signing_key(&self) -> &SigningKey {
        &self.key
    }

    /// Sets `receipt.key_id` to this key's id, encodes the receipt once and signs those bytes.
    pub fn sign(&self, receipt: &mut Receipt) -> SignedReceipt {
        receipt.key_id = self.key_id.clone();
        let bytes = receipt.encode_to_vec();
        let signature = self.key.sign(&signing_message(&bytes));
        SignedReceipt {
            receipt: bytes,
            key_id: self.key_id.clone(),
            signature: signature.to_bytes().to_vec(),
        }
    }
}

impl std::fmt::Debug for ReceiptSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret.
        f.debug_struct("ReceiptSigner")
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

/// The text form: `tgr1.` + unpadded base64url of the envelope's protobuf bytes.
pub fn to_text(signed: &SignedReceipt) -> String {
    let mut text = String::from(TEXT_PREFIX);
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode_string(signed.encode_to_vec(), &mut text);
    text
}

/// Parses the text form (surrounding whitespace is ignored) into an envelope.
///
/// Fails with [`VerifyError::Malformed`] on a wrong prefix, bad base64 (including non-zero
/// trailing bits, so every character matters) or an envelope that is not canonical protobuf.
pub fn from_text(text: &str) -> Result<SignedReceipt, VerifyError> {
    let text = text.trim();
    let body = text.strip_prefix(TEXT_PREFIX).ok_or_else(|| {
        VerifyError::malformed(format!("text form must start with {TEXT_PREFIX:?}"))
    })?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(body)
        .map_err(|e| VerifyError::malformed(format!("text form is not base64url: {e}")))?;
    parse_envelope(&bytes)
}

/// Decodes envelope bytes, requiring the canonical encoding (no unknown fields, no
/// duplicates, no padding): any other byte string is rejected rather than silently normalised.
pub fn parse_envelope(bytes: &[u8]) -> Result<SignedReceipt, VerifyError> {
    let signed = SignedReceipt::decode(bytes)
        .map_err(|e| VerifyError::malformed(format!("envelope is not a SignedReceipt: {e}")))?;
    if signed.encode_to_vec() != bytes {
        return Err(VerifyError::malformed(
            "envelope is not canonically encoded (unknown, repeated or reordered fields)",
        ));
    }
    Ok(signed)
}

/// Decodes a public key of exactly 32 bytes.
pub fn public_key_from_bytes(bytes: &[u8]) -> Result<VerifyingKey, KeySetError> {
    let array: [u8; PUBLIC_KEY_LEN] = bytes.try_into().map_err(|_| {
        KeySetError::BadKey(format!("public key has {} bytes, not 32", bytes.len()))
    })?;
    VerifyingKey::from_bytes(&array)
        .map_err(|_| KeySetError::BadKey("public key is not a valid Ed25519 point".into()))
}
