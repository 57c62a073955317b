//! What both Tollgate daemons (the authority and the supervisor) do the same way, in one
//! place: bounded gRPC serving ([`serve`]), a supervisor's claim on its host's cgroup parent
//! and host ids ([`host`]), daemon addresses as clients give them
//! ([`address`]), the log format ([`logging`]), the `/metrics` endpoint ([`metrics`]), the data directory's lock and atomic private
//! files ([`files`]), bearer tokens ([`token`]), secrets that never print ([`Secret`]), the
//! shutdown signal ([`shutdown`]), systemd's readiness protocol ([`systemd`]) and blocking work off the async threads ([`blocking`]).
#![forbid(unsafe_code)]

pub mod address;
pub mod files;
pub mod health;
pub mod host;
pub mod logging;
pub mod metrics;
pub mod reflection;
pub mod secret;
pub mod serve;
pub mod shutdown;
pub mod systemd;
pub mod tls;
pub mod token;

pub use secret::Secret;
pub use serve::{incoming, raise_open_files_limit, ConnectionLimits, RequestLimits, ServeLimits};

/// Runs blocking work (storage, file system) on tokio's blocking threads; `Err` only when the
/// work panicked.
pub async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    tokio::task::spawn_blocking(work).await
}

/// An error with every cause under it, `: `-separated (a TLS failure is several layers down,
/// and the top one alone says only "transport error"). A cause that repeats the whole line, or
/// the part of it after its last `: `, is said once: a wrapper that prints its inner error's
/// words, or a layer that prints its own cause, would otherwise repeat it ("tcp connect error:
/// tcp connect error: …").
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        let cause = inner.to_string();
        let repeated = text == cause || text.ends_with(&format!(": {cause}"));
        if !cause.is_empty() && !repeated {
            text.push_str(": ");
            text.push_str(&cause);
        }
        source = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::error_chain;

    /// One layer of an error: its words and what is under it.
    #[derive(Debug)]
    struct Layer {
        words: &'static str,
        under: Option<Box<Layer>>,
    }

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.words)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.under
                .as_deref()
                .map(|layer| layer as &(dyn std::error::Error + 'static))
        }
    }

    fn chain(words: &[&'static str]) -> Layer {
        let mut layers = words.iter().rev();
        let mut error = Layer {
            words: layers.next().expect("one layer at least"),
            under: None,
        };
        for words in layers {
            error = Layer {
                words,
                under: Some(Box::new(error)),
            };
        }
        error
    }

    #[test]
    fn every_cause_is_said_once() {
        // tonic's transport error over hyper's connect error, which repeats its own words.
        let refused = chain(&[
            "transport error",
            "tcp connect error",
            "tcp connect error",
            "Connection refused (os error 111)",
        ]);
        assert_eq!(
            error_chain(&refused),
            "transport error: tcp connect error: Connection refused (os error 111)"
        );
        // A layer that prints its cause itself.
        let read = chain(&["reading /etc/x: Permission denied", "Permission denied"]);
        assert_eq!(error_chain(&read), "reading /etc/x: Permission denied");
        // Words that only end like the line before are a cause of their own.
        let denied = chain(&["access denied", "denied"]);
        assert_eq!(error_chain(&denied), "access denied: denied");
        let checksum = chain(&["checksum mismatch", "match"]);
        assert_eq!(error_chain(&checksum), "checksum mismatch: match");
        // Different words are all kept, in order.
        let tls = chain(&[
            "transport error",
            "invalid peer certificate",
            "UnknownIssuer",
        ]);
        assert_eq!(
            error_chain(&tls),
            "transport error: invalid peer certificate: UnknownIssuer"
        );
    }
}
