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
use crate::files::{read_input, write_private};
use crate::show;

/// Mints from a spec file with an already-connected client.
pub async fn mint_with(
    client: &mut AuthorityClient<Channel>,
    token: &str,
    spec_text: &str,
    spec_name: &str,
) -> Result<pb::MintReceiptResponse, CliError> {
    let request = RunSpec::parse(spec_text)
        .and_then(|spec| spec.to_request())
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
    spec: &Path,
    json: bool,
) -> Result<(), CliError> {
    let text = read_input(spec)?;
    let token = global.tokens().token()?;
    let request = RunSpec::parse(&text)
        .and_then(|spec| spec.to_request())
        .map_err(|e| CliError::Input(e.in_file(&spec.display().to_string())))?;
    let mut client = connect(&global.authority, &global.tls()).await?;
    let checked = client
        .check_mint(authed(&token, request)?)
        .await?
        .into_inner();
    if json {
        println!(
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
        );
    } else if checked.violations.is_empty() {
        say!(
            "{}: within your ceiling; `tollgate mint --spec {}` would mint it",
            spec.display(),
            spec.display()
        );
    } else {
        say!(
            "{}: {} grant(s) above your ceiling:",
            spec.display(),
            checked.violations.len()
        );
        for violation in &checked.violations {
            say!("  {violation}");
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
    spec: &Path,
    out: Option<&Path>,
    json: bool,
) -> Result<(), CliError> {
    let text = read_input(spec)?;
    let token = global.tokens().token()?;
    let mut client = connect(&global.authority, &global.tls()).await?;
    let minted = mint_with(&mut client, &token, &text, &spec.display().to_string()).await?;
    let receipt = minted.receipt.clone().unwrap_or_default();
    if let Some(out) = out {
        write_private(out, &format!("{}\n", minted.text))?;
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
        println!("{value}");
    } else if out.is_none() {
        println!("{}", minted.text);
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
        println!(
            "{}",
            json!({
                "valid": valid,
                "failure": failure,
                "reason": reason,
                "use_checked": use_checked,
                "spent": spent,
                "receipt": shown.as_ref().map(show::receipt_json),
            })
        );
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
        say!("{:<11}{status}", "status");
        if let Some(receipt) = &shown {
            for line in show::receipt_lines(receipt) {
                say!("{line}");
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
    if !json {
        say!(
            "{:<37}{:<14}{:<20}{:<22}{:<9}{:<6}PARENT",
            "RECEIPT",
            "OWNER",
            "SUBJECT",
            "EXPIRES",
            "STATE",
            "DEPTH"
        );
    }
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
            let expired = r
                .expires_at
                .as_ref()
                .is_some_and(|t| t.seconds <= unix_now());
            let state = if r.revoked {
                "revoked"
            } else if expired {
                "expired"
            } else {
                "valid"
            };
            if json {
                println!(
                    "{}",
                    json!({
                        "receipt_id": r.receipt_id, "owner": r.owner, "subject": r.subject,
                        "audience": r.audience,
                        "issued_at": r.issued_at.map(|t| t.seconds),
                        "expires_at": r.expires_at.map(|t| t.seconds),
                        "state": state,
                        "parent_receipt_id": r.parent_receipt_id,
                        "depth": r.depth,
                    })
                );
            } else {
                say!(
                    "{:<37}{:<14}{:<20}{:<22}{state:<9}{:<6}{}",
                    r.receipt_id,
                    r.owner,
                    r.subject,
                    show::time_text(r.expires_at.as_ref()),
                    r.depth,
                    if r.parent_receipt_id.is_empty() {
                        "-"
                    } else {
                        &r.parent_receipt_id
                    }
                );
            }
        }
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    Ok(())
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
        );
    } else {
        say!(
            "revoked {} (revocation #{})",
            revocation.receipt_id,
            revocation.seq
        );
    }
    // Revocation covers the receipt's delegated descendants.
    if !response.cascaded.is_empty() {
        say!(
            "also revoked {} descendant receipt(s): {}",
            response.cascaded.len(),
            response.cascaded.join(", ")
        );
    }
    Ok(())
}
