//! Workspaces after a run: `/work` kept for its receipt's `workspace_keep_seconds` under
//! `<data-dir>/workspaces/<run>/work` (with the time it goes in `until`), for `CopyOut`, until
//! then or `RemoveWorkspace`. The directory is root's and 0700, so no later sandbox that
//! gets the same host id can reach it.

use std::path::{Path, PathBuf};

use tollgate_audit::{Decision, EntryDraft, EntryKind};
use tollgate_receipt::unix_now;

use crate::COMPONENT;

use super::RunManager;
use crate::error::WorkspaceError;
use crate::sandbox::RunDirs;

/// Where kept workspaces live.
fn kept_root(data_dir: &Path) -> PathBuf {
    data_dir.join("workspaces")
}

/// Removes the kept workspace `place` if its time is up (or cannot be read); whether it did.
fn remove_if_due(place: &Path, now: u64) -> bool {
    let until = std::fs::read_to_string(place.join("until"))
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok());
    if until.is_some_and(|until| until > now) {
        return false;
    }
    match std::fs::remove_dir_all(place) {
        Ok(()) => tracing::info!(path = %place.display(), "kept workspace removed: its time is up"),
        Err(e) => {
            tracing::warn!(path = %place.display(), error = %e, "could not remove a kept workspace")
        }
    }
    true
}

/// A run id as a kept workspace's directory name: a UUID, nothing else (never a path).
pub(super) fn valid_id(run_id: &str) -> bool {
    uuid::Uuid::parse_str(run_id).is_ok() && !run_id.contains('/')
}

impl RunManager {
    /// Moves an ended run's `/work` aside for `keep` seconds; where, and until when.
    pub(super) fn keep_workspace(
        &self,
        run_id: &str,
        dirs: &RunDirs,
        keep: u64,
    ) -> std::io::Result<(PathBuf, u64)> {
        use std::os::unix::fs::DirBuilderExt as _;
        let root = kept_root(&self.settings.data_dir);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&root)?;
        let place = root.join(run_id);
        std::fs::DirBuilder::new().mode(0o700).create(&place)?;
        let until = u64::try_from(unix_now()).unwrap_or(0).saturating_add(keep);
        // The time first: a crash between the two leaves a place the sweep removes.
        std::fs::write(place.join("until"), format!("{until}\n"))?;
        let work = place.join("work");
        std::fs::rename(&dirs.work, &work)?;
        Ok((work, until))
    }

    /// Removes every kept workspace whose time has come (or whose time cannot be read).
    pub(crate) fn sweep_workspaces(&self) {
        let now = u64::try_from(unix_now()).unwrap_or(0);
        let Ok(entries) = std::fs::read_dir(kept_root(&self.settings.data_dir)) else {
            return;
        };
        for entry in entries.flatten() {
            remove_if_due(&entry.path(), now);
        }
    }

    /// The host directory that is `run_id`'s `/work`: the live run's, or the kept one (whose
    /// time, if up, removes it now rather than at the next sweep).
    pub fn workspace_of(&self, run_id: &str) -> Result<PathBuf, WorkspaceError> {
        if let Ok(live) = self.live_workspace(run_id) {
            return Ok(live);
        }
        let place = kept_root(&self.settings.data_dir).join(run_id);
        let now = u64::try_from(unix_now()).unwrap_or(0);
        if valid_id(run_id) && place.join("work").is_dir() && !remove_if_due(&place, now) {
            Ok(place.join("work"))
        } else {
            Err(WorkspaceError::NotFound(run_id.to_owned()))
        }
    }

    /// Audits an access to `run_id`'s workspace: `action` (`copy_out`, `remove`) of `path`,
    /// allowed with `bytes`, or refused with why.
    pub fn audit_workspace(
        &self,
        run_id: &str,
        action: &str,
        path: &str,
        outcome: Result<u64, String>,
    ) {
        let mut draft = EntryDraft::new(COMPONENT, EntryKind::WorkspaceAccess)
            .meta("action", action)
            .meta("path", path);
        if valid_id(run_id) {
            draft = draft.run(run_id).receipt(run_id);
        }
        draft = match outcome {
            Ok(bytes) => draft
                .decision(Decision::Allow)
                .meta("bytes", i64::try_from(bytes).unwrap_or(i64::MAX)),
            Err(reason) => draft.decision(Decision::Deny).reason(reason),
        };
        if let Err(e) = self.audit.append(draft) {
            tracing::error!(run_id, error = %e, "could not audit a workspace access");
        }
    }

    /// The supervisor's data directory.
    pub fn data_dir(&self) -> &Path {
        &self.settings.data_dir
    }

    /// The host directory that is live run `run_id`'s `/work` (none for an ended run).
    pub fn live_workspace(&self, run_id: &str) -> Result<PathBuf, WorkspaceError> {
        if valid_id(run_id) && self.live_run(run_id).is_some() {
            let dirs = RunDirs::new(&self.settings.data_dir.join("runs"), run_id);
            if dirs.work.is_dir() {
                return Ok(dirs.work);
            }
        }
        Err(WorkspaceError::NotFound(run_id.to_owned()))
    }

    /// Removes `run_id`'s kept workspace now; where it was.
    pub fn remove_workspace(&self, run_id: &str) -> Result<PathBuf, WorkspaceError> {
        if !valid_id(run_id) {
            return Err(WorkspaceError::NotFound(run_id.to_owned()));
        }
        let place = kept_root(&self.settings.data_dir).join(run_id);
        if !place.is_dir() {
            return Err(WorkspaceError::NotFound(run_id.to_owned()));
        }
        std::fs::remove_dir_all(&place).map_err(|source| WorkspaceError::Remove {
            path: place.clone(),
            source,
        })?;
        Ok(place.join("work"))
    }
}
