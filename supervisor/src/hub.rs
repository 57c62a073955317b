//! Per-run event channels for WatchRun: everything a run printed is kept (it is bounded by
//! the receipt's output limit) and replayed to late watchers, then live events follow.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use tokio::sync::broadcast;
use tollgate_proto::v1 as pb;

/// Ended runs whose events are kept for late watchers.
const KEEP_ENDED: usize = 256;

struct Channel {
    history: Vec<pb::RunEvent>,
    live: broadcast::Sender<pb::RunEvent>,
    ended: bool,
}

/// The channels, and the ended ones in the order they ended: the oldest is dropped first,
/// without looking at the others (a run's end used to count and sort every channel).
#[derive(Default)]
struct Channels {
    by_run: HashMap<String, Channel>,
    ended: VecDeque<String>,
}

/// Events of every run this supervisor has started since it started.
#[derive(Default)]
pub struct RunHub {
    channels: Mutex<Channels>,
}

impl std::fmt::Debug for RunHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunHub").finish_non_exhaustive()
    }
}

/// What a watcher gets: the history so far, and live events unless the run has ended.
pub type Subscription = (Vec<pb::RunEvent>, Option<broadcast::Receiver<pb::RunEvent>>);

impl RunHub {
    fn with<R>(&self, run_id: &str, f: impl FnOnce(&mut Channel) -> R) -> R {
        let mut guard = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        let channel = guard
            .by_run
            .entry(run_id.to_owned())
            .or_insert_with(|| Channel {
                history: Vec::new(),
                live: broadcast::channel(1024).0,
                ended: false,
            });
        f(channel)
    }

    /// Opens the channel of a run that just started, so watchers wait for its events even
    /// before its first output.
    pub fn open(&self, run_id: &str) {
        self.with(run_id, |_| ());
    }

    /// Records and broadcasts an event.
    pub fn push(&self, run_id: &str, event: pb::RunEvent) {
        self.with(run_id, |channel| {
            channel.history.push(event.clone());
            // No watcher is fine: the history replays.
            let _ = channel.live.send(event);
        });
    }

    /// Records the final event; later watchers get the history only.
    pub fn end(&self, run_id: &str, run: pb::Run) {
        let event = pb::RunEvent {
            event: Some(pb::run_event::Event::Ended(run)),
        };
        // One critical section: a watcher sees either the run live (and receives this event)
        // or ended (with this event in the history), never the event without the flag.
        let newly = self.with(run_id, |channel| {
            channel.history.push(event.clone());
            let _ = channel.live.send(event);
            !std::mem::replace(&mut channel.ended, true)
        });
        let mut guard = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        let channels = &mut *guard;
        if newly {
            channels.ended.push_back(run_id.to_owned());
        }
        while channels.ended.len() > KEEP_ENDED {
            let Some(oldest) = channels.ended.pop_front() else {
                break;
            };
            // Only a channel still ended goes.
            if channels.by_run.get(&oldest).is_some_and(|c| c.ended) {
                channels.by_run.remove(&oldest);
            }
        }
    }

    /// The history of `run_id` and, while it is live, a receiver for what follows. `None`
    /// when the hub has never seen the run.
    pub fn subscribe(&self, run_id: &str) -> Option<Subscription> {
        let guard = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        let channel = guard.by_run.get(run_id)?;
        let receiver = (!channel.ended).then(|| channel.live.subscribe());
        Some((channel.history.clone(), receiver))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_ended_runs_go_first_and_live_ones_stay() {
        let hub = RunHub::default();
        hub.open("live");
        for i in 0..KEEP_ENDED + 10 {
            let id = format!("run{i}");
            hub.open(&id);
            hub.end(&id, pb::Run::default());
            hub.end(&id, pb::Run::default()); // twice: counted once
        }
        assert!(hub.subscribe("run0").is_none());
        assert!(hub.subscribe("run9").is_none());
        assert!(hub.subscribe("run10").is_some());
        let (history, live) = hub.subscribe("live").unwrap();
        assert!(history.is_empty() && live.is_some());
        let guard = hub.channels.lock().unwrap();
        assert_eq!(guard.ended.len(), KEEP_ENDED);
        assert_eq!(guard.by_run.len(), KEEP_ENDED + 1);
    }
}
