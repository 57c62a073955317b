//! Reading entries in order across files, with a simple filter. Reading does not verify: run
//! [`verify_dir`](crate::verify_dir) first when the answer matters.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::entry::Entry;
use crate::error::AuditError;
use crate::files::{list_log_files, split_lines};

/// Which entries to yield; every field that is set must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EntryFilter {
    /// Only entries with this `run_id`.
    pub run_id: Option<String>,
    /// Only entries with this `receipt_id`.
    pub receipt_id: Option<String>,
    /// Only entries appended at or after this time.
    pub since: Option<SystemTime>,
}

impl EntryFilter {
    /// Whether `entry` passes. An entry whose time does not parse fails a `since` filter.
    pub fn matches(&self, entry: &Entry) -> bool {
        let same = |want: &Option<String>, have: &Option<String>| {
            want.as_ref().is_none_or(|want| have.as_ref() == Some(want))
        };
        same(&self.run_id, &entry.run_id)
            && same(&self.receipt_id, &entry.receipt_id)
            && self
                .since
                .is_none_or(|since| entry.timestamp().is_some_and(|t| t >= since))
    }
}

/// Iterates the entries of a log directory in order, one file in memory at a time. A torn final
/// line of the newest file is skipped; any other unreadable line is an error item.
#[derive(Debug)]
pub struct AuditReader {
    files: std::vec::IntoIter<PathBuf>,
    remaining_files: usize,
    current: Option<CurrentFile>,
    filter: EntryFilter,
    done: bool,
}

#[derive(Debug)]
struct CurrentFile {
    path: PathBuf,
    data: Vec<u8>,
    // Offsets of line starts still to read, with their line numbers.
    lines: std::vec::IntoIter<(usize, usize, usize, bool)>,
    last_file: bool,
    line_count: usize,
}

/// Opens the log in `dir` for reading every entry in order.
pub fn read_entries(dir: &Path) -> Result<AuditReader, AuditError> {
    AuditReader::open(dir)
}

impl AuditReader {
    /// Lists the log files of `dir`; fails if there are none.
    pub fn open(dir: &Path) -> Result<Self, AuditError> {
        let files = list_log_files(dir).map_err(|source| AuditError::Dir {
            path: dir.to_owned(),
            source,
        })?;
        if files.is_empty() {
            return Err(AuditError::NoLog {
                dir: dir.to_owned(),
            });
        }
        let paths: Vec<PathBuf> = files.into_iter().map(|(_, path)| path).collect();
        Ok(Self {
            remaining_files: paths.len(),
            files: paths.into_iter(),
            current: None,
            filter: EntryFilter::default(),
            done: false,
        })
    }

    /// Yields only entries matching `filter`.
    pub fn filtered(mut self, filter: EntryFilter) -> Self {
        self.filter = filter;
        self
    }

    fn next_file(&mut self) -> Result<bool, AuditError> {
        let Some(path) = self.files.next() else {
            return Ok(false);
        };
        self.remaining_files -= 1;
        let data = std::fs::read(&path).map_err(|source| AuditError::Read {
            path: path.clone(),
            source,
        })?;
        let lines: Vec<(usize, usize, usize, bool)> = split_lines(&data)
            .iter()
            .enumerate()
            .map(|(index, line)| {
                let start = usize::try_from(line.offset).unwrap_or(usize::MAX);
                (index + 1, start, start + line.bytes.len(), line.is_torn())
            })
            .collect();
        self.current = Some(CurrentFile {
            path,
            line_count: lines.len(),
            lines: lines.into_iter(),
            data,
            last_file: self.remaining_files == 0,
        });
        Ok(true)
    }
}

impl Iterator for AuditReader {
    type Item = Result<Entry, AuditError>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.done {
            let Some(current) = &mut self.current else {
                match self.next_file() {
                    Ok(true) => continue,
                    Ok(false) => {
                        self.done = true;
                        return None;
                    }
                    Err(error) => {
                        self.done = true;
                        return Some(Err(error));
                    }
                }
            };
            let Some((number, start, end, torn)) = current.lines.next() else {
                self.current = None;
                continue;
            };
            if torn && current.last_file && number == current.line_count {
                continue;
            }
            let parsed: Result<Entry, _> = serde_json::from_slice(&current.data[start..end]);
            match parsed {
                Ok(entry) if self.filter.matches(&entry) => return Some(Ok(entry)),
                Ok(_) => {}
                Err(e) => {
                    return Some(Err(AuditError::BadEntry {
                        path: current.path.clone(),
                        line: number,
                        detail: e.to_string(),
                    }))
                }
            }
        }
        None
    }
}
