//! The command line as clap reads it: global options, commands and their arguments. Their doc
//! comments are the `--help` text.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::client::{TokenSource, DEFAULT_AUTHORITY, DEFAULT_SUPERVISOR};
use crate::error::Daemon;

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
    /// The token file for authority commands only (wins over --token-file there): set both
    /// daemons' tokens once and run either kind of command.
    #[arg(
        long,
        global = true,
        env = "TOLLGATE_AUTHORITY_TOKEN_FILE",
        value_name = "PATH"
    )]
    pub authority_token_file: Option<PathBuf>,
    /// The token file for supervisor commands only (wins over --token-file there).
    #[arg(
        long,
        global = true,
        env = "TOLLGATE_SUPERVISOR_TOKEN_FILE",
        value_name = "PATH"
    )]
    pub supervisor_token_file: Option<PathBuf>,
    /// The CA the daemons' certificates must chain to: connect with TLS (a daemon serving
    /// TLS refuses plaintext). `tollgate pki init` makes one.
    #[arg(long, global = true, env = "TOLLGATE_CA", value_name = "PEM")]
    pub ca: Option<PathBuf>,
    /// This client's certificate, for daemons that require one (mutual TLS); with --key.
    #[arg(
        long,
        global = true,
        env = "TOLLGATE_CERT",
        value_name = "PEM",
        requires = "key"
    )]
    pub cert: Option<PathBuf>,
    /// The private key of --cert.
    #[arg(
        long,
        global = true,
        env = "TOLLGATE_KEY",
        value_name = "PEM",
        requires = "cert"
    )]
    pub key: Option<PathBuf>,
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

impl GlobalArgs {
    /// What a client connection trusts and presents (`--ca`, `--cert`, `--key`).
    pub fn tls(&self) -> tollgate_daemon::tls::ClientTls {
        tollgate_daemon::tls::ClientTls {
            ca: self.ca.clone(),
            cert: self.cert.clone(),
            key: self.key.clone(),
        }
    }
}

/// Commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Mint a receipt from a TOML run spec or a profile; print its tgr1. text or write it to
    /// --out.
    ///
    /// The spec names subject, ttl, audience, [agent], [limits], [[fs]], [exec], [[routes]]
    /// and [delegate] (see docs/run-spec.md). A profile (`--profile claude-code --project DIR
    /// --task TEXT`, or `profile = "NAME"` in a spec) expands first into the explicit spec
    /// that is signed: `tollgate profiles` lists them. The authority refuses anything above
    /// your operator ceiling and names the grant.
    Mint {
        /// The run spec (TOML); "-" reads stdin.
        #[arg(
            long,
            value_name = "FILE",
            required_unless_present = "profile",
            conflicts_with = "profile"
        )]
        spec: Option<PathBuf>,
        /// Mint from this profile (`tollgate profiles` lists them) instead of a spec file.
        #[arg(long, value_name = "NAME")]
        profile: Option<String>,
        /// The profile's variables.
        #[command(flatten)]
        values: ProfileValues,
        /// Write the receipt's text form here (mode 0600) instead of stdout.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// Print the minted receipt as JSON (with its text form) instead.
        #[arg(long)]
        json: bool,
        /// Mint nothing: check the spec against your ceiling and list every violation at once
        /// (exit 77 when there is one); with --json, {"violations": [...], "limits": {...}}.
        #[arg(long, conflicts_with = "out")]
        dry_run: bool,
    },
    /// Inspect receipts.
    #[command(subcommand)]
    Receipt(ReceiptCommand),
    /// List the profiles `tollgate mint --profile NAME` can start from: yours
    /// (~/.config/tollgate/profiles/NAME.toml), the host's (/etc/tollgate/profiles/) and the
    /// built-in ones (claude-code, codex, aider, opencode, python, node, shell), in that order
    /// of precedence.
    Profiles {
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one profile.
    #[command(subcommand)]
    Profile(ProfileCommand),
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
        /// File with the receipt's tgr1. text; "-" reads stdin (not with -i or -t).
        #[arg(long, value_name = "FILE")]
        receipt: PathBuf,
        /// Forward this process's stdin to the agent (its end is the agent's end of input);
        /// without it the agent's stdin is /dev/null.
        #[arg(short = 'i', long)]
        interactive: bool,
        /// Give the agent a terminal inside its sandbox, wired to this one: raw mode, resizes
        /// followed, Ctrl-C reaches the agent as SIGINT, one output stream; exits with the
        /// agent's exit code. Implies -i.
        #[arg(short = 't', long)]
        tty: bool,
        /// The agent command, for receipts that do not pin one.
        #[arg(last = true, value_name = "ARGV")]
        argv: Vec<String>,
    },
    /// Attach this terminal to a live run started with -i or -t (`tollgate run -t`): its
    /// output from the start, then live; what you type goes to the agent (raw mode when the
    /// run has a terminal and this is one). Exits with the agent's exit code when it ends.
    ///
    /// The end of this command's stdin (Ctrl-D on a line, a pipe or /dev/null running dry)
    /// detaches this attach only, exit 0: the agent's input stays open for the run and other
    /// attaches (only `tollgate run -i` ends it).
    Attach {
        /// The run id.
        run_id: String,
        /// Show the output only: nothing is read from stdin or sent to the agent.
        #[arg(long)]
        read_only: bool,
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
    /// Copy files out of a run's /work — a live run's, or an ended run's workspace its
    /// receipt kept (`[workspace] keep = "1h"`; the teardown report says where and until
    /// when) — or into a live run's /work.
    ///
    /// Out: SOURCE is RUN:/work/PATH (a file or a directory); DEST a local path: inside it
    /// when it is a directory, else the new name; "-" writes the tar stream to stdout. Read
    /// beneath the workspace without following the agent's links; unpacked beside DEST first,
    /// so DEST never holds half a copy. In: SOURCE a local file or directory (links kept as
    /// links), DEST RUN:/work/DIR (a directory there); it lands as DIR/NAME, the agent's own,
    /// at most 256 MiB. Audited on the supervisor.
    ///
    /// Examples: tollgate cp 0193f0c2-…:/work/report.md ./report.md;
    /// tollgate cp ./data 0193f0c2-…:/work
    Cp {
        /// RUN:/work/PATH, or a local file or directory to copy in.
        #[arg(value_name = "SOURCE")]
        source: String,
        /// A local path ("-": the tar stream to stdout), or RUN:/work/DIR to copy into.
        #[arg(value_name = "DEST")]
        dest: PathBuf,
    },
    /// Remove an ended run's kept workspace now, before its time.
    Rm {
        /// The run id.
        run_id: String,
    },
    /// The gateway calls waiting for an operator's approval (under a grant with `ask = true`)
    /// on the runs you may see: what each would change and when it is denied unless decided.
    /// Decide with `tollgate approve RUN CALL` or `tollgate deny RUN CALL`
    #[command(
        after_help = "Examples:\n  tollgate approvals\n  tollgate approvals --watch\n  tollgate approvals --run 0193f0c2-… --json"
    )]
    Approvals {
        /// Only this run's calls.
        #[arg(long, value_name = "RUN")]
        run: Option<String>,
        /// Keep watching: each new waiting call and each end of a wait, until interrupted.
        #[arg(long)]
        watch: bool,
        /// One JSON object per event.
        #[arg(long)]
        json: bool,
    },
    /// Approve a waiting call: it goes on at once (audited with your name)
    Approve {
        /// The run id.
        run_id: String,
        /// The call id (`tollgate approvals` lists them).
        call_id: String,
        /// Also let later calls of the same tool on the same path of this run through
        /// without asking, for the rest of the run.
        #[arg(long)]
        remember: bool,
        /// Why (audited).
        #[arg(long, default_value = "")]
        reason: String,
        /// Print the decision as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Deny a waiting call: it fails in the agent with your reason (audited with your name)
    Deny {
        /// The run id.
        run_id: String,
        /// The call id (`tollgate approvals` lists them).
        call_id: String,
        /// Why (shown to the agent, audited).
        #[arg(long, default_value = "")]
        reason: String,
        /// Print the decision as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Take powers away from a live run without stopping it (no signature needed; the run's
    /// owner or an admin): drop fs grants (a mounted one is unmounted from the sandbox), lower
    /// its budgets (tool calls, model tokens, relayed output, outbound bytes), take
    /// gateway-only programs away, bring its expiry forward. Each budget is the run's in all, at most the current one; what was spent stays
    /// spent. Prints what it may do now
    Narrow {
        /// The run id.
        run_id: String,
        /// A granted host path to drop (as the receipt names it); repeatable.
        #[arg(long = "drop", value_name = "PATH")]
        drop_fs: Vec<String>,
        /// The new tool-call budget (at most the current one).
        #[arg(long, value_name = "N")]
        tool_calls: Option<u64>,
        /// The new model-token budget (at most the current one).
        #[arg(long, value_name = "N")]
        tokens: Option<u64>,
        /// The new budget of agent output relayed, e.g. "1MiB" (at most the current one).
        #[arg(long, value_name = "SIZE")]
        output_bytes: Option<String>,
        /// The new budget of outbound bytes, each way, e.g. "10MiB" (at most the current one).
        #[arg(long, value_name = "SIZE")]
        egress_bytes: Option<String>,
        /// A gateway-only program to take away (as granted); repeatable.
        #[arg(long = "drop-exec", value_name = "PROGRAM")]
        drop_gateway_exec: Vec<String>,
        /// End the run this long from now, e.g. "2m" (no later than its current expiry).
        #[arg(long, value_name = "DURATION")]
        expires_in: Option<String>,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Give a live run more through its gateway without restarting it: the authority signs an
    /// amendment within your ceiling, the supervisor applies it. Gateway-only fs grants and
    /// programs, bigger budgets, a later expiry; never a mount or another kernel-level power
    /// (start a new run for those). Prints what it may do now
    Widen {
        /// The run id (= its receipt id).
        run_id: String,
        /// A host path to grant: PATH, PATH:read, PATH:write, with :ask after either to have
        /// each change approved and :ask-reads (last) each read; repeatable.
        #[arg(long = "fs", value_name = "PATH[:ACCESS][:ask][:ask-reads]")]
        fs: Vec<String>,
        /// The new tool-call budget (above the current one).
        #[arg(long, value_name = "N")]
        tool_calls: Option<u64>,
        /// The new model-token budget (above the receipt's).
        #[arg(long, value_name = "N")]
        tokens: Option<u64>,
        /// The new budget of agent output relayed, e.g. "10MiB" (above the receipt's).
        #[arg(long, value_name = "SIZE")]
        output_bytes: Option<String>,
        /// The new budget of outbound bytes, each way, e.g. "2GiB" (above the receipt's).
        #[arg(long, value_name = "SIZE")]
        egress_bytes: Option<String>,
        /// A program the exec tool may run, only through the gateway; :ask after it to have
        /// each command approved; repeatable.
        #[arg(long = "gateway-exec", value_name = "PROGRAM[:ask]")]
        gateway_exec: Vec<String>,
        /// Extend the run's expiry by this much, e.g. "30m".
        #[arg(long, value_name = "DURATION")]
        extend: Option<String>,
        /// Let the run's future delegated children be granted what this adds too (by default
        /// they never gain what an amendment gives their parent).
        #[arg(long)]
        for_children: bool,
        /// Print the result as JSON.
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
    /// medium, high) and the reasons — what was found, the detector and the byte span, never
    /// the matched text.
    ///
    /// By default credentials and personal data are high, internal hosts and private
    /// addresses medium, everything else low; a routes file's [policy] may change any
    /// detector's level (--routes uses it, --explain-policy lists them all). Runs locally;
    /// nothing is sent anywhere.
    Classify {
        /// The text; "-" reads stdin (or use --file).
        #[arg(
            value_name = "TEXT|-",
            required_unless_present_any = ["file", "explain_policy"],
            conflicts_with = "file"
        )]
        text: Option<String>,
        /// Classify this file's contents instead.
        #[arg(long, value_name = "FILE")]
        file: Option<PathBuf>,
        /// Classify with this routes file's [policy] (levels, internal suffixes), as the
        /// supervisor given it does.
        #[arg(long, value_name = "FILE")]
        routes: Option<PathBuf>,
        /// List every detector with its level under the policy and what it looks for.
        #[arg(long)]
        explain_policy: bool,
        /// One JSON object: sensitivity and reasons (or the policy).
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
    /// Check whether this host can run tollgate-supervisor: root, user namespaces, Landlock
    /// (through tollgate-shim probe), seccomp, cgroups and their controllers, memfd_noexec,
    /// free host ids, the data directory, and (with --authority given) the authority and its
    /// key set. Prints each finding with its fix; exit 1 when something will fail.
    ///
    /// Example: sudo tollgate doctor --data-dir /var/lib/tollgate/supervisor --authority 127.0.0.1:7700
    Doctor {
        /// The supervisor's data directory, to check its permissions.
        #[arg(long, value_name = "DIR")]
        data_dir: Option<PathBuf>,
        /// The tollgate-shim binary [default: next to tollgate].
        #[arg(long, value_name = "PATH")]
        shim: Option<PathBuf>,
        /// The first host id the supervisor would use.
        #[arg(long, value_name = "ID", default_value_t = 2_000_000)]
        host_id_base: u32,
        /// How many host ids it would use.
        #[arg(long, value_name = "N", default_value_t = 65_536)]
        host_id_count: u32,
        /// Where live supervisors register their cgroup parent and host ids (the
        /// supervisor's --run-dir): a range one of them holds fails.
        #[arg(
            long,
            value_name = "DIR",
            env = "TOLLGATE_RUN_DIR",
            default_value = tollgate_daemon::host::DEFAULT_RUN_DIR
        )]
        run_dir: PathBuf,
        /// One JSON object: {"ready": bool, "checks": [{check, verdict, seen, fix}]}.
        #[arg(long)]
        json: bool,
    },
    /// The userlands a supervisor's runs may name instead of the host's (`[rootfs] name =
    /// "NAME"` in a run spec): import one from a tar stream (`docker export`, `podman
    /// export`), list them, remove one. Run as root on the supervisor's host.
    #[command(subcommand)]
    Rootfs(RootfsCommand),
    /// A small certificate authority for TLS between the daemons and their clients: make
    /// one, then a certificate for the authority, each supervisor and each operator.
    ///
    /// Example: tollgate pki init --dir pki; tollgate pki issue authority --dir pki --dns
    /// authority.example.com; tollgate-authority --tls-cert pki/authority.pem --tls-key
    /// pki/authority.key --tls-client-ca pki/ca.pem; tollgate --ca pki/ca.pem --cert
    /// pki/operator-alice.pem --key pki/operator-alice.key receipts
    #[command(subcommand)]
    Pki(PkiCommand),
    /// Start a throwaway authority and (as root) a supervisor, mint, verify and revoke a
    /// receipt, run an agent in a sandbox, and explain each step.
    Quickstart {
        /// Keep the temporary data directory (its path is printed).
        #[arg(long)]
        keep: bool,
        /// Where live supervisors register (the supervisor's --run-dir): quickstart's
        /// supervisor registers there, and its host-id check reads it.
        #[arg(
            long,
            value_name = "DIR",
            env = "TOLLGATE_RUN_DIR",
            default_value = tollgate_daemon::host::DEFAULT_RUN_DIR
        )]
        run_dir: PathBuf,
    },
}

/// `tollgate pki ...`
#[derive(Debug, Subcommand)]
pub enum PkiCommand {
    /// Make a CA: DIR/ca.pem (daemons take it as --tls-client-ca, clients as --ca) and its
    /// key DIR/ca.key (mode 0600; keep it off the fleet's hosts). Nothing is overwritten.
    Init {
        /// Where the CA's files go (created if missing).
        #[arg(long, value_name = "DIR", default_value = "tollgate-pki")]
        dir: PathBuf,
        /// The CA's name, in its certificate.
        #[arg(long, default_value = "Tollgate fleet CA")]
        name: String,
        /// How long it is valid.
        #[arg(long, default_value_t = 3650)]
        days: u32,
    },
    /// Issue a certificate and key (0600) signed by the CA in DIR: `authority`,
    /// `supervisor ID` or `operator NAME`. The identity is in the certificate (URI
    /// tollgate://supervisor/ID); daemons' certificates name localhost, 127.0.0.1, ::1 and
    /// every --dns and --ip given. Files: DIR/authority.pem, DIR/supervisor-ID.pem,
    /// DIR/operator-NAME.pem, each with its .key.
    Issue {
        /// Whose certificate.
        #[arg(value_enum)]
        kind: PkiKind,
        /// The supervisor's id (its audience name) or the operator's name.
        #[arg(required_if_eq_any([("kind", "supervisor"), ("kind", "operator")]))]
        name: Option<String>,
        /// Where the CA is, and where the files go.
        #[arg(long, value_name = "DIR", default_value = "tollgate-pki")]
        dir: PathBuf,
        /// A DNS name the daemon is reached by (repeat for more).
        #[arg(long, value_name = "NAME")]
        dns: Vec<String>,
        /// An address the daemon is reached at (repeat for more).
        #[arg(long, value_name = "ADDR")]
        ip: Vec<std::net::IpAddr>,
        /// How long it is valid.
        #[arg(long, default_value_t = 397)]
        days: u32,
    },
}

/// Whose certificate `tollgate pki issue` makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PkiKind {
    /// The authority's.
    Authority,
    /// A supervisor's (give its id).
    Supervisor,
    /// An operator's (give its name).
    Operator,
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

/// Where a supervisor keeps the root file systems runs name: its `--rootfs-dir`, or
/// `<data dir>/rootfs`.
#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
pub struct RootfsPlace {
    /// The supervisor's data directory (its --data-dir): root file systems live in its
    /// `rootfs` directory.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// The supervisor's --rootfs-dir, when it was given one.
    #[arg(long, value_name = "DIR")]
    pub rootfs_dir: Option<PathBuf>,
}

impl RootfsPlace {
    /// The rootfs directory.
    pub fn dir(&self) -> PathBuf {
        match (&self.rootfs_dir, &self.data_dir) {
            (Some(dir), _) => dir.clone(),
            (None, Some(data)) => data.join("rootfs"),
            (None, None) => PathBuf::from("rootfs"),
        }
    }
}

/// `tollgate rootfs ...`
#[derive(Debug, Subcommand)]
pub enum RootfsCommand {
    /// Unpack a tar stream as the root file system NAME: beside its place first, renamed into
    /// place once complete. Device nodes and FIFOs are left out and set-uid/set-gid bits
    /// cleared (and sandboxes mount it read-only, nosuid, nodev); an entry that would land
    /// outside it refuses the import.
    ///
    /// Example: docker export $(docker create python:3.12-slim) | sudo tollgate rootfs import
    /// py312 - --data-dir /var/lib/tollgate/supervisor
    Import {
        /// The name runs give (`[rootfs] name = "NAME"`): letters, digits, '.', '_', '-'.
        name: String,
        /// The tar file (not compressed); "-" reads stdin.
        #[arg(value_name = "FILE.tar|-")]
        file: PathBuf,
        /// Where.
        #[command(flatten)]
        place: RootfsPlace,
        /// One JSON object: name, path, entries, bytes, devices_skipped, set_id_cleared.
        #[arg(long)]
        json: bool,
    },
    /// List the root file systems, with the distribution each says it is.
    List {
        /// Where.
        #[command(flatten)]
        place: RootfsPlace,
        /// A JSON array of {name, path, os}.
        #[arg(long)]
        json: bool,
    },
    /// Remove the root file system NAME (stop the runs using it first: they see it go).
    Rm {
        /// Its name.
        name: String,
        /// Where.
        #[command(flatten)]
        place: RootfsPlace,
    },
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

/// Values of a profile's variables (`tollgate mint --profile`, `tollgate profile show`).
#[derive(Debug, Default, Args)]
pub struct ProfileValues {
    /// The project the agent works on: a directory on this host (the profile's `project`).
    #[arg(long, value_name = "DIR")]
    pub project: Option<PathBuf>,
    /// What the agent is asked to do (the profile's `task`), e.g. "make the tests pass".
    #[arg(long, value_name = "TEXT")]
    pub task: Option<String>,
    /// Any other variable of the profile, e.g. --var install=/opt/claude-code (repeatable;
    /// `tollgate profile show NAME` lists them).
    #[arg(long = "var", value_name = "NAME=VALUE")]
    pub vars: Vec<String>,
}

/// `tollgate profile ...`
#[derive(Debug, Subcommand)]
pub enum ProfileCommand {
    /// Print a profile: its file as written (with the comments saying what each setting is
    /// for and which variables it takes), or with --expanded the run spec it mints.
    Show {
        /// The profile's name.
        name: String,
        /// Print the explicit run spec the profile expands to with these values (what
        /// `tollgate mint --profile` would sign), instead of the file.
        #[arg(long)]
        expanded: bool,
        /// The profile's variables (with --expanded).
        #[command(flatten)]
        values: ProfileValues,
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
    /// Where an authority command's token comes from.
    pub(crate) fn tokens(&self) -> TokenSource {
        TokenSource {
            file: self
                .authority_token_file
                .clone()
                .or_else(|| self.token_file.clone()),
            value: self.token.clone(),
            daemon: Daemon::Authority,
            certificate: false,
        }
    }

    /// Where a supervisor command's token comes from.
    pub(crate) fn supervisor_tokens(&self) -> TokenSource {
        TokenSource {
            file: self
                .supervisor_token_file
                .clone()
                .or_else(|| self.token_file.clone()),
            value: self.token.clone(),
            daemon: Daemon::Supervisor,
            certificate: self.cert.is_some(),
        }
    }
}
