//! The run record's types: a run's state, its teardown report, the record as read, and a
//! new run to insert. A leaf: the other `records` modules use it, it uses none of them.

use serde::{Deserialize, Serialize};

/// Where a run is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Admitted and recorded; the sandbox is being built.
    Starting,
    /// The agent is running.
    Running,
    /// The agent exited by itself.
    Exited,
    /// The sandbox could not be built or the agent could not start.
    Failed,
    /// An operator stopped it.
    Stopped,
    /// The receipt expired.
    Expired,
    /// The receipt was revoked.
    Revoked,
    /// A resource limit ended it (memory).
    LimitExceeded,
    /// The shim died unexpectedly.
    ShimDied,
    /// The supervisor shut down.
    SupervisorShutdown,
    /// The supervisor crashed while the run was live; found and swept at the next start.
    Lost,
    /// Its parent run (delegation) ended, and the whole subtree with it.
    ParentEnded,
    /// Its sandbox could not be built for a reason of this host's (a cgroup, the shim, the
    /// agent's exec), before the agent existed: the receipt may be started again (at most
    /// [`MAX_START_ATTEMPTS`] times in all).
    FailedBeforeStart,
}

/// How many times one receipt may try to start while every earlier try failed before its
/// agent existed: enough to ride out a host's hiccup, few enough that a broken host does not
/// turn one receipt into many starts.
pub const MAX_START_ATTEMPTS: u32 = 3;

impl RunState {
    /// Whether the run is over.
    pub fn is_final(self) -> bool {
        !matches!(self, Self::Starting | Self::Running)
    }

    /// Stable lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Exited => "exited",
            Self::Failed => "failed",
            Self::Stopped => "stopped",
            Self::Expired => "expired",
            Self::Revoked => "revoked",
            Self::LimitExceeded => "limit_exceeded",
            Self::ShimDied => "shim_died",
            Self::SupervisorShutdown => "supervisor_shutdown",
            Self::Lost => "lost",
            Self::ParentEnded => "parent_ended",
            Self::FailedBeforeStart => "failed_before_start",
        }
    }

    /// The state named `text` (as written by [`Self::name`]); an unknown name reads as
    /// `Lost`.
    pub(super) fn parse(text: &str) -> Self {
        match text {
            "starting" => Self::Starting,
            "running" => Self::Running,
            "exited" => Self::Exited,
            "failed" => Self::Failed,
            "stopped" => Self::Stopped,
            "expired" => Self::Expired,
            "revoked" => Self::Revoked,
            "limit_exceeded" => Self::LimitExceeded,
            "shim_died" => Self::ShimDied,
            "supervisor_shutdown" => Self::SupervisorShutdown,
            "parent_ended" => Self::ParentEnded,
            "failed_before_start" => Self::FailedBeforeStart,
            _ => Self::Lost,
        }
    }
}

/// What teardown found and did, recorded when a run ends.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TeardownReport {
    /// Why the run ended, in words.
    pub reason: String,
    /// Milliseconds from admission to the end of teardown.
    pub duration_ms: u64,
    /// The agent's exit code, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that killed the agent, when one did.
    pub signal: Option<i32>,
    /// Peak memory of the run's cgroup, when the kernel reports it.
    pub peak_memory_bytes: Option<u64>,
    /// The last gateway tool call (filled once the gateway exists).
    pub last_tool_call_id: Option<String>,
    /// Model routes the run used (those of `route_usage`).
    pub routes_used: Vec<String>,
    /// Whether relayed output hit the receipt's output limit.
    pub output_truncated: bool,
    /// Problems teardown met (a cgroup or directory it could not remove), if any.
    pub cleanup_errors: Vec<String>,
    /// The Landlock ABI version the agent ran under (none when it never started).
    #[serde(default)]
    pub landlock_abi: Option<u32>,
    /// The sandbox's cgroup, relative to each hierarchy's root (none when it had none).
    #[serde(default)]
    pub cgroup: Option<String>,
    /// What the run spent on each model route it used.
    #[serde(default)]
    pub route_usage: Vec<RouteUsage>,
    /// Where the run's `/work` was kept after it ended (its receipt's
    /// `workspace_keep_seconds`); none when it was removed.
    #[serde(default)]
    pub workspace: Option<String>,
    /// Until when (unix seconds).
    #[serde(default)]
    pub workspace_kept_until: Option<u64>,
    /// The receipt's `workspace_keep_seconds` (0: the workspace goes at teardown).
    #[serde(default)]
    pub workspace_keep_seconds: u64,
}

/// One model route's use by one run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteUsage {
    /// The route's name.
    pub route: String,
    /// Model calls that went out on it.
    pub calls: u64,
    /// Prompt tokens charged.
    pub prompt_tokens: u64,
    /// Completion tokens charged.
    pub completion_tokens: u64,
}

/// One run as recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    /// The run id (= receipt id).
    pub run_id: String,
    /// The receipt's owner.
    pub owner: String,
    /// The receipt's subject.
    pub subject: String,
    /// The state.
    pub state: RunState,
    /// The host uid/gid of the sandbox.
    pub host_id: u32,
    /// Unix seconds.
    pub created_at: i64,
    /// Unix seconds, when it ended.
    pub ended_at: Option<i64>,
    /// The receipt's expiry, Unix seconds.
    pub expires_at: i64,
    /// The teardown report, once ended.
    pub report: Option<TeardownReport>,
    /// The run that delegated this one, for a child run.
    pub parent_run_id: Option<String>,
    /// Delegation depth: 0 for a run an operator started.
    pub depth: u32,
}

/// A new run to record.
#[derive(Debug, Clone)]
pub struct NewRun<'a> {
    /// Run id (= receipt id).
    pub run_id: &'a str,
    /// Owner.
    pub owner: &'a str,
    /// Subject.
    pub subject: &'a str,
    /// The signed receipt's bytes.
    pub receipt: &'a [u8],
    /// The sandbox's host id.
    pub host_id: u32,
    /// Unix seconds.
    pub now: i64,
    /// The receipt's expiry.
    pub expires_at: i64,
    /// The run that delegated this one (a child run), if any.
    pub parent_run_id: Option<&'a str>,
    /// Delegation depth (0 for an operator's run).
    pub depth: u32,
}
