//! The data directory's own rule: private (0700), or refused. Its lock, atomic private files
//! and the readiness file are `tollgate_daemon::files`, shared with the supervisor.

use std::path::Path;

use crate::error::AuthorityError;

/// Creates `dir` (and parents) as 0700, or refuses an existing one that other users can
/// enter, naming the `chmod` that fixes it (the rule both daemons share, from the audit crate).
pub fn ensure_private_dir(dir: &Path) -> Result<(), AuthorityError> {
    tollgate_audit::ensure_private_dir(dir).map_err(AuthorityError::PrivateDir)
}
