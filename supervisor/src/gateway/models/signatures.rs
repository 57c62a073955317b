//! Opaque reasoning goes back only where it came from.
//!
//! A thinking part's `signature` (Anthropic's signature or redacted thinking, the Responses
//! API's encrypted reasoning) cannot be read, so it cannot be classified: an agent could
//! hide anything in it. It is sent on only when this run's backend issued it: each signature
//! a reply carries is remembered (its SHA-256 with the wire format that made it, never the
//! text), and a thinking part whose signature is not remembered is dropped from the call.

use std::collections::{HashSet, VecDeque};

use sha2::{Digest as _, Sha256};

/// Most signatures one run remembers; the oldest is forgotten first. A conversation sends
/// back the reasoning of its last turns, so a few hundred cover any agent's live context.
pub const MAX_SIGNATURES: usize = 256;

/// The signatures this run's backends issued (hashes only), oldest first.
#[derive(Debug, Default)]
pub struct Signatures {
    order: VecDeque<[u8; 32]>,
    known: HashSet<[u8; 32]>,
}

/// The hash a signature is remembered by: its origin and its bytes, so a signature one wire
/// format issued is not taken for another's.
fn digest(origin: &str, signature: &str) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(origin.as_bytes());
    hash.update([0]);
    hash.update(signature.as_bytes());
    hash.finalize().into()
}

impl Signatures {
    /// Remembers a signature a backend's reply carried (empty ones are nothing to remember).
    pub fn remember(&mut self, origin: &str, signature: &str) {
        if signature.is_empty() {
            return;
        }
        let hash = digest(origin, signature);
        if !self.known.insert(hash) {
            return;
        }
        self.order.push_back(hash);
        while self.order.len() > MAX_SIGNATURES {
            if let Some(old) = self.order.pop_front() {
                self.known.remove(&old);
            }
        }
    }

    /// Whether a backend of this run issued `signature` (and it is not yet forgotten).
    pub fn issued(&self, origin: &str, signature: &str) -> bool {
        self.known.contains(&digest(origin, signature))
    }

    /// How many are remembered.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_issued_signatures_are_known_and_the_oldest_are_forgotten() {
        let mut seen = Signatures::default();
        assert!(!seen.issued("anthropic", "sig-a"));
        seen.remember("anthropic", "sig-a");
        assert!(seen.issued("anthropic", "sig-a"));
        // Bound to the wire format that issued it.
        assert!(!seen.issued("openai-responses", "sig-a"));
        seen.remember("anthropic", "sig-a");
        assert_eq!(seen.len(), 1, "remembered once");
        seen.remember("anthropic", "");
        assert_eq!(seen.len(), 1, "an empty signature is nothing");
        for i in 0..MAX_SIGNATURES {
            seen.remember("anthropic", &format!("sig-{i}"));
        }
        assert_eq!(seen.len(), MAX_SIGNATURES);
        assert!(
            !seen.issued("anthropic", "sig-a"),
            "the oldest is forgotten"
        );
        assert!(seen.issued("anthropic", &format!("sig-{}", MAX_SIGNATURES - 1)));
    }
}
