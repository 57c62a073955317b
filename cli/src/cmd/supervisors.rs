//! `tollgate supervisor`: enrolling supervisors for delegation and removing them (admin token
//! needed).

use std::path::Path;

use tollgate_proto::v1 as pb;

use crate::args::GlobalArgs;
use crate::client::{authed, connect};
use crate::error::CliError;
use crate::files::{fill_private, open_private};

/// `tollgate supervisor add ID`: enrols a supervisor; its delegation token is shown once.
pub(crate) async fn add_supervisor(
    global: &GlobalArgs,
    supervisor_id: String,
    token_out: Option<&Path>,
) -> Result<(), CliError> {
    let token = global.tokens().token()?;
    // The token is shown once: make sure it can be written before asking for it.
    let out = token_out.map(open_private).transpose()?;
    let enrolled = async {
        let mut client = connect(&global.authority, &global.tls()).await?;
        Ok::<_, CliError>(
            client
                .add_supervisor(authed(&token, pb::AddSupervisorRequest { supervisor_id })?)
                .await?
                .into_inner(),
        )
    }
    .await;
    let enrolled = match (enrolled, &out) {
        (Ok(enrolled), _) => enrolled,
        (Err(e), Some((_, true))) => {
            // Created for this call: nothing of it should remain.
            if let Some(path) = token_out {
                let _ = std::fs::remove_file(path);
            }
            return Err(e);
        }
        (Err(e), _) => return Err(e),
    };
    match (token_out, out) {
        (Some(path), Some((file, _))) => {
            fill_private(file, path, &format!("{}\n", enrolled.token))?;
            say!(
                "enrolled supervisor {}; delegation token written to {}",
                enrolled.supervisor_id,
                path.display()
            )?;
        }
        _ => {
            say_err!(
                "enrolled supervisor {}; its delegation token (shown once):",
                enrolled.supervisor_id
            );
            out!("{}", enrolled.token)?;
        }
    }
    Ok(())
}

/// `tollgate supervisor remove ID`.
pub(crate) async fn remove_supervisor(
    global: &GlobalArgs,
    supervisor_id: String,
) -> Result<(), CliError> {
    let token = global.tokens().token()?;
    let removed = connect(&global.authority, &global.tls())
        .await?
        .remove_supervisor(authed(
            &token,
            pb::RemoveSupervisorRequest { supervisor_id },
        )?)
        .await?
        .into_inner();
    say!(
        "removed supervisor {}; its delegation token no longer works",
        removed.supervisor_id
    )?;
    Ok(())
}
