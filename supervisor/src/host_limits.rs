//! The host limits that bound how many runs a supervisor holds live: its open-file limit
//! (raised at start-up as far as the kernel allows, by `tollgate_daemon::raise_open_files_limit`), pids and threads, memory and host ids.
//! A start refused by one of them is `RESOURCE_EXHAUSTED` naming it ([`crate::error::HostLimit`]).

/// Descriptors the supervisor holds for one live run at most, between gateway calls: the
/// shim's control socket and the agent's stdout and stderr pipes (the run's gateway listening
/// socket is its pid 1's, which hands each connection over; a run with input holds its
/// input's end too, and a run re-adopted after a live restore a pidfd of its pid 1).
pub const FDS_PER_RUN: u64 = 3;
