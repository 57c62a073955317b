//! `tollgate-authority`: the receipt-minting daemon. Parses flags and hands over to the library.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use tollgate_audit::AuditKey;
use tollgate_authority::{serve, AuthorityConfig, AuthorityError};

/// Mint, revoke and publish Ed25519-signed Tollgate run receipts over gRPC.
///
/// On first start the data directory is initialised: a signing key (keys/<key_id>.key, 0600),
/// the SQLite database, and the bootstrap admin token (admin.token, 0600). Once the daemon
/// accepts connections it writes its bound address to <data-dir>/authority.addr.
///
/// Every mint, refusal, revocation, operator, supervisor and key change is appended to the audit log in
/// <data-dir>/audit/ (hash-chained, checkpoints signed with <data-dir>/audit-checkpoint.key);
/// check it with `tollgate audit verify`.
///
/// Clients authenticate with gRPC metadata "authorization: Bearer <token>".
/// Stop it with SIGINT or SIGTERM. Log verbosity follows RUST_LOG (default "info").
#[derive(Debug, Parser)]
#[command(name = "tollgate-authority", version, about, long_about)]
struct Flags {
    /// Data directory (created 0700 if missing). Overrides `data_dir` in --config.
    #[arg(long, value_name = "DIR", env = "TOLLGATE_AUTHORITY_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Address to listen on, e.g. 127.0.0.1:7700; port 0 (or ":0") picks a free port.
    /// [default: 127.0.0.1:7700]
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// Optional TOML configuration: issuer, listen, data_dir, policy_version, admin_max_ttl,
    /// admin_max_delegate_depth and a [defaults] table of limits.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Key for HMAC-SHA-256 audit hashes (hex or raw, at least 32 bytes; never written to
    /// the log). Without it the key is read from TOLLGATE_AUDIT_KEY when set; otherwise
    /// entries are chained with plain SHA-256.
    #[arg(long, value_name = "FILE", env = "TOLLGATE_AUDIT_KEY_FILE")]
    audit_key_file: Option<PathBuf>,
    /// Log format on stderr: text (coloured only on a terminal) or json (one object a line,
    /// for journald, Loki, Elasticsearch…). The level comes from RUST_LOG (default info).
    #[arg(
        long,
        value_name = "FORMAT",
        env = "TOLLGATE_LOG_FORMAT",
        default_value = "text",
        value_parser = clap::value_parser!(tollgate_daemon::logging::LogFormat)
    )]
    log_format: tollgate_daemon::logging::LogFormat,
    /// Serve Prometheus metrics (OpenMetrics text) at http://ADDR/metrics: mints by outcome
    /// with latency, revocations, key rotations, open revocation streams. Off unless given;
    /// the bound address goes to <data-dir>/metrics.addr.
    #[arg(long, value_name = "ADDR", env = "TOLLGATE_METRICS_LISTEN")]
    metrics_listen: Option<String>,
    /// Serve TLS with this certificate (PEM; `tollgate pki issue authority` makes one), with
    /// --tls-key. Clients then connect with --ca.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Require every client (supervisors, operators) to present a certificate this CA signed
    /// (mutual TLS); needs --tls-cert.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Allow plaintext on an address that is not loopback (refused otherwise: tokens and
    /// receipts would cross the network in clear). Only for a network you trust.
    #[arg(long)]
    insecure_plaintext: bool,
    /// Also serve the standard gRPC health service, and nothing else, in plaintext at ADDR:
    /// for probes that cannot speak TLS (Kubernetes' gRPC probes). The bound address goes
    /// to <data-dir>/health.addr.
    #[arg(long, value_name = "ADDR")]
    health_listen: Option<String>,
    /// Instead of serving: back up or restore the database of --data-dir.
    #[command(subcommand)]
    command: Option<StateCommand>,
}

/// Keeping the authority's state safe.
#[derive(Debug, clap::Subcommand)]
enum StateCommand {
    /// Copy the database to FILE (created 0600, never overwritten), consistent while the
    /// authority serves: `tollgate-authority backup --data-dir DIR --to FILE`. It holds every
    /// operator's and supervisor's token hash; keep it as private as the data directory.
    Backup {
        /// Where the copy goes.
        #[arg(long, value_name = "FILE")]
        to: PathBuf,
    },
    /// Put a backup in place as the database of --data-dir (no authority may be running on
    /// it). The restored authority withdraws every key the backup held — receipts they signed,
    /// including any minted after the backup, stop verifying; runs already started go on;
    /// mint the rest again — signs with a new key from its next start, and starts a new
    /// revocation history that every supervisor reads again from the start.
    Restore {
        /// The backup file.
        #[arg(long, value_name = "FILE")]
        from: PathBuf,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let flags = Flags::parse();
    tollgate_daemon::logging::init(flags.log_format, None);
    match run(flags).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tollgate-authority: error: {error}");
            ExitCode::from(u8::try_from(error.exit_code()).unwrap_or(1))
        }
    }
}

/// `backup` or `restore`, on the data directory `--data-dir` names.
fn state_command(command: StateCommand, data_dir: Option<PathBuf>) -> Result<(), AuthorityError> {
    let data_dir = data_dir.ok_or_else(|| {
        AuthorityError::Config("give --data-dir DIR (or TOLLGATE_AUTHORITY_DATA_DIR)".into())
    })?;
    match command {
        StateCommand::Backup { to } => {
            tollgate_authority::backup::backup(&data_dir, &to)?;
            println!("backed up {} to {}", data_dir.display(), to.display());
        }
        StateCommand::Restore { from } => {
            let report = tollgate_authority::backup::restore(&data_dir, &from)?;
            println!(
                "restored {} from {}; withdrawn keys: {} (receipts they signed no longer verify; mint again what has not started); new revocation history {}",
                report.database.display(),
                from.display(),
                if report.withdrawn_keys.is_empty() {
                    "none".to_owned()
                } else {
                    report.withdrawn_keys.join(", ")
                },
                report.history
            );
        }
    }
    Ok(())
}

/// Resolves the configuration from the flags and serves until SIGINT or SIGTERM.
async fn run(mut flags: Flags) -> Result<(), AuthorityError> {
    if let Some(command) = flags.command.take() {
        return state_command(command, flags.data_dir);
    }
    // Connections are bounded per listener (tollgate_daemon), not by a low descriptor limit
    // that one busy client could exhaust for everyone.
    if let Err(e) = tollgate_daemon::raise_open_files_limit() {
        tracing::warn!(error = %e, "could not raise the open-files limit");
    }
    let mut config = AuthorityConfig::load(flags.config.as_deref(), flags.data_dir, flags.listen)?;
    config.audit_key = AuditKey::configured(flags.audit_key_file.as_deref())?;
    config.metrics_listen = flags.metrics_listen;
    config.tls = tollgate_daemon::tls::ServerTls {
        cert: flags.tls_cert,
        key: flags.tls_key,
        client_ca: flags.tls_client_ca,
    };
    config.insecure_plaintext = flags.insecure_plaintext;
    config.health_listen = flags.health_listen;
    serve(config, tollgate_daemon::shutdown::signal()).await
}
