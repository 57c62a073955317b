//! The one form `time` fields take, shared by entries and checkpoints.

use std::time::SystemTime;

/// RFC 3339 UTC with milliseconds, the only form `time` fields take.
pub(crate) fn format_time(time: SystemTime) -> String {
    humantime::format_rfc3339_millis(time).to_string()
}

/// Whether `text` is exactly what [`format_time`] writes for some instant.
pub(crate) fn is_canonical_time(text: &str) -> bool {
    humantime::parse_rfc3339(text).is_ok_and(|t| format_time(t) == text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_must_be_rfc3339_millis_utc() {
        assert!(is_canonical_time("2025-01-02T03:04:05.678Z"));
        assert!(!is_canonical_time("2025-01-02T03:04:05Z"));
        assert!(!is_canonical_time("2025-01-02T03:04:05.678+00:00"));
        assert!(!is_canonical_time("2025-01-02T03:04:05.678912Z"));
    }
}
