//! The `tollgate` operator CLI. The binary parses flags into [`Cli`] and calls [`run`].
#![forbid(unsafe_code)]

#[macro_use]
pub mod human;
pub mod audit;
pub mod client;
pub mod error;
mod quickstart;
mod runs;
pub mod show;

use std::collections::HashSet;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand};
use prost::Message as _;
use serde_json::json;
use tokio_stream::StreamExt as _;
use tollgate_proto::v1 as pb;
use tollgate_proto::v1::authority_client::AuthorityClient;
use tollgate_receipt::spec::{CeilingSpec, RunSpec};
use tollgate_receipt::{
    from_text, unix_now, KeySet, Receipt, ReceiptVerifier, VerifyContext, VerifyError,
};
use tonic::transport::Channel;

pub use error::CliError;

use crate::client::{authed, connect, TokenSource, DEFAULT_AUTHORITY, DEFAULT_SUPERVISOR};

/// Operate Tollgate: mint and revoke signed run receipts, run them in sandboxes, follow and
/// stop runs, read the audit trail.
///
/// Receipt, operator and supervisor-enrolment commands (mint, receipt, receipts, revoke,
/// operator, supervisor, keys) talk to the authority: --authority or TOLLGATE_AUTHORITY (host:port, or the path of an authority.addr
/// file). Run commands (run, ps, watch, tree, inspect, stop) talk to the supervisor: --supervisor or
/// TOLLGATE_SUPERVISOR. The bearer token of the daemon a command talks to comes from
/// --token-file or TOLLGATE_TOKEN_FILE (or the token itself in TOLLGATE_TOKEN). Audit commands
/// (audit, trace, calls) and restore read the files themselves; classify runs locally.
///
/// Errors are one line on stderr with a non-zero exit: 1 invalid receipt or broken audit log,
/// 2 usage, 65 bad request, 66 missing input, 69 daemon unreachable, 73 cannot write,
/// 77 not authenticated or not allowed, 125 a run could not start; `run` and `watch` exit with
/// the agent's own code (128+N when a signal ended it).
///
/// New here? Run `tollgate quickstart`: it starts a throwaway authority and (as root) a
/// supervisor, mints, verifies and revokes a receipt, runs an agent in a sandbox and shows the
/// audit trail, explaining each step.
#[derive(Debug, Parser)]
#[command(name = "tollgate", version, about, long_about)]
pub struct Cli {
    /// Options shared by every command.
    #[command(flatten)]
    pub global: GlobalArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Connection options.
#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// Authority address: host:port, http://host:port, or the path of an authority.addr file.
    #[arg(long, global = true, env = "TOLLGATE_AUTHORITY", default_value = DEFAULT_AUTHORITY)]
    pub authority: String,
    /// Supervisor address: host:port, http://host:port, or the path of a supervisor.addr file.
    #[arg(long, global = true, env = "TOLLGATE_SUPERVISOR", default_value = DEFAULT_SUPERVISOR)]
    pub supervisor: String,
    /// File holding the bearer token of the daemon the command talks to (the authority's or
    /// the supervisor's <data dir>/admin.token).
    #[arg(long, global = true, env = "TOLLGATE_TOKEN_FILE", value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// The operator's bearer token itself (prefer --token-file: environments leak).
    #[arg(
        long,
        global = true,
        env = "TOLLGATE_TOKEN",
        hide_env_values = true,
        hide = true
    )]
    pub token: Option<String>,
}

/// Commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Mint a receipt from a TOML run spec; print its tgr1. text or write it to --out.
    ///
    /// The spec names subject, ttl, audience, [agent], [limits], [[fs]], [exec], [[routes]]
    /// and [delegate] (see docs/run-spec.md). The authority refuses anything above your
    /// operator ceiling and names the grant.
    Mint {
        /// The run spec (TOML); "-" reads stdin.
        #[arg(long, value_name = "FILE")]
        spec: PathBuf,
        /// Write the receipt's text form here (mode 0600) instead of stdout.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// Print the minted receipt as JSON (with its text form) instead.
        #[arg(long)]
        json: bool,
    },
    /// Inspect receipts.
    #[command(subcommand)]
    Receipt(ReceiptCommand),
    /// List your receipts (admins: everyone's), newest first.
    Receipts {
        /// Include expired receipts.
        #[arg(long)]
        all: bool,
        /// Only this owner's receipts (admins only).
        #[arg(long)]
        owner: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a receipt: supervisors following the authority stop honouring it at once.
    Revoke {
        /// The receipt id.
        receipt_id: String,
        /// Why (recorded and streamed to supervisors).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Manage operators (admin token needed).
    #[command(subcommand)]
    Operator(OperatorCommand),
    /// Enrol supervisors for delegation, or remove them (admin token needed).
    #[command(subcommand)]
    Supervisor(SupervisorCommand),
    /// Show the authority's public key set, or rotate the signing key.
    Keys {
        /// `rotate` starts signing with a new key (admin); omit to list keys.
        #[command(subcommand)]
        action: Option<KeysCommand>,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Run a receipt on the supervisor: stream the agent's output and exit with its exit code
    /// (125 when the run could not start, with the reason on stderr; 128+N when killed by
    /// signal N, e.g. when stopped or expired).
    Run {
        /// File with the receipt's tgr1. text; "-" reads stdin.
        #[arg(long, value_name = "FILE")]
        receipt: PathBuf,
        /// The agent command, for receipts that do not pin one.
        #[arg(last = true, value_name = "ARGV")]
        argv: Vec<String>,
    },
    /// List runs on the supervisor (live ones; --all for every run).
    Ps {
        /// Include ended runs.
        #[arg(long)]
        all: bool,
        /// JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// Follow a run: its output as it comes, a live status line (elapsed time, output so far,
    /// state) on a terminal, then its end; exits with the agent's exit code, like `run`.
    ///
    /// Attach to any live run (or an ended one: its end is shown at once). Interrupting with
    /// Ctrl-C detaches; the run goes on (stop it with `tollgate stop`).
    Watch {
        /// The run id.
        run_id: String,
        /// One JSON object per event (`output` with stream and text, then `ended` with the run).
        #[arg(long)]
        json: bool,
    },
    /// Print a shell completion script: `tollgate completions bash > /etc/bash_completion.d/tollgate`,
    /// `tollgate completions zsh > "${fpath[1]}/_tollgate"`, `tollgate completions fish >
    /// ~/.config/fish/completions/tollgate.fish`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Show a run and every run it delegated, as a tree with each one's state and age.
    ///
    /// Children, grandchildren and so on, each with its state, age and expiry; child receipts
    /// minted but not started show as `minted`. Exits 66 when the run is unknown.
    ///
    /// A child run ends as `parent_ended` when its parent ends (stopped, revoked, expired
    /// or exited): a delegated run never outlives the run that started it.
    Tree {
        /// The run at the root of the tree (any run).
        run_id: String,
        /// One JSON object per run (run_id, parent_run_id, depth, subject, state,
        /// created_at, ended_at, expires_at, exit_code); pending children have state
        /// "minted".
        #[arg(long)]
        json: bool,
    },
    /// Show one run: state and, once ended, its teardown report.
    Inspect {
        /// The run id.
        run_id: String,
        /// JSON.
        #[arg(long)]
        json: bool,
    },
    /// Stop a live run; prints its teardown report.
    Stop {
        /// The run id.
        run_id: String,
        /// Recorded in the teardown report.
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// A run's gateway calls with their decisions, in order, from the supervisor's audit log
    /// (time, call id, tool, decision, path, and why a call was refused).
    Calls {
        /// The run id.
        run_id: String,
        /// The supervisor's audit log directory (<data dir>/audit), or several.
        #[arg(required = true, value_name = "LOG_DIR")]
        logs: Vec<PathBuf>,
        /// One JSON object per call.
        #[arg(long)]
        json: bool,
    },
    /// Put a file back as it was before one of a run's gateway calls changed it.
    ///
    /// Every allowed fs.write and fs.delete keeps the file's previous state (its exact bytes,
    /// owner and mode, or that it did not exist) under <supervisor data dir>/snapshots/RUN/
    /// before the change. Restoring writes it back atomically — or removes the file when the
    /// call had created it — resolving the path beneath its grant as the gateway did, so a
    /// link planted since cannot redirect it. Find call ids with `tollgate calls RUN`. Run it
    /// as root on the supervisor's host; the supervisor need not be running.
    Restore {
        /// The run id.
        run_id: String,
        /// The call id (from `tollgate calls RUN`).
        call_id: String,
        /// The supervisor's data directory (its --data-dir).
        #[arg(long, value_name = "DIR")]
        data_dir: PathBuf,
        /// One JSON object: path, removed, size.
        #[arg(long)]
        json: bool,
    },
    /// Say how sensitive a text is, as the router sees it: the highest sensitivity (low,
    /// medium, high) and the reasons — detector and byte span, never the matched text.
    ///
    /// Secrets and credentials are high; personal data and internal hosts medium. Runs
    /// locally; nothing is sent anywhere.
    Classify {
        /// The text; "-" reads stdin (or use --file).
        #[arg(
            value_name = "TEXT|-",
            required_unless_present = "file",
            conflicts_with = "file"
        )]
        text: Option<String>,
        /// Classify this file's contents instead.
        #[arg(long, value_name = "FILE")]
        file: Option<PathBuf>,
        /// One JSON object: sensitivity and reasons.
        #[arg(long)]
        json: bool,
    },
    /// Check and read audit logs (each daemon's <data dir>/audit), from the files themselves.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// The story of one run from mint to teardown, in order, from the audit logs given
    /// (typically the authority's and the supervisor's), after checking each is intact.
    ///
    /// Exits 1 when a log does not verify (the story is still printed), 66 when no entry
    /// names the run.
    Trace {
        /// The run id (= its receipt id).
        run_id: String,
        /// Audit log directories, e.g. /var/lib/tollgate/authority/audit
        /// /var/lib/tollgate/supervisor/audit.
        #[arg(required = true, value_name = "LOG_DIR")]
        logs: Vec<PathBuf>,
        /// How to check the logs.
        #[command(flatten)]
        trust: AuditTrustArgs,
    },
    /// Start a throwaway authority and (as root) a supervisor, mint, verify and revoke a
    /// receipt, run an agent in a sandbox, and explain each step.
    Quickstart {
        /// Keep the temporary data directory (its path is printed).
        #[arg(long)]
        keep: bool,
    },
}

/// How audit logs are checked.
#[derive(Debug, Args)]
pub struct AuditTrustArgs {
    /// The audit key the daemons were given (HMAC hashes); without it TOLLGATE_AUDIT_KEY is
    /// used when set, and a keyed log then fails at its first entry.
    #[arg(long, value_name = "FILE", env = "TOLLGATE_AUDIT_KEY_FILE")]
    pub key_file: Option<PathBuf>,
    /// The Ed25519 public key that signs the log's checkpoints (64 hex digits, or a copy of
    /// <data dir>/audit/checkpoint.pub kept elsewhere). Without it the checkpoint.pub beside
    /// the log is used, which proves consistency but not who wrote the log.
    #[arg(long, value_name = "HEX|FILE")]
    pub checkpoint_key: Option<String>,
}

impl AuditTrustArgs {
    fn trust(&self) -> audit::Trust {
        audit::Trust {
            key_file: self.key_file.clone(),
            checkpoint_key: self.checkpoint_key.clone(),
        }
    }
}

/// `tollgate audit ...`
#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Verify audit logs: exit 0 only if each is intact (every entry canonical and chained,
    /// every checkpoint signed and matching); otherwise print the first bad entry of each
    /// broken log and why, and exit 1.
    Verify {
        /// Audit log directories (<data dir>/audit).
        #[arg(required = true, value_name = "LOG_DIR")]
        logs: Vec<PathBuf>,
        /// How to check them.
        #[command(flatten)]
        trust: AuditTrustArgs,
        /// One JSON object per log.
        #[arg(long)]
        json: bool,
    },
    /// Print the entries that match, from every log given, in time order.
    Query {
        /// Audit log directories (<data dir>/audit).
        #[arg(required = true, value_name = "LOG_DIR")]
        logs: Vec<PathBuf>,
        /// Only entries of this run.
        #[arg(long, value_name = "ID")]
        run: Option<String>,
        /// Only entries of this receipt.
        #[arg(long, value_name = "ID")]
        receipt: Option<String>,
        /// Only entries since this time: RFC 3339 (2026-11-30T10:00:00Z) or an age (2h).
        #[arg(long, value_name = "TIME")]
        since: Option<String>,
        /// The entries as stored (canonical JSON lines).
        #[arg(long)]
        json: bool,
    },
    /// Every entry as stored (canonical JSON, hashes included), one per line, in time order:
    /// NDJSON for SIEM ingestion.
    Export {
        /// Audit log directories (<data dir>/audit).
        #[arg(required = true, value_name = "LOG_DIR")]
        logs: Vec<PathBuf>,
        /// Only entries since this time: RFC 3339 or an age (2h).
        #[arg(long, value_name = "TIME")]
        since: Option<String>,
    },
}

/// `tollgate receipt ...`
#[derive(Debug, Subcommand)]
pub enum ReceiptCommand {
    /// Decode a receipt and verify it against the authority's key set and revocations.
    ///
    /// Exits 0 when valid, 1 when not (the reason is printed: bad signature, unknown key,
    /// malformed, not yet valid, expired, wrong audience or revoked).
    Show {
        /// File with the tgr1. text form; "-" reads stdin.
        file: PathBuf,
        /// Also require this supervisor id in the audience.
        #[arg(long, value_name = "ID")]
        audience: Option<String>,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

/// `tollgate operator ...`
#[derive(Debug, Subcommand)]
pub enum OperatorCommand {
    /// Create an operator with a ceiling; prints its token once.
    Add {
        /// Operator name: letters, digits, '.', '_', '-', '@'.
        name: String,
        /// Ceiling file (TOML): max_ttl, audience, exec, max_delegate_depth, [[fs]],
        /// [[routes]], [limits] (see docs/authority.md).
        #[arg(long, value_name = "FILE")]
        ceiling: PathBuf,
        /// Make it an admin (may add operators and rotate keys).
        #[arg(long)]
        admin: bool,
        /// Write the token here (mode 0600) instead of printing it.
        #[arg(long, value_name = "FILE")]
        token_out: Option<PathBuf>,
    },
    /// List operators and their ceilings.
    List {
        /// JSON lines.
        #[arg(long)]
        json: bool,
    },
}

/// `tollgate supervisor ...`
#[derive(Debug, Subcommand)]
pub enum SupervisorCommand {
    /// Enrol a supervisor for delegation and print its delegation token once.
    ///
    /// A run whose receipt may delegate (`[delegate] max_depth >= 1`) asks its supervisor for
    /// narrower child receipts; the supervisor asks the authority with this token (give it to
    /// the supervisor with --delegation-token-file, mode 0600, root only). The token
    /// authenticates only that request, only for receipts whose audience names ID, and only
    /// for children within their parent: it is not an operator token. The authority keeps
    /// only its SHA-256, so keep the output: enrolling the same ID again is refused (exit 73).
    ///
    /// Example: tollgate --token-file /var/lib/tollgate/authority/admin.token supervisor add
    /// workstation --token-out /etc/tollgate/delegation.token
    Add {
        /// The supervisor's id, as in its --id and in receipt audiences: 1-64 letters, digits,
        /// '.', '_', '-', '@'.
        #[arg(value_name = "ID")]
        supervisor_id: String,
        /// Write the token here (mode 0600) instead of printing it.
        #[arg(long, value_name = "FILE")]
        token_out: Option<PathBuf>,
    },
    /// Remove an enrolled supervisor: its delegation token stops working at once.
    ///
    /// Runs on that supervisor can no longer delegate; children already minted are untouched
    /// (revoke them as usual). To rotate a token, remove the supervisor and add it again.
    /// Exit 66: not enrolled; 77: not an admin token.
    Remove {
        /// The supervisor's id.
        #[arg(value_name = "ID")]
        supervisor_id: String,
    },
}

/// `tollgate keys ...`
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Generate a new signing key; the old one stays verifiable until its receipts expire.
    Rotate,
}

impl GlobalArgs {
    pub(crate) fn tokens(&self) -> TokenSource {
        TokenSource {
            file: self.token_file.clone(),
            value: self.token.clone(),
        }
    }
}

/// Runs one command; output goes to stdout, the caller prints the error.
pub async fn run(cli: Cli) -> Result<(), CliError> {
    let global = &cli.global;
    match cli.command {
        Command::Mint { spec, out, json } => mint(global, &spec, out.as_deref(), json).await,
        Command::Receipt(ReceiptCommand::Show {
            file,
            audience,
            json,
        }) => show_receipt(global, &file, audience.as_deref(), json).await,
        Command::Receipts {
            all,
            owner,
            limit,
            json,
        } => list_receipts(global, all, owner, limit, json).await,
        Command::Revoke { receipt_id, reason } => revoke(global, receipt_id, reason).await,
        Command::Operator(OperatorCommand::Add {
            name,
            ceiling,
            admin,
            token_out,
        }) => add_operator(global, name, &ceiling, admin, token_out.as_deref()).await,
        Command::Operator(OperatorCommand::List { json }) => list_operators(global, json).await,
        Command::Supervisor(SupervisorCommand::Add {
            supervisor_id,
            token_out,
        }) => add_supervisor(global, supervisor_id, token_out.as_deref()).await,
        Command::Supervisor(SupervisorCommand::Remove { supervisor_id }) => {
            let token = global.tokens().token()?;
            let removed = connect(&global.authority)
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
            );
            Ok(())
        }
        Command::Keys { action: None, json } => keys(global, json).await,
        Command::Keys {
            action: Some(KeysCommand::Rotate),
            ..
        } => rotate(global).await,
        Command::Quickstart { keep } => quickstart::run(keep).await,
        Command::Calls { run_id, logs, json } => audit::calls(&run_id, &logs, json),
        Command::Restore {
            run_id,
            call_id,
            data_dir,
            json,
        } => restore(&run_id, &call_id, &data_dir, json),
        Command::Classify { text, file, json } => {
            let input = match (text, file) {
                (_, Some(file)) => read_input(&file)?,
                (Some(text), None) if text == "-" => read_input(Path::new("-"))?,
                (Some(text), None) => text,
                (None, None) => String::new(),
            };
            classify(&input, json)
        }
        Command::Audit(AuditCommand::Verify { logs, trust, json }) => {
            audit::verify(&logs, &trust.trust(), json)
        }
        Command::Audit(AuditCommand::Query {
            logs,
            run,
            receipt,
            since,
            json,
        }) => {
            let filter = tollgate_audit::EntryFilter {
                run_id: run,
                receipt_id: receipt,
                since: since.as_deref().map(audit::parse_since).transpose()?,
            };
            audit::query(&logs, &filter, json)
        }
        Command::Audit(AuditCommand::Export { logs, since }) => {
            audit::export(&logs, since.as_deref().map(audit::parse_since).transpose()?)
        }
        Command::Trace {
            run_id,
            logs,
            trust,
        } => audit::trace(&run_id, &logs, &trust.trust()),
        Command::Run { receipt, argv } => runs::run(global, &receipt, argv).await,
        Command::Ps { all, json } => runs::ps(global, all, json).await,
        Command::Watch { run_id, json } => runs::watch(global, &run_id, json).await,
        Command::Completions { shell } => {
            use clap::CommandFactory as _;
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "tollgate",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Command::Inspect { run_id, json } => runs::inspect(global, &run_id, json).await,
        Command::Tree { run_id, json } => runs::tree(global, &run_id, json).await,
        Command::Stop { run_id, reason } => runs::stop(global, run_id, reason).await,
    }
}

/// `tollgate classify`.
fn classify(text: &str, json_out: bool) -> Result<(), CliError> {
    let classifier =
        tollgate_router::Classifier::new(&tollgate_router::ClassifierConfig::default())
            .map_err(|e| CliError::Other(format!("the built-in detectors do not compile: {e}")))?;
    let found = classifier.classify(text);
    if json_out {
        let reasons: Vec<_> = found
            .reasons
            .iter()
            .map(|r| {
                json!({
                    "detector": r.detector.as_str(),
                    "sensitivity": r.sensitivity.name(),
                    "start": r.span.start,
                    "end": r.span.end,
                })
            })
            .collect();
        println!(
            "{}",
            json!({"sensitivity": found.sensitivity.name(), "reasons": reasons})
        );
    } else {
        say!("sensitivity: {}", found.sensitivity.name());
        for reason in &found.reasons {
            say!("  {reason}");
        }
    }
    Ok(())
}

pub(crate) fn read_input(path: &Path) -> Result<String, CliError> {
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| CliError::Input(format!("cannot read stdin: {e}")))?;
        return Ok(text);
    }
    std::fs::read_to_string(path)
        .map_err(|e| CliError::Input(format!("cannot read {}: {e}", path.display())))
}

/// Writes a secret (receipt or token) to `path` with mode 0600, also when the file already
/// existed with a looser mode (the mode given to open() applies only on creation).
fn write_private(path: &Path, contents: &str) -> Result<(), CliError> {
    let (file, _) = open_private(path)?;
    fill_private(file, path, contents)
}

/// Opens `path` for a secret, mode 0600, without changing what it holds yet; whether it was
/// created now.
fn open_private(path: &Path) -> Result<(std::fs::File, bool), CliError> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let error = |e: std::io::Error| CliError::Output {
        path: path.display().to_string(),
        detail: e.to_string(),
    };
    let created = !path.exists();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(error)?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(error)?;
    Ok((file, created))
}

/// Replaces what a file opened by [`open_private`] holds with `contents`, durably.
fn fill_private(mut file: std::fs::File, path: &Path, contents: &str) -> Result<(), CliError> {
    use std::io::Write as _;
    let error = |e: std::io::Error| CliError::Output {
        path: path.display().to_string(),
        detail: e.to_string(),
    };
    file.set_len(0).map_err(error)?;
    file.write_all(contents.as_bytes()).map_err(error)?;
    file.sync_all().map_err(error)
}

/// Mints from a spec file with an already-connected client.
pub async fn mint_with(
    client: &mut AuthorityClient<Channel>,
    token: &str,
    spec_text: &str,
    spec_name: &str,
) -> Result<pb::MintReceiptResponse, CliError> {
    let request = RunSpec::parse(spec_text)
        .and_then(|spec| spec.to_request())
        .map_err(|e| CliError::Input(format!("{spec_name}: {e}")))?;
    Ok(client
        .mint_receipt(authed(token, request)?)
        .await?
        .into_inner())
}

async fn mint(
    global: &GlobalArgs,
    spec: &Path,
    out: Option<&Path>,
    json: bool,
) -> Result<(), CliError> {
    let text = read_input(spec)?;
    let token = global.tokens().token()?;
    let mut client = connect(&global.authority).await?;
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
        .watch_revocations(pb::WatchRevocationsRequest { after_seq: 0 })
        .await?
        .into_inner();
    let mut revoked = HashSet::new();
    while let Some(event) = stream.next().await {
        match event?.event {
            Some(pb::revocation_event::Event::Revoked(r)) => {
                revoked.insert(r.receipt_id);
            }
            Some(pb::revocation_event::Event::CaughtUp(_)) => break,
            None => {}
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

async fn show_receipt(
    global: &GlobalArgs,
    file: &Path,
    audience: Option<&str>,
    json: bool,
) -> Result<(), CliError> {
    let text = read_input(file)?;
    let mut client = connect(&global.authority).await?;
    let (claimed, outcome) = verify_with(&mut client, &text, audience).await?;
    let shown = outcome.as_ref().ok().cloned().or(claimed);
    if json {
        let (valid, failure, reason) = match &outcome {
            Ok(_) => (true, None, None),
            Err(e) => (false, Some(e.failure().code()), Some(e.to_string())),
        };
        println!(
            "{}",
            json!({
                "valid": valid,
                "failure": failure,
                "reason": reason,
                "receipt": shown.as_ref().map(show::receipt_json),
            })
        );
    } else {
        let status = match &outcome {
            Ok(_) => "valid (signature, validity window and revocation checked)".to_owned(),
            Err(e) => format!("INVALID: {e}"),
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

async fn list_receipts(
    global: &GlobalArgs,
    all: bool,
    owner: Option<String>,
    limit: u32,
    json: bool,
) -> Result<(), CliError> {
    let token = global.tokens().token()?;
    let mut client = connect(&global.authority).await?;
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

async fn revoke(global: &GlobalArgs, receipt_id: String, reason: String) -> Result<(), CliError> {
    let token = global.tokens().token()?;
    let mut client = connect(&global.authority).await?;
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

async fn add_operator(
    global: &GlobalArgs,
    name: String,
    ceiling_file: &Path,
    admin: bool,
    token_out: Option<&Path>,
) -> Result<(), CliError> {
    let text = read_input(ceiling_file)?;
    let ceiling = CeilingSpec::parse(&text)
        .and_then(|spec| spec.to_proto())
        .map_err(|e| CliError::Input(format!("{}: {e}", ceiling_file.display())))?;
    let token = global.tokens().token()?;
    let mut client = connect(&global.authority).await?;
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
            );
        }
        None => {
            say_err!("added operator {}; its token (shown once):", created.name);
            println!("{}", created.token);
        }
    }
    Ok(())
}

async fn add_supervisor(
    global: &GlobalArgs,
    supervisor_id: String,
    token_out: Option<&Path>,
) -> Result<(), CliError> {
    let token = global.tokens().token()?;
    // The token is shown once: make sure it can be written before asking for it.
    let out = token_out.map(open_private).transpose()?;
    let enrolled = async {
        let mut client = connect(&global.authority).await?;
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
            );
        }
        _ => {
            say_err!(
                "enrolled supervisor {}; its delegation token (shown once):",
                enrolled.supervisor_id
            );
            println!("{}", enrolled.token);
        }
    }
    Ok(())
}

async fn list_operators(global: &GlobalArgs, json: bool) -> Result<(), CliError> {
    let token = global.tokens().token()?;
    let mut client = connect(&global.authority).await?;
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
        );
    }
    for op in operators {
        let ceiling = op.ceiling.unwrap_or_default();
        let ttl =
            humantime::format_duration(std::time::Duration::from_secs(ceiling.max_ttl_seconds));
        if json {
            println!(
                "{}",
                json!({
                    "name": op.name, "admin": op.admin, "created_by": op.created_by,
                    "created_at": op.created_at.map(|t| t.seconds),
                    "max_ttl_seconds": ceiling.max_ttl_seconds,
                    "fs": ceiling.fs.iter().map(|g| json!({"path": g.path, "access": show::access(g.access)})).collect::<Vec<_>>(),
                    "exec": ceiling.exec,
                    "routes": ceiling.routes.iter().map(|g| json!({"name": g.name, "max_sensitivity": show::sensitivity(g.max_sensitivity)})).collect::<Vec<_>>(),
                    "audience": ceiling.audience,
                    "max_delegate_depth": ceiling.max_delegate_depth,
                })
            );
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
            );
        }
    }
    Ok(())
}

async fn keys(global: &GlobalArgs, json: bool) -> Result<(), CliError> {
    let mut client = connect(&global.authority).await?;
    let set = client
        .get_key_set(pb::GetKeySetRequest {})
        .await?
        .into_inner();
    if json {
        println!(
            "{}",
            json!({"issuer": set.issuer, "keys": set.keys.iter().map(show::key_json).collect::<Vec<_>>()})
        );
        return Ok(());
    }
    say!("issuer {}", set.issuer);
    say!(
        "{:<18}{:<9}{:<22}{:<22}PUBLIC KEY",
        "KEY ID",
        "STATE",
        "CREATED",
        "VERIFY UNTIL"
    );
    for key in &set.keys {
        say!(
            "{:<18}{:<9}{:<22}{:<22}{}",
            key.key_id,
            if key.active { "active" } else { "retired" },
            show::time_text(key.created_at.as_ref()),
            show::time_text(key.verify_until.as_ref()),
            hex::encode(&key.public_key)
        );
    }
    Ok(())
}

async fn rotate(global: &GlobalArgs) -> Result<(), CliError> {
    let token = global.tokens().token()?;
    let mut client = connect(&global.authority).await?;
    let rotated = client
        .rotate_key(authed(&token, pb::RotateKeyRequest {})?)
        .await?
        .into_inner();
    say!(
        "signing with {}; {} retired (verifiable until its receipts expire)",
        rotated.active.map(|k| k.key_id).unwrap_or_default(),
        rotated.retired.map(|k| k.key_id).unwrap_or_default()
    );
    Ok(())
}

/// `tollgate restore RUN CALL_ID --data-dir DIR`.
fn restore(run_id: &str, call_id: &str, data_dir: &Path, json_out: bool) -> Result<(), CliError> {
    let store = tollgate_files::snapshot::SnapshotStore::new(data_dir);
    let restored = store.restore(run_id, call_id)?;
    if json_out {
        println!(
            "{}",
            serde_json::json!({
                "run_id": run_id,
                "call_id": call_id,
                "path": restored.path,
                "removed": restored.removed,
                "size": restored.size,
            })
        );
    } else if restored.removed {
        say!("removed {} (call {call_id} had created it)", restored.path);
    } else {
        say!(
            "restored {} ({} bytes) as it was before call {call_id}",
            restored.path,
            restored.size
        );
    }
    Ok(())
}
