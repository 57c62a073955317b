//! The entry as written ([`Entry`]), its canonical bytes and its hash.

use std::time::SystemTime;

use hmac::Mac as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::draft::EntryDraft;
use crate::key::AuditKey;
use crate::kind::{Decision, EntryKind};
use crate::meta::Metadata;
use crate::time::format_time;

/// Domain tag hashed in front of every entry body, so an entry hash can never be confused with
/// any other SHA-256 or HMAC the project computes.
pub const ENTRY_HASH_DOMAIN: &[u8] = b"tollgate-audit-entry-v1\n";

/// `prev_hash` of the first entry: 64 zeros.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// One entry as written in the log. Its JSON serialization (field order as declared) is the
/// canonical line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// Position in the log, from 1.
    pub seq: u64,
    /// When it was appended: RFC 3339 UTC with milliseconds.
    pub time: String,
    /// The component that recorded it.
    pub component: String,
    /// What happened.
    pub kind: EntryKind,
    /// The receipt concerned, if any.
    pub receipt_id: Option<String>,
    /// The run concerned, if any.
    pub run_id: Option<String>,
    /// The gateway call concerned, if any.
    pub call_id: Option<String>,
    /// The decision, if any.
    pub decision: Option<Decision>,
    /// Why, if given (already redacted).
    pub reason: Option<String>,
    /// Further facts (already redacted).
    pub metadata: Metadata,
    /// The previous entry's `hash` ([`GENESIS_HASH`] for entry 1).
    pub prev_hash: String,
    /// This entry's hash: see the crate documentation for the rule.
    pub hash: String,
}

// The entry without its hash, field for field in the same order: the hashed body.
#[derive(Serialize)]
struct Body<'a> {
    seq: u64,
    time: &'a str,
    component: &'a str,
    kind: EntryKind,
    receipt_id: Option<&'a str>,
    run_id: Option<&'a str>,
    call_id: Option<&'a str>,
    decision: Option<Decision>,
    reason: Option<&'a str>,
    metadata: &'a Metadata,
    prev_hash: &'a str,
}

impl Entry {
    /// Builds the entry that follows `(seq - 1, prev_hash)` from a (redacted) draft.
    pub(crate) fn seal(
        draft: EntryDraft,
        seq: u64,
        time: SystemTime,
        prev_hash: String,
        key: Option<&AuditKey>,
    ) -> Self {
        let mut entry = Self {
            seq,
            time: format_time(time),
            component: draft.component,
            kind: draft.kind,
            receipt_id: draft.receipt_id,
            run_id: draft.run_id,
            call_id: draft.call_id,
            decision: draft.decision,
            reason: draft.reason,
            metadata: draft.metadata,
            prev_hash,
            hash: String::new(),
        };
        entry.hash = entry.expected_hash(key);
        entry
    }

    /// The same entry moved to follow `(seq - 1, prev_hash)`: used when entries before it
    /// could not be written and were refused, so the chain closes over the gap.
    pub(crate) fn reseal(mut self, seq: u64, prev_hash: String, key: Option<&AuditKey>) -> Self {
        self.seq = seq;
        self.prev_hash = prev_hash;
        self.hash = self.expected_hash(key);
        self
    }

    /// The canonical line, without the trailing newline.
    pub fn to_line(&self) -> String {
        // Serializing these types cannot fail: every map key is a string and there are no floats.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// `time` as a point in time, if it parses.
    pub fn timestamp(&self) -> Option<SystemTime> {
        humantime::parse_rfc3339(&self.time).ok()
    }

    /// The canonical bytes of the entry without `hash`: what the hash covers after the domain.
    pub(crate) fn body(&self) -> Vec<u8> {
        let body = Body {
            seq: self.seq,
            time: &self.time,
            component: &self.component,
            kind: self.kind,
            receipt_id: self.receipt_id.as_deref(),
            run_id: self.run_id.as_deref(),
            call_id: self.call_id.as_deref(),
            decision: self.decision,
            reason: self.reason.as_deref(),
            metadata: &self.metadata,
            prev_hash: &self.prev_hash,
        };
        serde_json::to_vec(&body).unwrap_or_default()
    }

    /// The hash this entry must carry under `key` (plain SHA-256 without one).
    pub(crate) fn expected_hash(&self, key: Option<&AuditKey>) -> String {
        let body = self.body();
        match key {
            Some(key) => {
                let mut mac = key.mac();
                mac.update(ENTRY_HASH_DOMAIN);
                mac.update(&body);
                hex::encode(mac.finalize().into_bytes())
            }
            None => {
                let mut digest = Sha256::new();
                digest.update(ENTRY_HASH_DOMAIN);
                digest.update(&body);
                hex::encode(digest.finalize())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::MetaValue;

    fn sample() -> Entry {
        let draft = EntryDraft::new("authority", EntryKind::ToolCall)
            .receipt("r-1")
            .decision(Decision::Deny)
            .reason("line\nbreak \"quoted\" é")
            .meta("zeta", 1)
            .meta("alpha", vec!["a", "b"])
            .meta("flag", true)
            .meta("none", MetaValue::Null);
        Entry::seal(
            draft,
            7,
            SystemTime::UNIX_EPOCH,
            GENESIS_HASH.to_owned(),
            None,
        )
    }

    #[test]
    fn line_is_body_plus_hash_in_declared_order() {
        let entry = sample();
        let line = entry.to_line();
        let body = String::from_utf8(entry.body()).unwrap();
        let expected = format!(
            "{},\"hash\":\"{}\"}}",
            body.strip_suffix('}').unwrap(),
            entry.hash
        );
        assert_eq!(line, expected);
        assert!(line.starts_with(
            "{\"seq\":7,\"time\":\"1970-01-01T00:00:00.000Z\",\"component\":\"authority\",\"kind\":\"tool_call\",\"receipt_id\":\"r-1\",\"run_id\":null,\"call_id\":null,\"decision\":\"deny\""
        ));
        assert!(line.contains(
            "\"metadata\":{\"alpha\":[\"a\",\"b\"],\"flag\":true,\"none\":null,\"zeta\":1}"
        ));
        assert!(line.contains("line\\nbreak \\\"quoted\\\" é"));
        let control = EntryDraft::new("a", EntryKind::Teardown).reason("\u{1f}\u{7f}");
        let control = Entry::seal(
            control,
            1,
            SystemTime::UNIX_EPOCH,
            GENESIS_HASH.into(),
            None,
        );
        assert!(control.to_line().contains("\"reason\":\"\\u001f\u{7f}\""));
        let parsed: Entry = serde_json::from_str(&line).unwrap();
        assert_eq!(parsed, entry);
    }

    #[test]
    fn hash_follows_the_documented_rule() {
        let entry = sample();
        let mut digest = Sha256::new();
        digest.update(b"tollgate-audit-entry-v1\n");
        digest.update(entry.body());
        assert_eq!(entry.hash, hex::encode(digest.finalize()));
        let key = AuditKey::from_bytes(vec![9u8; 32]).unwrap();
        assert_ne!(entry.expected_hash(Some(&key)), entry.hash);
    }
}
