//! Messages on the control socket between the supervisor and the shim: one JSON object per
//! line. The supervisor sends the base (at once) and the plan (when a run takes the sandbox);
//! the shim answers with lifecycle events.

use serde::{Deserialize, Serialize};

use crate::plan::{SandboxBase, SandboxPlan};

/// The fd number the control socket has in the shim.
pub const CONTROL_FD: i32 = 3;
/// The fd number of the pidfd of the sandbox's pid 1 in `tollgate-shim enter`.
pub const PID_ONE_FD: i32 = 4;

/// Supervisor to shim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToShim {
    /// First message, and the shim's go-ahead (sent only once the shim is in its cgroup in
    /// every hierarchy; it does nothing before it): build the part of the sandbox no receipt
    /// decides.
    Prepare(Box<SandboxBase>),
    /// Second message, sent only once the supervisor has read [`FromShim::PidOne`]: complete
    /// the sandbox for this run and start the agent. Sent with
    /// descriptors attached (SCM_RIGHTS), in this order: a detached mount of each of the
    /// plan's binds, the run's root file system's when it has one, and the run's gateway
    /// listening socket when it has one (`gateway_socket`). pid 1 keeps the gateway socket,
    /// accepts on it, and hands connections over only when asked ([`ToShim::Accept`]): the
    /// supervisor holds no listening socket for a run.
    Start(Box<SandboxPlan>),
    /// Hand over the oldest gateway connection that has spoken (or the next to speak) as
    /// [`FromShim::Connection`]. The supervisor asks for one at a time, after
    /// [`FromShim::ConnectionWaiting`], only when it can hold another connection and has a
    /// descriptor free for it: otherwise pid 1 holds what it accepted (at most 32) and new
    /// connections wait in the socket's backlog.
    Accept,
    /// The supervisor holds the connection pid 1 handed over last ([`FromShim::Connection`]):
    /// pid 1 closes its copy, so the caller sees the connection end when the gateway ends it.
    Received,
    /// The connection pid 1 handed over last did not arrive whole (the supervisor's receive
    /// came truncated, `MSG_CTRUNC`, or with no descriptor: the kernel closes a descriptor
    /// that finds no free number): pid 1 sends the copy it kept again, as
    /// [`FromShim::Connection`]. Sent after backing off, and only while the supervisor holds
    /// a descriptor for it, as [`ToShim::Accept`] is.
    Resend,
    /// Live restore: the supervisor is stopping cleanly and will come back. Sent with
    /// [`DETACH_FDS`] descriptors attached (SCM_RIGHTS), in this order: a listening socket the
    /// next supervisor connects to, and the read ends of the agent's stdout and stderr pipes.
    /// pid 1 holds them (so the pipes outlive the supervisor), stops accepting gateway
    /// connections (calls wait in the gateway socket's backlog, which pid 1 already holds),
    /// answers [`FromShim::Detached`], stops treating the control socket's end as the end of
    /// the run, and ends the sandbox itself at `until_ms` unless a supervisor re-adopts it
    /// first.
    Detach {
        /// Unix milliseconds: the receipt's expiry or the end of the live-restore window,
        /// whichever comes first.
        until_ms: u64,
    },
    /// First message on a connection to the detach listener: the new supervisor re-adopts
    /// the sandbox. Answered by [`FromShim::Reattached`].
    Reattach,
}

/// How many descriptors come with [`ToShim::Detach`].
pub const DETACH_FDS: usize = 3;
/// How many descriptors come with [`FromShim::Reattached`]: stdout and stderr, in this order.
pub const REATTACH_FDS: usize = 2;

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
    /// The first message, from the shim that received [`ToShim::Prepare`]: it has forked the
    /// sandbox's pid 1 as the supervisor's own child (`CLONE_PARENT`) and exits. The
    /// supervisor reaps both; pid 1 writes nothing before it has the plan, so this is always
    /// the first line (or `Failed`, when nothing was forked).
    PidOne {
        /// pid 1's pid in the supervisor's pid namespace.
        host_pid: u32,
    },
    /// The sandbox is built and the agent has been started.
    Started {
        /// The agent's pid as seen inside the sandbox (never 1).
        agent_pid: i32,
        /// The Landlock ABI version enforced.
        landlock_abi: u32,
        /// The executables Landlock allows, interpreters included, as resolved when the
        /// sandbox started (paths inside the sandbox).
        #[serde(default)]
        execute: Vec<std::path::PathBuf>,
    },
    /// The sandbox could not be built or the agent could not start.
    Failed {
        /// Which step failed and why.
        reason: String,
    },
    /// The agent has ended.
    Exited(AgentExit),
    /// pid 1 holds the descriptors of [`ToShim::Detach`] and runs on alone.
    Detached,
    /// A connection to the run's gateway socket, accepted for [`ToShim::Accept`] (or sent
    /// again for [`ToShim::Resend`]), attached (SCM_RIGHTS, one descriptor). pid 1 keeps a
    /// copy until [`ToShim::Received`] (or the next `Accept`, or a `Detach`), so a connection
    /// lost on the way can be sent again instead of being closed on its caller. Sent without
    /// a descriptor when pid 1 could not send it with one: the supervisor asks
    /// [`ToShim::Resend`] as for one that arrived truncated.
    Connection,
    /// pid 1 holds no connection to send again for [`ToShim::Resend`] (older shims: nor one
    /// to accept for [`ToShim::Accept`]). pid 1 says [`FromShim::ConnectionWaiting`] again
    /// once one has spoken; the supervisor backs off before it asks again.
    NotAccepted,
    /// A gateway connection pid 1 accepted has spoken (its client wrote its first bytes) and
    /// none is asked for: said once, then not again until the next [`ToShim::Accept`]. pid 1
    /// holds silent connections itself, so the supervisor, which closes a connection silent
    /// past its deadline, never holds one whose client is merely slow to write. The
    /// supervisor asks only once it holds a descriptor for the connection, so no ask is
    /// outstanding while a run makes no call.
    ConnectionWaiting,
    /// The answer to [`ToShim::Reattach`], with [`REATTACH_FDS`] descriptors attached. The
    /// connection is the control socket from now on; `Exited` follows on it when the agent
    /// ends (at once, if it ended while detached), and gateway connections when asked for.
    Reattached {
        /// The agent's pid inside the sandbox.
        agent_pid: i32,
        /// The executables Landlock allows, as resolved when the sandbox started.
        execute: Vec<std::path::PathBuf>,
        /// pid 1 keeps each [`FromShim::Connection`] until [`ToShim::Received`] and answers
        /// [`ToShim::Resend`]. Absent (`false`) from a pid 1 of an older shim, left running
        /// across an upgrade (live restore): it keeps none, so the supervisor asks it for
        /// nothing again.
        #[serde(default)]
        keeps_connections: bool,
    },
}

/// What `tollgate-shim enter` is asked to run inside a live sandbox (one JSON line on fd 3,
/// from the supervisor's gateway).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnterRequest {
    /// The sandbox's plan with `agent` set to the command to run (argv, environment, cwd)
    /// and `landlock.execute` as resolved when the sandbox started.
    pub plan: SandboxPlan,
    /// Wall-clock limit; also the CPU-time limit, rounded up to whole seconds.
    pub timeout_ms: u64,
    /// Instead of running a command: detach the mount at this sandbox path (a grant an
    /// operator narrowed away from the live run).
    #[serde(default)]
    pub unmount: Option<String>,
    /// A program this command may execute beside `plan.landlock.execute` (a gateway-only
    /// grant's, which the agent itself may not execute). Resolved, with its ELF interpreter,
    /// inside the sandbox's mount namespace.
    #[serde(default)]
    pub also_execute: Option<std::path::PathBuf>,
    /// Instead of running a command: hide this program (a sandbox path) from the agent, as
    /// the shim hides a receipt's gateway-only programs at start (an amendment added it).
    #[serde(default)]
    pub hide: Option<std::path::PathBuf>,
}

/// How a command run by `tollgate-shim enter` ended (one JSON line on fd 3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EnterOutcome {
    /// The command ran and ended.
    Ended {
        /// How it ended.
        exit: AgentExit,
        /// Whether it was killed at the time limit.
        timed_out: bool,
    },
    /// The mount was detached (`unmount`).
    Unmounted,
    /// The program was hidden (`hide`).
    Hidden,
    /// The command could not be started in the sandbox.
    Failed {
        /// Which step failed and why.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hand-over's messages have the names the other side parses, and an older pid 1's
    /// `Reattached` (no `keeps_connections`) reads as one that keeps no connection.
    #[test]
    fn hand_over_messages_and_an_older_reattached() {
        for (message, line) in [
            (ToShim::Accept, "\"accept\""),
            (ToShim::Received, "\"received\""),
            (ToShim::Resend, "\"resend\""),
        ] {
            assert_eq!(serde_json::to_string(&message).unwrap(), line);
        }
        assert_eq!(
            serde_json::to_string(&FromShim::NotAccepted).unwrap(),
            "\"not_accepted\""
        );
        let older: FromShim =
            serde_json::from_str(r#"{"reattached":{"agent_pid":2,"execute":[]}}"#).unwrap();
        assert_eq!(
            older,
            FromShim::Reattached {
                agent_pid: 2,
                execute: Vec::new(),
                keeps_connections: false,
            }
        );
    }
}
