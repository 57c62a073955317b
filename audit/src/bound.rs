//! Bounds on what one entry may put on disk, and the cutting that keeps a draft within them.

use crate::draft::EntryDraft;
use crate::meta::{MetaScalar, MetaValue, Metadata};

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
