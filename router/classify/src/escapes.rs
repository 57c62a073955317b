//! String escapes neutralised before the scan, byte for byte.
//!
//! Tool calls travel as JSON, often JSON inside JSON (a call's arguments are a JSON object
//! encoded as a string), so the text the classifier sees is full of `\n`, `\"` and `\\\"`.
//! Read as it is, an escape glues its letter to the next token: `\nAKIA…` starts with the
//! word `nAKIA…`, so no detector that starts at a word boundary finds the key, and
//! `\n@pytest.mark` reads as the e-mail address `n@pytest.mark`; `\"password\": \"…\"` is not
//! a `"password": "…"` pair.
//!
//! [`normalise`] rewrites every escape as what it stands for, padded with spaces to its own
//! length, so every byte keeps its offset and every span found in the result is a span of the
//! original text (and on its `char` boundaries: only ASCII bytes change). A run of backslashes
//! is one escape however deep the nesting (`\n`, `\\n`, `\\\\n` are all a line break):
//!
//! * `\n`, `\r`, `\t`, `\b`, `\f`: the white space first (a line break for `n`, a tab for `t`,
//!   a space otherwise), then spaces;
//! * `\"`: a quote, on the side of the string it delimits: `\"key\"` → ` "key" `, so keys and
//!   values read as they would unescaped;
//! * `\uXXXX`: spaces, then the character itself when it is printable ASCII (Go escapes `&`,
//!   `<`, `>` and `=` this way);
//! * `\/` (PHP escapes slashes): slashes, so `https:\/\/host` reads `https:////host`, which
//!   the URL detectors accept;
//! * anything else (`\d` in a regex, Windows paths) is left alone, and so is a Windows
//!   file-share path (`\\server\share`, or escaped, `\\\\server\\share`), whose backslashes
//!   are the path's own.

use std::borrow::Cow;

/// `text` with its escapes neutralised, the same length; borrowed when it has no backslash.
pub(crate) fn normalise(text: &str) -> Cow<'_, str> {
    // `str::find` with a `char` is a word-at-a-time memchr: text without a backslash, most
    // prose, costs one fast pass and no copy.
    let Some(first) = text.find('\\') else {
        return Cow::Borrowed(text);
    };
    let bytes = text.as_bytes();
    let mut out = bytes.to_vec();
    let mut i = first;
    while i < bytes.len() {
        if bytes[i] != b'\\' {
            // `i` is always on a char boundary: it only ever steps over ASCII bytes.
            match text.get(i..).and_then(|rest| rest.find('\\')) {
                Some(next) => i += next,
                None => break,
            }
            continue;
        }
        let run = i;
        while i < bytes.len() && bytes[i] == b'\\' {
            i += 1;
        }
        let Some(&c) = bytes.get(i) else { break };
        if let Some(end) = file_share_path(bytes, run, i) {
            i = end;
            continue;
        }
        match c {
            b'n' | b'r' | b't' | b'b' | b'f' => {
                out[run..=i].fill(b' ');
                out[run] = match c {
                    b'n' => b'\n',
                    b't' => b'\t',
                    _ => b' ',
                };
                i += 1;
            }
            b'"' => {
                out[run..=i].fill(b' ');
                // A quote that closes a string is followed by what follows strings in JSON
                // (`:` `,` `}` `]`, space, another escape); one that opens it, by its text.
                let closes = bytes.get(i + 1).is_none_or(|&b| {
                    matches!(b, b':' | b',' | b'}' | b']' | b')' | b';' | b'\\')
                        || b.is_ascii_whitespace()
                });
                out[if closes { run } else { i }] = b'"';
                i += 1;
            }
            b'/' => {
                // Slashes stay slashes (`https:\/\/host` → `https:////host`): a filler would
                // split the URL, and the URL detectors accept the doubled slashes.
                out[run..=i].fill(b'/');
                i += 1;
            }
            b'u' => {
                let hex = bytes.get(i + 1..i + 5);
                let Some(code) = hex
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u32::from_str_radix(h, 16).ok())
                else {
                    continue;
                };
                out[run..i + 5].fill(b' ');
                if let Ok(b @ 0x21..=0x7e) = u8::try_from(code) {
                    out[i + 4] = b;
                }
                i += 5;
            }
            _ => {}
        }
    }
    // Only ASCII bytes were replaced, by ASCII bytes, so the text is still UTF-8.
    Cow::Owned(String::from_utf8(out).unwrap_or_else(|_| text.to_owned()))
}

/// When the backslashes `run..at` start a Windows file-share path (`\\server\share`, at the
/// start of a word, escaped or not), the end of that path; its backslashes are separators, not
/// escapes.
fn file_share_path(bytes: &[u8], run: usize, at: usize) -> Option<usize> {
    let k = at - run;
    let starts_word = run == 0
        || matches!(
            bytes[run - 1],
            b' ' | b'\t' | b'\n' | b'"' | b'\'' | b'(' | b'=' | b':' | b'>' | b'['
        );
    if k < 2 || !starts_word {
        return None;
    }
    let is_host = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-');
    let mut j = at;
    while j < bytes.len() && is_host(bytes[j]) {
        j += 1;
    }
    let sep = j;
    while j < bytes.len() && bytes[j] == b'\\' {
        j += 1;
    }
    let share_starts = bytes
        .get(j)
        .is_some_and(|&b| b.is_ascii_alphanumeric() || matches!(b, b'$' | b'_' | b'.' | b'-'));
    // A path's leading backslashes are twice its separators, however deeply it is escaped
    // (`\\host\share` in plain text, `\\\\host\\share` in JSON); `\\nfoo\\nbar` is text
    // escaped twice.
    if sep == at || j - sep == 0 || k != 2 * (j - sep) || !share_starts {
        return None;
    }
    while j < bytes.len()
        && (bytes[j].is_ascii_alphanumeric()
            || matches!(bytes[j], b'$' | b'_' | b'.' | b'-' | b'\\'))
    {
        j += 1;
    }
    Some(j)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_become_what_they_stand_for() {
        assert_eq!(normalise("plain"), Cow::Borrowed("plain"));
        assert_eq!(normalise(r"a\nAKIA"), "a\n AKIA");
        assert_eq!(normalise(r"a\\nb"), "a\n  b");
        assert_eq!(
            normalise(r#"{\"password\": \"x\"}"#),
            r#"{ "password" :  "x" }"#
        );
        assert_eq!(normalise(r"a\u0026b"), "a     &b");
        assert_eq!(normalise(r"x\u00e9y"), "x      y");
        assert_eq!(normalise(r"\d+\/"), r"\d+//");
        assert_eq!(normalise(r"https:\/\/h\/p"), "https:////h//p");
        assert_eq!(normalise("end\\"), "end\\");
        for text in [r#"a\nb\\\"c\u12"#, "\\", r"\\\\", "é\\n東"] {
            assert_eq!(normalise(text).len(), text.len(), "{text}");
        }
    }

    #[test]
    fn file_share_paths_keep_their_backslashes() {
        assert_eq!(
            normalise(r"copy \\nas01\backups now"),
            r"copy \\nas01\backups now"
        );
        assert_eq!(
            normalise(r#""\\\\nas01\\builds\\web""#),
            r#""\\\\nas01\\builds\\web""#
        );
        // Not at the start of a word, or not shaped as a path: escapes.
        assert_eq!(normalise(r"x\\nas"), "x\n  as");
        assert_eq!(normalise(r#"keys:\\nAKIA\\n""#), "keys:\n  AKIA\n  \"");
    }
}
