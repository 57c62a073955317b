//! Conversions between protobuf timestamps and Unix seconds.

use std::time::{SystemTime, UNIX_EPOCH};

use prost_types::Timestamp;

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(elapsed) => i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX),
        // A clock before 1970 is broken; treat it as the epoch rather than panic.
        Err(_) => 0,
    }
}

/// A timestamp at whole Unix seconds.
pub fn timestamp_from_unix(seconds: i64) -> Timestamp {
    Timestamp { seconds, nanos: 0 }
}

/// The Unix second of a timestamp (nanoseconds are dropped: receipts use whole seconds).
pub fn timestamp_to_unix(timestamp: &Timestamp) -> i64 {
    timestamp.seconds
}

/// Unix seconds as a date for people: RFC 3339 in UTC (`2026-12-05T03:20:00Z`); a time past
/// the year 9999 (or before 1970) as `unix N`, which RFC 3339 cannot write.
pub fn rfc3339(seconds: i64) -> String {
    match u64::try_from(seconds) {
        Ok(s) if s <= 253_402_300_799 => {
            humantime::format_rfc3339_seconds(UNIX_EPOCH + std::time::Duration::from_secs(s))
                .to_string()
        }
        _ => format!("unix {seconds}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_for_people_are_rfc3339_utc() {
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(-1), "unix -1");
    }
}
