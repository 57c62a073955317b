//! The entry model, its canonical bytes and its hash.

use std::collections::BTreeMap;
use std::fmt;
use std::time::SystemTime;

use hmac::Mac as _;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::key::AuditKey;

/// Domain tag hashed in front of every entry body, so an entry hash can never be confused with
/// any other SHA-256 or HMAC the project computes.
pub const ENTRY_HASH_DOMAIN: &[u8] = b"tollgate-audit-entry-v1\n";

/// `prev_hash` of the first entry: 64 zeros.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

// One line per kind: the variant and the name written in the log. Adding a kind is adding a line.
macro_rules! entry_kinds {
    ($($(#[doc = $doc:literal])+ $variant:ident => $name:literal,)+) => {
        /// What an entry records. Written as its snake_case name.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum EntryKind {
            $($(#[doc = $doc])+ $variant,)+
        }

        impl EntryKind {
            /// Every kind, in declaration order.
            pub const ALL: &'static [EntryKind] = &[$(EntryKind::$variant,)+];

            /// The name written in the log.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(EntryKind::$variant => $name,)+
                }
            }

            /// The kind written as `name`, if this build knows it.
            pub fn from_name(name: &str) -> Option<Self> {
                match name {
                    $($name => Some(EntryKind::$variant),)+
                    _ => None,
                }
            }
        }
    };
}

entry_kinds! {
    /// The authority minted a receipt.
    ReceiptMinted => "receipt_minted",
    /// The authority revoked a receipt.
    ReceiptRevoked => "receipt_revoked",
    /// The authority refused to mint a receipt.
    ReceiptRefused => "receipt_refused",
    /// The supervisor accepted a receipt and is starting its run.
    RunAdmitted => "run_admitted",
    /// The supervisor refused to start a run.
    RunRefused => "run_refused",
    /// A sandbox was built.
    SandboxCreated => "sandbox_created",
    /// A gateway tool call was decided.
    ToolCall => "tool_call",
    /// A model route was chosen or refused.
    RouteDecision => "route_decision",
    /// A run hit one of its limits.
    LimitHit => "limit_hit",
    /// A run was torn down.
    Teardown => "teardown",
    /// A component started.
    ComponentStarted => "component_started",
    /// A component stopped cleanly.
    ComponentStopped => "component_stopped",
    /// A component recovered from a crash (swept leftovers, reconciled state).
    ComponentRecovered => "component_recovered",
    /// The audit log itself recovered a torn final line when it was opened.
    LogRecovered => "log_recovered",
    /// An operator was added.
    OperatorAdded => "operator_added",
    /// A signing key was rotated.
    KeyRotated => "key_rotated",
    /// A supervisor was enrolled for delegation (given a delegation token).
    SupervisorEnrolled => "supervisor_enrolled",
    /// An enrolled supervisor was removed (its delegation token revoked).
    SupervisorRemoved => "supervisor_removed",
}

impl fmt::Display for EntryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for EntryKind {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for EntryKind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        EntryKind::from_name(&name).ok_or_else(|| {
            de::Error::custom(format!(
                "unknown entry kind {name:?} (written by a newer Tollgate? upgrade the verifier)"
            ))
        })
    }
}

/// The outcome of a decision an entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    /// Allowed.
    Allow,
    /// Denied.
    Deny,
}

impl Decision {
    /// `"allow"` or `"deny"`, as in the log.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Deny => "deny",
        }
    }
}

/// A metadata value that may appear inside a list: string, integer, boolean or null.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MetaScalar {
    /// JSON `null`.
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer. Floats are not allowed: their text form is not canonical.
    Int(i64),
    /// A string (redacted before it is written).
    Str(String),
}

/// A metadata value: a [`MetaScalar`] or a list of them (no nesting deeper than that).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MetaValue {
    /// JSON `null`.
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer. Floats are not allowed: their text form is not canonical.
    Int(i64),
    /// A string (redacted before it is written).
    Str(String),
    /// A list of scalars.
    List(Vec<MetaScalar>),
}

/// Entry metadata: keys sorted bytewise (a `BTreeMap` iterates that way), so it has one form.
pub type Metadata = BTreeMap<String, MetaValue>;

macro_rules! from_impls {
    ($target:ident) => {
        impl From<bool> for $target {
            fn from(value: bool) -> Self {
                Self::Bool(value)
            }
        }
        impl From<i64> for $target {
            fn from(value: i64) -> Self {
                Self::Int(value)
            }
        }
        impl From<i32> for $target {
            fn from(value: i32) -> Self {
                Self::Int(value.into())
            }
        }
        impl From<u32> for $target {
            fn from(value: u32) -> Self {
                Self::Int(value.into())
            }
        }
        impl From<&str> for $target {
            fn from(value: &str) -> Self {
                Self::Str(value.to_owned())
            }
        }
        impl From<String> for $target {
            fn from(value: String) -> Self {
                Self::Str(value)
            }
        }
    };
}
from_impls!(MetaScalar);
from_impls!(MetaValue);

impl<T: Into<MetaScalar>> From<Vec<T>> for MetaValue {
    fn from(values: Vec<T>) -> Self {
        Self::List(values.into_iter().map(Into::into).collect())
    }
}

impl From<MetaScalar> for MetaValue {
    fn from(value: MetaScalar) -> Self {
        match value {
            MetaScalar::Null => Self::Null,
            MetaScalar::Bool(b) => Self::Bool(b),
            MetaScalar::Int(i) => Self::Int(i),
            MetaScalar::Str(s) => Self::Str(s),
        }
    }
}

impl Serialize for MetaScalar {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Null => serializer.serialize_unit(),
            Self::Bool(b) => serializer.serialize_bool(*b),
            Self::Int(i) => serializer.serialize_i64(*i),
            Self::Str(s) => serializer.serialize_str(s),
        }
    }
}

impl Serialize for MetaValue {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Null => serializer.serialize_unit(),
            Self::Bool(b) => serializer.serialize_bool(*b),
            Self::Int(i) => serializer.serialize_i64(*i),
            Self::Str(s) => serializer.serialize_str(s),
            Self::List(items) => serializer.collect_seq(items),
        }
    }
}

// Reads metadata values, refusing what the canonical form excludes with a message that says so.
struct MetaVisitor {
    allow_list: bool,
}

impl<'de> Visitor<'de> for MetaVisitor {
    type Value = MetaValue;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.allow_list {
            f.write_str("a string, integer, boolean, null, or a list of those")
        } else {
            f.write_str("a string, integer, boolean or null")
        }
    }

    fn visit_unit<E: de::Error>(self) -> Result<MetaValue, E> {
        Ok(MetaValue::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<MetaValue, E> {
        Ok(MetaValue::Null)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<MetaValue, E> {
        Ok(MetaValue::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<MetaValue, E> {
        Ok(MetaValue::Int(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<MetaValue, E> {
        i64::try_from(v)
            .map(MetaValue::Int)
            .map_err(|_| E::custom(format!("metadata integer {v} is beyond the i64 range")))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<MetaValue, E> {
        Err(E::custom(format!(
            "metadata holds the float {v}; floats are not allowed (their text is not canonical)"
        )))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<MetaValue, E> {
        Ok(MetaValue::Str(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<MetaValue, E> {
        Ok(MetaValue::Str(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<MetaValue, A::Error> {
        if !self.allow_list {
            return Err(de::Error::custom(
                "metadata lists may not contain lists (one level only)",
            ));
        }
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<MetaScalar>()? {
            items.push(item);
        }
        Ok(MetaValue::List(items))
    }

    fn visit_map<A: de::MapAccess<'de>>(self, _map: A) -> Result<MetaValue, A::Error> {
        Err(de::Error::custom(
            "metadata values may not be objects (flatten them into keys)",
        ))
    }
}

impl<'de> Deserialize<'de> for MetaValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(MetaVisitor { allow_list: true })
    }
}

impl<'de> Deserialize<'de> for MetaScalar {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match deserializer.deserialize_any(MetaVisitor { allow_list: false })? {
            MetaValue::Null => Ok(Self::Null),
            MetaValue::Bool(b) => Ok(Self::Bool(b)),
            MetaValue::Int(i) => Ok(Self::Int(i)),
            MetaValue::Str(s) => Ok(Self::Str(s)),
            // The visitor refuses lists when allow_list is false.
            MetaValue::List(_) => Err(de::Error::custom("unexpected list")),
        }
    }
}

/// Scrubs sensitive text before it reaches the log.
///
/// The writer applies it to `reason` and to every string value in `metadata` (list items
/// included) before hashing, so the original text never touches the disk. Ids, `component` and
/// metadata keys are not redacted: they are identifiers chosen by code, not free text.
pub trait Redactor {
    /// The redacted text when `text` contains something sensitive, `None` when it is clean.
    fn redact(&self, text: &str) -> Option<String>;
}

/// What a caller records; the log adds `seq`, `time`, `prev_hash` and `hash`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryDraft {
    /// The component recording it, e.g. `"authority"` or `"supervisor"`.
    pub component: String,
    /// What happened.
    pub kind: EntryKind,
    /// The receipt concerned, if any.
    pub receipt_id: Option<String>,
    /// The run concerned, if any.
    pub run_id: Option<String>,
    /// The gateway call concerned, if any.
    pub call_id: Option<String>,
    /// The decision taken, if the entry records one.
    pub decision: Option<Decision>,
    /// Why, in words (redacted before writing).
    pub reason: Option<String>,
    /// Further facts (strings redacted before writing).
    pub metadata: Metadata,
}

impl EntryDraft {
    /// A draft with no ids, decision, reason or metadata.
    pub fn new(component: impl Into<String>, kind: EntryKind) -> Self {
        Self {
            component: component.into(),
            kind,
            receipt_id: None,
            run_id: None,
            call_id: None,
            decision: None,
            reason: None,
            metadata: Metadata::new(),
        }
    }

    /// Sets `receipt_id`.
    pub fn receipt(mut self, receipt_id: impl Into<String>) -> Self {
        self.receipt_id = Some(receipt_id.into());
        self
    }

    /// Sets `run_id`.
    pub fn run(mut self, run_id: impl Into<String>) -> Self {
        self.run_id = Some(run_id.into());
        self
    }

    /// Sets `call_id`.
    pub fn call(mut self, call_id: impl Into<String>) -> Self {
        self.call_id = Some(call_id.into());
        self
    }

    /// Sets `decision`.
    pub fn decision(mut self, decision: Decision) -> Self {
        self.decision = Some(decision);
        self
    }

    /// Sets `reason`.
    pub fn reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }

    /// Adds one metadata value (replacing any earlier value under `key`).
    pub fn meta(mut self, key: impl Into<String>, value: impl Into<MetaValue>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// Applies `redactor` to the reason and every metadata string; returns how many changed.
    pub(crate) fn redact_with(&mut self, redactor: &dyn Redactor) -> usize {
        let mut changed = 0;
        let mut scrub = |text: &mut String| {
            if let Some(clean) = redactor.redact(text) {
                *text = clean;
                changed += 1;
            }
        };
        if let Some(reason) = &mut self.reason {
            scrub(reason);
        }
        for value in self.metadata.values_mut() {
            match value {
                MetaValue::Str(text) => scrub(text),
                MetaValue::List(items) => {
                    for item in items {
                        if let MetaScalar::Str(text) = item {
                            scrub(text);
                        }
                    }
                }
                MetaValue::Null | MetaValue::Bool(_) | MetaValue::Int(_) => {}
            }
        }
        changed
    }
}

/// Most bytes one entry's line may take (its newline included): no caller, whatever it is
/// handed, can make the writer put more than this on disk for one entry.
pub const MAX_ENTRY_BYTES: usize = 16 << 10;
/// Most bytes (as written, JSON escapes included) of `reason` or of one metadata string,
/// before an entry that is still too large has its fields cut further.
pub const MAX_FIELD_BYTES: usize = 4200;
/// Most items of one metadata list kept, before an entry that is still too large has its
/// lists cut further.
pub const MAX_LIST_ITEMS: usize = 64;
/// Most bytes of an id (`receipt_id`, `run_id`, `call_id`) or of `component`.
pub const MAX_ID_BYTES: usize = 128;
/// What marks a cut: text ends with `…[truncated N of M bytes]`, a list with an item
/// `…[truncated N of M items]`, metadata dropped whole with the key `audit_truncated`.
pub const TRUNCATION_MARKER: &str = "[truncated";
/// Bytes of a string kept before redaction, so redacting costs no more than this whatever a
/// caller hands over (far more than any field keeps afterwards).
pub(crate) const PRE_REDACTION_BYTES: usize = 64 << 10;
// Room in MAX_ENTRY_BYTES for seq, time, the hashes, field names and punctuation.
const FIXED_OVERHEAD: usize = 400;
// The smallest cut the shrinking goes to before dropping metadata.
const MIN_FIELD_BYTES: usize = 64;
const MIN_LIST_ITEMS: usize = 4;

/// Bytes `text` takes as a JSON string body (escapes counted, quotes not).
fn json_len(text: &str) -> usize {
    text.bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum()
}

/// Cuts `text` so that it takes at most `max` bytes as JSON, marking the cut; whether it cut.
fn cut(text: &mut String, max: usize) -> bool {
    if text.len() <= max / 6 || json_len(text) <= max {
        return false;
    }
    let total = text.len();
    let marker_room = 48;
    let keep_json = max.saturating_sub(marker_room);
    let mut end = 0;
    let mut used = 0;
    for (at, c) in text.char_indices() {
        let mut buf = [0u8; 4];
        let width = json_len(c.encode_utf8(&mut buf));
        if used + width > keep_json {
            break;
        }
        used += width;
        end = at + c.len_utf8();
    }
    text.truncate(end);
    text.push_str(&format!(
        "…{TRUNCATION_MARKER} {} of {total} bytes]",
        total - end
    ));
    true
}

/// Cuts `text` to `max` raw bytes (at a char boundary) without a marker: a first bound on
/// work, never what is written.
fn clip_raw(text: &mut String, max: usize) {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}

impl EntryDraft {
    /// Bounds every string before the (costly) redaction pass; the cut made here is always
    /// cut again, with a marker, by [`EntryDraft::bound`].
    pub(crate) fn pre_bound(&mut self) {
        if let Some(reason) = &mut self.reason {
            clip_raw(reason, PRE_REDACTION_BYTES);
        }
        for value in self.metadata.values_mut() {
            match value {
                MetaValue::Str(text) => clip_raw(text, PRE_REDACTION_BYTES),
                MetaValue::List(items) => {
                    items.truncate(MAX_LIST_ITEMS + 1);
                    for item in items {
                        if let MetaScalar::Str(text) = item {
                            clip_raw(text, PRE_REDACTION_BYTES);
                        }
                    }
                }
                MetaValue::Null | MetaValue::Bool(_) | MetaValue::Int(_) => {}
            }
        }
    }

    /// Cuts the draft to fit in [`MAX_ENTRY_BYTES`]: ids to [`MAX_ID_BYTES`], each string to
    /// [`MAX_FIELD_BYTES`] and each list to [`MAX_LIST_ITEMS`], then, while the entry is still
    /// too large, every string and list by half again; as a last resort the metadata is
    /// replaced by one `audit_truncated` note. Every cut is marked. Returns how many fields
    /// were cut.
    pub(crate) fn bound(&mut self) -> usize {
        let mut cuts = 0;
        for id in [&mut self.receipt_id, &mut self.run_id, &mut self.call_id]
            .into_iter()
            .flatten()
        {
            cuts += usize::from(cut(id, MAX_ID_BYTES));
        }
        cuts += usize::from(cut(&mut self.component, MAX_ID_BYTES));
        let mut field = MAX_FIELD_BYTES;
        let mut items = MAX_LIST_ITEMS;
        loop {
            if let Some(reason) = &mut self.reason {
                cuts += usize::from(cut(reason, field));
            }
            for value in self.metadata.values_mut() {
                match value {
                    MetaValue::Str(text) => cuts += usize::from(cut(text, field)),
                    MetaValue::List(list) => {
                        if list.len() > items {
                            let total = list.len();
                            list.truncate(items - 1);
                            list.push(MetaScalar::Str(format!(
                                "…{TRUNCATION_MARKER} {} of {total} items]",
                                total - (items - 1)
                            )));
                            cuts += 1;
                        }
                        for item in list {
                            if let MetaScalar::Str(text) = item {
                                cuts += usize::from(cut(text, field));
                            }
                        }
                    }
                    MetaValue::Null | MetaValue::Bool(_) | MetaValue::Int(_) => {}
                }
            }
            if self.json_len() + FIXED_OVERHEAD <= MAX_ENTRY_BYTES {
                return cuts;
            }
            if field <= MIN_FIELD_BYTES && items <= MIN_LIST_ITEMS {
                break;
            }
            field = (field / 2).max(MIN_FIELD_BYTES);
            items = (items / 2).max(MIN_LIST_ITEMS);
        }
        // Too many fields to keep even cut short (metadata keys are the caller's): say so.
        let dropped = self.metadata.len();
        self.metadata = Metadata::new();
        self.metadata.insert(
            "audit_truncated".into(),
            MetaValue::Str(format!(
                "…{TRUNCATION_MARKER}: {dropped} metadata fields dropped, the entry exceeded {MAX_ENTRY_BYTES} bytes]"
            )),
        );
        cuts + dropped
    }

    /// Roughly the bytes the variable fields take as JSON (never less than they take).
    fn json_len(&self) -> usize {
        let text = |t: &str| json_len(t) + 3;
        let mut len = text(&self.component)
            + [&self.receipt_id, &self.run_id, &self.call_id, &self.reason]
                .into_iter()
                .flatten()
                .map(|t| text(t))
                .sum::<usize>();
        for (key, value) in &self.metadata {
            len += text(key) + 1;
            len += match value {
                MetaValue::Str(t) => text(t),
                MetaValue::List(list) => {
                    2 + list
                        .iter()
                        .map(|item| match item {
                            MetaScalar::Str(t) => text(t),
                            _ => 21,
                        })
                        .sum::<usize>()
                }
                _ => 21,
            };
        }
        len
    }
}

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

/// RFC 3339 UTC with milliseconds, the only form `time` fields take.
pub(crate) fn format_time(time: SystemTime) -> String {
    humantime::format_rfc3339_millis(time).to_string()
}

/// Whether `text` is exactly what [`format_time`] writes for some instant.
pub(crate) fn is_canonical_time(text: &str) -> bool {
    humantime::parse_rfc3339(text).is_ok_and(|t| format_time(t) == text)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn metadata_refuses_floats_objects_and_nested_lists() {
        for bad in [
            r#"{"x":1.5}"#,
            r#"{"x":{"y":1}}"#,
            r#"{"x":[[1]]}"#,
            r#"{"x":18446744073709551615}"#,
        ] {
            assert!(serde_json::from_str::<Metadata>(bad).is_err(), "{bad}");
        }
        let ok: Metadata = serde_json::from_str(r#"{"a":[1,"x",null,true],"b":-3}"#).unwrap();
        assert_eq!(ok["b"], MetaValue::Int(-3));
    }

    #[test]
    fn every_kind_round_trips_by_name() {
        for kind in EntryKind::ALL {
            assert_eq!(EntryKind::from_name(kind.as_str()), Some(*kind));
            let json = serde_json::to_string(kind).unwrap();
            assert_eq!(serde_json::from_str::<EntryKind>(&json).unwrap(), *kind);
        }
        assert!(serde_json::from_str::<EntryKind>("\"made_up\"").is_err());
    }

    #[test]
    fn time_must_be_rfc3339_millis_utc() {
        assert!(is_canonical_time("2025-01-02T03:04:05.678Z"));
        assert!(!is_canonical_time("2025-01-02T03:04:05Z"));
        assert!(!is_canonical_time("2025-01-02T03:04:05.678+00:00"));
        assert!(!is_canonical_time("2025-01-02T03:04:05.678912Z"));
    }
}
