//! Snapshots of what a gateway call changed, and `tollgate restore RUN CALL_ID`.
//!
//! Before `fs.write` or `fs.delete` changes a file, the file's previous state is kept under
//! `<data-dir>/snapshots/<run_id>/<call_id>.json` (what and where) and `<call_id>.data` (the
//! exact bytes, binary-safe), both fsynced before the change is made. Snapshots outlive the
//! run; an operator removes them (or the whole run's directory) when no longer needed.
//! Restoring puts the file back as it was — its bytes, owner and mode, or its absence when
//! the call created it — atomically, resolving the path beneath its grant as the gateway does,
//! so a link planted since cannot redirect the restore.

use std::path::{Path, PathBuf};

use nix::errno::Errno;
use serde::{Deserialize, Serialize};

use crate::beneath::{self, GrantRoot, Ownership};

/// What one snapshot records about the file before the call changed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotManifest {
    /// The run (= receipt) id.
    pub run_id: String,
    /// The call that changed the file.
    pub call_id: String,
    /// The tool (`fs.write`, `fs.delete`).
    pub tool: String,
    /// The file's host path.
    pub path: String,
    /// The grant the path was resolved beneath.
    pub grant: String,
    /// Device of the grant's pinned directory (for a granted file: the directory holding it)
    /// when the call ran: a restore goes only into that very directory.
    pub grant_dev: u64,
    /// Its inode.
    pub grant_ino: u64,
    /// The path relative to the grant (empty: the grant is the file).
    pub rest: String,
    /// Whether the file existed before the call (if not, restoring removes it).
    pub existed: bool,
    /// Its size before the call.
    pub size: u64,
    /// Its owner uid before the call.
    pub uid: u32,
    /// Its owner gid before the call.
    pub gid: u32,
    /// Its permission bits before the call.
    pub mode: u32,
    /// Unix seconds when the snapshot was taken.
    pub taken_at: i64,
}

/// Why a snapshot could not be taken or restored.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The run or call id is not a UUID (they name files, so nothing else is accepted).
    #[error("{0:?} is not a run or call id (a UUID, as `tollgate calls` prints it)")]
    BadId(String),
    /// No snapshot exists for this call.
    #[error("no snapshot for run {run_id} call {call_id} in {dir} (only fs.write and fs.delete calls that were allowed have one)")]
    NotFound {
        /// The run.
        run_id: String,
        /// The call.
        call_id: String,
        /// Where it was looked for.
        dir: PathBuf,
    },
    /// The manifest is unreadable.
    #[error("snapshot manifest {path}: {reason}")]
    BadManifest {
        /// The manifest file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A file system step failed.
    #[error("{step}: {source}")]
    Io {
        /// Which step.
        step: String,
        /// The failure.
        source: std::io::Error,
    },
    /// The file is larger than a snapshot may be.
    #[error("the file has {size} bytes; the gateway changes only files it can keep a snapshot of (at most {max} bytes)")]
    TooLarge {
        /// Its size.
        size: u64,
        /// The limit.
        max: u64,
    },
    /// The run's snapshots have reached their quota.
    #[error("this run's snapshots have reached their quota ({quota} bytes); no further file changes are made")]
    QuotaSpent {
        /// The quota.
        quota: u64,
    },
    /// The grant's path no longer leads to the directory the call changed.
    #[error("{grant} is no longer the directory the call changed (it was replaced, or a link now redirects it); restore by hand from {data}")]
    GrantMoved {
        /// The granted path.
        grant: String,
        /// The snapshot's bytes.
        data: PathBuf,
    },
    /// The path now holds something restore will not replace (a directory, link or device).
    #[error("{path} is now {what}; restore replaces only regular files (move it aside and retry)")]
    NotAFile {
        /// The host path.
        path: String,
        /// What it is now.
        what: &'static str,
    },
}

impl SnapshotError {
    fn io(step: impl Into<String>, source: impl Into<std::io::Error>) -> Self {
        Self::Io {
            step: step.into(),
            source: source.into(),
        }
    }
}

/// Largest file a snapshot keeps (and so the largest file the gateway changes).
pub const DEFAULT_MAX_FILE: u64 = 256 << 20;
/// Most snapshot bytes one run may leave.
pub const DEFAULT_RUN_QUOTA: u64 = 1 << 30;

/// Where a supervisor keeps its snapshots, with one run's limits: no file larger than
/// `max_file`, at most `quota` bytes in all (a change that would pass either is refused
/// before anything is copied).
#[derive(Debug)]
pub struct SnapshotStore {
    dir: PathBuf,
    max_file: u64,
    quota: u64,
    used: std::sync::atomic::AtomicU64,
}

fn check_id(id: &str) -> Result<(), SnapshotError> {
    uuid::Uuid::parse_str(id)
        .map(|_| ())
        .map_err(|_| SnapshotError::BadId(id.to_owned()))
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

impl SnapshotStore {
    /// The store of the supervisor whose data directory is `data_dir`.
    pub fn new(data_dir: &Path) -> Self {
        Self::with_limits(data_dir, DEFAULT_MAX_FILE, DEFAULT_RUN_QUOTA)
    }

    /// The store with other limits.
    pub fn with_limits(data_dir: &Path, max_file: u64, quota: u64) -> Self {
        Self {
            dir: data_dir.join("snapshots"),
            max_file,
            quota,
            used: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn run_dir(&self, run_id: &str) -> Result<PathBuf, SnapshotError> {
        check_id(run_id)?;
        Ok(self.dir.join(run_id))
    }

    /// Keeps `manifest` and, when the file existed, its bytes from `content` (an open
    /// descriptor of the very inode that was checked). Both are on disk before this returns.
    pub fn take(
        &self,
        manifest: &SnapshotManifest,
        content: Option<&std::os::fd::OwnedFd>,
    ) -> Result<(), SnapshotError> {
        use std::os::unix::fs::DirBuilderExt as _;
        use std::sync::atomic::Ordering;
        check_id(&manifest.call_id)?;
        let dir = self.run_dir(&manifest.run_id)?;
        let size = if content.is_some() { manifest.size } else { 0 };
        if size > self.max_file {
            return Err(SnapshotError::TooLarge {
                size,
                max: self.max_file,
            });
        }
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                used.checked_add(size).filter(|total| *total <= self.quota)
            })
            .map_err(|_| SnapshotError::QuotaSpent { quota: self.quota })?;
        for path in [&self.dir, &dir] {
            if !path.exists() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(path)
                    .and_then(|()| sync_dir(path.parent().unwrap_or(Path::new("/"))))
                    .map_err(|e| SnapshotError::io(format!("creating {}", path.display()), e))?;
            }
        }
        let data = dir.join(format!("{}.data", manifest.call_id));
        if let Some(content) = content {
            if let Err(e) = beneath::copy_to_new(content, &data, size) {
                let _ = std::fs::remove_file(&data);
                return Err(SnapshotError::io(
                    format!("copying into {}", data.display()),
                    e,
                ));
            }
        }
        let json = dir.join(format!("{}.json", manifest.call_id));
        let text = serde_json::to_vec_pretty(manifest).map_err(std::io::Error::other);
        text.and_then(|text| {
            use std::io::Write as _;
            use std::os::unix::fs::OpenOptionsExt as _;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&json)?;
            file.write_all(&text)?;
            file.sync_all()
        })
        .and_then(|()| sync_dir(&dir))
        .map_err(|e| {
            // No manifest, no snapshot: leave no bytes behind that nothing names.
            let _ = std::fs::remove_file(&json);
            let _ = std::fs::remove_file(&data);
            SnapshotError::io(format!("writing {}", json.display()), e)
        })
    }

    /// The manifest of one call's snapshot.
    pub fn manifest(&self, run_id: &str, call_id: &str) -> Result<SnapshotManifest, SnapshotError> {
        check_id(call_id)?;
        let dir = self.run_dir(run_id)?;
        let path = dir.join(format!("{call_id}.json"));
        let text = match std::fs::read(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(SnapshotError::NotFound {
                    run_id: run_id.to_owned(),
                    call_id: call_id.to_owned(),
                    dir,
                })
            }
            Err(e) => return Err(SnapshotError::io(format!("reading {}", path.display()), e)),
        };
        let manifest: SnapshotManifest =
            serde_json::from_slice(&text).map_err(|e| SnapshotError::BadManifest {
                path: path.clone(),
                reason: e.to_string(),
            })?;
        if manifest.run_id != run_id || manifest.call_id != call_id {
            return Err(SnapshotError::BadManifest {
                path,
                reason: "it names another run or call".into(),
            });
        }
        Ok(manifest)
    }

    /// Puts the file of `run_id`'s call `call_id` back as it was before the call.
    pub fn restore(&self, run_id: &str, call_id: &str) -> Result<Restored, SnapshotError> {
        let manifest = self.manifest(run_id, call_id)?;
        let path = manifest.path.clone();
        let step = |what: &str| format!("{what} {path}");
        let data_path = self.run_dir(run_id)?.join(format!("{call_id}.data"));
        let root = match GrantRoot::open(&manifest.grant) {
            Ok(root) => Some(root),
            // A link now on the grant's path: it no longer leads to the directory (links are
            // never followed).
            Err(Errno::ELOOP) => None,
            Err(e) => {
                return Err(SnapshotError::io(
                    format!("opening the grant {}", manifest.grant),
                    e,
                ))
            }
        };
        let Some(root) =
            root.filter(|root| (root.dev, root.ino) == (manifest.grant_dev, manifest.grant_ino))
        else {
            return Err(SnapshotError::GrantMoved {
                grant: manifest.grant.clone(),
                data: data_path,
            });
        };
        let parent = beneath::parent_beneath(&root, &manifest.rest)
            .map_err(|e| SnapshotError::io(step("opening the directory of"), e))?;
        let now = parent
            .entry()
            .map_err(|e| SnapshotError::io(step("looking at"), e))?;
        if let Some(stat) = &now {
            if !beneath::is_regular(stat) {
                return Err(SnapshotError::NotAFile {
                    path,
                    what: if beneath::is_dir(stat) {
                        "a directory"
                    } else {
                        "a link, device, FIFO or socket"
                    },
                });
            }
        }
        if !manifest.existed {
            if now.is_some() {
                beneath::remove(&parent, false)
                    .map_err(|e| SnapshotError::io(step("removing"), e))?;
            }
            return Ok(Restored {
                path,
                removed: true,
                size: 0,
            });
        }
        let data_path = self.run_dir(run_id)?.join(format!("{call_id}.data"));
        let data = nix::fcntl::open(
            &data_path,
            nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(|e| SnapshotError::io(format!("opening {}", data_path.display()), e))?;
        let len = nix::sys::stat::fstat(&data)
            .map_err(|e| SnapshotError::io(format!("reading {}", data_path.display()), e))?
            .st_size as u64;
        let staged = beneath::stage(
            parent,
            &format!("restore-{call_id}"),
            Some((&data, len)),
            &[],
            Ownership {
                uid: manifest.uid,
                gid: manifest.gid,
                mode: manifest.mode,
            },
        )
        .map_err(|e| SnapshotError::io(step("writing the restored content of"), e))?;
        let size = staged.size;
        staged
            .commit(false)
            .map_err(|e: Errno| SnapshotError::io(step("putting back"), e))?;
        Ok(Restored {
            path,
            removed: false,
            size,
        })
    }
}

/// What a restore did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// The host path.
    pub path: String,
    /// Whether the file was removed (the call had created it).
    pub removed: bool,
    /// The restored file's size.
    pub size: u64,
}
