//! A run's host-side directories: `<runs>/<run_id>` and its workspace.

use std::fs;
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use super::error::SandboxError;

/// Where a run's host-side files live: `<runs>/<run_id>/work`.
#[derive(Debug, Clone)]
pub struct RunDirs {
    /// `<runs>/<run_id>`.
    pub base: PathBuf,
    /// The workspace, shown at `/work`.
    pub work: PathBuf,
}

impl RunDirs {
    /// The directories of `run_id` under `runs`.
    pub fn new(runs: &Path, run_id: &str) -> Self {
        let base = runs.join(run_id);
        Self {
            work: base.join("work"),
            base,
        }
    }

    /// Creates them: `base` 0711 (owned by root, traversable), `work` 0700 owned by the
    /// sandbox's host id so only that sandbox's agent can use it.
    pub fn create(&self, host_id: u32) -> Result<(), SandboxError> {
        let error = |path: &Path| {
            let path = path.to_owned();
            move |source| SandboxError::RunDir { path, source }
        };
        for dir in [&self.base, &self.work] {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o711)
                .create(dir)
                .map_err(error(dir))?;
        }
        fs::set_permissions(&self.work, fs::Permissions::from_mode(0o700))
            .map_err(error(&self.work))?;
        nix::unistd::chown(
            &self.work,
            Some(nix::unistd::Uid::from_raw(host_id)),
            Some(nix::unistd::Gid::from_raw(host_id)),
        )
        .map_err(|e| SandboxError::RunDir {
            path: self.work.clone(),
            source: e.into(),
        })
    }

    /// Removes everything (after the sandbox's mounts died with its namespace).
    pub fn remove(&self) -> Result<(), SandboxError> {
        match fs::remove_dir_all(&self.base) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(SandboxError::RunDir {
                path: self.base.clone(),
                source,
            }),
        }
    }
}
