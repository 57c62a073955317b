//! The `tollgate` operator CLI. The binary parses flags into [`Cli`] and calls [`run`].
//!
//! `args` holds the command line as clap reads it, `cmd` one module per command group, and
//! `client`, `files`, `show` and `human` what the commands share (connecting, tokens, input
//! and secret files, output).
#![forbid(unsafe_code)]

#[macro_use]
pub mod out;
#[macro_use]
pub mod human;
mod args;
pub mod client;
mod cmd;
pub mod error;
mod files;
pub mod show;
mod terminal;

pub use args::{
    AuditCommand, AuditTrustArgs, Cli, Command, GlobalArgs, KeysCommand, OperatorCommand,
    PkiCommand, PkiKind, ProfileCommand, ProfileValues, ReceiptCommand, RootfsCommand, RootfsPlace,
    SupervisorCommand,
};
pub use cmd::audit;
pub use cmd::receipts::{fetch_trust, mint_with, verify_with};
pub use error::{CliError, RootfsError};
use tollgate_proto::v1 as pb;

use cmd::{
    approvals, copy, doctor, keys, local, operators, pki, profiles, quickstart, receipts, rootfs,
    runs, supervisors,
};

/// Runs one command; output goes to stdout, the caller prints the error.
pub async fn run(cli: Cli) -> Result<(), CliError> {
    let global = &cli.global;
    match cli.command {
        Command::Mint {
            spec,
            profile,
            values,
            json,
            dry_run: true,
            ..
        } => {
            let source = profiles::MintSource::new(spec, profile, values)?;
            receipts::check_mint(global, &source, json).await
        }
        Command::Mint {
            spec,
            profile,
            values,
            out,
            json,
            ..
        } => {
            let source = profiles::MintSource::new(spec, profile, values)?;
            receipts::mint(global, &source, out.as_deref(), json).await
        }
        Command::Profiles { json } => profiles::list(json),
        Command::Profile(ProfileCommand::Show {
            name,
            expanded,
            values,
        }) => profiles::show(&name, expanded, &values),
        Command::Receipt(ReceiptCommand::Show {
            file,
            audience,
            json,
        }) => receipts::show_receipt(global, &file, audience.as_deref(), json).await,
        Command::Receipts {
            all,
            owner,
            limit,
            json,
        } => receipts::list_receipts(global, all, owner, limit, json).await,
        Command::Revoke { receipt_id, reason } => {
            receipts::revoke(global, receipt_id, reason).await
        }
        Command::Operator(OperatorCommand::Add {
            name,
            ceiling,
            admin,
            token_out,
        }) => operators::add_operator(global, name, &ceiling, admin, token_out.as_deref()).await,
        Command::Operator(OperatorCommand::List { json }) => {
            operators::list_operators(global, json).await
        }
        Command::Supervisor(SupervisorCommand::Add {
            supervisor_id,
            token_out,
        }) => supervisors::add_supervisor(global, supervisor_id, token_out.as_deref()).await,
        Command::Supervisor(SupervisorCommand::Remove { supervisor_id }) => {
            supervisors::remove_supervisor(global, supervisor_id).await
        }
        Command::Keys { action: None, json } => keys::keys(global, json).await,
        Command::Keys {
            action: Some(KeysCommand::Rotate),
            ..
        } => keys::rotate(global).await,
        Command::Quickstart { keep, run_dir } => quickstart::run(keep, &run_dir).await,
        Command::Pki(PkiCommand::Init { dir, name, days }) => pki::init(&dir, &name, days),
        Command::Pki(PkiCommand::Issue {
            kind,
            name,
            dir,
            dns,
            ip,
            days,
        }) => {
            let identity = match (kind, name) {
                (PkiKind::Authority, _) => tollgate_daemon::tls::FleetIdentity::Authority,
                (PkiKind::Supervisor, Some(id)) => tollgate_daemon::tls::FleetIdentity::Supervisor(
                    pki::checked_name("supervisor id", &id)?,
                ),
                (PkiKind::Operator, Some(name)) => tollgate_daemon::tls::FleetIdentity::Operator(
                    pki::checked_name("operator name", &name)?,
                ),
                (_, None) => {
                    return Err(CliError::Input(
                        "tollgate pki issue supervisor|operator needs the id or name".into(),
                    ))
                }
            };
            let holder = pki::Holder {
                identity,
                dns,
                ips: ip,
            };
            pki::issue(&dir, &holder, days).map(|_| ())
        }
        Command::Doctor {
            data_dir,
            shim,
            host_id_base,
            host_id_count,
            run_dir,
            json,
        } => {
            let args = doctor::DoctorArgs {
                data_dir,
                shim,
                host_ids: host_id_base..host_id_base.saturating_add(host_id_count),
                run_dir,
                json,
            };
            doctor::doctor(global, args).await
        }
        Command::Calls { run_id, logs, json } => audit::calls(&run_id, &logs, json),
        Command::Restore {
            run_id,
            call_id,
            data_dir,
            json,
        } => local::restore(&run_id, &call_id, &data_dir, json),
        Command::Classify {
            text,
            file,
            routes,
            explain_policy,
            json,
        } => {
            let classifier = local::policy_classifier(routes.as_deref())?;
            if explain_policy {
                local::explain_policy(&classifier, json)
            } else {
                local::classify_input(&classifier, text, file, json)
            }
        }
        Command::Audit(command) => audit::audit_command(command),
        Command::Rootfs(command) => match command {
            RootfsCommand::Import {
                name,
                file,
                place,
                json,
            } => Ok(rootfs::import(&name, &file, &place.dir(), json)?),
            RootfsCommand::List { place, json } => Ok(rootfs::list(&place.dir(), json)?),
            RootfsCommand::Rm { name, place } => Ok(rootfs::remove(&name, &place.dir())?),
        },
        Command::Trace {
            run_id,
            logs,
            trust,
        } => audit::trace(&run_id, &logs, &(&trust).into()),
        Command::Run {
            receipt,
            argv,
            interactive,
            tty,
        } => {
            let input = match (tty, interactive) {
                (true, _) => runs::RunInput::Terminal,
                (false, true) => runs::RunInput::Stdin,
                (false, false) => runs::RunInput::None,
            };
            runs::run(global, &receipt, argv, input).await
        }
        Command::Attach { run_id, read_only } => runs::attach(global, &run_id, read_only).await,
        Command::Ps { all, json } => runs::ps(global, all, json).await,
        Command::Watch { run_id, json } => runs::watch(global, &run_id, json).await,
        Command::Completions { shell } => local::completions(shell),
        Command::Inspect { run_id, json } => runs::inspect(global, &run_id, json).await,
        Command::Tree { run_id, json } => runs::tree(global, &run_id, json).await,
        Command::Stop { run_id, reason } => runs::stop(global, run_id, reason).await,
        Command::Narrow {
            run_id,
            drop_fs,
            tool_calls,
            tokens,
            output_bytes,
            egress_bytes,
            drop_gateway_exec,
            expires_in,
            json,
        } => {
            let asked = approvals::NarrowArgs {
                drop_fs,
                tool_calls,
                tokens,
                output_bytes,
                egress_bytes,
                drop_gateway_exec,
                expires_in,
            };
            approvals::narrow(global, run_id, asked, json).await
        }
        Command::Widen {
            run_id,
            fs,
            tool_calls,
            tokens,
            output_bytes,
            egress_bytes,
            gateway_exec,
            extend,
            for_children,
            json,
        } => {
            let asked = approvals::WidenArgs {
                fs,
                tool_calls,
                tokens,
                output_bytes,
                egress_bytes,
                gateway_exec,
                extend,
                for_children,
            };
            approvals::widen(global, run_id, asked, json).await
        }
        Command::Approvals { run, watch, json } => {
            approvals::approvals(global, run, watch, json).await
        }
        Command::Approve {
            run_id,
            call_id,
            remember,
            reason,
            json,
        } => {
            let request = pb::DecideApprovalRequest {
                run_id,
                call_id,
                approve: true,
                remember,
                reason,
            };
            approvals::decide(global, request, json).await
        }
        Command::Deny {
            run_id,
            call_id,
            reason,
            json,
        } => {
            let request = pb::DecideApprovalRequest {
                run_id,
                call_id,
                approve: false,
                remember: false,
                reason,
            };
            approvals::decide(global, request, json).await
        }
        Command::Cp { source, dest } => copy::copy(global, &source, &dest).await,
        Command::Rm { run_id } => copy::remove(global, run_id).await,
    }
}
