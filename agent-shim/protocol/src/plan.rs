//! The sandbox plan: everything the shim needs to build one sandbox, derived from a receipt
//! by the supervisor and sent to the shim as one JSON line. Pure data, so the supervisor's
//! translation of a receipt is unit-testable without root.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// A bind mount of a host path into the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bind {
    /// Host path (resolved by the supervisor).
    pub source: PathBuf,
    /// Absolute path inside the sandbox.
    pub target: PathBuf,
    /// Whether the agent may write through it.
    pub writable: bool,
    /// Mounted without `noexec` (`nosuid` stays): its shared libraries can be loaded and the
    /// programs Landlock allows can run from it. Writable too only where the receipt lifts
    /// W^X for this grant (`exec = true` on a write grant).
    #[serde(default)]
    pub executable: bool,
}

/// Landlock allow-lists, as paths inside the sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LandlockPlan {
    /// Read files and list directories beneath these.
    pub read: Vec<PathBuf>,
    /// Read, create, modify and remove beneath these.
    pub write: Vec<PathBuf>,
    /// Execute these files (and the dynamic loader they need).
    pub execute: Vec<PathBuf>,
    /// Whether `execute` already holds the interpreters too, as resolved by pid 1 when the
    /// sandbox started (a command the gateway runs later uses that list: what the agent has
    /// changed since must not add to it).
    #[serde(default)]
    pub execute_resolved: bool,
}

/// What the agent's standard input is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentInput {
    /// `/dev/null`.
    #[default]
    Null,
    /// A pipe whose write end the supervisor holds (`tollgate run -i`).
    Pipe,
    /// A pseudo-terminal as stdin, stdout and stderr and the agent's controlling terminal,
    /// this size; the supervisor holds its master (`tollgate run -t`).
    Terminal {
        /// Rows.
        rows: u16,
        /// Columns.
        cols: u16,
    },
}

/// The byte pid 1 sends, with the supervisor's end of the agent's input attached
/// (SCM_RIGHTS: the pipe's write end, or the terminal's master), just before
/// `FromShim::Started`, when the plan asks for input.
pub const INPUT_MARKER: u8 = b'I';

/// What runs as the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentCommand {
    /// Absolute path of the executable, then arguments.
    pub argv: Vec<String>,
    /// The complete environment (nothing is inherited).
    pub env: Vec<(String, String)>,
    /// Working directory inside the sandbox.
    pub cwd: PathBuf,
}

impl AgentCommand {
    /// The agent's home for `/etc/passwd`: its `HOME` when that is an absolute path a passwd
    /// line can hold (no `:` or line break), else [`DEFAULT_AGENT_HOME`].
    pub fn home(&self) -> &str {
        self.env
            .iter()
            // The first, as getenv finds it.
            .find(|(name, _)| name == "HOME")
            .map(|(_, home)| home.as_str())
            .filter(|home| home.starts_with('/') && !home.contains([':', '\n', '\r']))
            .unwrap_or(DEFAULT_AGENT_HOME)
    }
}

/// What every sandbox of a supervisor shares, sent before any receipt is known: the shim
/// builds this part of the root ahead of need.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxBase {
    /// Host name inside the sandbox.
    pub hostname: String,
    /// An empty host directory where the new root is assembled: a tmpfs is mounted on it
    /// inside the sandbox's own mount namespace, so one directory serves every sandbox.
    pub root_dir: PathBuf,
    /// Host system directories shown read-only at the same path (symlinks, as on merged-/usr
    /// systems, are recreated as symlinks).
    pub system_paths: Vec<PathBuf>,
    /// Host path of the `tollgate-shim` binary, shown read-only and executable at
    /// [`SHIM_IN_SANDBOX`] so the agent can run `tollgate-shim tool ...`.
    #[serde(default)]
    pub shim_binary: Option<PathBuf>,
}

/// Entries of the host's `/etc` a sandbox's generated `/etc` shows read-only (those the host
/// has), besides the files it writes itself ([`generated_etc`]): what programs need to run — the
/// dynamic loader's cache, the alternatives links, CA certificates, the time zone, service and
/// protocol names, MIME types, Python's Debian configuration (and every `/etc/python3.*`) — and
/// nothing about the host's users, secrets or configuration (`passwd`, `shadow`, `ssh`,
/// `pip.conf`, `npmrc`, `gitconfig`, `environment`, `machine-id`, …).
pub const ETC_FROM_HOST: [&str; 19] = [
    "alternatives",
    "ca-certificates",
    "ca-certificates.conf",
    "debian_version",
    "gai.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "magic",
    "mime.types",
    "os-release",
    "pki",
    "protocols",
    "python3",
    "services",
    "ssl/certs",
    "ssl/openssl.cnf",
    "timezone",
];

/// The agent's user in a sandbox's generated `/etc/passwd` (uid and gid 1000).
pub const AGENT_USER: &str = "agent";

/// The agent's home in the generated `/etc/passwd` when its environment names none usable.
pub const DEFAULT_AGENT_HOME: &str = "/work";

/// A sandbox's generated `/etc/passwd`, with the agent's home at `home` (programs that look
/// their user up, as `ssh` and `getpwuid` callers do, find the same home as `HOME`).
pub fn generated_passwd(home: &str) -> String {
    format!(
        "root:x:0:0:root:/root:/usr/sbin/nologin\n\
         {AGENT_USER}:x:1000:1000:Tollgate agent:{home}:/bin/sh\n\
         nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )
}

/// The files a sandbox's `/etc` gets written for it, with the sandbox's `hostname`: users and
/// groups (root, the agent, nobody), the hosts it can name (itself and localhost), a resolver
/// configuration with no server (the sandbox has no network of its own) and a name-service
/// switch reading only these files. With a root file system of the run's choosing they are
/// bound over that userland's own.
pub fn generated_etc(hostname: &str) -> [(&'static str, String); 5] {
    [
        ("passwd", generated_passwd(DEFAULT_AGENT_HOME)),
        (
            "group",
            format!("root:x:0:\n{AGENT_USER}:x:1000:\nnogroup:x:65534:\n"),
        ),
        (
            "hosts",
            format!(
                "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{hostname}\n"
            ),
        ),
        (
            "resolv.conf",
            "# A Tollgate sandbox has no network of its own: no name server.\n".to_owned(),
        ),
        (
            "nsswitch.conf",
            "passwd: files\ngroup: files\nshadow: files\nhosts: files\nnetworks: files\n\
             protocols: files\nservices: files\nethers: files\nrpc: files\n"
                .to_owned(),
        ),
    ]
}

/// The port of the sandbox's own model endpoint on its `127.0.0.1` (OpenAI- and
/// Anthropic-compatible; it forwards to the gateway's `Complete`).
pub const MODELS_PORT: u16 = 7710;

/// The in-sandbox model endpoint: started by pid 1 before the agent when the receipt grants
/// a model route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelsEndpoint {
    /// Its port on the sandbox's `127.0.0.1`.
    pub port: u16,
}

/// The port of the sandbox's own HTTP proxy on its `127.0.0.1`: every outbound connection a
/// receipt grants goes through it (CONNECT, or a plain HTTP request in absolute form) and on
/// as one gateway `Egress` stream.
pub const EGRESS_PORT: u16 = 7711;

/// The in-sandbox egress proxy: started by pid 1 before the agent when the receipt grants
/// outbound connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressProxy {
    /// Its port on the sandbox's `127.0.0.1`.
    pub port: u16,
    /// Gateway connections it spreads its streams over (each carries at most 16 at once):
    /// enough for the receipt's `egress_connections`.
    pub channels: u16,
}

/// The proxy variables an agent gets when its receipt grants egress, upper and lower case,
/// so curl, pip, git, npm and the language runtimes all use the sandbox's proxy. Loopback
/// stays direct (the model endpoint, the agent's own servers).
pub fn proxy_env(port: u16) -> Vec<(String, String)> {
    let proxy = format!("http://127.0.0.1:{port}");
    let mut env = Vec::new();
    for (name, value) in [
        ("HTTP_PROXY", proxy.as_str()),
        ("HTTPS_PROXY", proxy.as_str()),
        ("ALL_PROXY", proxy.as_str()),
        ("NO_PROXY", "localhost,127.0.0.1,::1"),
    ] {
        env.push((name.to_owned(), value.to_owned()));
        env.push((name.to_ascii_lowercase(), value.to_owned()));
    }
    env
}

/// Where a run's egress certificate authority appears inside its sandbox (a read-only
/// directory: `ca.pem`, the run's CA; `bundle.pem`, the host's CA bundle followed by it),
/// when the receipt has a grant the supervisor inspects.
pub const EGRESS_CA_IN_SANDBOX: &str = "/run/tollgate/egress";

/// The trust variables an agent gets when its receipt has an inspected grant: the usual
/// clients trust the run's CA (and, through the bundle, everything the host trusts).
pub fn egress_ca_env() -> Vec<(String, String)> {
    let bundle = format!("{EGRESS_CA_IN_SANDBOX}/bundle.pem");
    let mut env: Vec<(String, String)> = [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "GIT_SSL_CAINFO",
    ]
    .into_iter()
    .map(|name| (name.to_owned(), bundle.clone()))
    .collect();
    env.push((
        "NODE_EXTRA_CA_CERTS".to_owned(),
        format!("{EGRESS_CA_IN_SANDBOX}/ca.pem"),
    ));
    env
}

/// Most bytes one gateway `fs.write` carries: one atomic change.
pub const MAX_WRITE_BYTES: usize = 16 << 20;

/// Where the shim binary appears inside every sandbox (first on the agent's PATH).
pub const SHIM_IN_SANDBOX: &str = "/run/tollgate/bin/tollgate-shim";
/// Where the run's gateway socket appears inside its sandbox.
pub const GATEWAY_IN_SANDBOX: &str = "/run/tollgate/gateway.sock";

/// One sandbox: what its receipt decides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxPlan {
    /// The run id (the receipt id).
    pub run_id: String,
    /// Host directory shown read-write at `/work` (for messages: the workspace itself comes
    /// as the first detached mount, see [`SandboxPlan::descriptors`]).
    pub workspace: PathBuf,
    /// Whether `/work` is mounted without `noexec` (the receipt's `workspace_exec`: W^X
    /// lifted for `/work` alone; `nosuid` stays).
    #[serde(default)]
    pub workspace_exec: bool,
    /// Size of the `/tmp` tmpfs.
    pub tmpfs_bytes: u64,
    /// The receipt's bind-mounted grants.
    pub binds: Vec<Bind>,
    /// Landlock allow-lists.
    pub landlock: LandlockPlan,
    /// The agent.
    pub agent: AgentCommand,
    /// The agent's uid and gid inside its user namespace.
    pub inner_id: u32,
    /// The host uid and gid the inner id maps to (unique to this sandbox).
    pub host_id: u32,
    /// Host path of the run's gateway socket (bound by the supervisor before the plan is
    /// sent; for messages: it comes as a detached mount), shown at [`GATEWAY_IN_SANDBOX`];
    /// none: no gateway.
    #[serde(default)]
    pub gateway_socket: Option<PathBuf>,
    /// The model endpoint to start; none: the receipt grants no model route.
    #[serde(default)]
    pub models: Option<ModelsEndpoint>,
    /// The egress proxy to start; none: the receipt grants no outbound connection.
    #[serde(default)]
    pub egress: Option<EgressProxy>,
    /// Host directory of the run's egress certificate authority (for messages: it comes as
    /// a detached mount), shown read-only at [`EGRESS_CA_IN_SANDBOX`]; none: the receipt
    /// inspects no host.
    #[serde(default)]
    pub egress_ca: Option<PathBuf>,
    /// `RLIMIT_NOFILE` (soft and hard) of the agent and of every command the gateway execs:
    /// the receipt's `limits.files`; 0 means `tollgate_proto::DEFAULT_FILES`.
    #[serde(default)]
    pub files: u32,
    /// The root file system the run chose (its host path, for messages: the userland itself
    /// comes as the last detached mount); none: the host's system paths and a generated
    /// `/etc`.
    #[serde(default)]
    pub rootfs: Option<PathBuf>,
    /// The agent's standard input.
    #[serde(default)]
    pub input: AgentInput,
    /// Programs the agent may run only through the gateway's exec tool (sandbox paths): the
    /// shim covers each before the agent exists, so the agent cannot execute or load them.
    #[serde(default)]
    pub hidden: Vec<PathBuf>,
    /// How many of the run's cgroup v1 `tasks` files come first among the plan's descriptors
    /// (0: the sandbox started in the run's cgroup in every hierarchy). A sandbox started with
    /// none prepared ahead on a hybrid host starts in the run's v2 directory and its shard's
    /// v1 cgroups, while the supervisor makes the run's v1 cgroups and limits beside it; pid 1
    /// joins them (writes `0` to each) before anything else of the plan, and the agent, forked
    /// later, is in them from its first instruction.
    #[serde(default)]
    pub cgroup_joins: usize,
}

impl SandboxPlan {
    /// How many descriptors come with the plan, in this order: the run's cgroup v1 `tasks`
    /// files pid 1 joins ([`SandboxPlan::cgroup_joins`], usually none); detached mounts
    /// (clones made by the supervisor, never a path the shim looks up) of the workspace, the
    /// egress certificate authority's directory when there is one, the gateway socket when
    /// there is one, each bind in order, and the root file system when there is one; then the
    /// run's gateway listening socket when there is a gateway, which pid 1 keeps.
    pub fn descriptors(&self) -> usize {
        let gateway = usize::from(self.gateway_socket.is_some());
        self.cgroup_joins
            + 1
            + usize::from(self.egress_ca.is_some())
            + gateway
            + self.binds.len()
            + usize::from(self.rootfs.is_some())
            + gateway
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(env: &[(&str, &str)]) -> AgentCommand {
        AgentCommand {
            argv: vec!["/bin/sh".into()],
            env: env
                .iter()
                .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
                .collect(),
            cwd: PathBuf::from("/work"),
        }
    }

    #[test]
    fn the_passwd_home_is_homes_value_when_a_passwd_line_can_hold_it() {
        assert_eq!(agent(&[("HOME", "/home/me")]).home(), "/home/me");
        assert!(generated_passwd("/home/me").contains(":Tollgate agent:/home/me:/bin/sh\n"));
        for unusable in ["", "relative", "/a:b", "/a\nroot::0:0::/:/bin/sh"] {
            assert_eq!(agent(&[("HOME", unusable)]).home(), DEFAULT_AGENT_HOME);
        }
        assert_eq!(agent(&[]).home(), DEFAULT_AGENT_HOME);
    }
}
