//! `CopyOut`: files of a run's `/work` (live, or kept after it ended) as a tar stream, made on
//! a blocking thread from descriptors beneath the workspace and sent in chunks as it is made.

use std::io::Write;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tollgate_proto::v1 as pb;
use tonic::Status;

use crate::runs::RunManager;

/// Most bytes of file content one copy carries.
pub const MAX_COPY: u64 = 1 << 30;

/// Bytes per chunk sent.
const CHUNK: usize = 256 << 10;

/// The chunks of one copy.
pub type CopyStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::CopyChunk, Status>> + Send>>;

/// For a sandbox path `/work` or beneath it: the part beneath `/work` and the name its top
/// gets in the archive (its last component). `None` for anything else.
pub fn within_work(path: &str) -> Option<(String, String)> {
    if !tollgate_receipt::paths::is_normal_absolute(path) {
        return None;
    }
    let rest = match path.strip_prefix("/work") {
        Some("") => "",
        Some(rest) => rest.strip_prefix('/')?,
        None => return None,
    };
    let name = path.rsplit('/').next().unwrap_or("work").to_owned();
    Some((rest.to_owned(), name))
}

/// Sends what is written to it as chunks; a gone receiver is a broken pipe.
struct ChunkWriter {
    sender: mpsc::Sender<Result<pb::CopyChunk, Status>>,
    buffer: Vec<u8>,
}

impl ChunkWriter {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let data = std::mem::replace(&mut self.buffer, Vec::with_capacity(CHUNK));
        self.sender
            .blocking_send(Ok(pb::CopyChunk { data }))
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))
    }
}

impl Write for ChunkWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buffer.extend_from_slice(bytes);
        if self.buffer.len() >= CHUNK {
            self.send()?;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

/// Starts copying `path` of `run_id`'s workspace; the stream of the archive's chunks. The
/// copy is audited when it ends (allowed with its bytes, or refused with why).
pub fn copy_out(
    manager: Arc<RunManager>,
    run_id: String,
    path: String,
) -> Result<CopyStream, Status> {
    let refuse = |manager: &RunManager, status: Status| {
        manager.audit_workspace(&run_id, "copy_out", &path, Err(status.message().to_owned()));
        status
    };
    let Some((rest, name)) = within_work(&path) else {
        return Err(refuse(
            &manager,
            Status::invalid_argument(format!(
                "path {path:?}: copy from /work or beneath it (an absolute, normalised sandbox path)"
            )),
        ));
    };
    let workspace = manager
        .workspace_of(&run_id)
        .map_err(|e| refuse(&manager, crate::status::workspace_status(&e)))?;
    let (sender, receiver) = mpsc::channel(4);
    std::thread::spawn(move || {
        let root = match tollgate_files::beneath::GrantRoot::open(
            workspace.to_str().unwrap_or_default(),
        ) {
            Ok(root) => root,
            Err(e) => {
                let status = crate::status::internal("opening the workspace", &e);
                manager.audit_workspace(&run_id, "copy_out", &path, Err(e.to_string()));
                let _ = sender.blocking_send(Err(status));
                return;
            }
        };
        let mut writer = ChunkWriter {
            sender: sender.clone(),
            buffer: Vec::with_capacity(CHUNK),
        };
        let made = tollgate_files::archive::write_tar(&root, &rest, &name, &mut writer, MAX_COPY);
        let outcome = made
            .as_ref()
            .map(|bytes| *bytes)
            .map_err(ToString::to_string);
        manager.audit_workspace(&run_id, "copy_out", &path, outcome);
        if let Err(e) = made {
            let _ = sender.blocking_send(Err(crate::status::archive_status(&e)));
        }
    });
    Ok(Box::pin(ReceiverStream::new(receiver)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_paths_at_or_beneath_work_are_copied() {
        assert_eq!(within_work("/work"), Some((String::new(), "work".into())));
        assert_eq!(
            within_work("/work/out/report.md"),
            Some(("out/report.md".into(), "report.md".into()))
        );
        for outside in [
            "/workspace",
            "/work/../etc",
            "/etc/passwd",
            "work/x",
            "/work/",
        ] {
            assert_eq!(within_work(outside), None, "{outside}");
        }
    }
}
