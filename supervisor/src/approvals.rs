//! Calls waiting for an operator's approval, across every run of this supervisor.
//!
//! A gateway call under a grant that asks (`ask = true`) is put on the board with what an
//! operator needs to decide (tool, path, sizes; never data) and waits on its [`Ticket`]:
//! until an operator decides ([`ApprovalBoard::decide`]), its deadline passes, its run ends,
//! or the agent gives the call up (the ticket is dropped). Whichever comes first takes the
//! call off the board under one lock, so a decision and a timeout never both win. Watchers
//! ([`ApprovalBoard::watch`]) get the calls waiting now and then every change.
//!
//! What a run can make the supervisor hold here is bounded: [`MAX_WAITING_PER_RUN`] waiting
//! calls a run, [`MAX_WAITING_PER_OWNER`] an owner's runs together (one operator's many runs
//! never fill the board for the others), [`MAX_WAITING`] in all, [`MAX_REMEMBERED_PER_RUN`]
//! remembered approvals a run. A leaf: it knows nothing of the gateway or the API that use it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use tokio::sync::{broadcast, oneshot, watch};
use tollgate_proto::v1 as pb;

/// Most calls of one run waiting at once.
pub const MAX_WAITING_PER_RUN: usize = 16;
/// Most calls of one owner's runs waiting at once.
pub const MAX_WAITING_PER_OWNER: usize = 256;
/// Most calls waiting at once on this supervisor.
pub const MAX_WAITING: usize = 1024;
/// Most remembered approvals (tool and path) of one run.
pub const MAX_REMEMBERED_PER_RUN: usize = 256;
/// Most bytes of a decider's reason kept.
pub const MAX_REASON: usize = 1024;
/// Changes a slow watcher may fall behind before its stream ends (it watches again and
/// gets the calls waiting then).
const WATCH_BACKLOG: usize = 256;

/// An operator's verdict on one waiting call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Go on; with `remember`, later calls of the same tool on the same path pass unasked.
    Approved {
        /// Who decided.
        by: String,
        /// Whether to remember it for the rest of the run.
        remember: bool,
        /// Why, if the decider said.
        reason: String,
    },
    /// Refused, with the decider's reason.
    Denied {
        /// Who decided.
        by: String,
        /// Why.
        reason: String,
    },
}

/// How a wait ended, as the waiting call sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitOutcome {
    /// An operator decided.
    Decided(Verdict),
    /// No one decided before the deadline.
    TimedOut,
    /// The run ended (stopped, expired, revoked) while the call waited.
    RunEnded,
}

/// Why a call could not be put on the board.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AskError {
    /// The run already has as many calls waiting as it may.
    #[error("{MAX_WAITING_PER_RUN} calls of this run already wait for approval; wait for a decision, or cancel one")]
    RunFull,
    /// The runs of the call's owner already have as many calls waiting as they may.
    #[error("{MAX_WAITING_PER_OWNER} calls of this operator's runs already wait for approval; retry once some are decided")]
    OwnerFull,
    /// The supervisor already has as many calls waiting as it may.
    #[error("{MAX_WAITING} calls already wait for approval on this supervisor; retry once operators have decided")]
    BoardFull,
}

/// Why a decision could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecideError {
    /// No such call waits (it was decided, timed out, cancelled, or never asked).
    #[error("call {call_id} of run {run_id} does not wait for approval (decided, timed out or cancelled already, or never asked)")]
    NotWaiting {
        /// The run.
        run_id: String,
        /// The call.
        call_id: String,
    },
}

struct Waiting {
    call: pb::PendingCall,
    verdict: oneshot::Sender<Verdict>,
}

#[derive(Default)]
struct Board {
    /// By (run id, call id): call ids are time-ordered, so each run's oldest come first.
    waiting: BTreeMap<(String, String), Waiting>,
    /// Per run: the (tool, path) pairs an operator approved with `remember`.
    remembered: HashMap<String, HashSet<(String, String)>>,
}

/// What a remembered approval of a call reaching `path` lets through again: the same path;
/// for a command, the same whole `argv`, in the same `cwd`, with the same stdin (its SHA-256):
/// approving `git status` never approves `git push`, nor `sh -s` with other input.
pub fn remembered_as(path: &str, argv: &[String], cwd: &str, stdin_sha256: &str) -> String {
    if argv.is_empty() {
        path.to_owned()
    } else {
        // Unambiguous: each part quoted and escaped.
        format!("{argv:?} {cwd:?} {stdin_sha256:?}")
    }
}

/// The calls waiting for approval on this supervisor.
pub struct ApprovalBoard {
    board: Mutex<Board>,
    changes: broadcast::Sender<pb::ApprovalEvent>,
}

impl std::fmt::Debug for ApprovalBoard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApprovalBoard").finish_non_exhaustive()
    }
}

impl Default for ApprovalBoard {
    fn default() -> Self {
        Self {
            board: Mutex::default(),
            changes: broadcast::channel(WATCH_BACKLOG).0,
        }
    }
}

impl ApprovalBoard {
    fn lock(&self) -> std::sync::MutexGuard<'_, Board> {
        self.board.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether an operator approved `tool` on `target` ([`remembered_as`]) for the rest of
    /// run `run_id`.
    pub fn remembered(&self, run_id: &str, tool: &str, target: &str) -> bool {
        self.lock()
            .remembered
            .get(run_id)
            .is_some_and(|rules| rules.contains(&(tool.to_owned(), target.to_owned())))
    }

    /// Puts `call` on the board; its [`Ticket`] waits for the outcome.
    pub fn ask(&self, call: pb::PendingCall) -> Result<Ticket<'_>, AskError> {
        let (sender, receiver) = oneshot::channel();
        let key = (call.run_id.clone(), call.call_id.clone());
        {
            let mut board = self.lock();
            if board.waiting.len() >= MAX_WAITING {
                return Err(AskError::BoardFull);
            }
            let of_run = board
                .waiting
                .range((key.0.clone(), String::new())..)
                .take_while(|((run, _), _)| *run == key.0)
                .count();
            if of_run >= MAX_WAITING_PER_RUN {
                return Err(AskError::RunFull);
            }
            let of_owner = board
                .waiting
                .values()
                .filter(|w| w.call.owner == call.owner)
                .take(MAX_WAITING_PER_OWNER)
                .count();
            if of_owner >= MAX_WAITING_PER_OWNER {
                return Err(AskError::OwnerFull);
            }
            board.waiting.insert(
                key.clone(),
                Waiting {
                    call: call.clone(),
                    verdict: sender,
                },
            );
        }
        let _ = self.changes.send(pb::ApprovalEvent {
            event: Some(pb::approval_event::Event::Pending(call)),
        });
        Ok(Ticket {
            board: self,
            key,
            verdict: receiver,
            done: false,
        })
    }

    /// Applies an operator's verdict to a waiting call; the end of its wait as watchers see
    /// it.
    pub fn decide(
        &self,
        run_id: &str,
        call_id: &str,
        verdict: Verdict,
    ) -> Result<pb::DecidedCall, DecideError> {
        let key = (run_id.to_owned(), call_id.to_owned());
        let decided = decided_call(&key, &verdict);
        {
            let mut board = self.lock();
            let Some(waiting) = board.waiting.remove(&key) else {
                return Err(DecideError::NotWaiting {
                    run_id: run_id.to_owned(),
                    call_id: call_id.to_owned(),
                });
            };
            if let Verdict::Approved { remember: true, .. } = &verdict {
                let rules = board.remembered.entry(run_id.to_owned()).or_default();
                if rules.len() < MAX_REMEMBERED_PER_RUN {
                    rules.insert((
                        waiting.call.tool.clone(),
                        remembered_as(
                            &waiting.call.path,
                            &waiting.call.argv,
                            &waiting.call.cwd,
                            &waiting.call.stdin_sha256,
                        ),
                    ));
                }
            }
            // Sent under the lock: a deadline that finds the call gone finds its verdict too
            // (a decision and a timeout never both win). A waiting call whose client hung up
            // in between drops it.
            let _ = waiting.verdict.send(verdict);
        }
        let _ = self.changes.send(pb::ApprovalEvent {
            event: Some(pb::approval_event::Event::Decided(decided.clone())),
        });
        Ok(decided)
    }

    /// The calls waiting now that `visible` lets through, oldest run first, and every change
    /// from this moment on (none missed in between).
    pub fn watch(
        &self,
        visible: impl Fn(&pb::PendingCall) -> bool,
    ) -> (Vec<pb::PendingCall>, broadcast::Receiver<pb::ApprovalEvent>) {
        let board = self.lock();
        let changes = self.changes.subscribe();
        let waiting = board
            .waiting
            .values()
            .map(|w| &w.call)
            .filter(|call| visible(call))
            .cloned()
            .collect();
        (waiting, changes)
    }

    /// The calls of run `run_id` waiting now, oldest first.
    pub fn waiting_of(&self, run_id: &str) -> Vec<pb::PendingCall> {
        self.lock()
            .waiting
            .range((run_id.to_owned(), String::new())..)
            .take_while(|((run, _), _)| run == run_id)
            .map(|(_, w)| w.call.clone())
            .collect()
    }

    /// Forgets what an ended run's operators remembered (its waiting calls end on their own
    /// when the run does).
    pub fn forget_run(&self, run_id: &str) {
        self.lock().remembered.remove(run_id);
    }

    /// Takes a call off the board if it still waits: `true` when this caller ended it.
    fn withdraw(&self, key: &(String, String), outcome: pb::ApprovalOutcome, reason: &str) -> bool {
        let removed = self.lock().waiting.remove(key).is_some();
        if removed {
            let _ = self.changes.send(pb::ApprovalEvent {
                event: Some(pb::approval_event::Event::Decided(pb::DecidedCall {
                    run_id: key.0.clone(),
                    call_id: key.1.clone(),
                    outcome: outcome as i32,
                    decided_by: String::new(),
                    reason: reason.to_owned(),
                    remember: false,
                })),
            });
        }
        removed
    }
}

/// The end of a wait, as the API and the audit describe it.
pub fn decided_call(key: &(String, String), verdict: &Verdict) -> pb::DecidedCall {
    let (outcome, by, reason, remember) = match verdict {
        Verdict::Approved {
            by,
            remember,
            reason,
        } => (pb::ApprovalOutcome::Approved, by, reason, *remember),
        Verdict::Denied { by, reason } => (pb::ApprovalOutcome::Denied, by, reason, false),
    };
    pb::DecidedCall {
        run_id: key.0.clone(),
        call_id: key.1.clone(),
        outcome: outcome as i32,
        decided_by: by.clone(),
        reason: reason.clone(),
        remember,
    }
}

/// A decider's reason as kept: at most [`MAX_REASON`] bytes, one line.
pub fn clip_reason(reason: &str) -> String {
    let mut end = reason.len().min(MAX_REASON);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason[..end].replace(['\n', '\r'], " ")
}

/// One call's wait. Dropped before it ends (the agent gave the call up), it takes the call
/// off the board as cancelled.
pub struct Ticket<'a> {
    board: &'a ApprovalBoard,
    key: (String, String),
    verdict: oneshot::Receiver<Verdict>,
    done: bool,
}

impl Ticket<'_> {
    /// Waits for a verdict, at most until `deadline` (wall clock) and until `run_ended`
    /// says the run is over.
    pub async fn wait(
        mut self,
        deadline: SystemTime,
        mut run_ended: watch::Receiver<bool>,
    ) -> WaitOutcome {
        let left = deadline
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO);
        let ended = async move {
            let _ = run_ended.wait_for(|ended| *ended).await;
        };
        let outcome = tokio::select! {
            verdict = &mut self.verdict => match verdict {
                Ok(verdict) => WaitOutcome::Decided(verdict),
                // The board never drops a sender without sending; treat it as the run's end.
                Err(_) => WaitOutcome::RunEnded,
            },
            () = tokio::time::sleep(left) => self.end(WaitOutcome::TimedOut),
            () = ended => self.end(WaitOutcome::RunEnded),
        };
        self.done = true;
        outcome
    }

    /// Ends the wait with `outcome` unless a verdict got there first (then that wins).
    fn end(&mut self, outcome: WaitOutcome) -> WaitOutcome {
        let (code, reason) = match outcome {
            WaitOutcome::TimedOut => (
                pb::ApprovalOutcome::TimedOut,
                "no operator decided before the deadline",
            ),
            _ => (pb::ApprovalOutcome::RunEnded, "the run ended"),
        };
        if self.board.withdraw(&self.key, code, reason) {
            return outcome;
        }
        match self.verdict.try_recv() {
            Ok(verdict) => WaitOutcome::Decided(verdict),
            Err(_) => outcome,
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.board.withdraw(
                &self.key,
                pb::ApprovalOutcome::Cancelled,
                "the agent gave the call up",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(run: &str, id: &str) -> pb::PendingCall {
        pb::PendingCall {
            run_id: run.into(),
            call_id: id.into(),
            tool: "fs.write".into(),
            path: "/srv/a".into(),
            ..Default::default()
        }
    }

    fn later(seconds: u64) -> SystemTime {
        SystemTime::now() + Duration::from_secs(seconds)
    }

    #[tokio::test]
    async fn a_decision_reaches_the_waiting_call_and_remember_is_per_tool_and_path() {
        let board = ApprovalBoard::default();
        let (_, mut changes) = board.watch(|_| true);
        let ticket = board.ask(call("r1", "c1")).unwrap();
        let (_end, ended) = watch::channel(false);
        let waiter = ticket.wait(later(60), ended);
        let approve = Verdict::Approved {
            by: "alice".into(),
            remember: true,
            reason: String::new(),
        };
        let decided = board.decide("r1", "c1", approve.clone()).unwrap();
        assert_eq!(decided.decided_by, "alice");
        assert_eq!(waiter.await, WaitOutcome::Decided(approve.clone()));
        assert!(board.remembered("r1", "fs.write", "/srv/a"));
        assert!(!board.remembered("r1", "fs.delete", "/srv/a"));
        assert!(!board.remembered("r1", "fs.write", "/srv/b"));
        assert!(!board.remembered("r2", "fs.write", "/srv/a"));
        assert!(matches!(
            changes.recv().await.unwrap().event,
            Some(pb::approval_event::Event::Pending(_))
        ));
        assert!(matches!(
            changes.recv().await.unwrap().event,
            Some(pb::approval_event::Event::Decided(_))
        ));
        // Decided once: a second decision finds nothing waiting.
        assert!(board.decide("r1", "c1", approve).is_err());
        board.forget_run("r1");
        assert!(!board.remembered("r1", "fs.write", "/srv/a"));
    }

    #[tokio::test]
    async fn a_wait_ends_at_its_deadline_at_the_runs_end_or_when_given_up() {
        let board = ApprovalBoard::default();
        let (_end, ended) = watch::channel(false);
        let timed_out = board.ask(call("r1", "c1")).unwrap();
        let outcome = timed_out
            .wait(SystemTime::now() + Duration::from_millis(50), ended.clone())
            .await;
        assert_eq!(outcome, WaitOutcome::TimedOut);
        assert!(board.waiting_of("r1").is_empty());

        let (end, ended) = watch::channel(false);
        let ticket = board.ask(call("r1", "c2")).unwrap();
        end.send(true).unwrap();
        assert_eq!(ticket.wait(later(60), ended).await, WaitOutcome::RunEnded);

        let (_, mut changes) = board.watch(|_| true);
        drop(board.ask(call("r1", "c3")).unwrap());
        let _pending = changes.recv().await.unwrap();
        match changes.recv().await.unwrap().event {
            Some(pb::approval_event::Event::Decided(d)) => {
                assert_eq!(d.outcome, pb::ApprovalOutcome::Cancelled as i32);
            }
            other => panic!("{other:?}"),
        }
        assert!(board.waiting_of("r1").is_empty());
    }

    #[test]
    fn what_a_run_can_make_the_board_hold_is_bounded() {
        let board = ApprovalBoard::default();
        let tickets: Vec<_> = (0..MAX_WAITING_PER_RUN)
            .map(|i| board.ask(call("r1", &format!("c{i:03}"))).unwrap())
            .collect();
        assert!(matches!(
            board.ask(call("r1", "c999")),
            Err(AskError::RunFull)
        ));
        assert!(board.ask(call("r2", "c0")).is_ok(), "other runs still ask");
        // One owner's many runs fill only that owner's share.
        let owned = |run: usize, id: usize| pb::PendingCall {
            owner: "mallory".into(),
            ..call(&format!("m{run:03}"), &format!("c{id:03}"))
        };
        let many: Vec<_> = (0..MAX_WAITING_PER_OWNER)
            .map(|i| board.ask(owned(i / MAX_WAITING_PER_RUN, i)).unwrap())
            .collect();
        assert!(matches!(board.ask(owned(999, 0)), Err(AskError::OwnerFull)));
        assert!(
            board.ask(call("r3", "c0")).is_ok(),
            "other owners still ask"
        );
        drop(many);
        let waiting = board.waiting_of("r1");
        assert_eq!(waiting.len(), MAX_WAITING_PER_RUN);
        assert_eq!(waiting[0].call_id, "c000", "oldest first");
        drop(tickets);
        assert!(board.waiting_of("r1").is_empty());
        assert_eq!(clip_reason(&"é".repeat(1000)).len(), 1024);
        assert_eq!(clip_reason("a\nb"), "a b");
    }
}
