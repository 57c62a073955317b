//! How sensitive a text is, and scrubbing secrets out of it.
//!
//! The [`Classifier`] rates a text [`Sensitivity::Low`], `Medium` or `High` and says why; the
//! router decides model routes with it, and [`SecretRedactor`] builds on it to keep secrets out
//! of audit logs. It knows nothing of routes, receipts or the wire protocol, so a daemon that
//! only redacts (the authority) does not link model routing.
//!
//! # The classifier
//!
//! [`Classifier::new`] compiles every detector into **one** multi-pattern automaton
//! (`regex_automata::meta::Regex` built from all patterns at once, leftmost-first). A scan is a
//! single left-to-right pass: each search returns the leftmost candidate and the id of the
//! pattern that matched it; only that candidate goes to its validator (Luhn, mod-97, SSN rules,
//! the JWT header check, entropy, placeholder tests). No detector scans the text on its own.
//!
//! * Priority: when several patterns match at the same leftmost position, the one listed first
//!   wins (specific provider tokens before `token = ...`, everything before the entropy
//!   fallback). If its validator rejects the candidate, the lower-priority patterns are tried
//!   *anchored at that position* before the scan moves on, so a number that fails as a card
//!   (`0044 20 7946 0958`) can still be a phone number.
//! * Refinement: a credential value found by a generic detector (`secret_assignment`,
//!   `credential_url`, `authorization_header`) that is itself a known format
//!   (`GITHUB_TOKEN=ghp_...`, a PEM key inside JSON, a JWT bearer token) is reported under the
//!   specific detector, over the whole value.
//! * Progress: an accepted finding resumes the scan at its end, so reasons never overlap. A
//!   rejected candidate resumes where another pattern could start: at the end of its ASCII word
//!   when every pattern starts with `\b` or a non-word byte (all built-ins do), else one
//!   character later. A rejected candidate longer than 256 bytes is skipped whole, which keeps
//!   adversarial input linear.
//! * Escapes: text carried in JSON (tool-call arguments are JSON inside JSON) is read as it
//!   would be unescaped. Before the scan, every escape (`\n`, `\"`, `\\\"`, `\u0026`, `\/`,
//!   any depth) is replaced by what it stands for padded with spaces to its own length, so
//!   spans stay spans of the original text and no escape letter is glued to the next token
//!   (`\nAKIA…` is a key id, not the word `nAKIA…`). Text without a backslash is scanned as it
//!   is, without a copy.
//! * Harmless shapes are consumed and never reported, so nothing inside them trips the entropy
//!   fallback: certificates, public-key and signature PEM blocks, SSH public keys, Subresource
//!   Integrity hashes (`sha512-...`), Go module checksums (`h1:...`), digests named by their
//!   algorithm (`SHA256:` SSH fingerprints), hashed `known_hosts` entries, and the model APIs'
//!   own ids in their exact shapes (`call_` + 24 base62, `chatcmpl-…`, Anthropic's `toolu_01…`,
//!   `msg_01…`, `req_01…`); an id-like prefix on anything else (`call_` glued to a key) hides
//!   nothing.
//! * Speed: every `\b` is compiled as an ASCII word boundary, so the lazy DFA never gives up on
//!   non-ASCII text; each retry skips patterns whose first byte cannot match; the entropy
//!   candidate already requires an upper-case letter, so hex digests, UUIDs and lower-case
//!   paths never become candidates. The lazy DFA may cache 16 MiB of states per thread (the
//!   built-ins use about 3 MiB on mixed text); below what a text needs, it would fall back to a
//!   far slower engine. On the project's 2-core machine, release build, 1 MiB of
//!   [`bench::mixed_text`] classifies at about 250-300 MB/s
//!   (`cargo run --release -p tollgate-classify --example classify_throughput`).
//! * Reasons carry the detector id, what it finds in a few words ("email address"), its
//!   sensitivity (the default, or the one [`ClassifierConfig::levels`] gives) and a byte span
//!   on `char` boundaries, never the matched text. Patterns with a `value` group (assignments, URL passwords,
//!   Authorization headers, Azure keys, operator patterns that name one) report only that part.
//!
//! ## Detectors
//!
//! | id | sensitivity | what, and what it deliberately leaves out |
//! | --- | --- | --- |
//! | `private_key` | high | PEM / OpenSSH / PGP `-----BEGIN ... PRIVATE KEY-----` with its body (also with `\n` escapes) |
//! | `gcp_service_account` | high | `"type": "service_account"` with `"private_key"` within 8 KiB |
//! | `azure_storage_key` | high | `DefaultEndpointsProtocol=...;AccountKey=...` (the key is reported) |
//! | `aws_access_key_id` | high | `AKIA` / `ASIA` + 16 base32 characters |
//! | `aws_secret_access_key` | high | 40 base64 characters after an `aws_secret_access_key` / `SecretAccessKey` key |
//! | `authorization_header` | high | `Authorization: Bearer/Basic/Token <value>` |
//! | `github_token`, `gitlab_token`, `slack_token`, `stripe_key`, `anthropic_key`, `openai_key`, `huggingface_token`, `npm_token`, `pypi_token` | high | provider formats (`ghp_`…, `github_pat_`, `glpat-`, `xox[abprs]-`, `sk_live_`/`rk_live_` — test keys are not reported —, `sk-ant-`, `sk-`/`sk-proj-`, `hf_`, `npm_`, `pypi-AgEIcHlwaS5vcmc`…); bodies of one character class or with runs like `xxxxxxxx` are placeholders |
//! | `jwt` | high | three base64url parts whose header decodes to JSON with `"alg"` |
//! | `credential_url` | high | `scheme://user:password@` (the password is reported; the host is scanned on its own) |
//! | `secret_assignment` | high | `password`, `passwd`, `passphrase`, `pass`, `secret`, `token`, `api_key`, `access_key`, `auth_key`, `private_key`, `client_secret`, `credentials` as the *last segment* of a key (`DB_PASSWORD=`, `"api-key":`, `stripe.api_key`, camelCase `clientSecret`; not `max_tokens`, `bypass`), then `=`, `:`, `:=`, `=>` or `>` (or `==` / `===` before a quoted literal: a hardcoded comparison; or, in PHP's `define('DB_PASSWORD', '…')`, a comma before a quoted literal — elsewhere a comma makes a list, such as a CSV header), then a value. Not reported: values under 4 characters, pure numbers (`max_token: 4096`), masks (`***`, `xxxx`), placeholders (`<password>`, `changeme`, `changeit`, `your_token`, `example…`, `none`, `true`…), references (`$X`, `${X}`, `{{ x }}`, `%X%`), code (`get_password()`, `self.token`, `ENV['X']`, `Option<String>`), pagination cursors (`NextToken`, `nextPageToken`, `continuationToken`), and bare all-letter values except in the tight `KEY=value` form of env files (so `password: String` is code but `PASSWORD=letmein` is a secret) |
//! | `credit_card` | high | 14-19 digits, optionally in groups separated consistently by spaces or dashes, Luhn-valid, with a known issuer prefix (Visa, Mastercard incl. 2-series, Amex, Discover, JCB, Diners, UnionPay, Maestro, Mir) and a length that issuer uses; 13-digit Visa is left out (retired, and it collides with EAN-13 barcodes) |
//! | `iban` | high | country code, mod-97 checksum, the country's registered length |
//! | `us_ssn` | high | `AAA-GG-SSSS` or space-separated, or nine digits right after "SSN" / "social security number"; area 001-899 except 666, group ≠ 00, serial ≠ 0000, not the SSA's published sample numbers; other bare nine-digit runs are not reported |
//! | `google_api_key`, `sendgrid_key`, `azure_client_secret` | high | `AIza` + 35; `SG.` + 22 + `.` + 43; Entra client secrets (three characters, `8Q~`, 31-34) |
//! | `twilio_key` | high | `SK` + 32 hex (API key SID), or 32 hex within 256 bytes of "twilio" or an `AC` account SID (alone, 32 hex is usually a digest) |
//! | `passport`, `national_id` | high | a number with at least five digits right after the words that name it (`passport no.`, `NINO`, `Aadhaar`, `national id`, `personnummer`, `BSN`, `DNI`, …) |
//! | `email` | high | addresses, except at reserved example domains (`example.com/.org/.net`, `.test`, `.example`, `.invalid`, `.localhost`), SSH remotes (`git@host`), file names (`icon@2x.png`) and a URL's user part (`https://key@o1.ingest.sentry.io/`) |
//! | `phone` | high | E.164 / `00` international (8-15 digits), North American with separators, national numbers with a trunk `0` (10-12 digits); dates, versions, decimals (`+48.856613`), bare digit runs (`4155550132`) and the tail of a longer run of digit groups are not phones |
//! | `private_ipv4` | medium | 10/8, 172.16/12, 192.168/16, 169.254/16; not loopback (127/8 names no network), not part of a longer dotted number (`1.10.0.0.1`) |
//! | `private_ipv6` | medium | fc00::/7 and fe80::/10 (parsed, so `fcde:1234` is not an address) |
//! | `internal_unc_path` | medium | Windows file-share paths `\\server\share`, also escaped in JSON; not drive paths (`C:\\Users\\x` in JSON) |
//! | `bare_host_url` | medium | a single-label host in an `http(s)://` URL (`http://intranet/wiki`, `http://jira:8080/`); not `localhost`, `example`, `host` |
//! | `internal_hostname` | medium | names ending in a configured suffix (default `.internal`, `.corp`, `.local`, `.lan`, `.intranet`, `.home.arpa`, `.consul`), or with a configured single-label suffix as an inner label of a public name (`db.internal.acme.com`: not the first label, followed by a name ending in a known top-level domain, not `example.*`); not file names (`.env.local`), packages (`com.acme.internal`), module paths (`app.internal.utils`) or mixed-case type paths (`Foo.Internal`) |
//! | operator patterns | configured | [`CustomPattern`]s, after the built-ins |
//! | `high_entropy` | high (configurable) | a base64/base64url run of 24-256 characters mixing upper case, lower case and digits, switching class on ≥ 40% of characters, with Shannon entropy ≥ 4.0 bits per byte, that does not decode (as base64) to readable text and is not an SSH wire blob (`AAAA...`). Hex digests (also behind a one- or two-letter prefix, such as Gerrit's `I…` Change-Ids), git SHAs, UUIDs, ULIDs, base32 (so TOTP seeds too), identifiers, paths (judged on their segments with an upper-case letter, so `dist/assets/index-BQx3mZ7c` is not random), JWT-like parts of encoded JSON do not qualify; runs over 256 characters are treated as encoded data. A run that does qualify is still not reported, and is consumed whole, when it decodes to the header of a file (an image, a PDF, an archive: a small `data:` URI or image block) or when the key right before it names an identifier or a digest (`"id"`, `"tool_call_id"`, `requestId=`, `gclid=`, `"sha256"`, `"signature"`, `"encrypted_content"`, a pagination cursor such as `"NextToken"`; never a key that names a credential, such as `session_id`, and for id keys only base62/base64url values that do not carry an API id prefix in the wrong shape). It is high because an unlabelled random token in text is most likely a credential; set [`ClassifierConfig::entropy_sensitivity`] to lower it |
//!
//! `router/classify/corpus/cases.txt` holds true cases and near misses for every detector; the
//! `corpus` test checks each and prints precision and recall. `corpus/tool_calls.txt` holds
//! coding agents' tool traffic (tool definitions, call arguments, results, whole messages),
//! harmless and not; the `tool_calls` test classifies each as extracted text and inside
//! OpenAI Chat, Responses and Anthropic messages, and prints false positives and exact levels.
#![forbid(unsafe_code)]

pub mod bench;
mod checks;
mod classifier;
mod detectors;
mod entropy;
mod escapes;
mod patterns;
mod redact;

pub use classifier::{
    Classification, Classifier, ClassifierConfig, ConfigError, CustomPattern, DetectorId, Reason,
    DEFAULT_ENTROPY_MIN_LEN, DEFAULT_ENTROPY_THRESHOLD, DEFAULT_INTERNAL_SUFFIXES,
};

pub use redact::SecretRedactor;

/// How sensitive a text is, ordered `Low < Medium < High`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Sensitivity {
    /// Nothing sensitive found.
    Low,
    /// Personal data or internal names.
    Medium,
    /// Secrets and credentials.
    High,
}

impl Sensitivity {
    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Low => "low",
            Self::Medium => "medium",
            Self::High => "high",
        }
    }
}
