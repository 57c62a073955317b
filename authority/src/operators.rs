//! Operator and supervisor identities, found by the hash of their bearer token.
//!
//! Tokens are `tollgate_daemon::token`s (32 random bytes, `tgt_` + base64url); only their
//! SHA-256 is stored. A hash of a high-entropy token is as strong as a slow password hash here
//! and lets a lookup be one map access per call.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use tollgate_daemon::token;

use crate::store::{Operator, Supervisor};

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
            .get(&token::hash(token))
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
            .get(&token::hash(token))
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_finds_its_holder_by_hash() {
        let token = token::generate();
        let operators = OperatorRegistry::default();
        let operator = Operator {
            name: "ci".into(),
            admin: false,
            ceiling: Default::default(),
            created_at: 0,
            created_by: "admin".into(),
        };
        operators.insert(token::hash(token.expose()), operator);
        assert_eq!(operators.by_token(token.expose()).unwrap().name, "ci");
        assert!(operators.by_token(token::generate().expose()).is_none());
    }

    #[test]
    fn names() {
        assert!(valid_operator_name("ci-bot@corp.example"));
        assert!(!valid_operator_name(""));
        assert!(!valid_operator_name("a b"));
        assert!(!valid_operator_name(&"x".repeat(65)));
    }
}
