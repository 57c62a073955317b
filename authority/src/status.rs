//! The one mapping of a failed call to the gRPC status its client sees: storage details are
//! logged here and never sent.

use crate::error::CallError;

impl From<CallError> for tonic::Status {
    fn from(error: CallError) -> Self {
        let message = error.to_string();
        match error {
            CallError::Unauthenticated(_) => Self::unauthenticated(message),
            CallError::PermissionDenied(_) => Self::permission_denied(message),
            CallError::InvalidArgument { .. } => Self::invalid_argument(message),
            CallError::NotFound(_) => Self::not_found(message),
            CallError::FailedPrecondition(_) => Self::failed_precondition(message),
            CallError::AlreadyExists(_) => Self::already_exists(message),
            CallError::Internal(inner) => {
                tracing::error!(error = %inner, "call failed on storage");
                Self::internal("the authority could not complete the call; see its log")
            }
        }
    }
}
