//! Operator and supervisor identities and bearer-token authentication.
//!
//! Tokens are 32 random bytes (`tgt_` + base64url); only their SHA-256 is stored. A hash of a
//! high-entropy token is as strong as a slow password hash here and lets a lookup be one map
//! access per call.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use base64::Engine as _;
use rand_core::RngCore as _;
use sha2::{Digest as _, Sha256};
use tonic::metadata::MetadataMap;

use crate::error::CallError;
use crate::store::{Operator, Supervisor};

/// Prefix of every operator token, so scanners (and the router) can recognise one.
pub const TOKEN_PREFIX: &str = "tgt_";

/// A fresh token.
pub fn generate_token() -> String {
    let mut bytes = [0u8; 32];
    rand_core::OsRng.fill_bytes(&mut bytes);
    let mut token = String::from(TOKEN_PREFIX);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode_string(bytes, &mut token);
    token
}

/// The stored form of a token.
pub fn token_hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Whether `name` is a valid operator name.
pub fn valid_operator_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'))
}

/// Whether `id` is a valid supervisor id for enrolment (the operator-name alphabet: it appears
/// in audit entries and messages, so no spaces or control characters).
pub fn valid_supervisor_id(id: &str) -> bool {
    valid_operator_name(id)
}

/// The token in the request's `authorization: Bearer <token>` metadata.
pub fn bearer_token(metadata: &MetadataMap) -> Result<&str, CallError> {
    let header = metadata.get("authorization").ok_or_else(|| {
        CallError::Unauthenticated(
            "missing \"authorization: Bearer <token>\" metadata; pass an operator token (or, for DelegateReceipt, a supervisor's delegation token)".into(),
        )
    })?;
    header
        .to_str()
        .ok()
        // The scheme name is case-insensitive (RFC 9110).
        .and_then(|value| {
            let (scheme, token) = value.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then_some(token)
        })
        .map(str::trim)
        .ok_or_else(|| {
            CallError::Unauthenticated("authorization metadata must be \"Bearer <token>\"".into())
        })
}

/// Known operators by token hash.
#[derive(Debug, Default)]
pub struct OperatorRegistry {
    by_hash: RwLock<HashMap<[u8; 32], Arc<Operator>>>,
}

impl OperatorRegistry {
    /// A registry holding these operators.
    pub fn new(operators: Vec<([u8; 32], Operator)>) -> Self {
        let by_hash = operators
            .into_iter()
            .map(|(hash, operator)| (hash, Arc::new(operator)))
            .collect();
        Self {
            by_hash: RwLock::new(by_hash),
        }
    }

    /// Adds an operator already stored durably.
    pub fn insert(&self, hash: [u8; 32], operator: Operator) {
        self.by_hash
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(hash, Arc::new(operator));
    }

    /// The operator holding `token`, if any.
    pub fn by_token(&self, token: &str) -> Option<Arc<Operator>> {
        self.by_hash
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&token_hash(token))
            .cloned()
    }
}

/// Supervisors enrolled for delegation, by token hash. Their tokens have the operators' format
/// (so the redactor masks them too) but authenticate only `DelegateReceipt`.
#[derive(Debug, Default)]
pub struct SupervisorRegistry {
    by_hash: RwLock<HashMap<[u8; 32], Arc<Supervisor>>>,
}

impl SupervisorRegistry {
    /// A registry holding these supervisors.
    pub fn new(supervisors: Vec<([u8; 32], Supervisor)>) -> Self {
        let by_hash = supervisors
            .into_iter()
            .map(|(hash, supervisor)| (hash, Arc::new(supervisor)))
            .collect();
        Self {
            by_hash: RwLock::new(by_hash),
        }
    }

    /// Adds a supervisor already stored durably.
    pub fn insert(&self, hash: [u8; 32], supervisor: Supervisor) {
        self.by_hash
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(hash, Arc::new(supervisor));
    }

    /// Forgets the supervisor with this id (its token stops authenticating).
    pub fn remove_id(&self, supervisor_id: &str) {
        self.by_hash
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|_, s| s.supervisor_id != supervisor_id);
    }

    /// Whether a supervisor with this id is enrolled.
    pub fn contains_id(&self, supervisor_id: &str) -> bool {
        self.by_hash
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .any(|s| s.supervisor_id == supervisor_id)
    }

    /// The supervisor holding `token`, if any.
    pub fn by_token(&self, token: &str) -> Option<Arc<Supervisor>> {
        self.by_hash
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&token_hash(token))
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_unique_prefixed_and_hashed() {
        let a = generate_token();
        let b = generate_token();
        assert_ne!(a, b);
        assert!(a.starts_with(TOKEN_PREFIX) && a.len() == 4 + 43);
        assert_ne!(token_hash(&a), token_hash(&b));
    }

    #[test]
    fn names() {
        assert!(valid_operator_name("ci-bot@corp.example"));
        assert!(!valid_operator_name(""));
        assert!(!valid_operator_name("a b"));
        assert!(!valid_operator_name(&"x".repeat(65)));
    }
}
