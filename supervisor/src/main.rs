//! `tollgate-supervisor`: the root daemon that runs one sandbox per receipt. Parses flags and
//! hands over to the library.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory as _, FromArgMatches as _, Parser};
use tollgate_router_backends::ModelRoutes;
use tollgate_supervisor::daemon::{
    serve, AuthorityLink, DaemonError, SupervisorConfig, SupervisorFile, Trust,
};
use tollgate_supervisor::egress::config::EgressConfig;
use tollgate_supervisor::runs::RunSettings;

/// Run AI agents in sandboxes built from signed Tollgate receipts (must run as root).
///
/// For each receipt: verify it (signature, validity window with --clock-skew, audience must
/// include --id, not revoked), record it as used (a receipt starts at most one sandbox, ever),
/// build the sandbox (namespaces, a cgroup with the receipt's limits, read-only root, no
/// capabilities, Landlock, seccomp, loopback only), run the agent, and tear everything down
/// when it exits, expires, is stopped or revoked, or hits a limit.
///
/// Every admission, refusal, sandbox and teardown is appended to the audit log in
/// <data-dir>/audit/ (hash-chained, checkpoints signed with <data-dir>/audit-checkpoint.key);
/// check it with `tollgate audit verify`.
///
/// First start writes <data-dir>/admin.token (0600): clients send it as
/// "authorization: Bearer <token>". Once listening, the bound address is written to
/// <data-dir>/supervisor.addr. SIGINT/SIGTERM tear down every run, then exit.
#[derive(Debug, Parser)]
#[command(name = "tollgate-supervisor", version, about, long_about)]
struct Flags {
    /// Settings from a TOML file: every key optional, named as its flag without the dashes
    /// (data_dir = "/var/lib/tollgate-supervisor", cgroup_parent = "tollgate", …); a flag or
    /// environment variable given here wins over the file.
    #[arg(long, value_name = "FILE", env = "TOLLGATE_SUPERVISOR_CONFIG")]
    config: Option<PathBuf>,
    /// Data directory: supervisor.db, runs/, admin.token, supervisor.addr.
    #[arg(long, value_name = "DIR", required_unless_present = "config")]
    data_dir: Option<PathBuf>,
    /// This supervisor's id: receipts must name it in their audience.
    #[arg(long, required_unless_present = "config")]
    id: Option<String>,
    /// Address to listen on; port 0 picks a free port.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7701")]
    listen: String,
    /// The authority (host:port, a URL, or the path of its authority.addr readiness file):
    /// fetch its key set and follow its revocations (reconnecting). Given as a flag, it
    /// replaces trust_keys of the config file (and --trust-keys replaces its authority).
    #[arg(
        long,
        value_name = "ADDR",
        conflicts_with = "trust_keys",
        required_unless_present_any = ["trust_keys", "config"]
    )]
    authority: Option<String>,
    /// Pinned key file for hosts without an authority link (`tollgate keys --json > FILE`).
    #[arg(long, value_name = "FILE")]
    trust_keys: Option<PathBuf>,
    /// The CA the authority's certificate must chain to: reach the authority over TLS,
    /// presenting --tls-cert when given (an authority with --tls-client-ca requires it).
    #[arg(long, value_name = "PEM")]
    authority_ca: Option<PathBuf>,
    /// Serve TLS with this certificate (PEM; `tollgate pki issue supervisor ID` makes one),
    /// with --tls-key; also this supervisor's identity to an authority that asks for one.
    #[arg(long, value_name = "PEM")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert.
    #[arg(long, value_name = "PEM")]
    tls_key: Option<PathBuf>,
    /// Require every client to present a certificate this CA signed (mutual TLS); needs
    /// --tls-cert.
    #[arg(long, value_name = "PEM")]
    tls_client_ca: Option<PathBuf>,
    /// Allow plaintext on an address that is not loopback (refused otherwise: tokens and
    /// receipts would cross the network in clear). Only for a network you trust.
    #[arg(long)]
    insecure_plaintext: bool,
    /// Seconds new runs may still start after the authority's revocation stream is lost (a
    /// silent link is noticed within 2 s); past it, starts are refused until the stream is
    /// back and has caught up with every revocation made meanwhile. Live runs go on.
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    max_staleness: u64,
    /// Also serve the standard gRPC health service, and nothing else, in plaintext at ADDR
    /// once the supervisor is ready: for probes that cannot speak TLS (Kubernetes' gRPC
    /// probes). The bound address goes to <data-dir>/health.addr.
    #[arg(long, value_name = "ADDR")]
    health_listen: Option<String>,
    /// Tolerated clock difference with the authority, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    clock_skew: u64,
    /// The tollgate-shim binary [default: next to this binary].
    #[arg(long, value_name = "PATH")]
    shim: Option<PathBuf>,
    /// Parent cgroup of every run: this supervisor's alone (it sweeps it at start), so
    /// supervisors sharing a host need different ones.
    #[arg(long, value_name = "NAME", default_value = "tollgate")]
    cgroup_parent: String,
    /// Serve Prometheus metrics (OpenMetrics text) at http://ADDR/metrics: runs by state,
    /// start and teardown latency, gateway calls by tool and decision, model tokens by route,
    /// the revocation stream, the key set's age, the warm pool. Off unless given; bind it to
    /// loopback or a management network. The bound address goes to <data-dir>/metrics.addr.
    #[arg(long, value_name = "ADDR", env = "TOLLGATE_METRICS_LISTEN")]
    metrics_listen: Option<String>,
    /// Where live supervisors register their cgroup parent and host-id range, so that two
    /// on one host never share either (the second refuses to start, naming the first).
    #[arg(
        long,
        value_name = "DIR",
        env = "TOLLGATE_RUN_DIR",
        default_value = tollgate_supervisor::daemon::host::DEFAULT_RUN_DIR
    )]
    run_dir: PathBuf,
    /// First host uid/gid handed to sandboxes (one per live run). Supervisors sharing a host
    /// need ranges that do not overlap.
    #[arg(long, value_name = "ID", default_value_t = 2_000_000)]
    host_id_base: u32,
    /// How many host ids (and so live runs) are available.
    #[arg(long, value_name = "N", default_value_t = 65_536)]
    host_id_count: u32,
    /// Sandboxes prepared ahead of need (cgroup, shim, namespaces, the part of the root no
    /// receipt decides), to take that work off a run's start. Each serves one run; it gets
    /// the run's limits before the agent exists. 0 prepares each on demand.
    #[arg(long, value_name = "N", default_value_t = 1)]
    warm_sandboxes: usize,
    /// Live restore: a clean stop (SIGTERM, SIGINT) leaves root runs running detached, and
    /// the next supervisor on this data directory re-adopts them; each sandbox ends itself
    /// after --live-restore-window (never past its receipt's expiry) if none does. A crash
    /// still ends every run. Runs with delegated children are torn down as at any stop.
    #[arg(long)]
    live_restore: bool,
    /// How long a run left detached by --live-restore waits to be re-adopted (seconds,
    /// 1 to 86400).
    #[arg(long, value_name = "SECONDS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    live_restore_window: u64,
    /// Where root file systems registered by name live: `tollgate rootfs import NAME FILE.tar`
    /// unpacks one there, and a receipt's `rootfs = "NAME"` runs on `<DIR>/NAME`. Default:
    /// `<data-dir>/rootfs`.
    #[arg(long, value_name = "DIR")]
    rootfs_dir: Option<PathBuf>,
    /// Names the supervisor resolves itself for runs' outbound connections (hosts-file
    /// syntax: `ADDRESS NAME [NAME...]` per line), before asking the system resolver: a test
    /// suite's or an air-gapped site's own servers. A name never reaches a loopback, private,
    /// link-local, shared or metadata address unless a receipt grants that address itself.
    #[arg(long, value_name = "FILE")]
    egress_hosts: Option<PathBuf>,
    /// Secrets the supervisor adds to runs' requests to inspected hosts (TOML: [[secret]]
    /// name, value = "env:NAME" | "file:/path", header (default Authorization), scheme
    /// (default "Bearer" for Authorization)). A receipt names one with `inject = "NAME"`;
    /// the value never enters a sandbox, the audit log or a message. Read at start.
    #[arg(long, value_name = "FILE")]
    egress_secrets: Option<PathBuf>,
    /// Certificate authorities (PEM) trusted for inspected hosts' servers besides the Web
    /// PKI roots and this host's bundle (/etc/ssl/certs/ca-certificates.crt): a site's own
    /// CA, or a test suite's.
    #[arg(long, value_name = "FILE")]
    egress_extra_roots: Option<PathBuf>,
    /// Bytes all inspected outbound connections of every run may hold in memory together:
    /// each connection's buffers (320 KiB) and each request body read to classify it
    /// reserve from it first. A connection or request that finds it spent is refused (503,
    /// `egress_budget`), never queued. Default 256 MiB.
    #[arg(long, value_name = "BYTES", default_value_t = tollgate_supervisor::egress::budget::DEFAULT_INSPECT_BUDGET)]
    egress_inspect_budget: usize,
    /// Key for HMAC-SHA-256 audit hashes (hex or raw, at least 32 bytes; never written to
    /// the log). Without it the key is read from TOLLGATE_AUDIT_KEY when set; otherwise
    /// entries are chained with plain SHA-256.
    #[arg(long, value_name = "FILE", env = "TOLLGATE_AUDIT_KEY_FILE")]
    audit_key_file: Option<PathBuf>,
    /// Model routes (TOML: [policy] and [[route]] entries: name, kind local|cloud, api or
    /// preset, endpoint, model, key_secret = "env:NAME" | "file:/path"). Keys are read at
    /// start and never enter a sandbox. Without it, model calls are refused as unavailable.
    /// SIGHUP reads it again (keys loaded, local routes probed): runs starting from then on
    /// use the new routes; a file that does not load leaves the old ones in use.
    #[arg(long, value_name = "FILE", env = "TOLLGATE_ROUTES")]
    routes: Option<PathBuf>,
    /// How long to wait at start for every local route's server to answer its health check
    /// and list the route's model (retrying every 500 ms; llama.cpp answers 503 while it
    /// loads). A route still failing then stops the supervisor. Cloud routes are not probed.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 30,
        value_parser = clap::value_parser!(u64).range(1..=3600)
    )]
    route_probe_timeout: u64,
    /// This supervisor's delegation token (`tollgate supervisor add ID --token-out FILE` on
    /// the authority): lets runs whose receipts carry a delegate grant ask for narrower child
    /// receipts through their gateway. Root-owned, mode 0600, never in a sandbox or a log.
    /// Needs --authority (or authority in the config file). Without it, a run's Delegate
    /// call is refused as unavailable.
    // Not `requires = "authority"`: clap knows only the command line, and the config file
    // may give the authority. Checked once both are merged (`settings_agree`).
    #[arg(long, value_name = "FILE", env = "TOLLGATE_DELEGATION_TOKEN_FILE")]
    delegation_token_file: Option<PathBuf>,
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
    /// Log level when RUST_LOG is not set: an EnvFilter directive (info, debug,
    /// tollgate_supervisor=debug,…). With --config, SIGHUP applies the file's log_level anew.
    #[arg(long, value_name = "LEVEL")]
    log_level: Option<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let matches = Flags::command().get_matches();
    let flags = match Flags::from_arg_matches(&matches)
        .map_err(|e| e.exit())
        .and_then(|flags| with_config_file(flags, &matches))
    {
        Ok(flags) => flags,
        Err(error) => {
            eprintln!("tollgate-supervisor: error: {error}");
            return ExitCode::from(error.exit_code());
        }
    };
    tollgate_daemon::logging::init(flags.log_format, flags.log_level.as_deref());
    // What inspected connections held goes back to the system when they end.
    tollgate_supervisor::memory::return_large_blocks_to_the_system();
    // Connections are bounded per listener (tollgate_daemon), not by a low descriptor limit
    // that one busy client could exhaust for everyone.
    // Each live run holds a few descriptors, so the limit bounds how many runs this
    // supervisor can hold: it goes as high as the kernel allows (the figure is logged once
    // the supervisor listens).
    if let Err(e) = tollgate_daemon::raise_open_files_limit() {
        tracing::warn!(error = %e, "could not raise the open-files limit");
    }
    let served = match configure(flags).await {
        Ok(config) => serve(config, tollgate_daemon::shutdown::signal()).await,
        Err(error) => Err(error),
    };
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tollgate-supervisor: error: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}

/// `--tls-cert`, checked to be this supervisor's: a certificate naming a Tollgate identity
/// must name supervisor `id` (it is the supervisor's identity at the authority, and a
/// receipt's audience names that id). One from another PKI, naming none, is taken as it is.
fn certificate_of(cert: Option<PathBuf>, id: &str) -> Result<Option<PathBuf>, DaemonError> {
    use tollgate_daemon::tls::{pem_certificate_identity, FleetIdentity};
    let Some(path) = cert else {
        return Ok(None);
    };
    let pem = std::fs::read(&path)
        .map_err(|e| DaemonError::Tls(format!("cannot read --tls-cert {}: {e}", path.display())))?;
    match pem_certificate_identity(&pem) {
        Some(FleetIdentity::Supervisor(named)) if named == id => Ok(Some(path)),
        Some(identity) => Err(DaemonError::Tls(format!(
            "--tls-cert {} names {identity}, but this is supervisor {id:?} (--id): a supervisor's certificate is its identity; issue one with `tollgate pki issue supervisor {id}`",
            path.display()
        ))),
        None => Ok(Some(path)),
    }
}

/// `flags` with what `--config` sets and no flag or environment variable gave, checked to
/// agree.
fn with_config_file(flags: Flags, matches: &ArgMatches) -> Result<Flags, DaemonError> {
    merge_config_file(flags, matches).and_then(settings_agree)
}

/// What clap cannot check because the config file may give a setting: a flag that needs
/// another one is checked here, once the file and the flags are one.
fn settings_agree(flags: Flags) -> Result<Flags, DaemonError> {
    if flags.delegation_token_file.is_some() && flags.authority.is_none() {
        return Err(DaemonError::DelegationNeedsAuthority);
    }
    Ok(flags)
}

/// `flags` with what `--config` sets and no flag or environment variable gave.
fn merge_config_file(mut flags: Flags, matches: &ArgMatches) -> Result<Flags, DaemonError> {
    let Some(path) = flags.config.clone() else {
        return Ok(flags);
    };
    let file = SupervisorFile::load(&path)?;
    let given = |id: &str| {
        matches!(
            matches.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        )
    };
    // A file value fills each setting no flag or variable gave (`$wrap` makes it the
    // flag's type).
    macro_rules! fill {
        ($($field:ident => $wrap:expr),* $(,)?) => {
            $(if !given(stringify!($field)) {
                if let Some(value) = file.$field {
                    flags.$field = $wrap(value);
                }
            })*
        };
    }
    // The two ways to trust keys are one setting: either given as a flag replaces the
    // file's choice, whichever key the file used.
    let trust_given = given("authority") || given("trust_keys");
    fill!(
        data_dir => Some,
        id => Some,
    );
    if !trust_given {
        flags.authority = file.authority;
        flags.trust_keys = file.trust_keys;
    }
    fill!(
        authority_ca => Some,
        tls_cert => Some,
        tls_key => Some,
        tls_client_ca => Some,
        insecure_plaintext => std::convert::identity,
        max_staleness => std::convert::identity,
        health_listen => Some,
        shim => Some,
        audit_key_file => Some,
        rootfs_dir => Some,
        egress_hosts => Some,
        egress_secrets => Some,
        egress_extra_roots => Some,
        egress_inspect_budget => std::convert::identity,
        routes => Some,
        delegation_token_file => Some,
        metrics_listen => Some,
        log_level => Some,
        listen => std::convert::identity,
        clock_skew => std::convert::identity,
        cgroup_parent => std::convert::identity,
        run_dir => std::convert::identity,
        host_id_base => std::convert::identity,
        host_id_count => std::convert::identity,
        warm_sandboxes => std::convert::identity,
        route_probe_timeout => std::convert::identity,
        live_restore => std::convert::identity,
        live_restore_window => std::convert::identity,
    );
    let window = Duration::from_secs(flags.live_restore_window);
    if window.is_zero() || window > tollgate_supervisor::runs::MAX_LIVE_RESTORE_WINDOW {
        return Err(DaemonError::ConfigFile {
            path,
            problem: "live_restore_window must be 1 to 86400 seconds".into(),
        });
    }
    if !given("log_format") {
        if let Some(format) = &file.log_format {
            flags.log_format = format.parse().map_err(|problem| DaemonError::ConfigFile {
                path: path.clone(),
                problem: format!("log_format: {problem}"),
            })?;
        }
    }
    if flags.authority.is_some() && flags.trust_keys.is_some() {
        return Err(DaemonError::MissingSetting(
            "give --authority or --trust-keys, not both (a flag and the config file may each set one)",
        ));
    }
    Ok(flags)
}

/// The daemon's configuration from its flags: root, the shim, the audit key, the model
/// routes (every local one probed), the delegation token.
async fn configure(flags: Flags) -> Result<SupervisorConfig, DaemonError> {
    if !nix::unistd::geteuid().is_root() {
        return Err(DaemonError::NotRoot);
    }
    let shim = flags.shim.unwrap_or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|dir| dir.join("tollgate-shim")))
            .unwrap_or_else(|| PathBuf::from("tollgate-shim"))
    });
    if !shim.is_file() {
        return Err(DaemonError::ShimMissing(shim));
    }
    let audit_key = tollgate_audit::AuditKey::configured(flags.audit_key_file.as_deref())
        .map_err(DaemonError::AuditKey)?;
    let timeout = Duration::from_secs(flags.route_probe_timeout);
    let routes_file = flags.routes.clone();
    let models = match flags.routes.as_deref() {
        Some(path) => Some(std::sync::Arc::new(ModelRoutes::load(path, timeout).await?)),
        None => None,
    };
    if let Some(models) = &models {
        tracing::info!(
            routes = models.routes.routes.len(),
            "model routes loaded; every local route's server answered its probe"
        );
    }
    let delegation_token = flags
        .delegation_token_file
        .as_deref()
        .map(delegation_token)
        .transpose()?;
    let listen = match flags.listen.strip_prefix(':') {
        Some(port) => format!("127.0.0.1:{port}"),
        None => flags.listen,
    };
    let supervisor_id = flags.id.clone().ok_or(DaemonError::MissingSetting(
        "give --id (or id in the config file)",
    ))?;
    let tls_cert = certificate_of(flags.tls_cert.clone(), &supervisor_id)?;
    Ok(SupervisorConfig {
        runs: RunSettings {
            egress: std::sync::Arc::new(EgressConfig {
                inspect_budget: tollgate_supervisor::egress::budget::InspectBudget::new(
                    flags.egress_inspect_budget,
                ),
                ..EgressConfig::load(
                    flags.egress_hosts.as_deref(),
                    flags.egress_secrets.as_deref(),
                    flags.egress_extra_roots.as_deref(),
                )?
            }),
            rootfs_dir: match (&flags.rootfs_dir, &flags.data_dir) {
                (Some(dir), _) => dir.clone(),
                (None, Some(data)) => data.join("rootfs"),
                (None, None) => PathBuf::new(),
            },
            data_dir: flags.data_dir.ok_or(DaemonError::MissingSetting(
                "give --data-dir (or data_dir in the config file)",
            ))?,
            supervisor_id: supervisor_id.clone(),
            shim,
            cgroup_parent: flags.cgroup_parent,
            host_ids: flags.host_id_base..flags.host_id_base.saturating_add(flags.host_id_count),
            clock_skew: Duration::from_secs(flags.clock_skew),
            warm_sandboxes: flags.warm_sandboxes,
            live_restore: flags
                .live_restore
                .then(|| Duration::from_secs(flags.live_restore_window)),
        },
        listen,
        metrics_listen: flags.metrics_listen,
        run_dir: flags.run_dir,
        tls: tollgate_daemon::tls::ServerTls {
            cert: tls_cert.clone(),
            key: flags.tls_key.clone(),
            client_ca: flags.tls_client_ca,
        },
        insecure_plaintext: flags.insecure_plaintext,
        max_staleness: Duration::from_secs(flags.max_staleness),
        health_listen: flags.health_listen,
        trust: match (flags.authority, flags.trust_keys) {
            (Some(addr), _) => {
                let tls = tollgate_daemon::tls::ClientTls {
                    ca: flags.authority_ca,
                    cert: tls_cert,
                    key: flags.tls_key,
                };
                let tls = match &tls.ca {
                    Some(_) => tls.config(),
                    None => Ok(None),
                }
                .map_err(|e| DaemonError::Tls(format!("the link to the authority: {e}")))?;
                Trust::Authority(AuthorityLink::new(
                    &tollgate_daemon::address::url(&addr).map_err(DaemonError::AuthorityAddress)?,
                    tls,
                ))
            }
            (None, Some(path)) => Trust::KeyFile(path),
            (None, None) => {
                return Err(DaemonError::MissingSetting(
                    "give --authority ADDR or --trust-keys FILE (or authority / trust_keys in the config file)",
                ))
            }
        },
        audit_key,
        models,
        routes_file,
        route_probe_timeout: timeout,
        config_file: flags.config.clone(),
        delegation_token,
    })
}

/// Reads the delegation token: a root-only file holding a `tgt_` token.
fn delegation_token(path: &std::path::Path) -> Result<tollgate_daemon::Secret, DaemonError> {
    let token = tollgate_daemon::files::read_secret_file(path)
        .map_err(|e| DaemonError::DelegationToken(e.to_string()))?;
    if !tollgate_daemon::token::looks_like_token(token.expose()) {
        return Err(DaemonError::DelegationToken(format!(
            "{}: not a delegation token (they start with tgt_; make one with `tollgate supervisor add ID --token-out FILE`)",
            path.display()
        )));
    }
    Ok(token)
}
