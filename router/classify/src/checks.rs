//! Validators that run on regex candidates only, never on the whole text.
//!
//! Each returns whether a candidate really is what its shape suggests (a Luhn-valid card, a
//! mod-97-valid IBAN, a JWT whose header is JSON with `"alg"`, ...). None of them logs or keeps
//! the text it looks at.

use std::net::Ipv6Addr;

use base64::Engine as _;

/// Whether `digits` (ASCII digits only) pass the Luhn check.
pub(crate) fn luhn(digits: &[u8]) -> bool {
    let mut sum = 0u32;
    for (i, d) in digits.iter().rev().enumerate() {
        let mut v = u32::from(d - b'0');
        if i % 2 == 1 {
            v *= 2;
            if v > 9 {
                v -= 9;
            }
        }
        sum += v;
    }
    sum.is_multiple_of(10)
}

/// Whether a card-number candidate (digits with optional, consistent spaces or dashes) has a
/// known issuer prefix, a length that issuer uses, and a valid Luhn check digit.
pub(crate) fn credit_card(candidate: &str) -> bool {
    let mut digits = Vec::with_capacity(19);
    let mut separator = None;
    for b in candidate.bytes() {
        if b.is_ascii_digit() {
            digits.push(b);
        } else if *separator.get_or_insert(b) != b {
            // "4111 1111-1111 1111" is not how anyone writes a card number.
            return false;
        }
    }
    let len = digits.len();
    if !(13..=19).contains(&len) || !luhn(&digits) {
        return false;
    }
    let prefix = |n: usize| -> u32 {
        digits[..n]
            .iter()
            .fold(0, |acc, d| acc * 10 + u32::from(d - b'0'))
    };
    let (p1, p2, p3, p4) = (prefix(1), prefix(2), prefix(3), prefix(4));
    match p1 {
        // Visa. The 13-digit form is long retired and collides with EAN-13 barcodes.
        4 => matches!(len, 16 | 19),
        // Mastercard (51-55 and the 2-series), Mir (2200-2204).
        2 => ((2221..=2720).contains(&p4) || (2200..=2204).contains(&p4)) && len == 16,
        5 if (51..=55).contains(&p2) => len == 16,
        // Maestro.
        5 if p2 == 50 || (56..=58).contains(&p2) => len >= 13,
        // Amex 34/37; JCB 3528-3589; Diners 300-305, 36, 38, 39.
        3 if p2 == 34 || p2 == 37 => len == 15,
        3 if (3528..=3589).contains(&p4) => len >= 16,
        3 if (300..=305).contains(&p3) || matches!(p2, 36 | 38 | 39) => len >= 14,
        // Discover 6011, 644-649, 65; UnionPay 62; Maestro 6x.
        6 if p4 == 6011 || (644..=649).contains(&p3) || p2 == 65 || p2 == 62 => len >= 16,
        6 => len >= 13,
        _ => false,
    }
}

/// IBAN lengths per country (ISO 13616 registry).
const IBAN_LENGTHS: &[(&str, usize)] = &[
    ("AD", 24),
    ("AE", 23),
    ("AL", 28),
    ("AT", 20),
    ("AZ", 28),
    ("BA", 20),
    ("BE", 16),
    ("BG", 22),
    ("BH", 22),
    ("BR", 29),
    ("BY", 28),
    ("CH", 21),
    ("CR", 22),
    ("CY", 28),
    ("CZ", 24),
    ("DE", 22),
    ("DK", 18),
    ("DO", 28),
    ("EE", 20),
    ("EG", 29),
    ("ES", 24),
    ("FI", 18),
    ("FO", 18),
    ("FR", 27),
    ("GB", 22),
    ("GE", 22),
    ("GI", 23),
    ("GL", 18),
    ("GR", 27),
    ("GT", 28),
    ("HR", 21),
    ("HU", 28),
    ("IE", 22),
    ("IL", 23),
    ("IQ", 23),
    ("IS", 26),
    ("IT", 27),
    ("JO", 30),
    ("KW", 30),
    ("KZ", 20),
    ("LB", 28),
    ("LC", 32),
    ("LI", 21),
    ("LT", 20),
    ("LU", 20),
    ("LV", 21),
    ("MC", 27),
    ("MD", 24),
    ("ME", 22),
    ("MK", 19),
    ("MR", 27),
    ("MT", 31),
    ("MU", 30),
    ("NL", 18),
    ("NO", 15),
    ("PK", 24),
    ("PL", 28),
    ("PS", 29),
    ("PT", 25),
    ("QA", 29),
    ("RO", 24),
    ("RS", 22),
    ("SA", 24),
    ("SC", 31),
    ("SE", 24),
    ("SI", 19),
    ("SK", 24),
    ("SM", 27),
    ("ST", 25),
    ("SV", 28),
    ("TL", 23),
    ("TN", 24),
    ("TR", 26),
    ("UA", 29),
    ("VA", 22),
    ("VG", 24),
    ("XK", 20),
];

/// Checks an IBAN candidate (upper-case letters and digits, optionally in space-separated
/// groups). The candidate may run past the IBAN (`DE89 ... 00 EUR`): the country's length
/// decides where it ends. Returns the byte length of the IBAN within `candidate`.
pub(crate) fn iban(candidate: &str) -> Option<usize> {
    let bytes = candidate.as_bytes();
    let country = candidate.get(..2)?;
    let want = IBAN_LENGTHS
        .iter()
        .find(|(c, _)| *c == country)
        .map(|&(_, n)| n)?;
    let mut chars = Vec::with_capacity(want);
    let mut end = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if b == b' ' {
            continue;
        }
        chars.push(b);
        if chars.len() == want {
            end = i + 1;
            break;
        }
    }
    if chars.len() != want {
        return None;
    }
    // What follows must not continue the same group: "DE89...3000X" is some other token.
    if bytes.get(end).is_some_and(u8::is_ascii_alphanumeric) {
        return None;
    }
    // mod-97 over the rearranged string, letters as 10..35, computed incrementally.
    let mut rem = 0u32;
    for &b in chars[4..].iter().chain(&chars[..4]) {
        rem = match b {
            b'0'..=b'9' => (rem * 10 + u32::from(b - b'0')) % 97,
            b'A'..=b'Z' => (rem * 100 + u32::from(b - b'A' + 10)) % 97,
            _ => return None,
        };
    }
    (rem == 1).then_some(end)
}

/// US SSN rules: area 001-899 but not 666, group 01-99, serial 0001-9999, and not one of the
/// numbers the SSA has published as never valid (advertising and sample cards).
pub(crate) fn us_ssn(candidate: &str) -> bool {
    let digits: Vec<u32> = candidate
        .bytes()
        .filter(u8::is_ascii_digit)
        .map(|d| u32::from(d - b'0'))
        .collect();
    if digits.len() != 9 {
        return false;
    }
    let num = |r: std::ops::Range<usize>| digits[r].iter().fold(0, |a, d| a * 10 + d);
    let (area, group, serial) = (num(0..3), num(3..5), num(5..9));
    let published = matches!(
        (area, group, serial),
        (78, 5, 1120) | (219, 9, 9999) | (123, 45, 6789)
    );
    (1..900).contains(&area) && area != 666 && group != 0 && serial != 0 && !published
}

/// Whether a provider-token body looks like a real token rather than a placeholder such as
/// `ghp_xxxxxxxx...`: at least two character classes and no run of eight equal bytes.
pub(crate) fn token_body(body: &str) -> bool {
    let b = body.as_bytes();
    let classes = [
        b.iter().any(u8::is_ascii_uppercase),
        b.iter().any(u8::is_ascii_lowercase),
        b.iter().any(u8::is_ascii_digit),
    ]
    .iter()
    .filter(|&&x| x)
    .count();
    classes >= 2 && !has_run(b, 8)
}

/// Whether `b` holds `n` equal bytes in a row.
fn has_run(b: &[u8], n: usize) -> bool {
    let mut run = 0;
    let mut prev = None;
    for &c in b {
        if Some(c) == prev {
            run += 1;
        } else {
            run = 1;
            prev = Some(c);
        }
        if run >= n {
            return true;
        }
    }
    false
}

/// OpenAI keys: not an Anthropic key (same `sk-` prefix) and a body that mixes upper case, lower
/// case and digits, which `sk-some-long-kebab-case-name` does not.
pub(crate) fn openai_key(candidate: &str) -> bool {
    if candidate.starts_with("sk-ant-") {
        return false;
    }
    let b = candidate.as_bytes();
    b[3..].iter().any(u8::is_ascii_uppercase)
        && b[3..].iter().any(u8::is_ascii_lowercase)
        && b[3..].iter().any(u8::is_ascii_digit)
        && !has_run(&b[3..], 8)
}

/// Whether a JWT candidate's header decodes to a JSON object with an `"alg"` member.
pub(crate) fn jwt(candidate: &str) -> bool {
    let Some(header) = candidate.split('.').next() else {
        return false;
    };
    let Ok(decoded) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(header) else {
        return false;
    };
    let text = String::from_utf8_lossy(&decoded);
    let text = text.trim();
    text.starts_with('{') && text.ends_with('}') && text.contains("\"alg\"")
}

/// Phone numbers: enough digits for a real number, so dates and versions never qualify, and
/// not the tail of a longer run of digit groups (an account number, a failed IBAN).
pub(crate) fn phone(text: &str, start: usize, end: usize) -> bool {
    let b = text.as_bytes();
    if start >= 2 && matches!(b[start - 1], b' ' | b'.' | b'-') && b[start - 2].is_ascii_digit() {
        return false;
    }
    let candidate = &text[start..end];
    let digits = candidate.bytes().filter(u8::is_ascii_digit).count();
    if candidate.starts_with('+') {
        // E.164 allows at most 15 digits; fewer than 8 is a short code or an arithmetic term.
        // A single '.' makes it a signed decimal (`+48.856613`), not `+1.415.555.0132`.
        let dots = candidate.matches('.').count();
        (8..=15).contains(&digits) && dots != 1
    } else if candidate.starts_with("00") {
        // After "00" and the country code the number never restarts with a trunk 0, which
        // is what digit groups such as the tail of an account number look like.
        let mut groups = candidate.split([' ', '.', '-']);
        let second = groups.nth(1).unwrap_or_default();
        (10..=17).contains(&digits) && !second.starts_with('0')
    } else if candidate.starts_with('0') {
        // National numbers with a trunk 0: UK 11, France 10, Germany 10-12.
        (10..=12).contains(&digits)
    } else {
        // North American: area code, exchange, line, optionally a leading 1.
        digits == 10 || (digits == 11 && candidate.starts_with('1'))
    }
}

/// Whether the bytes around a dotted-quad candidate show it is part of something longer
/// (`1.10.0.0.1`, `10.0.0.1.5`): versions and OIDs, not addresses.
pub(crate) fn standalone_dotted(text: &str, start: usize, end: usize) -> bool {
    let b = text.as_bytes();
    let before = start >= 2 && b[start - 1] == b'.' && b[start - 2].is_ascii_digit();
    let after = b.get(end) == Some(&b'.') && b.get(end + 1).is_some_and(u8::is_ascii_digit);
    !before && !after
}

/// Parses an IPv6 candidate (trimming a trailing `:` that belongs to the sentence) and checks it
/// is unique-local (fc00::/7) or link-local (fe80::/10). Returns the address's byte length.
pub(crate) fn private_ipv6(candidate: &str) -> Option<usize> {
    let mut s = candidate;
    for _ in 0..2 {
        if let Ok(addr) = s.parse::<Ipv6Addr>() {
            let first = addr.segments()[0];
            let private = (first & 0xfe00) == 0xfc00 || (first & 0xffc0) == 0xfe80;
            return private.then_some(s.len());
        }
        s = s.strip_suffix(':')?;
    }
    None
}

/// First labels that mark a reverse-DNS package name (`com.acme.internal`), not a host.
const REVERSE_DNS: &[&str] = &[
    "com", "org", "net", "io", "java", "javax", "android", "androidx", "kotlin", "scala",
];

/// Whether an internal-hostname candidate is a host, not a file name (`.env.local`), a package
/// (`com.acme.internal`), a type path (`Foo.Internal`) or the start of a longer public name
/// (`build.corp.example.com`).
pub(crate) fn internal_hostname(text: &str, start: usize, end: usize, suffixes: &[String]) -> bool {
    let b = text.as_bytes();
    if start > 0 && matches!(b[start - 1], b'.' | b'-') {
        return false;
    }
    if b.get(end) == Some(&b'-')
        || (b.get(end) == Some(&b'.') && b.get(end + 1).is_some_and(u8::is_ascii_alphanumeric))
    {
        return false;
    }
    let host = &text[start..end];
    let lower = host.to_ascii_lowercase();
    let labels: Vec<&str> = lower.split('.').collect();
    let ends_internal = suffixes.iter().any(|s| lower.ends_with(&format!(".{s}")));
    if !ends_internal {
        // An internal label inside a public name: `db.internal.acme.com`. Not the first label
        // (a host), followed by a registrable name whose last label is a known top-level
        // domain (module paths such as `app.internal.utils.helpers` end otherwise).
        let n = labels.len();
        if n < 4 || !known_tld(labels[n - 1]) || RESERVED_NAME.contains(&labels[n - 2]) {
            return false;
        }
        let inner = labels[1..n - 2]
            .iter()
            .any(|label| suffixes.iter().any(|s| s == label));
        if !inner {
            return false;
        }
    }
    let first = host.split('.').next().unwrap_or_default();
    if REVERSE_DNS.iter().any(|p| first.eq_ignore_ascii_case(p)) {
        return false;
    }
    // Hosts are written in one case; mixed-case labels are code (`Acme.Internal`).
    host.split('.').all(|label| {
        let lb = label.as_bytes();
        !(lb.iter().any(u8::is_ascii_uppercase) && lb.iter().any(u8::is_ascii_lowercase))
    })
}

/// Second-level names reserved for documentation (RFC 2606): `build.corp.example.com`.
const RESERVED_NAME: &[&str] = &["example"];

/// Whether `label` is a top-level domain a public name ends in: the common generic ones and
/// any two-letter country code.
fn known_tld(label: &str) -> bool {
    const GENERIC: &[&str] = &[
        "com",
        "net",
        "org",
        "io",
        "dev",
        "ai",
        "app",
        "co",
        "cloud",
        "tech",
        "biz",
        "info",
        "edu",
        "gov",
        "mil",
        "int",
        "xyz",
        "online",
        "site",
        "systems",
        "services",
        "solutions",
        "group",
        "global",
        "company",
        "digital",
        "network",
        "software",
        "works",
        "host",
    ];
    (label.len() == 2 && label.bytes().all(|b| b.is_ascii_lowercase())) || GENERIC.contains(&label)
}

/// Whether a 32-hex candidate is a Twilio auth token: the word "twilio" or an account SID
/// (`AC` + 32 hex) within 256 bytes before or after it. Without that context 32 hex digits
/// are most often a digest.
pub(crate) fn twilio_token(text: &str, start: usize, end: usize) -> bool {
    // An API key SID (`SK` + 32 hex) is Twilio's own shape.
    if text[start..end].starts_with("SK") {
        return true;
    }
    let from = floor_boundary(text, start.saturating_sub(256));
    let to = floor_boundary(text, (end + 256).min(text.len()));
    let around = text[from..to].to_ascii_lowercase();
    around.contains("twilio")
        || around.match_indices("ac").any(|(i, _)| {
            let sid = &around.as_bytes()[i + 2..];
            sid.len() >= 32 && sid[..32].iter().all(u8::is_ascii_hexdigit)
        })
}

fn floor_boundary(text: &str, mut at: usize) -> usize {
    while at > 0 && !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// Whether an identity-document number found after a context word has digits in it (a word
/// after "passport" is prose, not a number).
pub(crate) fn document_number(value: &str) -> bool {
    let digits = value.bytes().filter(u8::is_ascii_digit).count();
    digits >= 5 && value.bytes().filter(|b| b.is_ascii_alphanumeric()).count() >= 6
}

/// Whether a key names a pagination token (`NextToken`, `nextPageToken`, `page_token`,
/// `continuationToken`): an opaque cursor an API hands back, not a credential.
pub(crate) fn pagination_key(key: &str) -> bool {
    let squashed: String = key
        .bytes()
        .filter(|b| b.is_ascii_alphanumeric())
        .map(|b| char::from(b.to_ascii_lowercase()))
        .collect();
    [
        "pagetoken",
        "nexttoken",
        "continuationtoken",
        "synctoken",
        "paginationtoken",
        "resumetoken",
    ]
    .iter()
    .any(|s| squashed.ends_with(s))
}

/// Whether an e-mail candidate at `start` is the user part of a URL (`https://key@host/`, a
/// Sentry DSN), which names no mailbox.
pub(crate) fn url_userinfo(text: &str, start: usize) -> bool {
    // `://`, or more slashes where `\/` escapes were read (`https:\/\/key@host`).
    let before = &text[..start];
    let scheme = before.trim_end_matches('/');
    before.len() - scheme.len() >= 2 && scheme.ends_with(':')
}

/// Whether a file-share candidate is one: not a drive path escaped in JSON (`C:\\Users\\x`),
/// and with leading backslashes twice its separator, as an escaped or plain share path has
/// (`\\\\host\\share`, `\\host\share`).
pub(crate) fn unc_path(text: &str, start: usize, end: usize) -> bool {
    let b = text.as_bytes();
    if start > 0 && (b[start - 1] == b':' || b[start - 1].is_ascii_alphanumeric()) {
        return false;
    }
    let path = &b[start..end];
    let lead = path.iter().take_while(|&&c| c == b'\\').count();
    let host = path[lead..].iter().take_while(|&&c| c != b'\\').count();
    let sep = path[lead + host..]
        .iter()
        .take_while(|&&c| c == b'\\')
        .count();
    lead == 2 * sep
}

/// Top-level "domains" that are really file extensions (`icon@2x.png`).
const FILE_TLDS: &[&str] = &[
    "png", "jpg", "jpeg", "gif", "svg", "webp", "ico", "bmp", "tif", "tiff", "pdf", "txt", "md",
    "json", "yaml", "yml", "toml", "lock", "tsx", "jsx",
];

/// Whether an e-mail candidate is a personal address: not at a domain reserved for examples
/// and documentation (RFC 2606 / RFC 6761), not an SSH remote (`git@host`), not a file name.
pub(crate) fn email(candidate: &str) -> bool {
    let Some((local, domain)) = candidate.rsplit_once('@') else {
        return false;
    };
    if local.eq_ignore_ascii_case("git") || local.starts_with('.') || local.ends_with('.') {
        return false;
    }
    let domain = domain.to_ascii_lowercase();
    let tld = domain.rsplit('.').next().unwrap_or_default();
    if FILE_TLDS.contains(&tld) {
        return false;
    }
    let reserved = ["example", "test", "invalid", "localhost"].contains(&tld)
        || ["example.com", "example.org", "example.net"]
            .iter()
            .any(|d| domain == *d || domain.ends_with(&format!(".{d}")));
    !reserved
}

/// Whether a credential value is a real secret rather than a placeholder, a template reference
/// or code. A bare (unquoted) value made only of letters counts only when `tight_equals`: the
/// `KEY=value` form with no spaces, as in env files and command lines; elsewhere
/// (`password: String`, `token = token`) it is code.
pub(crate) fn real_secret_value(value: &str, quoted: bool, tight_equals: bool) -> bool {
    let v = value.trim();
    if v.chars().count() < 4 {
        return false;
    }
    // Our own redaction marker must never be reported again.
    if v.starts_with("[REDACTED") {
        return false;
    }
    let lower = v.to_ascii_lowercase();
    // Template and variable references: ${X}, $X, {{ x }}, %(x)s, %X%, <your-password>.
    if v.starts_with('$')
        || v.starts_with('%')
        || v.starts_with('<')
        || v.contains("{{")
        || v.contains("${")
        || v.contains("$(")
    {
        return false;
    }
    // A provider's prefix kept on a placeholder: `sk-...`, `hf_xxx`, `ghp_XXXX…`.
    if let Some(body) = PROVIDER_PREFIXES.iter().find_map(|p| v.strip_prefix(p)) {
        if body.is_empty() || placeholder_body(body) {
            return false;
        }
    }
    // Masked values: ***, xxxx, ••••, ----.
    if v.chars()
        .all(|c| matches!(c, '*' | 'x' | 'X' | '.' | '-' | '_' | '#' | '•' | '?' | ' '))
    {
        return false;
    }
    const WORDS: &[&str] = &[
        "password",
        "passwd",
        "secret",
        "token",
        "changeme",
        "change_me",
        "change-me",
        "changeit",
        "placeholder",
        "redacted",
        "hidden",
        "none",
        "null",
        "nil",
        "true",
        "false",
        "undefined",
        "empty",
        "string",
        "required",
        "optional",
        "todo",
        "tbd",
        "test",
        "dummy",
    ];
    if WORDS.contains(&lower.as_str()) {
        return false;
    }
    if ["your", "example", "placeholder", "changeme", "redacted"]
        .iter()
        .any(|w| lower.contains(w))
    {
        return false;
    }
    if v.bytes().all(|b| b.is_ascii_digit()) {
        // `max_token: 4096`, `token: 42`: settings, not secrets.
        return false;
    }
    if quoted {
        return true;
    }
    // Unquoted values that read as code: calls, indexing, references, dotted names, types.
    if v.contains(['(', '[', '{', '<', '>'])
        || v.starts_with(['&', '!', '@', '*', ':'])
        || is_dotted_identifier(v)
    {
        return false;
    }
    let letters_only = v.bytes().all(|b| b.is_ascii_alphabetic() || b == b'_');
    !letters_only || tight_equals
}

/// Prefixes of provider tokens, longest first, that placeholders keep (`sk-...`).
const PROVIDER_PREFIXES: &[&str] = &[
    "github_pat_",
    "sk-proj-",
    "sk-ant-",
    "sk_live_",
    "rk_live_",
    "glpat-",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "npm_",
    "hf_",
    "sk-",
    "xoxb-",
    "xoxp-",
    "AKIA",
    "AIza",
    "SG.",
];

/// Whether a token's body (after its provider prefix) is a placeholder: masks and ellipses
/// (`...`, `…`, `xxxx`, `XXXX`, `****`, `<key>`), or one character repeated.
pub(crate) fn placeholder_body(body: &str) -> bool {
    let body = body.trim_end_matches(['.', '…']);
    if body.is_empty() || body.starts_with('<') || body.starts_with('{') {
        return true;
    }
    let first = body.chars().next().unwrap_or('x');
    body.chars().all(|c| c == first)
        || body
            .chars()
            .all(|c| matches!(c, 'x' | 'X' | '*' | '.' | '-' | '_' | '…' | '•'))
}

/// `self.token`, `config.db.password`, `os.environ`: two or more identifier segments.
fn is_dotted_identifier(v: &str) -> bool {
    v.contains('.')
        && v.split('.').all(|seg| {
            let mut chars = seg.chars();
            chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn luhn_known_numbers() {
        assert!(luhn(b"4111111111111111"));
        assert!(!luhn(b"4111111111111112"));
        assert!(credit_card("4111 1111 1111 1111"));
        assert!(!credit_card("4111 1111-1111 1111"));
        assert!(credit_card("378282246310005"));
        assert!(!credit_card("1234567812345670"));
    }

    #[test]
    fn iban_examples() {
        assert_eq!(iban("DE89 3704 0044 0532 0130 00"), Some(27));
        assert_eq!(iban("DE89 3704 0044 0532 0130 00 EUR"), Some(27));
        assert_eq!(iban("DE88 3704 0044 0532 0130 00"), None);
        assert_eq!(iban("GB82WEST12345698765432"), Some(22));
    }

    #[test]
    fn ssn_rules() {
        assert!(us_ssn("234-56-7891"));
        assert!(!us_ssn("666-12-3456"));
        assert!(!us_ssn("900-12-3456"));
        assert!(!us_ssn("234-00-3456"));
        assert!(!us_ssn("234-56-0000"));
        assert!(!us_ssn("078-05-1120"));
    }

    #[test]
    fn secret_values() {
        assert!(real_secret_value("hunter22", false, false));
        assert!(!real_secret_value("***", true, false));
        assert!(!real_secret_value("<password>", false, false));
        assert!(!real_secret_value("${DB_PASSWORD}", true, false));
        assert!(!real_secret_value("self.password", false, false));
        assert!(!real_secret_value("String", false, false));
        assert!(real_secret_value("letmein", false, true));
        assert!(real_secret_value("correct horse battery", true, false));
    }
}
