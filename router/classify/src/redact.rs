//! The audit log's redaction step.

use std::ops::Range;

use regex_automata::meta;

use crate::{Classifier, ClassifierConfig, ConfigError, Reason, Sensitivity};

/// Named credentials the routing classifier leaves alone to keep its precision, but an audit
/// log must never hold: a value after a name ending in key, secret, token, password or
/// credential, separated by `=`, `:` or blanks (`SIGNING_KEY=…`, `--password …`,
/// `password …`); and Tollgate's own operator tokens.
const AUDIT_EXTRAS: &str = concat!(
    r#"(?i:(?:^|[^a-z0-9])(?:[a-z0-9]+[_.-])*(?:key|secret|token|passw(?:or)?d|passphrase|pwd|credentials?))"#,
    r#"["']?(?:[ \t]*[:=][ \t]*|[ \t]+)["']?(?P<value>[^\s"',;]{8,})"#,
    r#"|(?P<token>\btgt_[A-Za-z0-9_-]{20,})"#,
);

/// Scrubs secrets from audit text: every finding the [`Classifier`] rates
/// [`Sensitivity::High`] (keys, tokens, passwords, credentials in URLs, card numbers, IBANs,
/// SSNs, high-entropy strings) is replaced with `[REDACTED:<detector>]` before an entry is
/// hashed and written, so a secret in a path, an argv or an error message never lands in a log.
///
/// Medium findings (e-mail addresses, internal host names, private addresses) are kept: the
/// audit must say which operator (names may be e-mail addresses) and which host did what.
///
/// On top of the classifier it also removes named credentials the classifier leaves alone to
/// keep its routing precision (`SIGNING_KEY=…`, `--password …`, values with a digit after a
/// key, secret, token or password name) and Tollgate's own operator tokens: in an audit log,
/// removing too much costs little and too little is a leak.
#[derive(Debug)]
pub struct SecretRedactor {
    classifier: Classifier,
    extras: meta::Regex,
}

/// Whether `value` is a Tollgate key id: 16 lowercase hex digits (the first 8 bytes of the
/// SHA-256 of a public key), perhaps followed by punctuation.
fn is_key_id(value: &str) -> bool {
    let id = value.trim_end_matches([':', '.', ',', ')', ';']);
    id.len() == 16 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl SecretRedactor {
    /// A redactor over `classifier`.
    pub fn new(classifier: Classifier) -> Self {
        let extras = meta::Regex::new(AUDIT_EXTRAS)
            .expect("the audit redaction pattern is a valid constant");
        Self { classifier, extras }
    }

    /// A redactor with the built-in detectors and default settings.
    pub fn with_defaults() -> Result<Self, ConfigError> {
        Classifier::new(&ClassifierConfig::default()).map(Self::new)
    }

    /// Spans of named credentials and operator tokens.
    fn extra_spans(&self, text: &str) -> Vec<(Range<usize>, &'static str)> {
        let mut spans = Vec::new();
        for caps in self.extras.captures_iter(text) {
            if let Some(value) = caps.get_group_by_name("value") {
                // A credential has a digit; `sort_key = timestamp` or `token bucket` do not.
                // A Tollgate key id in prose (`signing key 0a1b…`, not `key: …`) names a
                // *public* key: keep it, or the audit could not say which key signed or was
                // refused.
                let value_text = &text[value.range()];
                let assigned = text[..value.start]
                    .trim_end_matches([' ', '\t', '"', '\''])
                    .ends_with([':', '=']);
                let key_id = !assigned && is_key_id(value_text);
                if value_text.bytes().any(|b| b.is_ascii_digit()) && !key_id {
                    spans.push((value.range(), "named_credential"));
                }
            } else if let Some(token) = caps.get_group_by_name("token") {
                spans.push((token.range(), "tollgate_token"));
            }
        }
        spans
    }

    /// `text` with its secrets replaced, or `None` when it holds none: the shape of redactor
    /// the audit log takes (`Fn(&str) -> Option<String>`).
    pub fn redact(&self, text: &str) -> Option<String> {
        let found = self.classifier.classify(text);
        let mut spans: Vec<(Range<usize>, String)> = found
            .reasons
            .into_iter()
            .filter(|reason| reason.sensitivity == Sensitivity::High)
            .map(|reason: Reason| (reason.span, reason.detector.as_str().to_owned()))
            .collect();
        for (range, id) in self.extra_spans(text) {
            if !spans
                .iter()
                .any(|(r, _)| r.start < range.end && range.start < r.end)
            {
                spans.push((range, id.to_owned()));
            }
        }
        if spans.is_empty() {
            return None;
        }
        spans.sort_by_key(|(range, _)| range.start);
        let mut out = String::with_capacity(text.len());
        let mut at = 0;
        for (range, id) in spans {
            if range.start < at {
                continue;
            }
            out.push_str(&text[at..range.start]);
            out.push_str(&format!("[REDACTED:{id}]"));
            at = range.end;
        }
        out.push_str(&text[at..]);
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_go_and_identities_stay() {
        let redactor = SecretRedactor::with_defaults().unwrap();
        let token = format!("ghp_{}", "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8");
        let path = format!("/home/alice/.config/{token}/notes.txt");
        let redacted = redactor.redact(&path).expect("the token is found");
        assert!(!redacted.contains(&token), "{redacted}");
        assert!(redacted.starts_with("/home/alice/"), "{redacted}");
        assert!(redacted.contains("[REDACTED:"), "{redacted}");
        assert_eq!(redactor.redact("operator alice@corp.example.org"), None);
        assert_eq!(redactor.redact("/usr/bin/python3"), None);
        // Public key ids are not credentials; a key's value is.
        assert_eq!(
            redactor.redact(
                "unknown signing key 0a1b2c3d4e5f6071: not in the trusted key set (fetch the authority's current key set)"
            ),
            None
        );
        assert!(redactor
            .redact("signing key 0a1b2c3d4e5f60718293a4b5c6d7e8f9")
            .is_some());
        assert_eq!(
            redactor.redact("tollgate/sandbox-0190a1b2c3d4e5f60718293a4b5c6d7e"),
            None
        );
    }

    #[test]
    fn named_credentials_and_operator_tokens_go_too() {
        let redactor = SecretRedactor::with_defaults().unwrap();
        let hex = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        for (text, secret) in [
            (format!("SECRET_KEY={hex}"), hex),
            (format!("TOLLGATE_AUDIT_KEY={hex}"), hex),
            (
                "run --password S3cr3tPassw0rd! now".to_owned(),
                "S3cr3tPassw0rd!",
            ),
            ("password hunter2hunter2".to_owned(), "hunter2hunter2"),
            (
                "signing_key: ab12cd34ef56ab78".to_owned(),
                "ab12cd34ef56ab78",
            ),
            (
                "token tgt_Qm9vb2Jvb2Jvb2Jvb2Jvb2Jvb2Jvb2Jvb2Jvb28".to_owned(),
                "tgt_Qm9vb2Jvb2Jvb2Jvb2Jvb2Jvb2Jvb2Jvb2Jvb28",
            ),
        ] {
            let redacted = redactor.redact(&text).unwrap_or_default();
            assert!(!redacted.contains(secret), "{text:?} -> {redacted:?}");
            assert!(redacted.contains("[REDACTED:"), "{text:?} -> {redacted:?}");
        }
        for text in [
            "sort_key=timestamp",
            "retiring_key_id=051f6f999c9b7107",
            "token bucket overflow",
            "the key rotation finished",
        ] {
            assert_eq!(redactor.redact(text), None, "{text}");
        }
    }
}
