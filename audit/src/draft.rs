//! What a caller records ([`EntryDraft`]) and the redaction applied to it before writing.

use std::sync::Arc;

use crate::kind::{Decision, EntryKind};
use crate::meta::{MetaScalar, MetaValue, Metadata};

/// Scrubs sensitive text before it reaches the log: the redacted text when `text` contains
/// something sensitive, `None` when it is clean.
///
/// The writer applies it to `reason` and to every string value in `metadata` (list items
/// included) before hashing, so the original text never touches the disk. Ids, `component` and
/// metadata keys are not redacted: they are identifiers chosen by code, not free text. A plain
/// function, so any classifier can redact without the audit crate knowing it.
pub type Redactor = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

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
    pub(crate) fn redact_with(&mut self, redactor: &dyn Fn(&str) -> Option<String>) -> usize {
        let mut changed = 0;
        let mut scrub = |text: &mut String| {
            if let Some(clean) = redactor(text) {
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
