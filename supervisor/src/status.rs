//! The one place the supervisor's errors become gRPC statuses. What a client can act on
//! (a refused receipt, a bad argv, a full host) is said in one line; an internal failure
//! (storage, the audit log, a cgroup, the shim's plumbing) is logged here with everything and
//! a fresh error id, and the client gets only what failed and that id.

use tollgate_receipt::VerifyFailure;
use tonic::Status;

use crate::error::StartError;
use crate::sandbox::SandboxError;

/// Maps a run-start failure to its gRPC status (the one place this mapping lives).
pub fn start_status(error: &StartError) -> Status {
    let message = error.to_string();
    match error {
        StartError::Receipt(e) if e.failure() == VerifyFailure::Malformed => {
            Status::invalid_argument(message)
        }
        StartError::Receipt(e) => Status::permission_denied(format!(
            "receipt refused ({}): {message}",
            e.failure().code()
        )),
        StartError::AlreadyUsed(_) => Status::already_exists(message),
        StartError::ArgvNotAllowed(_) => Status::invalid_argument(format!("argv: {message}")),
        StartError::Sandbox(
            SandboxError::NoAgent | SandboxError::NotExecutable(_) | SandboxError::NotInSandbox(_),
        ) => Status::invalid_argument(format!("argv: {message}")),
        StartError::Sandbox(SandboxError::BadGrant { .. }) => {
            Status::invalid_argument(format!("receipt: {message}"))
        }
        StartError::NoHostId(_) | StartError::HostLimit(_) => Status::resource_exhausted(message),
        StartError::ShuttingDown | StartError::Stale(_) => Status::unavailable(message),
        StartError::ChildrenLimits(_) => {
            Status::resource_exhausted(format!("receipt refused (children_limits): {message}"))
        }
        StartError::Grant { code, .. } => {
            Status::failed_precondition(format!("receipt refused ({code}): {message}"))
        }
        StartError::Delegated { code, .. } => {
            Status::permission_denied(format!("receipt refused ({code}): {message}"))
        }
        // The shim's report of a step the receipt asked for (a mount, the agent's exec): the
        // operator needs it to fix the receipt, and it holds nothing the receipt does not.
        StartError::Sandbox(SandboxError::Setup(_)) => Status::internal(message),
        StartError::Sandbox(_)
        | StartError::Cgroup(_)
        | StartError::Records(_)
        | StartError::Audit(_) => internal("starting the run", error),
    }
}

/// Maps a workspace failure (`CopyOut`, `RemoveWorkspace`) to its gRPC status.
pub fn workspace_status(error: &crate::error::WorkspaceError) -> Status {
    use crate::error::WorkspaceError;
    match error {
        WorkspaceError::NotFound(_) => Status::not_found(error.to_string()),
        WorkspaceError::Remove { .. } => internal("removing a kept workspace", error),
    }
}

/// Maps a failure to change a live run (`AmendRun`) to its gRPC status.
pub fn amend_status(error: &crate::error::AmendError) -> Status {
    use crate::error::AmendError;
    match error {
        AmendError::NotLive(_) | AmendError::NotANarrowing(_) => {
            Status::failed_precondition(error.to_string())
        }
        AmendError::Amendment(_) | AmendError::Revoked(_) => {
            Status::permission_denied(error.to_string())
        }
        AmendError::Audit(_) => internal("auditing a change to a run", error),
        AmendError::Unmount { .. } => Status::failed_precondition(error.to_string()),
        AmendError::Hide { .. } => Status::failed_precondition(error.to_string()),
    }
}

/// Maps a failure to reach a run's input (`Attach`) to its gRPC status.
pub fn input_status(error: &crate::error::InputError) -> Status {
    use crate::error::InputError;
    match error {
        InputError::NotLive(_) => Status::not_found(error.to_string()),
        InputError::NoInput(_) => Status::failed_precondition(error.to_string()),
        InputError::Write(_) => Status::aborted(error.to_string()),
    }
}

/// Maps a failure to archive a workspace's files to its gRPC status.
pub fn archive_status(error: &tollgate_files::archive::ArchiveError) -> Status {
    use tollgate_files::archive::ArchiveError;
    match error {
        ArchiveError::NotFound(_) | ArchiveError::NoDirectory(_) => {
            Status::not_found(error.to_string())
        }
        ArchiveError::Outside(_) => Status::invalid_argument(error.to_string()),
        ArchiveError::TooLarge(_) | ArchiveError::TooDeep => {
            Status::resource_exhausted(error.to_string())
        }
        // Names a path in the workspace (the agent's own files), never a host path.
        ArchiveError::Io { .. } => Status::aborted(error.to_string()),
    }
}

/// A request without a usable admin token.
pub fn no_token(error: tollgate_daemon::token::BearerError) -> Status {
    match error {
        tollgate_daemon::token::BearerError::Missing => Status::unauthenticated(
            "missing \"authorization: Bearer <token>\"; the supervisor's token is <data-dir>/admin.token",
        ),
        tollgate_daemon::token::BearerError::Malformed => {
            Status::unauthenticated("authorization must be \"Bearer <token>\"")
        }
    }
}

/// A token that is not this supervisor's, on a supervisor that trusts a key file (no
/// authority to ask about operator tokens).
pub fn wrong_token() -> Status {
    Status::unauthenticated(
        "unknown token for this supervisor: it trusts a key file, not an authority, so it accepts only its own admin token, <supervisor data dir>/admin.token (or an operator's client certificate)",
    )
}

/// A token that is neither this supervisor's nor one its authority issued.
pub fn unknown_token() -> Status {
    Status::unauthenticated(
        "unknown token for this supervisor: neither its admin token (<supervisor data dir>/admin.token) nor an operator token its authority issued",
    )
}

/// A run id this supervisor has no record of.
pub fn no_run(run_id: &str) -> Status {
    Status::not_found(format!("no run {run_id}"))
}

/// An internal failure: logged with everything under a fresh error id; the client gets only
/// `what` failed and the id to quote.
pub fn internal(what: &str, error: &dyn std::fmt::Display) -> Status {
    let id = uuid::Uuid::now_v7().hyphenated().to_string();
    tracing::error!(error_id = %id, what, error = %error, "internal error");
    Status::internal(format!(
        "{what} failed inside the supervisor (error id {id}; the supervisor's log has the details)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_failures_reach_the_client_as_an_id_only() {
        let error = StartError::Sandbox(SandboxError::RunDir {
            path: "/var/lib/tollgate/runs/secret-host-path".into(),
            source: std::io::Error::other("disk on fire"),
        });
        let status = start_status(&error);
        assert_eq!(status.code(), tonic::Code::Internal);
        assert!(status.message().contains("error id "), "{status:?}");
        assert!(!status.message().contains("secret-host-path"), "{status:?}");
        assert!(!status.message().contains("disk on fire"), "{status:?}");
        let refused = start_status(&StartError::NoHostId(1..2));
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(refused.message().contains("no free sandbox host id"));
    }
}
