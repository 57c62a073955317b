//! What the helpers pid 1 starts beside the agent (`tollgate-shim models`, `tollgate-shim
//! egress`) share: where the gateway is, and a runtime of one thread (the sandbox's pids limit
//! counts threads).

use tollgate_shim_protocol::plan::GATEWAY_IN_SANDBOX;

/// The gateway's address: `TOLLGATE_GATEWAY`, else the sandbox's own socket.
pub(crate) fn gateway_target() -> String {
    std::env::var("TOLLGATE_GATEWAY").unwrap_or_else(|_| format!("unix:{GATEWAY_IN_SANDBOX}"))
}

/// A one-thread runtime for the helper `verb`, or the exit status after saying why not.
pub(crate) fn runtime(verb: &str) -> Result<tokio::runtime::Runtime, i32> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(1)
        .build()
        .map_err(|e| {
            eprintln!("tollgate-shim {verb}: {e}");
            70
        })
}
