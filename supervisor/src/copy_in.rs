//! `CopyIn`: files into a live run's `/work` (`tollgate cp SRC RUN:/work/DIR`). The tar
//! stream is spooled to an unnamed file under the data directory as it arrives (bounded), then
//! unpacked beneath the workspace by descriptor, as the agent's own files.

use std::io::{Seek as _, Write as _};
use std::sync::Arc;

use tollgate_files::archive::{extract_tar, Extract};
use tollgate_proto::v1 as pb;
use tonic::Status;

use crate::copy_out::within_work;
use crate::runs::RunManager;

/// Most bytes one copy-in carries (the archive, framing included).
pub const MAX_COPY_IN: u64 = 256 << 20;
/// Most bytes of one file in it (each file is staged in memory, then renamed in).
pub const MAX_COPY_IN_FILE: u64 = 64 << 20;

/// Receives and unpacks one `CopyIn` stream, whose `first` message (naming the run and the
/// directory) the caller has read.
pub async fn copy_in(
    manager: Arc<RunManager>,
    first: pb::CopyInRequest,
    mut requests: tonic::Streaming<pb::CopyInRequest>,
) -> Result<pb::CopyInResponse, Status> {
    let (run_id, path) = (first.run_id.clone(), first.path.clone());
    let refuse = |status: Status| {
        manager.audit_workspace(&run_id, "copy_in", &path, Err(status.message().to_owned()));
        status
    };
    let Some((rest, _)) = within_work(&path) else {
        return Err(refuse(Status::invalid_argument(format!(
            "path {path:?}: copy into /work or a directory beneath it"
        ))));
    };
    let workspace = manager
        .live_workspace(&run_id)
        .map_err(|e| refuse(crate::status::workspace_status(&e)))?;
    // An unnamed spool: created, then unlinked while open.
    let spool_path = manager
        .data_dir()
        .join(format!("copy-in-{}.tar", uuid::Uuid::now_v7()));
    let mut spool = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&spool_path)
        .map_err(|e| refuse(crate::status::internal("spooling a copy", &e)))?;
    let _ = std::fs::remove_file(&spool_path);
    let mut received = 0u64;
    let mut next = Some(first);
    while let Some(message) = next.take() {
        received = received.saturating_add(message.data.len() as u64);
        if received > MAX_COPY_IN {
            return Err(refuse(Status::resource_exhausted(format!(
                "more than {MAX_COPY_IN} bytes to copy in"
            ))));
        }
        spool
            .write_all(&message.data)
            .map_err(|e| refuse(crate::status::internal("spooling a copy", &e)))?;
        next = requests.message().await?;
    }
    let unpacked = tokio::task::spawn_blocking(move || {
        let outcome = (|| {
            spool
                .rewind()
                .map_err(|e| crate::status::internal("spooling a copy", &e))?;
            let root =
                tollgate_files::beneath::GrantRoot::open(workspace.to_str().unwrap_or_default())
                    .map_err(|e| crate::status::internal("opening the workspace", &e))?;
            // The agent's own: the workspace belongs to the run's host id.
            let owner = nix::sys::stat::fstat(&root.dir)
                .map_err(|e| crate::status::internal("opening the workspace", &e))?;
            extract_tar(
                &root,
                &rest,
                std::io::BufReader::new(spool),
                Extract {
                    owner: (owner.st_uid, owner.st_gid),
                    max_file: MAX_COPY_IN_FILE,
                    limit: MAX_COPY_IN,
                },
            )
            .map_err(|e| crate::status::archive_status(&e))
        })();
        manager.audit_workspace(
            &run_id,
            "copy_in",
            &path,
            outcome
                .as_ref()
                .map(|bytes| *bytes)
                .map_err(|status| status.message().to_owned()),
        );
        outcome
    })
    .await
    .map_err(|e| crate::status::internal("a worker", &e))??;
    Ok(pb::CopyInResponse { bytes: unpacked })
}
