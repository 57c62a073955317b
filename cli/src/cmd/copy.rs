//! `tollgate cp RUN:/work/PATH DEST` and `tollgate rm RUN`: files out of a run's workspace
//! (live, or kept after it ended by its receipt's `[workspace] keep`), and removing a kept
//! workspace before its time.
//!
//! The supervisor sends a tar stream; it is written to a temporary file beside DEST, unpacked
//! beside DEST (no `..`, no absolute path, no write through a link, no set-id bit, owners not
//! kept: the files are the caller's), and renamed into place, so DEST never holds half a copy.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use tokio_stream::StreamExt as _;
use tollgate_proto::v1 as pb;

use crate::args::GlobalArgs;
use crate::client::{authed, connect_supervisor};
use crate::error::CliError;

/// `RUN:/work/PATH` split into the run id and the sandbox path.
fn split_source(source: &str) -> Result<(&str, &str), CliError> {
    match source.split_once(':') {
        Some((run, path)) if !run.is_empty() && path.starts_with("/work") => Ok((run, path)),
        _ => Err(CliError::Input(format!(
            "{source:?}: give the source as RUN:/work/PATH (a run id, a colon, a path in its /work)"
        ))),
    }
}

/// Where the copy's top entry lands: inside DEST when DEST is a directory, else at DEST.
fn destination(dest: &Path, name: &str) -> PathBuf {
    if dest.is_dir() {
        dest.join(name)
    } else {
        dest.to_owned()
    }
}

fn output_error(path: &Path) -> impl FnOnce(std::io::Error) -> CliError + '_ {
    move |source| CliError::Output {
        path: path.display().to_string(),
        detail: source.to_string(),
    }
}

/// `tollgate cp`: out of a run (`RUN:/work/PATH DEST`) or into a live one
/// (`SRC RUN:/work/DIR`).
pub(crate) async fn copy(global: &GlobalArgs, source: &str, dest: &Path) -> Result<(), CliError> {
    let into = dest.to_str().and_then(|d| split_source(d).ok());
    if let (Some((run_id, path)), Err(_)) = (into, split_source(source)) {
        return copy_in(global, Path::new(source), run_id, path).await;
    }
    let (run_id, path) = split_source(source)?;
    let token = global.supervisor_tokens().token()?;
    let mut client = connect_supervisor(&global.supervisor, &global.tls()).await?;
    let mut stream = client
        .copy_out(authed(
            &token,
            pb::CopyOutRequest {
                run_id: run_id.to_owned(),
                path: path.to_owned(),
            },
        )?)
        .await?
        .into_inner();
    if dest == Path::new("-") {
        while let Some(chunk) = stream.next().await {
            crate::out::bytes(&chunk?.data)?;
        }
        return Ok(());
    }
    let name = path.rsplit('/').next().unwrap_or("work").to_owned();
    let target = destination(dest, &name);
    let beside = target
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_owned();
    let mut archive = tempfile::tempfile_in(&beside).map_err(output_error(&beside))?;
    while let Some(chunk) = stream.next().await {
        archive
            .write_all(&chunk?.data)
            .map_err(output_error(&beside))?;
    }
    unpack_into_place(archive, &name, &target, &beside)?;
    say!("copied {source} to {}", target.display())?;
    Ok(())
}

/// Unpacks the archive (top entry `name`) beside `target`, then renames it to `target`.
fn unpack_into_place(
    mut archive: std::fs::File,
    name: &str,
    target: &Path,
    beside: &Path,
) -> Result<(), CliError> {
    use std::io::Seek as _;
    archive.rewind().map_err(output_error(beside))?;
    let staging = tempfile::Builder::new()
        .prefix(".tollgate-cp-")
        .tempdir_in(beside)
        .map_err(output_error(beside))?;
    let mut tar = tar::Archive::new(archive);
    tar.set_preserve_permissions(true);
    tar.set_mask(0o6000);
    for entry in tar.entries().map_err(output_error(beside))? {
        let mut entry = entry.map_err(output_error(beside))?;
        let kind = entry.header().entry_type();
        if !(kind.is_file() || kind.is_dir() || kind.is_symlink()) {
            continue;
        }
        if !entry
            .unpack_in(staging.path())
            .map_err(output_error(beside))?
        {
            return Err(CliError::Input(
                "the copy names a path outside itself; nothing was written".into(),
            ));
        }
    }
    let unpacked = staging.path().join(name);
    if std::fs::symlink_metadata(&unpacked).is_err() {
        return Err(CliError::Input(format!("the copy holds no {name}")));
    }
    if target.is_dir() && unpacked.is_dir() {
        return Err(CliError::Output {
            path: target.display().to_string(),
            detail: "a directory of that name exists; copy into it or choose another name".into(),
        });
    }
    std::fs::rename(&unpacked, target).map_err(output_error(target))
}

/// Packs the local `source` (a file or a directory, its links kept as links) as a tar under
/// its own name, and sends it into the live run's `path` (a directory in its /work).
async fn copy_in(
    global: &GlobalArgs,
    source: &Path,
    run_id: &str,
    path: &str,
) -> Result<(), CliError> {
    use std::io::{Read as _, Seek as _};
    let input = |e: std::io::Error| CliError::Input(format!("{}: {e}", source.display()));
    let name = source
        .file_name()
        .ok_or_else(|| CliError::Input(format!("{}: name a file or directory", source.display())))?
        .to_owned();
    let mut archive = tempfile::tempfile().map_err(input)?;
    {
        let mut builder = tar::Builder::new(&mut archive);
        builder.follow_symlinks(false);
        if std::fs::symlink_metadata(source).map_err(input)?.is_dir() {
            builder.append_dir_all(&name, source).map_err(input)?;
        } else {
            builder
                .append_path_with_name(source, &name)
                .map_err(input)?;
        }
        builder.finish().map_err(input)?;
    }
    archive.rewind().map_err(input)?;
    let token = global.supervisor_tokens().token()?;
    let mut client = connect_supervisor(&global.supervisor, &global.tls()).await?;
    let (sender, receiver) = tokio::sync::mpsc::channel::<pb::CopyInRequest>(4);
    let (run, dir) = (run_id.to_owned(), path.to_owned());
    let reader = std::thread::spawn(move || -> std::io::Result<()> {
        let mut first = Some((run, dir));
        let mut buffer = vec![0u8; 256 << 10];
        loop {
            let n = archive.read(&mut buffer)?;
            let (run_id, path) = first.take().unwrap_or_default();
            if n == 0 && run_id.is_empty() {
                return Ok(());
            }
            let message = pb::CopyInRequest {
                run_id,
                path,
                data: buffer[..n].to_vec(),
            };
            if sender.blocking_send(message).is_err() || n == 0 {
                return Ok(());
            }
        }
    });
    let copied = client
        .copy_in(authed(
            &token,
            tokio_stream::wrappers::ReceiverStream::new(receiver),
        )?)
        .await?
        .into_inner();
    let _ = reader.join();
    say!(
        "copied {} into {run_id}:{path} ({})",
        source.display(),
        bytesize::ByteSize(copied.bytes)
    )?;
    Ok(())
}

/// `tollgate rm`.
pub(crate) async fn remove(global: &GlobalArgs, run_id: String) -> Result<(), CliError> {
    let token = global.supervisor_tokens().token()?;
    let mut client = connect_supervisor(&global.supervisor, &global.tls()).await?;
    let removed = client
        .remove_workspace(authed(&token, pb::RemoveWorkspaceRequest { run_id })?)
        .await?
        .into_inner();
    say!("removed the kept workspace {}", removed.path)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_source_is_a_run_and_a_path_in_its_work() {
        assert_eq!(
            split_source("0193:/work/out").unwrap(),
            ("0193", "/work/out")
        );
        for bad in ["/work/out", "0193:/etc/passwd", ":/work", "0193"] {
            assert!(split_source(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_copy_lands_whole_and_never_outside() {
        let dir = tempfile::tempdir().unwrap();
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Directory);
        header.set_mode(0o755);
        header.set_size(0);
        builder.append_data(&mut header, "out", &[][..]).unwrap();
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o4755);
        header.set_size(2);
        builder
            .append_data(&mut header, "out/a", &b"hi"[..])
            .unwrap();
        let bytes = builder.into_inner().unwrap();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&bytes).unwrap();
        let target = dir.path().join("copied");
        unpack_into_place(file, "out", &target, dir.path()).unwrap();
        assert_eq!(std::fs::read_to_string(target.join("a")).unwrap(), "hi");
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(target.join("a"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o755);
        // Nothing else beside it.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
