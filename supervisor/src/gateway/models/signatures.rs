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

/// The hash a signature is remembered by: the route whose backend issued it, its origin and
/// its bytes. A signature goes back only to the route that issued it: another route of the
/// same format (one allowed less sensitive text) must not receive an opaque blob made from
/// what the first one was sent.
fn digest(route: &str, origin: &str, signature: &str) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(route.as_bytes());
    hash.update([0]);
    hash.update(origin.as_bytes());
    hash.update([0]);
    hash.update(signature.as_bytes());
    hash.finalize().into()
}

impl Signatures {
    /// Remembers a signature a backend's reply carried (empty ones are nothing to remember).
    pub fn remember(&mut self, route: &str, origin: &str, signature: &str) {
        if signature.is_empty() {
            return;
        }
        let hash = digest(route, origin, signature);
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

    /// Whether `route`'s backend issued `signature` for this run (and it is not yet forgotten).
    pub fn issued(&self, route: &str, origin: &str, signature: &str) -> bool {
        self.known.contains(&digest(route, origin, signature))
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
        assert!(!seen.issued("claude", "anthropic", "sig-a"));
        seen.remember("claude", "anthropic", "sig-a");
        assert!(seen.issued("claude", "anthropic", "sig-a"));
        // Bound to the wire format that issued it.
        assert!(!seen.issued("claude", "openai-responses", "sig-a"));
        // Bound to the route that issued it: another route of the same format may be allowed
        // less sensitive text than the one the signature's reasoning was made from.
        assert!(!seen.issued("claude-public", "anthropic", "sig-a"));
        seen.remember("claude", "anthropic", "sig-a");
        assert_eq!(seen.len(), 1, "remembered once");
        seen.remember("claude", "anthropic", "");
        assert_eq!(seen.len(), 1, "an empty signature is nothing");
        for i in 0..MAX_SIGNATURES {
            seen.remember("claude", "anthropic", &format!("sig-{i}"));
        }
        assert_eq!(seen.len(), MAX_SIGNATURES);
        assert!(
            !seen.issued("claude", "anthropic", "sig-a"),
            "the oldest is forgotten"
        );
        assert!(seen.issued(
            "claude",
            "anthropic",
            &format!("sig-{}", MAX_SIGNATURES - 1)
        ));
    }
}
