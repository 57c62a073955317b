//! Bearer tokens: 32 random bytes (`tgt_` + base64url), stored only as their SHA-256, sent
//! as `authorization: Bearer <token>`. A hash of a high-entropy token is as strong as a slow
//! password hash here and lets a lookup be one map access per call.

use base64::Engine as _;
use rand_core::RngCore as _;
use sha2::{Digest as _, Sha256};
use tonic::metadata::MetadataMap;

use crate::Secret;

/// Prefix of every token, so scanners (and the router's redactor) can recognise one.
pub const TOKEN_PREFIX: &str = "tgt_";

/// A fresh token.
pub fn generate() -> Secret {
    let mut bytes = [0u8; 32];
    rand_core::OsRng.fill_bytes(&mut bytes);
    let mut token = String::from(TOKEN_PREFIX);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode_string(bytes, &mut token);
    Secret::new(token)
}

/// The stored form of a token.
pub fn hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Whether `token` looks like one of ours (its prefix).
pub fn looks_like_token(token: &str) -> bool {
    token.starts_with(TOKEN_PREFIX)
}

/// Why a request carries no usable bearer token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BearerError {
    /// No `authorization` metadata.
    #[error("missing \"authorization: Bearer <token>\" metadata")]
    Missing,
    /// `authorization` is not `Bearer <token>`.
    #[error("authorization metadata must be \"Bearer <token>\"")]
    Malformed,
}

/// The token in the request's `authorization: Bearer <token>` metadata (the scheme name is
/// case-insensitive, RFC 9110).
pub fn bearer(metadata: &MetadataMap) -> Result<&str, BearerError> {
    let header = metadata.get("authorization").ok_or(BearerError::Missing)?;
    header
        .to_str()
        .ok()
        .and_then(|value| {
            let (scheme, token) = value.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then_some(token)
        })
        .map(str::trim)
        .ok_or(BearerError::Malformed)
}

/// Whether `token` is the one whose hash is `expected`, comparing every byte so timing does
/// not reveal how much of a guess was right.
pub fn matches(token: &str, expected: &[u8; 32]) -> bool {
    let differs = hash(token)
        .iter()
        .zip(expected.iter())
        .fold(0u8, |acc, (a, b)| acc | (a ^ b));
    differs == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_fresh_prefixed_and_checked_by_hash() {
        let (a, b) = (generate(), generate());
        assert_ne!(a.expose(), b.expose());
        assert!(looks_like_token(a.expose()));
        assert_eq!(a.expose().len(), TOKEN_PREFIX.len() + 43);
        assert!(matches(a.expose(), &hash(a.expose())));
        assert!(!matches(b.expose(), &hash(a.expose())));
    }

    #[test]
    fn bearer_reads_the_scheme_case_insensitively() {
        let mut metadata = MetadataMap::new();
        assert_eq!(bearer(&metadata), Err(BearerError::Missing));
        metadata.insert("authorization", "bearer  tgt_x ".parse().unwrap());
        assert_eq!(bearer(&metadata), Ok("tgt_x"));
        metadata.insert("authorization", "Basic tgt_x".parse().unwrap());
        assert_eq!(bearer(&metadata), Err(BearerError::Malformed));
    }
}
