//! File naming, private files and directories, fsync helpers and line splitting.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

/// Name of the checkpoint file inside a log directory.
pub(crate) const CHECKPOINTS_FILE: &str = "checkpoints.jsonl";
/// Name of the checkpoint public-key file inside a log directory.
pub(crate) const CHECKPOINT_PUB_FILE: &str = "checkpoint.pub";

/// `log-000001.jsonl` for index 1.
pub(crate) fn log_file_name(index: u64) -> String {
    format!("log-{index:06}.jsonl")
}

/// The index of a log file name written by [`log_file_name`]; other spellings do not count.
fn parse_log_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("log-")?.strip_suffix(".jsonl")?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let index = digits.parse().ok()?;
    (log_file_name(index) == name).then_some(index)
}

/// The log files in `dir`, by index. Gaps are left for the caller to report.
pub(crate) fn list_log_files(dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if let Some(index) = entry.file_name().to_str().and_then(parse_log_file_name) {
            files.push((index, entry.path()));
        }
    }
    files.sort();
    Ok(files)
}

/// Why a directory that must be private to the daemon's user cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PrivateDirError {
    /// It exists with group or other permission bits: what is in it (receipts, the audit
    /// log, tokens) would be readable by other local users.
    #[error("{} is mode {mode:03o}, open to other users; run `chmod 700 {}` and start again", path.display(), path.display())]
    OpenToOthers {
        /// The directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// It exists and is not a directory.
    #[error("{} exists and is not a directory", path.display())]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// It could not be inspected or created.
    #[error("{}: {source}", path.display())]
    Io {
        /// The directory.
        path: PathBuf,
        /// The failure.
        source: io::Error,
    },
}

/// Creates `dir` (and missing parents) as 0700, or checks that an existing `dir` is a
/// directory no other user can enter or list (no group or other bits): the one rule for every
/// daemon's data and audit directories. A looser existing directory is refused with the
/// `chmod` that fixes it, never silently tightened (the operator chose it; they decide).
pub fn ensure_private_dir(dir: &Path) -> Result<(), PrivateDirError> {
    let io = |source| PrivateDirError::Io {
        path: dir.to_owned(),
        source,
    };
    match fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => {
            let mode = meta.permissions().mode() & 0o7777;
            if mode & 0o077 != 0 {
                return Err(PrivateDirError::OpenToOthers {
                    path: dir.to_owned(),
                    mode,
                });
            }
            Ok(())
        }
        Ok(_) => Err(PrivateDirError::NotADirectory {
            path: dir.to_owned(),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(io)?;
            // The mode given to mkdir is filtered by the umask; set it exactly.
            fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(io)
        }
        Err(e) => Err(io(e)),
    }
}

/// The log's own directory: created 0700 like [`ensure_private_dir`], but an existing looser
/// one is used with a warning, not refused: the daemons keep it inside their data directory,
/// which they refuse when loose, and a log opened elsewhere is where the caller chose.
pub(crate) fn ensure_log_dir(dir: &Path) -> Result<(), PrivateDirError> {
    match ensure_private_dir(dir) {
        Err(PrivateDirError::OpenToOthers { path, mode }) => {
            tracing::warn!(dir = %path.display(), mode = format!("{mode:o}"), "audit directory is accessible to other users; consider chmod 700");
            Ok(())
        }
        other => other,
    }
}

/// Opens `path` for appending, creating it as 0600 if needed; says whether it was created.
pub(crate) fn open_append(path: &Path) -> io::Result<(File, bool)> {
    match OpenOptions::new()
        .append(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(file) => {
            // The mode given to open() is filtered by the umask; set it exactly.
            file.set_permissions(fs::Permissions::from_mode(0o600))?;
            Ok((file, true))
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            Ok((OpenOptions::new().append(true).open(path)?, false))
        }
        Err(e) => Err(e),
    }
}

/// Writes a new 0600 file that must not exist yet, and fsyncs it (not the directory).
pub(crate) fn write_new_private(path: &Path, contents: &[u8]) -> io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.set_permissions(fs::Permissions::from_mode(0o600))?;
    file.write_all(contents)?;
    file.sync_all()
}

/// Atomically replaces `path` with `contents` (temp file, fsync, rename, fsync directory), 0600.
pub(crate) fn write_atomic(path: &Path, contents: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let _ = fs::remove_file(&temp);
    let result = write_new_private(&temp, contents)
        .and_then(|()| fs::rename(&temp, path))
        .and_then(|()| sync_dir(dir));
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result
}

/// Fsyncs a directory, so that a file created or renamed in it survives a crash.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// One line of a file.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Line<'a> {
    /// Byte offset of the line's first byte in the file.
    pub offset: u64,
    /// The line without its newline.
    pub bytes: &'a [u8],
    /// Whether a newline ended it (false only for a final, incomplete line).
    pub terminated: bool,
}

impl Line<'_> {
    /// A torn line: incomplete, or not JSON at all. Either is what an interrupted write leaves;
    /// anything that is JSON but not a valid entry is treated as tampering instead.
    pub(crate) fn is_torn(&self) -> bool {
        !self.terminated || serde_json::from_slice::<serde::de::IgnoredAny>(self.bytes).is_err()
    }

    /// Length on disk, newline included.
    pub(crate) fn len_on_disk(&self) -> u64 {
        self.bytes.len() as u64 + u64::from(self.terminated)
    }
}

/// Splits file contents into lines; an empty file has none.
pub(crate) fn split_lines(data: &[u8]) -> Vec<Line<'_>> {
    let mut lines = Vec::new();
    let mut offset = 0usize;
    while offset < data.len() {
        let rest = &data[offset..];
        match rest.iter().position(|&b| b == b'\n') {
            Some(end) => {
                lines.push(Line {
                    offset: offset as u64,
                    bytes: &rest[..end],
                    terminated: true,
                });
                offset += end + 1;
            }
            None => {
                lines.push(Line {
                    offset: offset as u64,
                    bytes: rest,
                    terminated: false,
                });
                offset = data.len();
            }
        }
    }
    lines
}

/// Current Unix time in whole seconds (0 if the clock is before 1970).
pub(crate) fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_odd_spellings_do_not_count() {
        assert_eq!(log_file_name(1), "log-000001.jsonl");
        assert_eq!(parse_log_file_name("log-000042.jsonl"), Some(42));
        assert_eq!(parse_log_file_name("log-1234567.jsonl"), Some(1_234_567));
        assert_eq!(parse_log_file_name("log-42.jsonl"), None);
        assert_eq!(parse_log_file_name("log-000001.jsonl.torn-5"), None);
        assert_eq!(parse_log_file_name("log-+00001.jsonl"), None);
    }

    #[test]
    fn lines_and_torn_detection() {
        let lines = split_lines(b"{}\n[1]\n{\"a\"");
        assert_eq!(lines.len(), 3);
        assert!(!lines[0].is_torn() && !lines[1].is_torn());
        assert!(lines[2].is_torn());
        assert_eq!(lines[2].offset, 7);
        assert!(split_lines(b"").is_empty());
        assert!(split_lines(b"\0\0\0\n")[0].is_torn());
    }

    #[test]
    fn private_modes() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("a/b");
        ensure_private_dir(&sub).unwrap();
        assert_eq!(
            fs::metadata(&sub).unwrap().permissions().mode() & 0o777,
            0o700
        );
        ensure_private_dir(&sub).expect("an existing 0700 directory is fine");
        fs::set_permissions(&sub, fs::Permissions::from_mode(0o750)).unwrap();
        let refused = ensure_private_dir(&sub).unwrap_err().to_string();
        assert!(
            refused.contains("mode 750")
                && refused.contains(&format!("chmod 700 {}", sub.display())),
            "{refused}"
        );
        fs::set_permissions(&sub, fs::Permissions::from_mode(0o700)).unwrap();
        let (_, created) = open_append(&sub.join("f")).unwrap();
        assert!(created);
        let (_, created) = open_append(&sub.join("f")).unwrap();
        assert!(!created);
        assert_eq!(
            fs::metadata(sub.join("f")).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
}
