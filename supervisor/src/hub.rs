//! Per-run event channels for WatchRun: everything a run printed is kept (it is bounded by
//! the receipt's output limit) and replayed to late watchers, then live events follow.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::broadcast;
use tollgate_proto::v1 as pb;

/// Ended runs whose events are kept for late watchers.
const KEEP_ENDED: usize = 256;

struct Channel {
    history: Vec<pb::RunEvent>,
    live: broadcast::Sender<pb::RunEvent>,
    ended: bool,
    order: u64,
}

/// Events of every run this supervisor has started since it started.
#[derive(Default)]
pub struct RunHub {
    channels: Mutex<(HashMap<String, Channel>, u64)>,
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
        let (channels, counter) = &mut *guard;
        *counter += 1;
        let order = *counter;
        let channel = channels
            .entry(run_id.to_owned())
            .or_insert_with(|| Channel {
                history: Vec::new(),
                live: broadcast::channel(1024).0,
                ended: false,
                order,
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
        self.with(run_id, |channel| {
            channel.history.push(event.clone());
            let _ = channel.live.send(event);
            channel.ended = true;
        });
        let mut guard = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        let channels = &mut guard.0;
        let ended = channels.values().filter(|c| c.ended).count();
        if ended > KEEP_ENDED {
            let mut oldest: Vec<(u64, String)> = channels
                .iter()
                .filter(|(_, c)| c.ended)
                .map(|(id, c)| (c.order, id.clone()))
                .collect();
            oldest.sort();
            for (_, id) in oldest.into_iter().take(ended - KEEP_ENDED) {
                channels.remove(&id);
            }
        }
    }

    /// The history of `run_id` and, while it is live, a receiver for what follows. `None`
    /// when the hub has never seen the run.
    pub fn subscribe(&self, run_id: &str) -> Option<Subscription> {
        let guard = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        let channel = guard.0.get(run_id)?;
        let receiver = (!channel.ended).then(|| channel.live.subscribe());
        Some((channel.history.clone(), receiver))
    }
}
