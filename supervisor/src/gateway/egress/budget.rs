//! The run's byte budget each way, over all its connections.

use std::sync::atomic::{AtomicU64, Ordering};

use tonic::Status;

use super::EgressCalls;
use crate::gateway::gate::Refusal;

impl EgressCalls {
    /// The bytes the run's connections may carry each way, in all, now.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes.load(Ordering::SeqCst)
    }

    /// Lowers that budget to `bytes` (a narrowing; never raises it). Connections past it are
    /// cut at their next chunk.
    pub fn lower_bytes(&self, bytes: u64) {
        self.max_bytes.fetch_min(bytes, Ordering::SeqCst);
    }

    /// Raises that budget to `bytes` (a signed amendment; never lowers it).
    pub fn raise_bytes(&self, bytes: u64) {
        self.max_bytes.fetch_max(bytes, Ordering::SeqCst);
    }

    /// Sets that budget to `bytes` (what a re-adopted run's amendments made of it).
    pub fn set_bytes(&self, bytes: u64) {
        self.max_bytes.store(bytes, Ordering::SeqCst);
    }

    pub(super) fn bytes_spent(&self, way: &str) -> Refusal {
        Refusal::with(
            Status::resource_exhausted,
            format!(
                "the run's outbound connections have {way} their {} bytes (limits.egress_bytes)",
                self.max_bytes()
            ),
        )
        .coded("egress_bytes")
    }

    /// Takes `bytes` from the run's budget one way; past it, the connection is cut.
    pub(super) fn charge(
        &self,
        counter: &AtomicU64,
        bytes: usize,
        way: &str,
    ) -> Result<(), Refusal> {
        let bytes = u64::try_from(bytes).unwrap_or(u64::MAX);
        let before = counter.fetch_add(bytes, Ordering::SeqCst);
        if before.saturating_add(bytes) > self.max_bytes() {
            return Err(self.bytes_spent(way));
        }
        Ok(())
    }
}
