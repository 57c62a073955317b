//! `tollgate operator`: adding and listing operators (admin token needed).

use std::path::Path;

use serde_json::json;
use tollgate_proto::v1 as pb;
use tollgate_receipt::spec::CeilingSpec;

use crate::args::GlobalArgs;
use crate::client::{authed, connect};
use crate::error::CliError;
use crate::files::{read_input, write_private};
use crate::show;

/// `tollgate operator add`: creates an operator; its token is printed once or written to a file.
pub(crate) async fn add_operator(
    global: &GlobalArgs,
    name: String,
    ceiling_file: &Path,
    admin: bool,
    token_out: Option<&Path>,
) -> Result<(), CliError> {
    let text = read_input(ceiling_file)?;
    let ceiling = CeilingSpec::parse(&text)
        .and_then(|spec| spec.to_proto())
        .map_err(|e| CliError::Input(e.in_file(&ceiling_file.display().to_string())))?;
    let token = global.tokens().token()?;
    let mut client = connect(&global.authority, &global.tls()).await?;
    let created = client
        .add_operator(authed(
            &token,
            pb::AddOperatorRequest {
                name,
                ceiling: Some(ceiling),
                admin,
            },
        )?)
        .await?
        .into_inner();
    match token_out {
        Some(path) => {
            write_private(path, &format!("{}\n", created.token))?;
            say!(
                "added operator {}; token written to {}",
                created.name,
                path.display()
            )?;
        }
        None => {
            say_err!("added operator {}; its token (shown once):", created.name);
            out!("{}", created.token)?;
        }
    }
    Ok(())
}

/// `tollgate operator list`: operators and their ceilings.
pub(crate) async fn list_operators(global: &GlobalArgs, json: bool) -> Result<(), CliError> {
    let token = global.tokens().token()?;
    let mut client = connect(&global.authority, &global.tls()).await?;
    let operators = client
        .list_operators(authed(&token, pb::ListOperatorsRequest {})?)
        .await?
        .into_inner()
        .operators;
    if !json {
        say!(
            "{:<24}{:<7}{:<10}{:<16}GRANTS",
            "NAME",
            "ADMIN",
            "MAX TTL",
            "CREATED BY"
        )?;
    }
    for op in operators {
        let ceiling = op.ceiling.unwrap_or_default();
        let ttl =
            humantime::format_duration(std::time::Duration::from_secs(ceiling.max_ttl_seconds));
        if json {
            out!(
                "{}",
                json!({
                    "name": op.name, "admin": op.admin, "created_by": op.created_by,
                    "created_at": op.created_at.map(|t| t.seconds),
                    "max_ttl_seconds": ceiling.max_ttl_seconds,
                    "fs": ceiling.fs.iter().map(|g| json!({"path": g.path, "access": show::access(g.access)})).collect::<Vec<_>>(),
                    "exec": ceiling.exec,
                    "exec_ask": ceiling.exec_ask,
                    "routes": ceiling.routes.iter().map(|g| json!({"name": g.name, "max_sensitivity": show::sensitivity(g.max_sensitivity)})).collect::<Vec<_>>(),
                    "audience": ceiling.audience,
                    "max_delegate_depth": ceiling.max_delegate_depth,
                })
            )?;
        } else {
            let fs: Vec<_> = ceiling
                .fs
                .iter()
                .map(|g| format!("{}:{}", show::access(g.access), g.path))
                .collect();
            say!(
                "{:<24}{:<7}{:<10}{:<16}fs {} · exec {} · routes {}",
                op.name,
                if op.admin { "yes" } else { "no" },
                ttl.to_string(),
                if op.created_by.is_empty() {
                    "-"
                } else {
                    &op.created_by
                },
                fs.join(","),
                ceiling.exec.join(","),
                ceiling
                    .routes
                    .iter()
                    .map(|r| r.name.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            )?;
        }
    }
    Ok(())
}
