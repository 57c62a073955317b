//! Receipt commands against the authority: `mint`, `receipt show`, `receipts`, `revoke`, and
//! the minting and verifying the quickstart shares.

use std::collections::HashSet;
use std::path::Path;

use prost::Message as _;
use serde_json::json;
use tokio_stream::StreamExt as _;
use tollgate_proto::v1 as pb;
use tollgate_proto::v1::authority_client::AuthorityClient;
use tollgate_receipt::spec::RunSpec;
use tollgate_receipt::{
    from_text, unix_now, KeySet, Receipt, ReceiptVerifier, VerifyContext, VerifyError,
};
use tonic::transport::Channel;

use crate::args::GlobalArgs;
use crate::client::{authed, connect, connect_supervisor};
use crate::error::CliError;
use crate::files::{fill_private, open_private, read_input};
use crate::show;

use super::profiles::{operator_home, MintSource};

/// Mints from a spec file with an already-connected client.
pub async fn mint_with(
    client: &mut AuthorityClient<Channel>,
    token: &str,
    spec_text: &str,
    spec_name: &str,
) -> Result<pb::MintReceiptResponse, CliError> {
    let request = RunSpec::parse(spec_text)
        .and_then(|spec| spec.to_request_for(operator_home().as_deref()))
        .map_err(|e| CliError::Input(e.in_file(spec_name)))?;
    Ok(client
        .mint_receipt(authed(token, request)?)
        .await?
        .into_inner())
}

/// `tollgate mint --dry-run`: every way the spec goes past the caller's ceiling, at once;
/// nothing is minted.
pub(crate) async fn check_mint(
    global: &GlobalArgs,
    source: &MintSource,
    json: bool,
) -> Result<(), CliError> {
    let request = source.request(false)?;
    let token = global.tokens().token()?;
    let mut client = connect(&global.authority, &global.tls()).await?;
    let checked = client
        .check_mint(authed(&token, request)?)
        .await?
        .into_inner();
    if json {
        out!(
            "{}",
            json!({
                "violations": checked.violations,
                "limits": checked.limits.as_ref().map(|l| json!({
                    "memory_bytes": l.memory_bytes,
                    "pids": l.pids,
                    "cpu_millicores": l.cpu_millicores,
                    "output_bytes": l.output_bytes,
                    "tmpfs_bytes": l.tmpfs_bytes,
                    "tool_calls": l.tool_calls,
                    "tokens": l.tokens,
                    "files": l.files,
                })),
            })
        )?;
    } else if checked.violations.is_empty() {
        say!(
            "{}: within your ceiling; `{}` would mint it",
            source.label(),
            source.mint_command()
        )?;
    } else {
        say!(
            "{}: {} grant(s) above your ceiling:",
            source.label(),
            checked.violations.len()
        )?;
        for violation in &checked.violations {
            say!("  {violation}")?;
        }
    }
    if checked.violations.is_empty() {
        Ok(())
    } else {
        Err(CliError::AboveCeiling(checked.violations.len()))
    }
}

/// `tollgate mint`: mints from a run spec; prints the text form or writes it to `out`.
pub(crate) async fn mint(
    global: &GlobalArgs,
    source: &MintSource,
    out: Option<&Path>,
    json: bool,
) -> Result<(), CliError> {
    let request = source.request(true)?;
    let token = global.tokens().token()?;
    // The output first (its directory exists and is writable, the file can be made): a
    // receipt that could not be written is never minted.
    let opened = out.map(open_private).transpose()?;
    let minting = async {
        let mut client = connect(&global.authority, &global.tls()).await?;
        Ok::<_, CliError>(
            client
                .mint_receipt(authed(&token, request)?)
                .await?
                .into_inner(),
        )
    };
    let minted = match (minting.await, out, &opened) {
        (Ok(minted), _, _) => minted,
        (Err(e), Some(out), Some((_, true))) => {
            // Made for this receipt only: not left behind empty.
            let _ = std::fs::remove_file(out);
            return Err(e);
        }
        (Err(e), _, _) => return Err(e),
    };
    let receipt = minted.receipt.clone().unwrap_or_default();
    if let (Some(out), Some((file, _))) = (out, opened) {
        fill_private(file, out, &format!("{}\n", minted.text))?;
        say_err!(
            "minted {} for {:?}, expires {}; written to {}",
            receipt.receipt_id,
            receipt.subject,
            show::time_text(receipt.expires_at.as_ref()),
            out.display()
        );
    }
    if json {
        let mut value = show::receipt_json(&receipt);
        value["text"] = json!(minted.text);
        out!("{value}")?;
    } else if out.is_none() {
        out!("{}", minted.text)?;
    }
    Ok(())
}

/// Fetches the key set and every current revocation (the stream's initial snapshot).
pub async fn fetch_trust(
    client: &mut AuthorityClient<Channel>,
) -> Result<(KeySet, HashSet<String>), CliError> {
    let set = client
        .get_key_set(pb::GetKeySetRequest {})
        .await?
        .into_inner();
    let keys = KeySet::from_proto(&set)
        .map_err(|e| CliError::Other(format!("the authority's key set is unusable: {e}")))?;
    let mut stream = client
        .watch_revocations(pb::WatchRevocationsRequest {
            after_seq: 0,
            ..Default::default()
        })
        .await?
        .into_inner();
    let mut revoked = HashSet::new();
    while let Some(event) = stream.next().await {
        match event?.event {
            Some(pb::revocation_event::Event::Revoked(r)) => {
                revoked.insert(r.receipt_id);
            }
            Some(pb::revocation_event::Event::CaughtUp(_)) => break,
            // Only revocations come before the marker; the key set was fetched above.
            Some(pb::revocation_event::Event::KeySetChanged(_)) | None => {}
        }
    }
    Ok((keys, revoked))
}

/// Verifies receipt text against the authority's current keys and revocations.
pub async fn verify_with(
    client: &mut AuthorityClient<Channel>,
    text: &str,
    audience: Option<&str>,
) -> Result<(Option<Receipt>, Result<Receipt, VerifyError>), CliError> {
    let signed = match from_text(text) {
        Ok(signed) => signed,
        Err(e) => return Ok((None, Err(e))),
    };
    // Decoded without trust, only to show what the receipt claims when it fails.
    let claimed = Receipt::decode(signed.receipt.as_slice()).ok();
    let (keys, revoked) = fetch_trust(client).await?;
    let outcome = ReceiptVerifier::new(keys).verify(
        &signed,
        &VerifyContext {
            now: unix_now(),
            audience,
            revocations: &revoked,
        },
    );
    Ok((claimed, outcome))
}

/// `tollgate receipt show`: verifies a receipt against the authority's keys and revocations.
pub(crate) async fn show_receipt(
    global: &GlobalArgs,
    file: &Path,
    audience: Option<&str>,
    json: bool,
) -> Result<(), CliError> {
    let text = read_input(file)?;
    let mut client = connect(&global.authority, &global.tls()).await?;
    let (claimed, outcome) = verify_with(&mut client, &text, audience).await?;
    let shown = outcome.as_ref().ok().cloned().or(claimed);
    // A receipt starts one run, ever: ask the supervisor whether this one has (when it can be
    // asked), so a spent receipt is never shown as one that could still start.
    let used = match &outcome {
        Ok(receipt) => run_of(global, &receipt.receipt_id).await,
        Err(_) => Use::Unchecked,
    };
    if json {
        let (valid, failure, reason) = match &outcome {
            Ok(_) => (true, None, None),
            Err(e) => (false, Some(e.failure().code()), Some(e.to_string())),
        };
        let (use_checked, spent) = match &used {
            Use::Unchecked => (false, None),
            Use::Unused => (true, None),
            Use::Spent(run) => (
                true,
                Some(json!({
                    "run_id": run.run_id,
                    "state": show::run_state_name(run.state),
                })),
            ),
        };
        out!(
            "{}",
            json!({
                "valid": valid,
                "failure": failure,
                "reason": reason,
                "use_checked": use_checked,
                "spent": spent,
                "receipt": shown.as_ref().map(show::receipt_json),
            })
        )?;
    } else {
        let status = match (&outcome, &used) {
            (Ok(_), Use::Spent(run)) => format!(
                "SPENT: it started run {} ({}); a receipt starts one run, ever (signature, validity window and revocation checked)",
                run.run_id,
                show::run_state_name(run.state)
            ),
            (Ok(_), Use::Unused) => "valid and unused (signature, validity window and revocation checked; the supervisor has not started it)".to_owned(),
            (Ok(_), Use::Unchecked) => "valid (signature, validity window and revocation checked; not checked: whether a supervisor has started it)".to_owned(),
            (Err(e), _) => format!("INVALID: {e}"),
        };
        say!("{:<11}{status}", "status")?;
        if let Some(receipt) = &shown {
            for line in show::receipt_lines(receipt) {
                say!("{line}")?;
            }
        }
    }
    outcome.map(|_| ()).map_err(CliError::InvalidReceipt)
}

/// Whether the supervisor has started a receipt's run.
enum Use {
    /// The supervisor could not be asked (no supervisor token, or not reachable).
    Unchecked,
    /// It has no run of this receipt.
    Unused,
    /// It started this run.
    Spent(Box<pb::Run>),
}

/// Asks the supervisor (`--supervisor`, with the supervisor's token) for the run of
/// `receipt_id`; anything short of an answer is [`Use::Unchecked`].
async fn run_of(global: &GlobalArgs, receipt_id: &str) -> Use {
    let Ok(token) = global.supervisor_tokens().token() else {
        return Use::Unchecked;
    };
    let Ok(mut client) = connect_supervisor(&global.supervisor, &global.tls()).await else {
        return Use::Unchecked;
    };
    let request = pb::GetRunRequest {
        run_id: receipt_id.to_owned(),
    };
    let Ok(request) = authed(&token, request) else {
        return Use::Unchecked;
    };
    match client.get_run(request).await {
        // Its tries so far failed before the agent existed: it may still start.
        Ok(run) if run.get_ref().state == pb::RunState::FailedBeforeStart as i32 => Use::Unused,
        Ok(run) => Use::Spent(Box::new(run.into_inner())),
        Err(status) if status.code() == tonic::Code::NotFound => Use::Unused,
        Err(_) => Use::Unchecked,
    }
}

/// `tollgate receipts`: pages through the receipts the token may see.
pub(crate) async fn list_receipts(
    global: &GlobalArgs,
    all: bool,
    owner: Option<String>,
    limit: u32,
    json: bool,
) -> Result<(), CliError> {
    let token = global.tokens().token()?;
    let mut client = connect(&global.authority, &global.tls()).await?;
    let mut page_token = String::new();
    let mut shown = 0u32;
    // Which receipts have started a run: only the supervisor knows (when it can be asked).
    let runs = supervisor_runs(global).await;
    let mut rows = vec![[
        "RECEIPT", "OWNER", "SUBJECT", "EXPIRES", "STATE", "DEPTH", "PARENT",
    ]
    .map(String::from)
    .to_vec()];
    while shown < limit {
        let page = client
            .list_receipts(authed(
                &token,
                pb::ListReceiptsRequest {
                    owner: owner.clone().unwrap_or_default(),
                    limit: (limit - shown).min(1000),
                    page_token: page_token.clone(),
                    include_expired: all,
                },
            )?)
            .await?
            .into_inner();
        for r in &page.receipts {
            shown += 1;
            let run = runs.as_ref().and_then(|runs| runs.get(&r.receipt_id));
            let state = receipt_state(r, unix_now(), runs.as_ref().map(|_| run));
            if json {
                out!(
                    "{}",
                    json!({
                        "receipt_id": r.receipt_id, "owner": r.owner, "subject": r.subject,
                        "audience": r.audience,
                        "issued_at": r.issued_at.map(|t| t.seconds),
                        "expires_at": r.expires_at.map(|t| t.seconds),
                        "state": state,
                        "run_state": run.map(|state| show::run_state_name(*state)),
                        "parent_receipt_id": r.parent_receipt_id,
                        "depth": r.depth,
                    })
                )?;
            } else {
                rows.push(vec![
                    r.receipt_id.clone(),
                    r.owner.clone(),
                    r.subject.clone(),
                    show::time_text(r.expires_at.as_ref()),
                    state.to_owned(),
                    r.depth.to_string(),
                    if r.parent_receipt_id.is_empty() {
                        "-".to_owned()
                    } else {
                        r.parent_receipt_id.clone()
                    },
                ]);
            }
        }
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    if !json {
        for line in crate::human::table(&rows) {
            out!("{line}")?;
        }
    }
    Ok(())
}

/// A listed receipt's state: `revoked`, `used` (it started a run: a receipt starts one run,
/// ever), `expired`, then `unused` (the supervisor was asked and has no run of it) or
/// `valid` (it could not be asked). `run` is `None` when the supervisor was not asked, else
/// the state of the receipt's run, if any.
fn receipt_state(r: &pb::ReceiptSummary, now: i64, run: Option<Option<&i32>>) -> &'static str {
    let expired = r.expires_at.as_ref().is_some_and(|t| t.seconds <= now);
    // Tries that failed before the agent existed do not spend it.
    let used = |state: &&i32| **state != pb::RunState::FailedBeforeStart as i32;
    if r.revoked {
        "revoked"
    } else if run.flatten().filter(used).is_some() {
        "used"
    } else if expired {
        "expired"
    } else if run.is_some() {
        "unused"
    } else {
        "valid"
    }
}

/// Every run the supervisor (`--supervisor`, with its token) has, by run id (a run's id is
/// its receipt's); `None` when it cannot be asked.
async fn supervisor_runs(global: &GlobalArgs) -> Option<std::collections::HashMap<String, i32>> {
    let token = global.supervisor_tokens().token().ok()?;
    let mut client = connect_supervisor(&global.supervisor, &global.tls())
        .await
        .ok()?;
    let runs = client
        .list_runs(authed(&token, pb::ListRunsRequest::default()).ok()?)
        .await
        .ok()?
        .into_inner()
        .runs;
    Some(
        runs.into_iter()
            .map(|run| (run.run_id, run.state))
            .collect(),
    )
}

/// `tollgate revoke`: revokes a receipt (and, by the authority, its descendants).
pub(crate) async fn revoke(
    global: &GlobalArgs,
    receipt_id: String,
    reason: String,
) -> Result<(), CliError> {
    let token = global.tokens().token()?;
    let mut client = connect(&global.authority, &global.tls()).await?;
    let response = client
        .revoke_receipt(authed(
            &token,
            pb::RevokeReceiptRequest { receipt_id, reason },
        )?)
        .await?
        .into_inner();
    let revocation = response.revocation.unwrap_or_default();
    if response.already_revoked {
        say!(
            "{} was already revoked at {} by {}",
            revocation.receipt_id,
            show::time_text(revocation.revoked_at.as_ref()),
            revocation.revoked_by
        )?;
    } else {
        say!(
            "revoked {} (revocation #{})",
            revocation.receipt_id,
            revocation.seq
        )?;
    }
    // Revocation covers the receipt's delegated descendants.
    if !response.cascaded.is_empty() {
        say!(
            "also revoked {} descendant receipt(s): {}",
            response.cascaded.len(),
            response.cascaded.join(", ")
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_receipt_that_started_a_run_is_listed_as_used() {
        let now = 1_700_000_000;
        let receipt = |revoked: bool, expires: i64| pb::ReceiptSummary {
            receipt_id: "r".into(),
            revoked,
            expires_at: Some(prost_types::Timestamp {
                seconds: expires,
                nanos: 0,
            }),
            ..Default::default()
        };
        let live = receipt(false, now + 60);
        let running = pb::RunState::Running as i32;
        let failed = pb::RunState::FailedBeforeStart as i32;
        assert_eq!(receipt_state(&live, now, Some(Some(&running))), "used");
        assert_eq!(receipt_state(&live, now, Some(Some(&failed))), "unused");
        assert_eq!(receipt_state(&live, now, Some(None)), "unused");
        assert_eq!(receipt_state(&live, now, None), "valid");
        let ended = receipt(false, now - 60);
        assert_eq!(receipt_state(&ended, now, Some(Some(&running))), "used");
        assert_eq!(receipt_state(&ended, now, None), "expired");
        assert_eq!(
            receipt_state(&receipt(true, now + 60), now, Some(Some(&running))),
            "revoked"
        );
    }
}
