//! The memory every inspected connection of a supervisor holds, together: one byte budget
//! (`--egress-inspect-budget`) that each connection's buffers and each request body the
//! supervisor reads to classify reserve before they are held. A reservation is returned when
//! it is dropped — the request answered, the connection ended, its task cancelled at the
//! run's end — so stalled connections of any number of runs never hold more than the budget,
//! and a request that finds it spent is refused at once (never queued).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The budget when no flag sets it: 256 MiB.
pub const DEFAULT_INSPECT_BUDGET: usize = 256 << 20;

/// A supervisor-wide byte budget shared by every run's inspected connections.
#[derive(Debug)]
pub struct InspectBudget {
    limit: usize,
    held: AtomicUsize,
}

/// Why a reservation was refused: the budget is spent.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "the supervisor's memory for inspected connections is in use ({held} of {limit} bytes, --egress-inspect-budget); \
     retry when other inspected requests have finished"
)]
pub struct BudgetSpent {
    /// Bytes held when the reservation was refused.
    pub held: usize,
    /// The budget.
    pub limit: usize,
}

impl InspectBudget {
    /// A budget of `limit` bytes, none held.
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            held: AtomicUsize::new(0),
        })
    }

    /// Bytes reserved now, by every holder together.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    /// The budget in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// An empty reservation, grown as bytes are held.
    pub fn reservation(self: &Arc<Self>) -> Reservation {
        Reservation {
            budget: self.clone(),
            bytes: 0,
        }
    }

    /// A reservation of `bytes`, or why the budget cannot give them.
    pub fn reserve(self: &Arc<Self>, bytes: usize) -> Result<Reservation, BudgetSpent> {
        let mut reservation = self.reservation();
        reservation.grow(bytes)?;
        Ok(reservation)
    }

    fn take(&self, bytes: usize) -> Result<(), BudgetSpent> {
        self.held
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| {
                held.checked_add(bytes).filter(|total| *total <= self.limit)
            })
            .map(|_| ())
            .map_err(|held| BudgetSpent {
                held,
                limit: self.limit,
            })
    }
}

impl Default for InspectBudget {
    fn default() -> Self {
        Self {
            limit: DEFAULT_INSPECT_BUDGET,
            held: AtomicUsize::new(0),
        }
    }
}

/// Bytes taken from an [`InspectBudget`], given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<InspectBudget>,
    bytes: usize,
}

impl Reservation {
    /// Takes `bytes` more, or leaves the reservation as it was when the budget cannot.
    pub fn grow(&mut self, bytes: usize) -> Result<(), BudgetSpent> {
        self.budget.take(bytes)?;
        self.bytes += bytes;
        Ok(())
    }

    /// Bytes this reservation holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_bounded_together_and_returned_when_dropped() {
        let budget = InspectBudget::new(100);
        let first = budget.reserve(60).unwrap();
        let mut second = budget.reservation();
        second.grow(30).unwrap();
        let spent = second.grow(20).unwrap_err();
        assert_eq!(
            spent,
            BudgetSpent {
                held: 90,
                limit: 100
            }
        );
        assert!(spent.to_string().contains("--egress-inspect-budget"));
        assert_eq!(second.bytes(), 30);
        assert_eq!(budget.held(), 90);
        drop(first);
        second.grow(20).unwrap();
        assert_eq!(budget.held(), 50);
        drop(second);
        assert_eq!(budget.held(), 0);
    }
}
