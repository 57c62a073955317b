//! `tollgate keys`: the authority's public key set, and rotating its signing key.

use serde_json::json;
use tollgate_proto::v1 as pb;

use crate::args::GlobalArgs;
use crate::client::{authed, connect};
use crate::error::CliError;
use crate::show;

/// `tollgate keys`: the authority's public key set.
pub(crate) async fn keys(global: &GlobalArgs, json: bool) -> Result<(), CliError> {
    let mut client = connect(&global.authority, &global.tls()).await?;
    let set = client
        .get_key_set(pb::GetKeySetRequest {})
        .await?
        .into_inner();
    if json {
        out!(
            "{}",
            json!({"issuer": set.issuer, "keys": set.keys.iter().map(show::key_json).collect::<Vec<_>>()})
        )?;
        return Ok(());
    }
    say!("issuer {}", set.issuer)?;
    say!(
        "{:<18}{:<9}{:<22}{:<22}PUBLIC KEY",
        "KEY ID",
        "STATE",
        "CREATED",
        "VERIFY UNTIL"
    )?;
    for key in &set.keys {
        say!(
            "{:<18}{:<9}{:<22}{:<22}{}",
            key.key_id,
            if key.active { "active" } else { "retired" },
            show::time_text(key.created_at.as_ref()),
            show::time_text(key.verify_until.as_ref()),
            hex::encode(&key.public_key)
        )?;
    }
    Ok(())
}

/// `tollgate keys rotate`: starts signing with a new key.
pub(crate) async fn rotate(global: &GlobalArgs) -> Result<(), CliError> {
    let token = global.tokens().token()?;
    let mut client = connect(&global.authority, &global.tls()).await?;
    let rotated = client
        .rotate_key(authed(&token, pb::RotateKeyRequest {})?)
        .await?
        .into_inner();
    say!(
        "signing with {}; {} retired (verifiable until its receipts expire)",
        rotated.active.map(|k| k.key_id).unwrap_or_default(),
        rotated.retired.map(|k| k.key_id).unwrap_or_default()
    )?;
    Ok(())
}
