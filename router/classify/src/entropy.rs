//! The entropy fallback's judgement: whether a base64-looking run is a random secret, or an
//! identifier, a digest, a path or encoded data that only looks random.
//!
//! The shape of the run decides first ([`high_entropy`]); then what surrounds it
//! ([`labelled_not_secret`], [`encoded_file`]): a value under a key that names it an
//! identifier, a digest or a pagination cursor (`"id"`, `"tool_call_id"`, `"sha256"`,
//! `"signature"`, `"NextToken"`) is one, and
//! base64 that decodes to the header of an image or an archive is a file. A key that names a
//! credential (`session_id`, `token_hash`) is never taken as such a label, and a value under
//! an id key that carries an API id prefix without being that API's id shape (a `call_` glued
//! to an AWS secret) is not an id.

use std::borrow::Cow;

use base64::Engine as _;

/// Shannon entropy of `token` in bits per byte.
pub(crate) fn shannon_entropy(token: &[u8]) -> f64 {
    if token.is_empty() {
        return 0.0;
    }
    let mut counts = [0u32; 256];
    for &b in token {
        counts[usize::from(b)] += 1;
    }
    let len = token.len() as f64;
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = f64::from(c) / len;
            -p * p.log2()
        })
        .sum()
}

/// Longest token the entropy fallback considers; longer runs are encoded data (images,
/// archives), not credentials.
pub(crate) const ENTROPY_MAX_LEN: usize = 256;

/// Whether a token looks like a random secret rather than an identifier, a hash or a path.
///
/// A token qualifies when it mixes upper case, lower case and digits (so hex digests, git SHAs,
/// UUIDs, ULIDs and base32 never do), its Shannon entropy reaches `threshold` bits per byte,
/// and it switches character class often, as random strings do and camelCase names do not.
pub(crate) fn high_entropy(token: &str, min_len: usize, threshold: f64) -> bool {
    let whole = token.trim_end_matches('=').as_bytes();
    if whole.len() < min_len || whole.len() > ENTROPY_MAX_LEN {
        return false;
    }
    // A path (`dist/assets/index-BQx3mZ7c`, `src/main/java/com/acme/Foo2Test`) is judged on
    // its segments that have an upper-case letter: the lower-case directory names around a
    // hashed or camel-case file name make no secret. Random base64 with a `/` keeps nearly
    // all of its segments.
    let body: Cow<'_, [u8]> = if whole.contains(&b'/') {
        Cow::Owned(
            whole
                .split(|&b| b == b'/')
                .filter(|segment| segment.iter().any(u8::is_ascii_uppercase))
                .flatten()
                .copied()
                .collect(),
        )
    } else {
        Cow::Borrowed(whole)
    };
    let body = &*body;
    if body.len() < min_len {
        return false;
    }
    // A hex digest behind a one- or two-letter prefix (Gerrit's `I8f3e…` Change-Id): random
    // base62 has three letters in four outside 0-9a-f.
    let hex = body
        .iter()
        .filter(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
        .count();
    if hex + 2 >= body.len() {
        return false;
    }
    let (mut upper, mut lower, mut digit) = (0usize, 0usize, 0usize);
    let mut switches = 0usize;
    let mut prev = 0u8;
    for &b in body {
        let class = if b.is_ascii_uppercase() {
            upper += 1;
            1
        } else if b.is_ascii_lowercase() {
            lower += 1;
            2
        } else if b.is_ascii_digit() {
            digit += 1;
            3
        } else {
            4
        };
        if prev != 0 && class != prev {
            switches += 1;
        }
        prev = class;
    }
    if upper == 0 || lower == 0 || digit == 0 {
        return false;
    }
    // Random base62 switches class on ~60% of bytes; identifiers on well under a third.
    if switches * 10 < body.len() * 4 {
        return false;
    }
    // `AAAA` is the length prefix of SSH wire-format blobs: public keys and signatures.
    if body.starts_with(b"AAAA") {
        return false;
    }
    shannon_entropy(body) >= threshold && !decodes_to_text(token)
}

/// Whether `token` is base64 (standard or URL-safe) of readable text, such as a JWT part or an
/// encoded message: random keys decode to random bytes, which are almost never UTF-8 text.
fn decodes_to_text(token: &str) -> bool {
    use base64::alphabet;
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};

    let config = GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true);
    let url_safe = token.contains(['-', '_']);
    if url_safe && token.contains(['+', '/']) {
        return false;
    }
    let alphabet = if url_safe {
        &alphabet::URL_SAFE
    } else {
        &alphabet::STANDARD
    };
    let body = token.trim_end_matches('=');
    // A length of 1 mod 4 cannot be base64; drop the odd byte rather than give up.
    let body = &body[..body.len() - usize::from(body.len() % 4 == 1)];
    let Ok(bytes) = GeneralPurpose::new(alphabet, config).decode(body) else {
        return false;
    };
    let Ok(text) = std::str::from_utf8(&bytes) else {
        return false;
    };
    let total = text.chars().count();
    let readable = text
        .chars()
        .filter(|c| !c.is_control() || matches!(c, '\n' | '\r' | '\t'))
        .count();
    total >= 8 && readable * 10 >= total * 9
}

/// Whether base64 (standard or URL-safe) decodes to the start of a binary file: an image
/// (`iVBORw0KGgo`, `/9j/`), a PDF, an archive, an executable. Random keys never start that way.
fn decodes_to_file_header(token: &str) -> bool {
    use base64::alphabet;
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};

    const HEADERS: &[&[u8]] = &[
        b"\x89PNG\r\n\x1a\n",
        b"\xff\xd8\xff",
        b"GIF87a",
        b"GIF89a",
        b"RIFF",
        b"%PDF-",
        b"\x1f\x8b",
        b"PK\x03\x04",
        b"PK\x05\x06",
        b"\x7fELF",
        b"\0asm",
        b"BZh",
        b"\xfd7zXZ\0",
        b"\x28\xb5\x2f\xfd",
        b"II*\0",
        b"MM\0*",
    ];
    let Some(head) = token.get(..token.len().min(16) / 4 * 4) else {
        return false;
    };
    let config = GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true);
    let alphabet = if head.contains(['-', '_']) {
        &alphabet::URL_SAFE
    } else {
        &alphabet::STANDARD
    };
    GeneralPurpose::new(alphabet, config)
        .decode(head)
        .is_ok_and(|bytes| HEADERS.iter().any(|h| bytes.starts_with(h)))
}

/// Whether the candidate at `start..end` of `text` is the start of an encoded file (a small
/// image in a `data:` URI or an Anthropic image block). The candidate may have lost a leading
/// `/` or `+` to its word boundary (JPEG's base64 starts `/9j/`), so those are put back.
pub(crate) fn encoded_file(text: &str, start: usize, end: usize) -> bool {
    let b = text.as_bytes();
    let mut from = start;
    while from > 0 && start - from < 4 && matches!(b[from - 1], b'/' | b'+') {
        from -= 1;
    }
    decodes_to_file_header(&text[from..end])
}

/// Keys whose values are identifiers: `id`, `*_id`, `*Id`, `uuid`, `cursor`, and the ad
/// click ids that ride on URLs (`gclid`, `fbclid`, `msclkid`).
fn id_key(key: &str, lower: &str) -> bool {
    lower == "id"
        || [
            "_id",
            "-id",
            ".id",
            "uuid",
            "guid",
            "cursor",
            "_ids",
            "request-id",
            "clid",
            "clkid",
        ]
        .iter()
        .any(|s| lower.ends_with(s))
        || (key.len() > 2 && (key.ends_with("Id") || key.ends_with("ID")))
}

/// Keys whose values are digests, signatures or ciphertext: never a credential in themselves.
fn digest_key(lower: &str) -> bool {
    [
        "sha",
        "sha1",
        "sha256",
        "sha384",
        "sha512",
        "md5",
        "hash",
        "digest",
        "checksum",
        "integrity",
        "etag",
        "signature",
        "fingerprint",
        "encrypted_content",
        "revision",
        "commit",
    ]
    .iter()
    .any(|s| lower.ends_with(s))
}

/// Parts of a key that name a credential: such a key is never read as naming an id or a digest.
const CREDENTIAL_WORDS: &[&str] = &[
    "secret",
    "token",
    "passw",
    "pwd",
    "auth",
    "session",
    "cookie",
    "credential",
    "private",
    "apikey",
    "api_key",
    "api-key",
    "access_key",
    "accesskey",
    "csrf",
];

/// Prefixes of the APIs' own ids. Their exact shapes are consumed before the entropy fallback
/// looks; a value that starts with one and reaches the fallback has the wrong shape, and is
/// judged on what it is.
const API_ID_PREFIXES: &[&str] = &[
    "call_",
    "toolu_",
    "srvtoolu_",
    "msg_",
    "req_",
    "file_",
    "chatcmpl-",
];

/// Whether the key right before `start` (`"id": "…"`, `call_id=…`, `sha256: …`, in JSON,
/// YAML, TOML or `key=value` form) names the value `candidate` an identifier or a digest.
pub(crate) fn labelled_not_secret(text: &str, start: usize, candidate: &str) -> bool {
    let b = text.as_bytes();
    let skip_back = |mut i: usize| {
        let floor = i.saturating_sub(8);
        while i > floor && matches!(b[i - 1], b' ' | b'\t' | b'"' | b'\'') {
            i -= 1;
        }
        i
    };
    // The value may open with its quote and a little punctuation (`"~!!~AI9F…"`, a Drive
    // page token), never with another key or value.
    let mut i = start;
    while i > start.saturating_sub(8)
        && (matches!(b[i - 1], b' ' | b'\t')
            || (b[i - 1].is_ascii_punctuation()
                && !matches!(
                    b[i - 1],
                    b':' | b'=' | b',' | b';' | b'{' | b'}' | b'[' | b']' | b'(' | b')'
                )))
    {
        i -= 1;
    }
    if i == 0 || !matches!(b[i - 1], b':' | b'=') {
        return false;
    }
    let end = skip_back(i - 1);
    let mut from = end;
    while from > 0
        && end - from < 64
        && (b[from - 1].is_ascii_alphanumeric() || matches!(b[from - 1], b'_' | b'-' | b'.'))
    {
        from -= 1;
    }
    let key = &text[from..end];
    let lower = key.to_ascii_lowercase();
    if crate::checks::pagination_key(key) {
        return true;
    }
    if key.is_empty() || CREDENTIAL_WORDS.iter().any(|w| lower.contains(w)) {
        return false;
    }
    if digest_key(&lower) {
        return true;
    }
    // Ids are base62 or base64url; standard base64 (`+`, `/`) under an id key is something
    // else, and so is an API id of the wrong shape.
    id_key(key, &lower)
        && !candidate.contains(['+', '/'])
        && !API_ID_PREFIXES.iter().any(|p| candidate.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entropy_separates_tokens_from_names() {
        assert!(high_entropy("Xq7vR2mK9pL4sT8wZ3nB6yH1cJ5dF0gA", 24, 4.0));
        assert!(!high_entropy("getUserAccountSettingsHandler2", 24, 4.0));
        assert!(!high_entropy(
            "3851c68a9b0e4f5d6c7b8a9f0e1d2c3b4a5f6e7d",
            24,
            4.0
        ));
        assert!(!high_entropy("YWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFh", 24, 4.0));
        assert!(!high_entropy(
            "SGVsbG8gd29ybGQsIHRoaXMgaXMgYSB0ZXN0IG1lc3NhZ2Uu",
            24,
            4.0
        ));
    }

    #[test]
    fn paths_and_prefixed_digests_are_not_random() {
        assert!(!high_entropy(
            "frontend/dist/assets/index-BQx3mZ7c",
            24,
            4.0
        ));
        assert!(!high_entropy(
            "I8f3e2d1c0b9a8f7e6d5c4b3a29180f7e6d5c4b3a",
            24,
            4.0
        ));
        // Random base64 keeps its segments.
        assert!(high_entropy(
            "tw5VDidyG/cqyoveWCzAFQDaoGOD1hP0LuK0o3gW",
            24,
            4.0
        ));
    }

    #[test]
    fn encoded_files_are_recognised_by_their_header() {
        let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk";
        assert!(encoded_file(png, 0, png.len()));
        let jpeg = "\"/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAAgGBgcGBQgHBwcJCQgKDBQNDAsL\"";
        assert!(encoded_file(jpeg, 2, jpeg.len() - 1));
        let key = "tw5VDidyG/cqyoveWCzAFQDaoGOD1hP0LuK0o3gW";
        assert!(!encoded_file(key, 0, key.len()));
    }

    #[test]
    fn keys_label_ids_and_digests() {
        let at = |text: &str, value: &str| {
            let start = text.find(value).unwrap();
            labelled_not_secret(text, start, value)
        };
        let v = "Xb7kQ2mZp9Lr4Tw8Vn3Yc6Hd1Jf5Gs0A";
        assert!(at(&format!(r#"{{"id": "{v}"}}"#), v));
        assert!(at(&format!(r#"{{"tool_call_id":"{v}"}}"#), v));
        assert!(at(&format!("requestId={v}"), v));
        assert!(at(&format!("signature: {v}"), v));
        assert!(at(
            &format!("https://acme-corp.io/?utm_source=x&gclid={v}"),
            v
        ));
        assert!(at(&format!(r#"{{"NextToken": "{v}"}}"#), v));
        assert!(at(&format!(r#"{{"nextPageToken": "~!!~{v}"}}"#), v));
        assert!(!at(&format!(r#"{{"session_id": "{v}"}}"#), v));
        assert!(!at(&format!(r#"{{"key": "{v}"}}"#), v));
        assert!(!at(&format!("token {v}"), v));
        assert!(!at(v, v));
        let glued = "call_tw5VDidyGcqyoveWCzAFQDaoGOD1hP0LuK0o3gW";
        assert!(!at(&format!(r#"{{"id": "{glued}"}}"#), glued));
        let base64 = "tw5VDidyG/cqyoveWCzAFQDaoGOD1hP0LuK0o3gW";
        assert!(!at(&format!(r#"{{"id": "{base64}"}}"#), base64));
    }
}
