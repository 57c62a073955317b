//! What the benches share of statistics (a leaf: every bench module may use it).

use std::time::Duration;

/// The `p` quantile (0 to 1) of `sorted`, nearest rank.
pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}
