//! Signed checkpoints of (entry count, head hash), and the `checkpoint.pub` key file.

use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

use crate::time::{format_time, is_canonical_time};

/// Domain-separation prefix of every checkpoint signature, so a checkpoint signature can never
/// pass for a receipt signature (or the reverse) even under the same key.
pub const CHECKPOINT_SIGNING_DOMAIN: &[u8] = b"tollgate-audit-checkpoint-v1\n";

/// One line of `checkpoints.jsonl`; its serialization (fields in this order) is canonical.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Checkpoint {
    pub count: u64,
    pub head_hash: String,
    pub time: String,
    pub component: String,
    pub key_id: String,
    pub signature: String,
}

/// The bytes a checkpoint signature covers.
pub(crate) fn signing_message(component: &str, count: u64, head_hash: &str) -> Vec<u8> {
    let mut message = CHECKPOINT_SIGNING_DOMAIN.to_vec();
    message.extend_from_slice(component.as_bytes());
    message.push(b'\n');
    message.extend_from_slice(count.to_string().as_bytes());
    message.push(b'\n');
    message.extend_from_slice(head_hash.as_bytes());
    message
}

impl Checkpoint {
    /// Signs (count, head) now.
    pub(crate) fn sign(
        key: &SigningKey,
        key_id: &str,
        component: &str,
        count: u64,
        head_hash: &str,
    ) -> Self {
        let signature = key.sign(&signing_message(component, count, head_hash));
        Self {
            count,
            head_hash: head_hash.to_owned(),
            time: format_time(std::time::SystemTime::now()),
            component: component.to_owned(),
            key_id: key_id.to_owned(),
            signature: hex::encode(signature.to_bytes()),
        }
    }

    /// The canonical line with its newline.
    pub(crate) fn to_line(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).unwrap_or_default();
        line.push(b'\n');
        line
    }

    /// Parses a line (without newline), requiring the canonical bytes.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Self, String> {
        let checkpoint: Self = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if checkpoint.to_line().strip_suffix(b"\n") != Some(bytes) {
            return Err("bytes differ from the canonical serialization".into());
        }
        if !is_canonical_time(&checkpoint.time) {
            return Err("time is not RFC 3339 UTC with milliseconds".into());
        }
        if checkpoint.count == 0 {
            return Err("count is 0; checkpoints cover at least one entry".into());
        }
        // One spelling only, so the line's bytes stay a function of its value.
        if !is_lower_hex(&checkpoint.head_hash, 64) {
            return Err("head_hash is not 64 lowercase hex digits".into());
        }
        if !is_lower_hex(&checkpoint.signature, 128) {
            return Err("signature is not 128 lowercase hex digits".into());
        }
        Ok(checkpoint)
    }

    /// Checks the signature strictly under `key`.
    pub(crate) fn verify(&self, key: &VerifyingKey) -> Result<(), String> {
        let bytes: [u8; 64] = hex::decode(&self.signature)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or("signature is not 128 hex digits")?;
        let message = signing_message(&self.component, self.count, &self.head_hash);
        key.verify_strict(&message, &Signature::from_bytes(&bytes))
            .map_err(|_| format!("signature does not verify under key {}", self.key_id))
    }
}

fn is_lower_hex(text: &str, len: usize) -> bool {
    text.len() == len && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// One line of `checkpoint.pub`.
pub(crate) fn pub_line(key: &VerifyingKey, key_id: &str) -> String {
    format!("{} {key_id}\n", hex::encode(key.as_bytes()))
}

/// Parses `checkpoint.pub`: `<64 hex digits> <key id>` per line, blank lines ignored.
pub(crate) fn parse_pub_file(text: &str) -> Result<Vec<(String, VerifyingKey)>, String> {
    let mut keys = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let (key_hex, key_id) = line.split_once(' ').ok_or_else(|| {
            format!(
                "line {}: expected \"<hex public key> <key id>\"",
                number + 1
            )
        })?;
        let bytes: [u8; 32] = hex::decode(key_hex)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| format!("line {}: public key is not 64 hex digits", number + 1))?;
        let key = VerifyingKey::from_bytes(&bytes)
            .map_err(|_| format!("line {}: not an Ed25519 public key", number + 1))?;
        keys.push((key_id.trim().to_owned(), key));
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_parse_verify() {
        let key = SigningKey::from_bytes(&[3u8; 32]);
        let checkpoint = Checkpoint::sign(&key, "k1", "authority", 12, &"ab".repeat(32));
        let line = checkpoint.to_line();
        let parsed = Checkpoint::parse(&line[..line.len() - 1]).unwrap();
        assert_eq!(parsed, checkpoint);
        parsed.verify(&key.verifying_key()).unwrap();
        let mut forged = parsed.clone();
        forged.count = 13;
        assert!(forged.verify(&key.verifying_key()).is_err());
        let other = SigningKey::from_bytes(&[4u8; 32]);
        assert!(parsed.verify(&other.verifying_key()).is_err());
        let upper = String::from_utf8(line)
            .unwrap()
            .replace(&checkpoint.signature, &checkpoint.signature.to_uppercase());
        assert!(Checkpoint::parse(upper.trim_end().as_bytes()).is_err());
    }

    #[test]
    fn message_is_domain_separated() {
        let message = signing_message("supervisor", 7, "ff");
        assert_eq!(message, b"tollgate-audit-checkpoint-v1\nsupervisor\n7\nff");
    }

    #[test]
    fn pub_file_round_trips() {
        let key = SigningKey::from_bytes(&[5u8; 32]).verifying_key();
        let text = pub_line(&key, "abcd");
        assert_eq!(
            parse_pub_file(&text).unwrap(),
            vec![("abcd".to_owned(), key)]
        );
        assert!(parse_pub_file("zz abcd").is_err());
    }
}
