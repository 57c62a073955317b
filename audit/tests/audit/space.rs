//! What a caller can make the writer put on disk, and what a full disk does to it: every
//! entry is bounded, and a writer that met ENOSPC resumes by itself once space returns,
//! without dropping an acknowledged entry or acknowledging one it could not write.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use tollgate_audit::{
    read_entries, verify_dir, AuditLog, Decision, EntryDraft, EntryKind, MetaValue, MAX_ENTRY_BYTES,
};

use crate::common::{config, draft, options};

/// A small tmpfs of our own, unmounted however the test ends.
struct SmallTmpfs {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl SmallTmpfs {
    /// `None` (and the test is skipped) when this process may not mount.
    fn mount(size: &str) -> Option<Self> {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: mounting a tmpfs needs root");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fs");
        fs::create_dir(&path).unwrap();
        mount(
            Some("tmpfs"),
            &path,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(format!("size={size},mode=0700").as_str()),
        )
        .unwrap();
        Some(Self { _dir: dir, path })
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        if let Err(e) = umount2(&self.path, MntFlags::MNT_DETACH) {
            eprintln!("unmounting {}: {e}", self.path.display());
        }
    }
}

/// Fills the file system holding `dir` with one file, until ENOSPC.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut file = fs::File::create(&path).unwrap();
    let chunk = vec![0u8; 4096];
    loop {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => break,
            Err(e) => panic!("filling: {e}"),
        }
    }
    path
}

fn call_ids(dir: &Path) -> Vec<String> {
    read_entries(dir)
        .unwrap()
        .filter_map(|entry| entry.unwrap().call_id)
        .collect()
}

#[test]
fn a_full_disk_stalls_the_writer_and_freed_space_resumes_it_without_a_restart() {
    let Some(tmpfs) = SmallTmpfs::mount("512k") else {
        return;
    };
    let dir = tmpfs.path.join("audit");
    let log = AuditLog::open(config(&dir, true)).unwrap();
    let mut acknowledged = Vec::new();
    for i in 1..=5 {
        log.append(draft(i)).unwrap();
        acknowledged.push(format!("call-{i}"));
    }
    let filler = fill(&tmpfs.path);

    // The disk is full: a durable append is refused, never acknowledged.
    let mut refused = Vec::new();
    let mut i = 6;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match log.append(draft(i)) {
            Ok(_) => acknowledged.push(format!("call-{i}")),
            Err(_) => {
                refused.push(format!("call-{i}"));
                break;
            }
        }
        i += 1;
        assert!(
            Instant::now() < deadline,
            "appends never failed on a full disk"
        );
    }
    // Refused again while the disk stays full.
    for _ in 0..3 {
        i += 1;
        assert!(log.append(draft(i)).is_err(), "acknowledged on a full disk");
        refused.push(format!("call-{i}"));
    }

    // Space returns: the same writer resumes, no reopen.
    fs::remove_file(&filler).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        i += 1;
        match log.append(draft(i)) {
            Ok(_) => {
                acknowledged.push(format!("call-{i}"));
                break;
            }
            Err(e) => {
                refused.push(format!("call-{i}"));
                assert!(
                    Instant::now() < deadline,
                    "the writer did not resume once space returned: {e}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    for _ in 0..5 {
        i += 1;
        log.append(draft(i)).unwrap();
        acknowledged.push(format!("call-{i}"));
    }
    log.close().unwrap();

    let report = verify_dir(&dir, &options(true)).unwrap();
    assert_eq!(report.entries, log.head_seq());
    let written = call_ids(&dir);
    for id in &acknowledged {
        assert!(written.contains(id), "acknowledged {id} is missing");
    }
    for id in &refused {
        assert!(!written.contains(id), "{id} was refused but written");
    }
}

#[test]
fn entries_handed_over_on_a_full_disk_are_written_once_space_returns() {
    let Some(tmpfs) = SmallTmpfs::mount("512k") else {
        return;
    };
    let dir = tmpfs.path.join("audit");
    let log = AuditLog::open(config(&dir, false)).unwrap();
    log.append(draft(1)).unwrap();
    let filler = fill(&tmpfs.path);
    // Handed over (so acknowledged to the caller) before the writer learns the disk is full.
    let mut handed = Vec::new();
    for i in 2..=20 {
        if log.record(draft(i)).is_ok() {
            handed.push(format!("call-{i}"));
        }
    }
    assert!(!handed.is_empty());
    // Let the writer meet the full disk.
    assert!(log.flush().is_err(), "flushed onto a full disk");
    fs::remove_file(&filler).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while log.flush().is_err() {
        assert!(Instant::now() < deadline, "the writer did not resume");
        std::thread::sleep(Duration::from_millis(20));
    }
    log.append(draft(99)).unwrap();
    log.close().unwrap();
    verify_dir(&dir, &options(false)).unwrap();
    let written = call_ids(&dir);
    for id in &handed {
        assert!(written.contains(id), "handed-over {id} was dropped");
    }
    assert!(written.contains(&"call-99".to_owned()));
}

#[test]
fn no_caller_can_write_a_huge_entry() {
    let dir = tempfile::tempdir().unwrap();
    let log = AuditLog::open(config(dir.path(), false)).unwrap();
    let huge = "/a".repeat(1 << 20);
    let long = "b".repeat(64 << 10);
    for _ in 0..5 {
        log.append(
            EntryDraft::new("supervisor", EntryKind::ToolCall)
                .run("r")
                .call(huge.clone())
                .decision(Decision::Deny)
                .reason(format!("no fs grant covers {huge}"))
                .meta("path", huge.clone())
                .meta("argv", vec![long.clone(); 200])
                .meta("many", vec!["x"; 100_000]),
        )
        .unwrap();
    }
    let mut wide = EntryDraft::new("supervisor", EntryKind::ToolCall);
    for k in 0..10_000 {
        wide = wide.meta(format!("key-{k}"), "v".repeat(1000));
    }
    log.append(wide).unwrap();
    log.close().unwrap();
    let mut total = 0;
    for entry in fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "jsonl") {
            let text = fs::read_to_string(&path).unwrap();
            for line in text.lines() {
                assert!(line.len() <= MAX_ENTRY_BYTES, "a {} byte entry", line.len());
            }
            total += text.len();
        }
    }
    assert!(total < 6 * MAX_ENTRY_BYTES + 4096, "{total} bytes written");
    verify_dir(dir.path(), &options(false)).unwrap();
    let entries: Vec<_> = read_entries(dir.path())
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let first = &entries[0];
    assert!(
        first.reason.as_deref().unwrap().contains("[truncated"),
        "a cut is marked: {:?}",
        first.reason
    );
    let Some(MetaValue::Str(path)) = first.metadata.get("path") else {
        panic!("no path")
    };
    assert!(path.starts_with("/a/a") && path.contains("[truncated"));
}
