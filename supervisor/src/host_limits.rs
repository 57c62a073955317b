//! The host limits that bound how many runs a supervisor holds live: its open-file limit
//! (raised at start-up as far as the kernel allows, by `tollgate_daemon::raise_open_files_limit`), pids and threads, memory and host ids.
//! A start refused by one of them is `RESOURCE_EXHAUSTED` naming it ([`crate::error::HostLimit`]).

/// Descriptors the supervisor holds for one live run at most: the shim's control socket, the
/// agent's stdout and stderr pipes and the gateway's listening socket (a root run under
/// live restore keeps a duplicate of the gateway socket for its hand-over; one with input
/// holds its input's end).
pub const FDS_PER_RUN: u64 = 4;
