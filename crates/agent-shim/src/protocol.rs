//! Messages on the control socket between the supervisor and the shim: one JSON object per
//! line. The supervisor sends the base (at once) and the plan (when a run takes the sandbox);
//! the shim answers with lifecycle events.

use serde::{Deserialize, Serialize};

use crate::plan::{SandboxBase, SandboxPlan};

/// The fd number the control socket has in the shim.
pub const CONTROL_FD: i32 = 3;

/// Supervisor to shim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToShim {
    /// First message: build the part of the sandbox no receipt decides.
    Prepare(Box<SandboxBase>),
    /// Second message: complete the sandbox for this run and start the agent.
    Start(Box<SandboxPlan>),
}

/// How the agent ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentExit {
    /// Exited with this code.
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
}

/// Shim to supervisor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FromShim {
    /// The sandbox is built and the agent has been started.
    Started {
        /// The agent's pid as seen inside the sandbox (never 1).
        agent_pid: i32,
        /// The Landlock ABI version enforced.
        landlock_abi: u32,
    },
    /// The sandbox could not be built or the agent could not start.
    Failed {
        /// Which step failed and why.
        reason: String,
    },
    /// The agent has ended.
    Exited(AgentExit),
}
