//! What a supervisor holds on its host besides its data directory: its cgroup parent (whose
//! every cgroup it sweeps at start and removes at shutdown) and its range of host ids (the
//! uids and gids its sandboxes run as). Two supervisors sharing either would destroy each
//! other's runs or share uids between their sandboxes, so each live supervisor registers
//! both in one file under the run directory (`/run/tollgate/supervisors/`), locked for its
//! lifetime: a crash releases the lock, and a stale file is removed by the next supervisor
//! that finds it unlocked. A supervisor whose parent or range a live one holds refuses to
//! start, naming it.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read as _, Seek as _, Write as _};
use std::ops::Range;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};

/// Where live supervisors register, by default.
pub const DEFAULT_RUN_DIR: &str = "/run/tollgate";

/// One supervisor's claim on its host: who it is, and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The supervisor's id.
    pub id: String,
    /// Its data directory (one supervisor per data directory: the registration's key).
    pub data_dir: PathBuf,
    /// Its process id.
    pub pid: u32,
    /// Its cgroup parent.
    pub cgroup_parent: String,
    /// Its sandboxes' host ids.
    pub host_ids: Range<u32>,
}

impl Claim {
    fn encode(&self) -> String {
        format!(
            "id={}\ndata_dir={}\npid={}\ncgroup_parent={}\nhost_ids={}..{}\n",
            self.id,
            self.data_dir.display(),
            self.pid,
            self.cgroup_parent,
            self.host_ids.start,
            self.host_ids.end
        )
    }

    fn decode(text: &str) -> Option<Self> {
        let field = |name: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix('='))
        };
        let (start, end) = field("host_ids")?.split_once("..")?;
        Some(Self {
            id: field("id")?.to_owned(),
            data_dir: PathBuf::from(field("data_dir")?),
            pid: field("pid")?.parse().ok()?,
            cgroup_parent: field("cgroup_parent")?.to_owned(),
            host_ids: start.parse().ok()?..end.parse().ok()?,
        })
    }

    /// How this claim is named in a refusal: `supervisor ID (data dir DIR, pid N)`.
    pub fn holder(&self) -> String {
        format!(
            "supervisor {} (data dir {}, pid {})",
            self.id,
            self.data_dir.display(),
            self.pid
        )
    }
}

/// Why a supervisor may not take what it was configured with.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// The run directory or a registration could not be used.
    #[error("cannot use {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The failure.
        source: io::Error,
    },
    /// A live supervisor has the same cgroup parent.
    #[error("cgroup parent {parent} is in use by {holder}; give this supervisor another --cgroup-parent")]
    ParentInUse {
        /// The parent.
        parent: String,
        /// The live supervisor.
        holder: String,
    },
    /// A live supervisor's host ids overlap this one's.
    #[error("host ids {start}..{end} overlap {other_start}..{other_end} of {holder}; give this supervisor another --host-id-base or --host-id-count")]
    HostIdsOverlap {
        /// This supervisor's range.
        start: u32,
        /// Its end (exclusive).
        end: u32,
        /// The live supervisor's range.
        other_start: u32,
        /// Its end (exclusive).
        other_end: u32,
        /// The live supervisor.
        holder: String,
    },
    /// A live supervisor's registration could not be read.
    #[error("{path} is held by a live supervisor whose claim cannot be read; refusing rather than risk sharing its cgroups or host ids")]
    Unreadable {
        /// The registration.
        path: PathBuf,
    },
}

/// This supervisor's registration, held (locked) until dropped.
#[derive(Debug)]
pub struct HostRegistration {
    _lock: Flock<File>,
    path: PathBuf,
}

impl HostRegistration {
    /// Registers `claim` under `run_dir`, refusing if a live supervisor holds the same cgroup
    /// parent or an overlapping range of host ids.
    pub fn register(run_dir: &Path, claim: &Claim) -> Result<Self, ClaimError> {
        let dir = run_dir.join("supervisors");
        let io_error = |path: &Path| {
            let path = path.to_owned();
            move |source| ClaimError::Io { path, source }
        };
        fs::create_dir_all(&dir).map_err(io_error(&dir))?;
        let path = registration_path(run_dir, &claim.data_dir);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .mode(0o644)
            .open(&path)
            .map_err(io_error(&path))?;
        // The data directory is locked already, so only a dead supervisor of this directory
        // can have held this file: taking it cannot block for long.
        let mut lock = Flock::lock(file, FlockArg::LockExclusive)
            .map_err(|(_, errno)| io_error(&path)(errno.into()))?;
        lock.set_len(0).map_err(io_error(&path))?;
        lock.rewind().map_err(io_error(&path))?;
        lock.write_all(claim.encode().as_bytes())
            .and_then(|()| lock.sync_all())
            .map_err(io_error(&path))?;
        let registration = Self { _lock: lock, path };
        for live in scan(run_dir, Some(&registration.path), true)? {
            check(claim, &live)?;
        }
        Ok(registration)
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        // Removed while still locked: a supervisor starting now finds it gone or unlocked.
        let _ = fs::remove_file(&self.path);
    }
}

/// The claims of the supervisors live under `run_dir` now (for `tollgate doctor`: stale
/// registrations are skipped, not removed).
pub fn live_claims(run_dir: &Path) -> Result<Vec<Claim>, ClaimError> {
    scan(run_dir, None, false)
}

/// The live claims under `run_dir` but `skip`'s, stale ones removed when `remove_stale`.
fn scan(run_dir: &Path, skip: Option<&Path>, remove_stale: bool) -> Result<Vec<Claim>, ClaimError> {
    let dir = run_dir.join("supervisors");
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(ClaimError::Io { path: dir, source }),
    };
    let mut claims = Vec::new();
    for entry in entries {
        let other = entry
            .map_err(|source| ClaimError::Io {
                path: dir.clone(),
                source,
            })?
            .path();
        if Some(other.as_path()) == skip
            || other.extension().and_then(|e| e.to_str()) != Some("claim")
        {
            continue;
        }
        if let Some(live) = live_claim(&other, remove_stale)? {
            claims.push(live);
        }
    }
    Ok(claims)
}

/// Where the supervisor of `data_dir` registers under `run_dir`.
pub fn registration_path(run_dir: &Path, data_dir: &Path) -> PathBuf {
    run_dir
        .join("supervisors")
        .join(format!("{}.claim", escape(&data_dir.to_string_lossy())))
}

/// The claim in `path` if a live supervisor holds it; a stale one is removed when
/// `remove_stale`.
fn live_claim(path: &Path, remove_stale: bool) -> Result<Option<Claim>, ClaimError> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(ClaimError::Io {
                path: path.to_owned(),
                source,
            })
        }
    };
    match Flock::lock(file, FlockArg::LockSharedNonblock) {
        Ok(stale) => {
            // Nobody holds it: its supervisor is gone. Remove it if it is still the file we
            // looked at (a restarting supervisor may have just taken the name).
            let same = fs::metadata(path).is_ok_and(|now| {
                stale
                    .metadata()
                    .is_ok_and(|held| held.ino() == now.ino() && held.dev() == now.dev())
            });
            if same && remove_stale {
                let _ = fs::remove_file(path);
            }
            Ok(None)
        }
        Err((mut held, _)) => {
            // Live. Its owner writes its claim right after locking: give it a moment.
            for _ in 0..50 {
                let mut text = String::new();
                if held.rewind().is_ok() && held.read_to_string(&mut text).is_ok() {
                    if let Some(claim) = Claim::decode(&text) {
                        return Ok(Some(claim));
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(ClaimError::Unreadable {
                path: path.to_owned(),
            })
        }
    }
}

/// Refuses `mine` when it takes what `live` holds.
fn check(mine: &Claim, live: &Claim) -> Result<(), ClaimError> {
    if mine.cgroup_parent == live.cgroup_parent {
        return Err(ClaimError::ParentInUse {
            parent: mine.cgroup_parent.clone(),
            holder: live.holder(),
        });
    }
    let (a, b) = (&mine.host_ids, &live.host_ids);
    if a.start < b.end && b.start < a.end {
        return Err(ClaimError::HostIdsOverlap {
            start: a.start,
            end: a.end,
            other_start: b.start,
            other_end: b.end,
            holder: live.holder(),
        });
    }
    Ok(())
}

/// A data directory as a file name: every byte outside `[A-Za-z0-9._-]` as `%XX`.
fn escape(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(data_dir: &str, parent: &str, ids: Range<u32>) -> Claim {
        Claim {
            id: format!("sup-{parent}"),
            data_dir: PathBuf::from(data_dir),
            pid: std::process::id(),
            cgroup_parent: parent.to_owned(),
            host_ids: ids,
        }
    }

    #[test]
    fn a_live_supervisors_parent_and_host_ids_are_refused_to_another() {
        let run = tempfile::tempdir().unwrap();
        let first = HostRegistration::register(run.path(), &claim("/a", "p", 100..200)).unwrap();
        let same_parent =
            HostRegistration::register(run.path(), &claim("/b", "p", 300..400)).unwrap_err();
        assert!(
            matches!(&same_parent, ClaimError::ParentInUse { holder, .. } if holder.contains("data dir /a")),
            "{same_parent}"
        );
        let overlap =
            HostRegistration::register(run.path(), &claim("/c", "q", 150..160)).unwrap_err();
        assert!(
            matches!(
                overlap,
                ClaimError::HostIdsOverlap {
                    other_start: 100,
                    other_end: 200,
                    ..
                }
            ),
            "{overlap}"
        );
        let apart = HostRegistration::register(run.path(), &claim("/d", "r", 200..300)).unwrap();
        drop(apart);
        // Gone with the supervisor that held it: the parent is free again.
        drop(first);
        HostRegistration::register(run.path(), &claim("/b", "p", 300..400)).unwrap();
    }

    #[test]
    fn a_stale_registration_is_removed_and_does_not_refuse() {
        let run = tempfile::tempdir().unwrap();
        let dir = run.path().join("supervisors");
        fs::create_dir_all(&dir).unwrap();
        let stale = dir.join("%2Fgone.claim");
        fs::write(&stale, claim("/gone", "p", 100..200).encode()).unwrap();
        HostRegistration::register(run.path(), &claim("/new", "p", 100..200)).unwrap();
        assert!(!stale.exists());
    }

    #[test]
    fn live_claims_lists_the_live_and_leaves_a_stale_registration_to_its_supervisors() {
        let run = tempfile::tempdir().unwrap();
        assert_eq!(live_claims(run.path()).unwrap(), Vec::new());
        let live = claim("/a", "p", 100..200);
        let _held = HostRegistration::register(run.path(), &live).unwrap();
        let stale = run.path().join("supervisors").join("%2Fgone.claim");
        fs::write(&stale, claim("/gone", "q", 300..400).encode()).unwrap();
        assert_eq!(live_claims(run.path()).unwrap(), vec![live]);
        // Only a starting supervisor removes stale registrations; a reader leaves them.
        assert!(stale.exists());
    }

    #[test]
    fn claims_round_trip_and_names_escape() {
        let c = claim("/var/lib/tollgate sup", "tollgate/x", 5..9);
        assert_eq!(Claim::decode(&c.encode()), Some(c));
        assert_eq!(escape("/var/lib/x y"), "%2Fvar%2Flib%2Fx%20y");
    }
}
