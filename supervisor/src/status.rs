//! The one place the supervisor's errors become gRPC statuses.

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
        StartError::Sandbox(SandboxError::NoAgent | SandboxError::NotExecutable(_)) => {
            Status::invalid_argument(format!("argv: {message}"))
        }
        StartError::Sandbox(SandboxError::BadGrant { .. }) => {
            Status::invalid_argument(format!("receipt: {message}"))
        }
        StartError::NoHostId(_) => Status::resource_exhausted(message),
        StartError::ShuttingDown => Status::unavailable(message),
        StartError::ChildrenLimits(_) => {
            Status::resource_exhausted(format!("receipt refused (children_limits): {message}"))
        }
        StartError::Grant { code, .. } => {
            Status::failed_precondition(format!("receipt refused ({code}): {message}"))
        }
        StartError::Delegated { code, .. } => {
            Status::permission_denied(format!("receipt refused ({code}): {message}"))
        }
        StartError::Sandbox(_)
        | StartError::Cgroup(_)
        | StartError::Records(_)
        | StartError::Audit(_) => Status::internal(message),
    }
}
