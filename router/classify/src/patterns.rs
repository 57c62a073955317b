//! Pattern plumbing: what the combined automaton is built from (ASCII word boundaries, the
//! `value` group) and which bytes each pattern can start with, so retries skip hopeless
//! patterns and a rejected candidate can skip the rest of its word.

use regex_syntax::hir::{Capture, Class, Hir, HirKind, Look, Repetition};

/// The index of the capture group named `value`, if any.
pub(crate) fn value_group_index(hir: &Hir) -> Option<usize> {
    match hir.kind() {
        HirKind::Capture(c) if c.name.as_deref() == Some("value") => usize::try_from(c.index).ok(),
        HirKind::Capture(c) => value_group_index(&c.sub),
        HirKind::Repetition(r) => value_group_index(&r.sub),
        HirKind::Concat(subs) | HirKind::Alternation(subs) => {
            subs.iter().find_map(value_group_index)
        }
        _ => None,
    }
}

/// Rewrites Unicode word-boundary assertions as ASCII ones. The lazy DFA cannot evaluate a
/// Unicode `\b` next to a non-ASCII byte and would hand the whole search to a much slower
/// engine; every built-in token is ASCII, so the ASCII boundary is the one meant anyway.
pub(crate) fn ascii_word_boundaries(hir: &Hir) -> Hir {
    match hir.kind() {
        HirKind::Look(look) => Hir::look(match look {
            Look::WordUnicode => Look::WordAscii,
            Look::WordUnicodeNegate => Look::WordAsciiNegate,
            Look::WordStartUnicode => Look::WordStartAscii,
            Look::WordEndUnicode => Look::WordEndAscii,
            Look::WordStartHalfUnicode => Look::WordStartHalfAscii,
            Look::WordEndHalfUnicode => Look::WordEndHalfAscii,
            other => *other,
        }),
        HirKind::Repetition(r) => Hir::repetition(Repetition {
            sub: Box::new(ascii_word_boundaries(&r.sub)),
            ..r.clone()
        }),
        HirKind::Capture(c) => Hir::capture(Capture {
            sub: Box::new(ascii_word_boundaries(&c.sub)),
            ..c.clone()
        }),
        HirKind::Concat(subs) => Hir::concat(subs.iter().map(ascii_word_boundaries).collect()),
        HirKind::Alternation(subs) => {
            Hir::alternation(subs.iter().map(ascii_word_boundaries).collect())
        }
        _ => hir.clone(),
    }
}

/// A set of bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ByteSet(pub(crate) [bool; 256]);

impl Default for ByteSet {
    fn default() -> Self {
        Self([false; 256])
    }
}

impl ByteSet {
    pub(crate) fn contains(&self, b: u8) -> bool {
        self.0[usize::from(b)]
    }

    fn insert_range(&mut self, lo: u8, hi: u8) {
        for b in lo..=hi {
            self.0[usize::from(b)] = true;
        }
    }
}

/// First bytes of a pattern's matches: all of them, and those not preceded by an ASCII
/// word-boundary assertion.
#[derive(Default)]
pub(crate) struct Firsts {
    /// Every byte a match can start with.
    pub(crate) any: ByteSet,
    /// Those a match can start with without a word boundary before them.
    pub(crate) unguarded: ByteSet,
}

impl Firsts {
    fn add(&mut self, lo: u8, hi: u8, guarded: bool) {
        self.any.insert_range(lo, hi);
        if !guarded {
            self.unguarded.insert_range(lo, hi);
        }
    }
}

/// Collects the bytes `hir` can start a match with (over-approximated for non-ASCII
/// characters); returns whether `hir` can match the empty string.
pub(crate) fn first_bytes(hir: &Hir, guarded: bool, out: &mut Firsts) -> bool {
    match hir.kind() {
        HirKind::Empty | HirKind::Look(_) => true,
        HirKind::Literal(lit) => {
            if let Some(&b) = lit.0.first() {
                out.add(b, b, guarded);
            }
            lit.0.is_empty()
        }
        HirKind::Class(Class::Unicode(class)) => {
            for r in class.ranges() {
                let (lo, hi) = (u32::from(r.start()), u32::from(r.end()));
                if lo < 0x80 {
                    out.add(lo as u8, hi.min(0x7f) as u8, guarded);
                }
                if hi >= 0x80 {
                    // Any UTF-8 lead byte: precise enough, these never start a built-in.
                    out.add(0xc2, 0xf4, guarded);
                }
            }
            false
        }
        HirKind::Class(Class::Bytes(class)) => {
            for r in class.ranges() {
                out.add(r.start(), r.end(), guarded);
            }
            false
        }
        HirKind::Repetition(r) => first_bytes(&r.sub, guarded, out) || r.min == 0,
        HirKind::Capture(c) => first_bytes(&c.sub, guarded, out),
        HirKind::Concat(subs) => {
            let mut guarded = guarded;
            for sub in subs {
                if let HirKind::Look(look) = sub.kind() {
                    // `\b` before a word byte means the match starts a word.
                    guarded |= matches!(
                        look,
                        Look::WordAscii | Look::WordStartAscii | Look::WordStartHalfAscii
                    );
                    continue;
                }
                if !first_bytes(sub, guarded, out) {
                    return false;
                }
            }
            true
        }
        HirKind::Alternation(subs) => {
            let mut nullable = false;
            for sub in subs {
                nullable |= first_bytes(sub, guarded, out);
            }
            nullable
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_bytes_are_conservative() {
        let hir = ascii_word_boundaries(
            &regex_syntax::ParserBuilder::new()
                .build()
                .parse(r"(?:\b1[ .-]?)?(?:\B\([2-9]|\b[2-9])|-x")
                .unwrap(),
        );
        let mut f = Firsts::default();
        assert!(!first_bytes(&hir, false, &mut f));
        for b in [b'1', b'2', b'9', b'(', b'-'] {
            assert!(f.any.contains(b), "{}", char::from(b));
        }
        assert!(!f.any.contains(b'0') && !f.any.contains(b'a'));
        assert!(f.unguarded.contains(b'(') && f.unguarded.contains(b'-'));
        assert!(!f.unguarded.contains(b'1') && !f.unguarded.contains(b'2'));
    }
}
