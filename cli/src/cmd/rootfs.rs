//! `tollgate rootfs import|list|rm`: the userlands a supervisor's runs may name
//! (`[rootfs] name = "..."`), kept as unpacked directories under its rootfs directory
//! (`<data dir>/rootfs`, or its `--rootfs-dir`). Run as root on the supervisor's host; the
//! supervisor need not be running.
//!
//! An import unpacks a tar stream (`docker export`, `podman export`, `tar -C DIR -c .`) beside
//! its destination and renames it into place when complete, so a run never sees half a
//! userland. What a container image may carry that a sandbox must never have is taken out on
//! the way in: device nodes and FIFOs are not created, set-uid and set-gid bits are cleared
//! (the sandbox mounts it nosuid and nodev as well), and nothing is written outside the
//! destination (no `..`, no absolute path, no write through a link).

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::json;
use tollgate_receipt::paths::Rootfs;

use crate::error::{CliError, RootfsError};

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RootfsError + '_ {
    move |source| RootfsError::Io {
        path: path.to_owned(),
        source,
    }
}

/// What an import took in, and what it left out.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct ImportReport {
    /// Entries unpacked.
    pub(crate) entries: u64,
    /// Bytes of file content unpacked.
    pub(crate) bytes: u64,
    /// Device nodes and FIFOs not created.
    pub(crate) devices_skipped: u64,
    /// Files whose set-uid or set-gid bit was cleared.
    pub(crate) set_id_cleared: u64,
}

fn checked_name(name: &str) -> Result<&str, RootfsError> {
    match Rootfs::parse(name, &[]) {
        Ok(Rootfs::Name(name)) => Ok(name),
        _ => Err(RootfsError::Name(name.to_owned())),
    }
}

/// Unpacks `tar` into `<dir>/<name>`: beside it first, then renamed into place.
pub(crate) fn import_from(
    name: &str,
    tar: impl Read,
    dir: &Path,
) -> Result<(PathBuf, ImportReport), RootfsError> {
    let name = checked_name(name)?;
    let destination = dir.join(name);
    if destination.exists() {
        return Err(RootfsError::Exists(destination));
    }
    fs::create_dir_all(dir).map_err(io(dir))?;
    let staging = dir.join(format!(".{name}.import-{}", std::process::id()));
    let _ = fs::remove_dir_all(&staging);
    fs::create_dir(&staging).map_err(io(&staging))?;
    let unpacked = unpack(tar, &staging);
    let report = match unpacked {
        Ok(report) => report,
        Err(e) => {
            let _ = fs::remove_dir_all(&staging);
            return Err(e);
        }
    };
    let userland = ["usr", "bin"]
        .iter()
        .any(|entry| fs::symlink_metadata(staging.join(entry)).is_ok());
    if !userland {
        let _ = fs::remove_dir_all(&staging);
        return Err(RootfsError::NotUserland);
    }
    // Traversable by the sandboxes' unprivileged ids, like any userland's /.
    let _ = fs::set_permissions(
        &staging,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    );
    if let Err(e) = fs::rename(&staging, &destination) {
        let _ = fs::remove_dir_all(&staging);
        return Err(io(&destination)(e));
    }
    Ok((destination, report))
}

fn unpack(tar: impl Read, into: &Path) -> Result<ImportReport, RootfsError> {
    let bad = RootfsError::Archive;
    let mut archive = tar::Archive::new(tar);
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(true);
    archive.set_unpack_xattrs(false);
    archive.set_overwrite(true);
    // Set-uid and set-gid bits never come in (the sandbox's nosuid mount would ignore them
    // too; a copy on the host must not carry them either).
    archive.set_mask(0o6000);
    let mut report = ImportReport::default();
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        let kind = entry.header().entry_type();
        if kind.is_character_special() || kind.is_block_special() || kind.is_fifo() {
            report.devices_skipped += 1;
            continue;
        }
        let mode = entry.header().mode().unwrap_or(0);
        if mode & 0o6000 != 0 && !kind.is_dir() {
            report.set_id_cleared += 1;
        }
        report.bytes += entry.header().size().unwrap_or(0);
        // false: the entry would land outside `into` (`..`, or through a link); not written.
        let path = entry
            .path()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        match entry.unpack_in(into) {
            Ok(true) => {}
            // Skipped for lying outside `into`, or refused for writing through a link there.
            Ok(false) => return Err(RootfsError::Outside(path)),
            Err(e) if e.to_string().contains("outside of destination") => {
                return Err(RootfsError::Outside(path))
            }
            Err(e) => return Err(RootfsError::Archive(e)),
        }
        report.entries += 1;
    }
    Ok(report)
}

/// `tollgate rootfs import NAME FILE`.
pub(crate) fn import(name: &str, file: &Path, dir: &Path, json: bool) -> Result<(), CliError> {
    let (destination, report) = if file == Path::new("-") {
        import_from(name, std::io::stdin().lock(), dir)?
    } else {
        let tar = fs::File::open(file).map_err(io(file))?;
        import_from(name, std::io::BufReader::new(tar), dir)?
    };
    if json {
        out!(
            "{}",
            json!({
                "name": name,
                "path": destination.display().to_string(),
                "entries": report.entries,
                "bytes": report.bytes,
                "devices_skipped": report.devices_skipped,
                "set_id_cleared": report.set_id_cleared,
            })
        )?;
    } else {
        out!(
            "imported {name} into {}: {} entries, {}; left out {} device nodes or FIFOs, cleared set-uid/set-gid on {} files\nruns name it with [rootfs] name = \"{name}\"",
            destination.display(),
            report.entries,
            bytesize::ByteSize(report.bytes),
            report.devices_skipped,
            report.set_id_cleared
        )?;
    }
    Ok(())
}

/// The distribution a userland says it is (`PRETTY_NAME` of its os-release), if any.
fn pretty_name(root: &Path) -> Option<String> {
    ["etc/os-release", "usr/lib/os-release"]
        .iter()
        .find_map(|file| fs::read_to_string(root.join(file)).ok())?
        .lines()
        .find_map(|line| line.strip_prefix("PRETTY_NAME="))
        .map(|value| value.trim_matches('"').to_owned())
}

/// `tollgate rootfs list`.
pub(crate) fn list(dir: &Path, json: bool) -> Result<(), CliError> {
    let mut names: Vec<String> = match fs::read_dir(dir) {
        Ok(entries) => entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|name| !name.starts_with('.'))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io(dir)(e).into()),
    };
    names.sort();
    if json {
        let list: Vec<_> = names
            .iter()
            .map(|name| json!({"name": name, "path": dir.join(name).display().to_string(), "os": pretty_name(&dir.join(name))}))
            .collect();
        out!("{}", json!(list))?;
    } else if names.is_empty() {
        out!(
            "no root file systems under {} (tollgate rootfs import NAME FILE.tar adds one)",
            dir.display()
        )?;
    } else {
        for name in names {
            let os = pretty_name(&dir.join(&name)).unwrap_or_else(|| "unknown userland".into());
            out!("{name:<20} {os}")?;
        }
    }
    Ok(())
}

/// `tollgate rootfs rm NAME`.
pub(crate) fn remove(name: &str, dir: &Path) -> Result<(), RootfsError> {
    let name = checked_name(name)?;
    let path = dir.join(name);
    match fs::symlink_metadata(&path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(&path).map_err(io(&path)),
        _ => Err(RootfsError::Missing {
            name: name.to_owned(),
            dir: dir.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(entries: &[(&str, tar::EntryType, u32, &[u8])]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, kind, mode, data) in entries {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(*kind);
            header.set_mode(*mode);
            header.set_size(data.len() as u64);
            header.set_uid(0);
            header.set_gid(0);
            if kind.is_symlink() {
                header
                    .set_link_name(std::str::from_utf8(data).unwrap())
                    .unwrap();
                header.set_size(0);
                builder.append_data(&mut header, path, &[][..]).unwrap();
            } else {
                builder.append_data(&mut header, path, *data).unwrap();
            }
        }
        builder.into_inner().unwrap()
    }

    #[test]
    fn devices_and_set_id_bits_stay_out_and_the_userland_lands_whole() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let tar = archive(&[
            (
                "usr/bin/tool",
                tar::EntryType::Regular,
                0o4755,
                b"#!/bin/sh\n",
            ),
            (
                "etc/os-release",
                tar::EntryType::Regular,
                0o644,
                b"PRETTY_NAME=\"Tiny\"\n",
            ),
            ("dev/sda", tar::EntryType::Block, 0o600, b""),
            ("dev/fifo", tar::EntryType::Fifo, 0o600, b""),
            ("bin", tar::EntryType::Symlink, 0o777, b"usr/bin"),
        ]);
        let (path, report) = import_from("tiny", &tar[..], dir.path()).unwrap();
        assert_eq!(path, dir.path().join("tiny"));
        assert_eq!(report.devices_skipped, 2);
        assert_eq!(report.set_id_cleared, 1);
        let mode = fs::metadata(path.join("usr/bin/tool"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o755);
        assert!(!path.join("dev/sda").exists());
        assert_eq!(pretty_name(&path).as_deref(), Some("Tiny"));
        // Nothing left beside it, and a second import of the name is refused.
        let left: Vec<_> = fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(left.len(), 1);
        assert!(import_from("tiny", &tar[..], dir.path()).is_err());
        remove("tiny", dir.path()).unwrap();
        assert!(!path.exists());
    }

    #[test]
    fn an_archive_that_is_not_a_userland_or_escapes_is_refused_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let tar = archive(&[("notes.txt", tar::EntryType::Regular, 0o644, b"x")]);
        let error = import_from("notes", &tar[..], dir.path()).unwrap_err();
        assert!(error.to_string().contains("no usr or bin"), "{error}");
        // A link out of the tree, then a write through it.
        let tar = archive(&[
            ("usr/bin/x", tar::EntryType::Regular, 0o755, b"x"),
            ("usr/out", tar::EntryType::Symlink, 0o777, b"/tmp"),
            ("usr/out/planted", tar::EntryType::Regular, 0o644, b"x"),
        ]);
        assert!(import_from("escape", &tar[..], dir.path()).is_err());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
        assert!(import_from("../x", &tar[..], dir.path()).is_err());
    }
}
