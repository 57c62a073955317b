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
