//! The runs' parent cgroup's CPU weight, raised for the length of a supervisor's stop.
//!
//! The scheduler shares the CPU between the runs' parent and its siblings by their weights,
//! so thousands of sandboxes under one parent weigh, together, as much as one ordinary
//! process beside it: the kernel's own workers among those. At a stop every sandbox exits at
//! once (each exiting process tears down its own address space, namespaces and mounts), and
//! the kernel's workers clean up after the sandboxes already gone (network namespaces,
//! released cgroups). At the default weight the two took turns; at the highest weight the
//! kernel allows, the exits go first and the workers find larger batches. The stop of 4,999
//! live runs took 0.4–0.7 s less than the build before, alternated with it, and no work was
//! left running after it (see "Scale" in `docs/benchmarks.md`).
//!
//! Raised only from a stop's kill until its runs are removed: while runs are live, the
//! sandboxes must not outweigh the supervisor that serves their gateway calls, nor the host's
//! other work. What the weight was is written to the supervisor's data directory before it is
//! raised, so that a supervisor that dies mid-stop leaves the next one what to put back
//! ([`restore_left`]); a weight someone changed meanwhile is left as they set it.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use cgroups_rs::fs::Controllers;
use serde::{Deserialize, Serialize};

use super::{read_trimmed, write_file, CgroupError, RunCgroup};

/// The highest `cpu.shares` a v1 cgroup takes (the kernel's `MAX_SHARES`, 2^18).
const V1_MOST_SHARES: &str = "262144";
/// The highest `cpu.weight` a v2 cgroup takes (`CGROUP_WEIGHT_MAX`).
const V2_MOST_WEIGHT: &str = "10000";

/// One control file a stop raised: what it held before, and what the stop wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct RaisedFile {
    file: PathBuf,
    before: String,
    raised: String,
}

/// The parent's CPU weight as [`raise_for_stop`] left it; [`Self::restore`] puts it back.
#[derive(Debug)]
#[must_use = "the weight stays raised until restored"]
pub struct StopWeight {
    raised: Vec<RaisedFile>,
    /// The record this stop wrote (none where it raised nothing): never another's, such as
    /// one a crashed stop left that could not be read back.
    record: Option<PathBuf>,
}

/// Raises the CPU weight of `parent` (the runs' parent cgroup) to the highest the kernel
/// takes, in the v1 `cpu` hierarchy and in the v2 tree where its `cpu.weight` exists, after
/// writing what it was to `record` (synced). A weight already at the highest is left alone.
/// On an error nothing stays raised.
pub fn raise_for_stop(parent: &str, record: &Path) -> Result<StopWeight, CgroupError> {
    let mut planned = Vec::new();
    for (file, most) in weight_files(parent) {
        let before = match read_trimmed(&file) {
            Ok(before) => before,
            // No such file here: this hierarchy has no CPU weight for the parent.
            Err(CgroupError::Io { source, .. }) if source.kind() == ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if before != most {
            planned.push(RaisedFile {
                file,
                before,
                raised: most.to_owned(),
            });
        }
    }
    if planned.is_empty() {
        return Ok(StopWeight {
            raised: Vec::new(),
            record: None,
        });
    }
    write_record(record, &planned)?;
    let mut weight = StopWeight {
        raised: Vec::new(),
        record: Some(record.to_owned()),
    };
    for file in planned {
        if let Err(e) = write_file(&file.file, &file.raised) {
            // Best effort: the write that failed is the error to report.
            let _ = weight.restore();
            return Err(e);
        }
        weight.raised.push(file);
    }
    Ok(weight)
}

impl StopWeight {
    /// Whether the stop raised any weight.
    pub fn raised_any(&self) -> bool {
        !self.raised.is_empty()
    }

    /// Puts back what each raised file held, unless it holds something else by now (someone
    /// set it meanwhile) or is gone (the parent was removed), then removes the record.
    pub fn restore(self) -> Result<(), CgroupError> {
        put_back(&self.raised)?;
        self.record.as_deref().map_or(Ok(()), remove_record)
    }
}

/// Puts back a weight that a stop raised and did not restore (the supervisor died during
/// it), from the `record` it left, and removes the record. Returns how many files were put
/// back (none where there is no record).
pub fn restore_left(record: &Path) -> Result<usize, CgroupError> {
    let text = match fs::read_to_string(record) {
        Ok(text) => text,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(0),
        Err(source) => {
            return Err(CgroupError::Io {
                file: record.to_owned(),
                source,
            })
        }
    };
    let raised: Vec<RaisedFile> =
        serde_json::from_str(&text).map_err(|e| CgroupError::WeightRecord {
            file: record.to_owned(),
            detail: e.to_string(),
        })?;
    let restored = put_back(&raised)?;
    remove_record(record)?;
    Ok(restored)
}

/// The control files that weigh `parent` against its siblings, each with the highest value
/// it takes.
fn weight_files(parent: &str) -> Vec<(PathBuf, &'static str)> {
    // Where `parent` is in each hierarchy, as for a run's cgroup. A hybrid host's v2 tree has
    // no CPU controller; its file is looked for regardless.
    let cgroup = RunCgroup::existing(parent);
    let v1 = cgroup
        .v1_dirs
        .iter()
        .find(|(controller, _)| *controller == Controllers::Cpu)
        .map(|(_, dir)| (dir.join("cpu.shares"), V1_MOST_SHARES));
    let v2 = cgroup
        .v2_dir
        .map(|dir| (dir.join("cpu.weight"), V2_MOST_WEIGHT));
    v1.into_iter().chain(v2).collect()
}

/// Writes each file's `before` back where it still holds `raised`; how many were written.
fn put_back(raised: &[RaisedFile]) -> Result<usize, CgroupError> {
    let mut restored = 0;
    for file in raised {
        match read_trimmed(&file.file) {
            Ok(now) if now == file.raised => {
                write_file(&file.file, &file.before)?;
                restored += 1;
            }
            Ok(_) => {}
            Err(CgroupError::Io { source, .. }) if source.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(restored)
}

/// Writes the record of what the weights were, whole or not at all, and durably (file and
/// directory synced): it must be on disk before any is raised.
fn write_record(record: &Path, raised: &[RaisedFile]) -> Result<(), CgroupError> {
    let io = |source| CgroupError::Io {
        file: record.to_owned(),
        source,
    };
    let text = serde_json::to_vec(raised).map_err(|e| io(e.into()))?;
    tollgate_daemon::files::write_atomic(record, &text, 0o600).map_err(io)
}

fn remove_record(record: &Path) -> Result<(), CgroupError> {
    match fs::remove_file(record) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(source) => Err(CgroupError::Io {
            file: record.to_owned(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file holding what the stop wrote is put back; one someone changed since, and one
    /// that is gone, are left as they are.
    #[test]
    fn only_a_weight_still_as_raised_is_put_back() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, value: &str| {
            let path = dir.path().join(name);
            fs::write(&path, format!("{value}\n")).unwrap();
            path
        };
        let raised = vec![
            RaisedFile {
                file: file("as-raised", "262144"),
                before: "1024".into(),
                raised: "262144".into(),
            },
            RaisedFile {
                file: file("changed-since", "2048"),
                before: "1024".into(),
                raised: "262144".into(),
            },
            RaisedFile {
                file: dir.path().join("gone"),
                before: "100".into(),
                raised: "10000".into(),
            },
        ];
        let record = dir.path().join("record");
        write_record(&record, &raised).unwrap();
        assert_eq!(restore_left(&record).unwrap(), 1);
        let read = |name: &str| fs::read_to_string(dir.path().join(name)).unwrap();
        assert_eq!(read("as-raised"), "1024");
        assert_eq!(read("changed-since").trim(), "2048");
        assert!(!dir.path().join("gone").exists());
        assert!(!record.exists(), "the record is removed once used");
        assert_eq!(
            restore_left(&record).unwrap(),
            0,
            "no record, nothing to do"
        );
    }

    /// A record that cannot be read back is an error naming it, not a silent skip.
    #[test]
    fn an_unreadable_record_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let record = dir.path().join("record");
        fs::write(&record, "not json").unwrap();
        let error = restore_left(&record).unwrap_err().to_string();
        assert!(error.contains(&record.display().to_string()), "{error}");
    }
}
