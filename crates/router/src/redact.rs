//! The audit log's redaction step.

use crate::{Classification, Classifier, ClassifierConfig, ConfigError, Sensitivity};

/// Scrubs secrets from audit text: every finding the [`Classifier`] rates
/// [`Sensitivity::High`] (keys, tokens, passwords, credentials in URLs, card numbers, IBANs,
/// SSNs, high-entropy strings) is replaced with `[REDACTED:<detector>]` before an entry is
/// hashed and written, so a secret in a path, an argv or an error message never lands in a log.
///
/// Medium findings (e-mail addresses, internal host names, private addresses) are kept: the
/// audit must say which operator (names may be e-mail addresses) and which host did what.
#[derive(Debug)]
pub struct SecretRedactor {
    classifier: Classifier,
}

impl SecretRedactor {
    /// A redactor over `classifier`.
    pub fn new(classifier: Classifier) -> Self {
        Self { classifier }
    }

    /// A redactor with the built-in detectors and default settings.
    pub fn with_defaults() -> Result<Self, ConfigError> {
        Classifier::new(&ClassifierConfig::default()).map(Self::new)
    }

    /// `text` with its secrets replaced, or `None` when it holds none.
    pub fn redact_secrets(&self, text: &str) -> Option<String> {
        let found = self.classifier.classify(text);
        let secrets = Classification {
            sensitivity: found.sensitivity,
            reasons: found
                .reasons
                .into_iter()
                .filter(|reason| reason.sensitivity == Sensitivity::High)
                .collect(),
        };
        if secrets.reasons.is_empty() {
            None
        } else {
            Some(secrets.redact(text))
        }
    }
}

impl tollgate_audit::Redactor for SecretRedactor {
    fn redact(&self, text: &str) -> Option<String> {
        self.redact_secrets(text)
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
        let redacted = redactor.redact_secrets(&path).expect("the token is found");
        assert!(!redacted.contains(&token), "{redacted}");
        assert!(redacted.starts_with("/home/alice/"), "{redacted}");
        assert!(redacted.contains("[REDACTED:"), "{redacted}");
        assert_eq!(
            redactor.redact_secrets("operator alice@corp.example.org"),
            None
        );
        assert_eq!(redactor.redact_secrets("/usr/bin/python3"), None);
        assert_eq!(
            redactor.redact_secrets("tollgate/sandbox-0190a1b2c3d4e5f60718293a4b5c6d7e"),
            None
        );
    }
}
