//! Sandbox host ids (one uid/gid per live run), handed out without looking at the other runs.
//!
//! A start used to read every live run's host id from the database and walk the range for
//! the first one not among them: a cost that grew with the number of live runs, paid under
//! the admission lock. The allocator here keeps what it needs up to date instead: ids never
//! handed out since the supervisor started are the range above `next`; ids given back wait in
//! `free`. A start takes the lowest free id, as before (`O(log live)`), and a run's id is
//! given back once its final record is written, the moment the database stops counting it as
//! live. Seeded at start-up from the runs still live (re-adopted by a live restore).

use std::collections::{BTreeSet, HashMap};
use std::ops::Range;

/// The host ids of a supervisor's range: which are held, by which run, and which are free.
#[derive(Debug)]
pub struct HostIds {
    range: Range<u32>,
    /// Every id at or above `next` (within the range) has never been handed out.
    next: u32,
    /// Ids below `next` that are free again.
    free: BTreeSet<u32>,
    /// The id each live run holds.
    held: HashMap<String, u32>,
}

impl HostIds {
    /// The ids of `range`, with `live` (run id, host id) already held. Ids outside the range
    /// (a range changed between supervisor starts) are held by their run, never handed out.
    pub fn new(range: Range<u32>, live: impl IntoIterator<Item = (String, u32)>) -> Self {
        let held: HashMap<String, u32> = live.into_iter().collect();
        let taken: BTreeSet<u32> = held
            .values()
            .copied()
            .filter(|id| range.contains(id))
            .collect();
        let next = taken.last().map_or(range.start, |last| last + 1);
        let free = (range.start..next)
            .filter(|id| !taken.contains(id))
            .collect();
        Self {
            range,
            next,
            free,
            held,
        }
    }

    /// The lowest free id, now held by `run_id`; `None` when every id of the range is held.
    /// The caller checks [`Self::holds`] first: a run holds one id at most.
    pub fn take(&mut self, run_id: &str) -> Option<u32> {
        debug_assert!(
            !self.held.contains_key(run_id),
            "{run_id} holds an id already"
        );
        let id = match self.free.pop_first() {
            Some(id) => id,
            None if self.next < self.range.end => {
                self.next += 1;
                self.next - 1
            }
            None => return None,
        };
        self.held.insert(run_id.to_owned(), id);
        Some(id)
    }

    /// Whether `run_id` holds an id (it is live, or its end is not recorded yet).
    pub fn holds(&self, run_id: &str) -> bool {
        self.held.contains_key(run_id)
    }

    /// Gives back the id `run_id` holds (nothing when it holds none: giving back twice is
    /// harmless, so the id can never be handed to two runs).
    pub fn give_back(&mut self, run_id: &str) {
        if let Some(id) = self.held.remove(run_id) {
            if self.range.contains(&id) {
                self.free.insert(id);
            }
        }
    }

    /// How many ids live runs hold.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// The configured range.
    pub fn range(&self) -> Range<u32> {
        self.range.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_free_id_goes_first_and_comes_back_once() {
        let mut ids = HostIds::new(100..104, []);
        assert_eq!(ids.take("a"), Some(100));
        assert_eq!(ids.take("b"), Some(101));
        assert_eq!(ids.take("c"), Some(102));
        assert!(ids.holds("a") && !ids.holds("z"));
        ids.give_back("b");
        ids.give_back("b");
        assert_eq!(ids.take("d"), Some(101), "the lowest free id, once");
        assert_eq!(ids.take("e"), Some(103));
        assert_eq!(ids.take("f"), None, "every id is held");
        assert_eq!(ids.held(), 4);
        ids.give_back("c");
        ids.give_back("a");
        assert_eq!(ids.take("g"), Some(100));
        assert_eq!(ids.take("h"), Some(102));
    }

    #[test]
    fn runs_still_live_at_start_up_keep_their_ids() {
        let live = [
            ("x".to_owned(), 12),
            ("y".to_owned(), 10),
            ("old".to_owned(), 7),
        ];
        let mut ids = HostIds::new(10..15, live);
        assert_eq!(ids.take("a"), Some(11));
        assert_eq!(ids.take("b"), Some(13));
        ids.give_back("old"); // outside the range: never handed out
        ids.give_back("y");
        assert_eq!(ids.take("c"), Some(10));
        assert_eq!(ids.take("d"), Some(14));
        assert_eq!(ids.take("e"), None);
    }

    /// Taking an id looks at no other run: with thousands held, a take touches the free set
    /// and the one new entry, whatever the number of live runs (no timing: the structure).
    #[test]
    fn a_take_does_not_walk_the_live_runs() {
        let live = (0..5000u32).map(|i| (format!("run{i}"), 1000 + i));
        let mut ids = HostIds::new(1000..20_000, live);
        assert!(ids.free.is_empty(), "no gap below the highest live id");
        assert_eq!(ids.next, 6000);
        assert_eq!(ids.take("new"), Some(6000));
        ids.give_back("run42");
        assert_eq!(ids.free.len(), 1);
        assert_eq!(ids.take("newer"), Some(1042));
        assert_eq!(ids.held(), 5001);
    }
}
