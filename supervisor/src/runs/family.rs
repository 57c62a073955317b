//! Live delegated runs by parent: which children each run has, and what they hold of its
//! limits together, kept up to date as children are admitted and end.
//!
//! Ending a run (every teardown), admitting a child, narrowing a run's grants and a live
//! restore's detach each need a run's live children. They used to find them by walking every
//! live run (or every live child's hold) on each call: a cost that grew with the number of
//! live runs. Here a child is found through its parent, and a parent's total hold is a sum
//! kept as children come and go.

use std::collections::{HashMap, HashSet};

/// What a live child holds of its parent's concurrent limits: memory bytes, pids, cpu
/// millicores.
pub(super) type Holds = [u64; 3];

/// The live children of every run (admitted, not yet ended) and their holds.
#[derive(Debug, Default)]
pub(super) struct Family {
    /// Each live child: its parent and what it holds.
    parent_of: HashMap<String, (String, Holds)>,
    /// Each parent's live children.
    children: HashMap<String, HashSet<String>>,
    /// What each parent's live children hold together.
    held: HashMap<String, Holds>,
}

impl Family {
    /// Notes `child` of `parent`, holding `holds` (at its admission).
    pub(super) fn add(&mut self, child: &str, parent: &str, holds: Holds) {
        self.remove(child);
        self.parent_of
            .insert(child.to_owned(), (parent.to_owned(), holds));
        self.children
            .entry(parent.to_owned())
            .or_default()
            .insert(child.to_owned());
        let sum = self.held.entry(parent.to_owned()).or_default();
        for (sum, value) in sum.iter_mut().zip(holds) {
            *sum = sum.saturating_add(value);
        }
    }

    /// Forgets `child` and gives back what it held (at its end; nothing for a root run).
    pub(super) fn remove(&mut self, child: &str) {
        let Some((parent, holds)) = self.parent_of.remove(child) else {
            return;
        };
        if let Some(children) = self.children.get_mut(&parent) {
            children.remove(child);
            if children.is_empty() {
                self.children.remove(&parent);
                self.held.remove(&parent);
                return;
            }
        }
        if let Some(sum) = self.held.get_mut(&parent) {
            for (sum, value) in sum.iter_mut().zip(holds) {
                *sum = sum.saturating_sub(value);
            }
        }
    }

    /// What `parent`'s live children hold together.
    pub(super) fn held_by(&self, parent: &str) -> Holds {
        self.held.get(parent).copied().unwrap_or_default()
    }

    /// `parent`'s live children (admitted and not ended; some may not have a sandbox yet).
    pub(super) fn children_of(&self, parent: &str) -> impl Iterator<Item = &String> + '_ {
        self.children.get(parent).into_iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_and_children_follow_admissions_and_ends() {
        let mut family = Family::default();
        family.add("a", "root", [10, 1, 100]);
        family.add("b", "root", [5, 2, 50]);
        family.add("a1", "a", [1, 1, 1]);
        assert_eq!(family.held_by("root"), [15, 3, 150]);
        let mut children: Vec<&String> = family.children_of("root").collect();
        children.sort();
        assert_eq!(children, ["a", "b"]);
        assert_eq!(family.children_of("a").collect::<Vec<_>>(), ["a1"]);
        assert_eq!(family.children_of("b").count(), 0);
        family.remove("a");
        family.remove("a"); // twice: nothing more is given back
        assert_eq!(family.held_by("root"), [5, 2, 50]);
        assert_eq!(family.children_of("root").collect::<Vec<_>>(), ["b"]);
        family.remove("b");
        family.remove("root"); // a root run holds nothing
        assert_eq!(family.held_by("root"), [0, 0, 0]);
        assert_eq!(family.children_of("root").count(), 0);
        assert_eq!(
            family.held_by("a"),
            [1, 1, 1],
            "a grandchild stays till its own end"
        );
        family.remove("a1");
        assert!(family.parent_of.is_empty() && family.children.is_empty());
        assert!(family.held.is_empty());
    }
}
