//! The TOML files operators write: run specs (`tollgate mint --spec run.toml`) and operator
//! ceilings (`tollgate operator add --ceiling ceiling.toml`).
//!
//! Parsing is strict: unknown keys are errors, so a typo never silently drops a limit.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tollgate_proto::v1 as pb;

/// A spec file could not be used. The message is one line naming the field and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// The file is not valid TOML or does not have the expected shape.
    #[error("{0}")]
    Syntax(TomlProblem),
    /// A field has a value that cannot be used.
    #[error("{field}: {reason}")]
    Invalid {
        /// Dotted path of the field, e.g. `limits.memory`.
        field: String,
        /// What is wrong and what to write instead.
        reason: String,
    },
}

impl From<crate::interpreters::InterpreterError> for SpecError {
    fn from(e: crate::interpreters::InterpreterError) -> Self {
        Self::Invalid {
            field: e.field,
            reason: e.reason,
        }
    }
}

impl SpecError {
    /// The error for a person, prefixed with the file it is about: `run.toml:3: exec.allow:
    /// invalid type: …` (the line where TOML was wrong) or `run.toml: limits.memory: …`.
    pub fn in_file(&self, file: &str) -> String {
        match self {
            Self::Syntax(problem) => problem.in_file(file),
            Self::Invalid { .. } => format!("{file}: {self}"),
        }
    }
}

pub use crate::toml_problem::{parse_toml, TomlProblem};

// serde's skip_serializing_if wants a function of a reference.
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_false(value: &bool) -> bool {
    !*value
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> SpecError {
    SpecError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// A size: an integer number of bytes or a string like `"512MiB"` or `"2 GB"`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum SizeValue {
    /// Bytes.
    Bytes(u64),
    /// Human form, parsed with binary (`KiB`, `MiB`, `GiB`) and decimal (`kB`, `MB`) units.
    Text(String),
}

impl SizeValue {
    fn bytes(&self, field: &str) -> Result<u64, SpecError> {
        let bytes = match self {
            Self::Bytes(bytes) => *bytes,
            Self::Text(text) => text
                .trim()
                .parse::<bytesize::ByteSize>()
                .map_err(|e| {
                    invalid(
                        field,
                        format!("{text:?} is not a size like \"512MiB\": {e}"),
                    )
                })?
                .as_u64(),
        };
        if bytes == 0 {
            return Err(invalid(field, "must be greater than zero"));
        }
        Ok(bytes)
    }
}

/// Parses a size like `"512MiB"`, `"2 GB"` or `"4096"` (bytes); never zero.
pub fn parse_size(field: &str, text: &str) -> Result<u64, SpecError> {
    match text.trim().parse::<u64>() {
        Ok(bytes) => SizeValue::Bytes(bytes),
        Err(_) => SizeValue::Text(text.to_owned()),
    }
    .bytes(field)
}

/// Parses a duration like `"10m"`, `"1h 30m"` or `"90s"`.
pub fn parse_duration(field: &str, text: &str) -> Result<Duration, SpecError> {
    let duration = humantime::parse_duration(text.trim()).map_err(|e| {
        invalid(
            field,
            format!("{text:?} is not a duration like \"10m\": {e}"),
        )
    })?;
    if duration.as_secs() == 0 {
        return Err(invalid(field, "must be at least one second"));
    }
    Ok(duration)
}

/// `[limits]` of a run spec or ceiling. Absent fields are left to defaults (run spec) or
/// uncapped (ceiling).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LimitsSpec {
    /// Memory of the run's cgroup.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<SizeValue>,
    /// Processes and threads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pids: Option<u32>,
    /// CPU cores, fractional allowed (`0.5`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<f64>,
    /// Output bytes relayed or returned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<SizeValue>,
    /// Size of `/tmp`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tmpfs: Option<SizeValue>,
    /// Gateway tool calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<u64>,
    /// Model tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// Open file descriptors of each sandbox process (`RLIMIT_NOFILE`); default 1024.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub files: Option<u32>,
    /// Outbound connections open at once; default 16.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_connections: Option<u32>,
    /// Bytes the run's outbound connections carry, each way; default 1 GiB.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_bytes: Option<SizeValue>,
    /// How long an outbound connection may be idle, e.g. `"60s"` (the default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_idle: Option<String>,
}

impl LimitsSpec {
    /// No limit is set.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    /// The limits as a protocol message; absent fields are zero.
    pub fn to_proto(&self) -> Result<pb::Limits, SpecError> {
        let size = |value: &Option<SizeValue>, field: &str| {
            value.as_ref().map_or(Ok(0), |v| v.bytes(field))
        };
        let nonzero = |value: Option<u64>, field: &str| match value {
            Some(0) => Err(invalid(field, "must be greater than zero")),
            other => Ok(other.unwrap_or(0)),
        };
        let cpu_millicores = match self.cpu {
            None => 0,
            Some(cores) if (0.001..=4096.0).contains(&cores) => (cores * 1000.0).round() as u32,
            Some(cores) => {
                return Err(invalid(
                    "limits.cpu",
                    format!("{cores} is not a core count between 0.001 and 4096"),
                ))
            }
        };
        Ok(pb::Limits {
            memory_bytes: size(&self.memory, "limits.memory")?,
            pids: u32::try_from(nonzero(self.pids.map(u64::from), "limits.pids")?)
                .unwrap_or(u32::MAX),
            cpu_millicores,
            output_bytes: size(&self.output, "limits.output")?,
            tmpfs_bytes: size(&self.tmpfs, "limits.tmpfs")?,
            tool_calls: nonzero(self.tool_calls, "limits.tool_calls")?,
            tokens: nonzero(self.tokens, "limits.tokens")?,
            files: match self.files {
                Some(files) if files > tollgate_proto::MAX_FILES => {
                    return Err(invalid(
                        "limits.files",
                        format!("{files} is above {}", tollgate_proto::MAX_FILES),
                    ))
                }
                files => u32::try_from(nonzero(files.map(u64::from), "limits.files")?)
                    .unwrap_or(u32::MAX),
            },
            egress_connections: u32::try_from(nonzero(
                self.egress_connections.map(u64::from),
                "limits.egress_connections",
            )?)
            .unwrap_or(u32::MAX),
            egress_bytes: size(&self.egress_bytes, "limits.egress_bytes")?,
            egress_idle_seconds: match &self.egress_idle {
                Some(text) => u32::try_from(parse_duration("limits.egress_idle", text)?.as_secs())
                    .map_err(|_| invalid("limits.egress_idle", "must be at most 136 years"))?,
                None => 0,
            },
        })
    }
}

/// One `[[fs]]` grant.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FsSpec {
    /// Absolute host path.
    pub path: String,
    /// `"read"` or `"write"`.
    pub access: String,
    /// Optional absolute path inside the sandbox to bind-mount at.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mount: Option<String>,
    /// Mount it executable (grants with a mount only). A read grant: its shared libraries
    /// load and the `exec` programs beneath it run. A write grant: W^X lifted for it alone,
    /// the agent runs what it builds there. In a ceiling (write entries only): executable
    /// write grants may be minted beneath it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub exec: bool,
    /// Each change the gateway makes beneath it waits for an operator's approval (grants
    /// without `mount` only). In a ceiling: grants minted beneath it must ask.
    #[serde(default, skip_serializing_if = "is_false")]
    pub ask: bool,
    /// Each read the gateway makes beneath it waits for an operator's approval too (grants
    /// without `mount`, and no mount reaching the same files). In a ceiling: grants minted
    /// beneath it must ask before reads.
    #[serde(default, skip_serializing_if = "is_false")]
    pub ask_reads: bool,
}

/// Parses `read` / `write`.
pub fn parse_access(field: &str, text: &str) -> Result<pb::FsAccess, SpecError> {
    match text.to_ascii_lowercase().as_str() {
        "read" => Ok(pb::FsAccess::Read),
        "write" => Ok(pb::FsAccess::Write),
        _ => Err(invalid(
            field,
            format!("{text:?} is not \"read\" or \"write\""),
        )),
    }
}

/// Parses `low` / `medium` / `high`.
pub fn parse_sensitivity(field: &str, text: &str) -> Result<pb::Sensitivity, SpecError> {
    match text.to_ascii_lowercase().as_str() {
        "low" => Ok(pb::Sensitivity::Low),
        "medium" => Ok(pb::Sensitivity::Medium),
        "high" => Ok(pb::Sensitivity::High),
        _ => Err(invalid(
            field,
            format!("{text:?} is not \"low\", \"medium\" or \"high\""),
        )),
    }
}

pub use tollgate_proto::{access_name, sensitivity_name};

fn fs_to_proto(grants: &[FsSpec]) -> Result<Vec<pb::FsGrant>, SpecError> {
    grants
        .iter()
        .enumerate()
        .map(|(i, grant)| {
            Ok(pb::FsGrant {
                path: grant.path.clone(),
                access: parse_access(&format!("fs[{i}].access"), &grant.access)? as i32,
                mount: grant.mount.clone().unwrap_or_default(),
                exec: grant.exec,
                ask: grant.ask,
                ask_reads: grant.ask_reads,
            })
        })
        .collect()
}

/// `[approvals]`: how calls that ask for approval wait.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ApprovalsSection {
    /// How long a call waits for a decision before it is denied, e.g. `"2m"` (default 5m,
    /// at most 1 day and the run's ttl).
    pub timeout: String,
}

/// How long a call waits for approval when the run spec does not say.
pub const DEFAULT_APPROVAL_TIMEOUT: Duration = Duration::from_secs(300);

/// Longest wait for an approval a receipt may ask for.
pub const MAX_APPROVAL_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// One `[[routes]]` grant.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RouteSpec {
    /// Route name from the supervisor's configuration (`"*"` in a ceiling: any route).
    pub name: String,
    /// `"low"`, `"medium"` or `"high"`.
    pub max_sensitivity: String,
    /// Each call this route carries waits for an operator's approval. In a ceiling: grants
    /// of the route must ask.
    #[serde(default, skip_serializing_if = "is_false")]
    pub ask: bool,
}

fn routes_to_proto(routes: &[RouteSpec]) -> Result<Vec<pb::RouteGrant>, SpecError> {
    routes
        .iter()
        .enumerate()
        .map(|(i, route)| {
            Ok(pb::RouteGrant {
                name: route.name.clone(),
                max_sensitivity: parse_sensitivity(
                    &format!("routes[{i}].max_sensitivity"),
                    &route.max_sensitivity,
                )? as i32,
                ask: route.ask,
            })
        })
        .collect()
}

/// One `[[egress]]` grant: where the run may connect through the supervisor.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EgressSpec {
    /// `"api.example.com"`, `"*.example.com"` or an IP address (`"*"` in a ceiling: any).
    pub host: String,
    /// Ports; default `[443]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u32>,
    /// `"low"` (the default), `"medium"` or `"high"`: the most sensitive text sent there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_sensitivity: Option<String>,
    /// A secret of the supervisor's whose header is added to each request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inject: Option<String>,
    /// HTTP methods allowed per request (inspected hosts).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    /// Path prefixes allowed per request (inspected hosts).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    /// Terminate TLS and read each request; implied by `inject`, `methods` and `paths`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inspect: Option<bool>,
    /// Each new connection waits for an operator's approval. In a ceiling: grants minted
    /// beneath it must ask.
    #[serde(default, skip_serializing_if = "is_false")]
    pub ask: bool,
}

fn egress_to_proto(grants: &[EgressSpec]) -> Result<Vec<pb::EgressGrant>, SpecError> {
    grants
        .iter()
        .enumerate()
        .map(|(i, grant)| {
            let needs_inspection =
                grant.inject.is_some() || !grant.methods.is_empty() || !grant.paths.is_empty();
            if grant.inspect == Some(false) && needs_inspection {
                return Err(invalid(
                    format!("egress[{i}].inspect"),
                    "inject, methods and paths need the supervisor to read each request: drop inspect = false",
                ));
            }
            Ok(pb::EgressGrant {
                host: grant.host.clone(),
                ports: grant.ports.clone(),
                max_sensitivity: match &grant.max_sensitivity {
                    Some(text) => {
                        parse_sensitivity(&format!("egress[{i}].max_sensitivity"), text)? as i32
                    }
                    None => pb::Sensitivity::Low as i32,
                },
                inject: grant.inject.clone().unwrap_or_default(),
                methods: grant.methods.clone(),
                paths: grant.paths.clone(),
                inspect: grant.inspect.unwrap_or(needs_inspection),
                ask: grant.ask,
            })
        })
        .collect()
}

/// `[agent]`: a pinned command.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AgentSection {
    /// Executable (absolute path) and arguments; empty: the command is given when the run
    /// starts (and must be listed in `exec`), with this section's env and workdir.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub argv: Vec<String>,
    /// Extra environment variables.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory inside the sandbox.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
}

/// `[exec]`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExecSection {
    /// Absolute paths of executables the agent may run (directly, or with the exec tool).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// Programs the agent may run only through the gateway's exec tool: each run checked and
    /// audited with its argv; the agent cannot execute them itself.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateway: Vec<String>,
    /// Programs run only through the gateway's exec tool, each run approved by an operator
    /// first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ask: Vec<String>,
    /// A program beneath a grant that links outside every grant (a virtualenv's
    /// `bin/python` made from a pyenv, uv or conda Python): `"refuse"` (the default) or
    /// `"follow"` (grant the interpreter's installation read-only and executable).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interpreters: Option<String>,
}

impl ExecSection {
    /// Nothing is listed or set.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    /// The gateway-only grants: `gateway` then `ask`.
    pub fn gateway_grants(&self) -> Result<Vec<pb::GatewayExecGrant>, SpecError> {
        let grants: Vec<pb::GatewayExecGrant> = self
            .gateway
            .iter()
            .map(|program| (program, false))
            .chain(self.ask.iter().map(|program| (program, true)))
            .map(|(program, ask)| pb::GatewayExecGrant {
                program: program.clone(),
                ask,
            })
            .collect();
        for (i, grant) in grants.iter().enumerate() {
            if self.allow.contains(&grant.program)
                || grants[..i].iter().any(|g| g.program == grant.program)
            {
                return Err(invalid(
                    if grant.ask { "exec.ask" } else { "exec.gateway" },
                    format!(
                        "{:?} is listed twice: a program is in exactly one of allow (the agent runs it), gateway (only through the gateway) and ask (only through the gateway, each run approved)",
                        grant.program
                    ),
                ));
            }
        }
        Ok(grants)
    }
}

/// `[rootfs]`: the userland the sandbox runs on instead of the host's; exactly one of the two.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RootfsSection {
    /// An unpacked root file system at this absolute host path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// One registered with the supervisor (`tollgate rootfs import NAME FILE.tar`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl RootfsSection {
    fn to_field(&self) -> Result<String, SpecError> {
        let value = match (&self.path, &self.name) {
            (Some(path), None) if path.starts_with('/') => path.clone(),
            (Some(path), None) => {
                return Err(invalid(
                    "rootfs.path",
                    format!(
                    "{path:?} must be an absolute host path; a registered userland is rootfs.name"
                ),
                ))
            }
            (None, Some(name)) if !name.starts_with('/') => name.clone(),
            (None, Some(name)) => {
                return Err(invalid(
                    "rootfs.name",
                    format!("{name:?} is a path; write rootfs.path = {name:?} instead"),
                ))
            }
            _ => {
                return Err(invalid(
                    "rootfs",
                    "give exactly one of path = \"/srv/rootfs/x\" or name = \"x\"",
                ))
            }
        };
        crate::paths::Rootfs::parse(&value, &[]).map_err(|e| {
            invalid(
                if self.path.is_some() {
                    "rootfs.path"
                } else {
                    "rootfs.name"
                },
                e.to_string(),
            )
        })?;
        Ok(value)
    }
}

/// `[workspace]`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceSection {
    /// How long `/work` is kept after the run ends, e.g. `"1h"` (at most 30 days); absent:
    /// removed at teardown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep: Option<String>,
    /// `/work` mounted executable: the agent runs what it builds there (W^X lifted for
    /// `/work` alone).
    #[serde(default, skip_serializing_if = "is_false")]
    pub exec: bool,
}

/// `[home]`: the agent's own host directory, kept across runs, mounted writable at its
/// `$HOME`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HomeSection {
    /// Absolute host path; never your own home, an ancestor of it, or a system path.
    pub path: String,
    /// Where the sandbox shows it, and what `HOME` says (default `/home/agent`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mount: Option<String>,
    /// Executable (W^X lifted for the home alone); default `noexec`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub exec: bool,
}

/// Longest a run's workspace may be kept after it ends.
pub const MAX_WORKSPACE_KEEP: Duration = Duration::from_secs(30 * 24 * 3600);

/// `[delegate]`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DelegateSection {
    /// Levels of descendants allowed.
    pub max_depth: u32,
    /// Each child receipt asked for waits for an operator's approval.
    #[serde(default, skip_serializing_if = "is_false")]
    pub ask: bool,
}

/// A run spec: what an operator asks the authority to sign.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RunSpec {
    /// The profile this spec starts from (`"claude-code"`): its settings, then this file's on
    /// top (see the `profile` module). Absent in an expanded spec.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// Values of the profile's variables (`project = "/home/me/project"`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub vars: BTreeMap<String, String>,
    /// The agent's name (required, here or from the profile).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub subject: String,
    /// Lifetime, e.g. `"10m"` (required, here or from the profile).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ttl: String,
    /// Supervisor ids (required, here or from the profile).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audience: Vec<String>,
    /// The agent: its command (pinned, or given when the run starts), environment and
    /// working directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentSection>,
    /// Limits.
    #[serde(default, skip_serializing_if = "LimitsSpec::is_empty")]
    pub limits: LimitsSpec,
    /// File-system grants.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fs: Vec<FsSpec>,
    /// Executables.
    #[serde(default, skip_serializing_if = "ExecSection::is_empty")]
    pub exec: ExecSection,
    /// Model routes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<RouteSpec>,
    /// Delegation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delegate: Option<DelegateSection>,
    /// The userland to run on; absent: the host's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<RootfsSection>,
    /// The workspace; absent: removed at teardown, not executable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workspace: Option<WorkspaceSection>,
    /// The agent's home; absent: `HOME` is `/work`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub home: Option<HomeSection>,
    /// Outbound connections through the supervisor.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<EgressSpec>,
    /// How calls that ask for approval wait.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approvals: Option<ApprovalsSection>,
}

impl RunSpec {
    /// Parses a run spec from TOML text.
    pub fn parse(text: &str) -> Result<Self, SpecError> {
        parse_toml(text).map_err(SpecError::Syntax)
    }

    /// The mint request this spec asks for. Checks shapes; the authority checks the ceiling.
    /// Reads no files: use [`RunSpec::to_request_for`] on the operator's host.
    pub fn to_request(&self) -> Result<pb::MintReceiptRequest, SpecError> {
        self.request(None)
    }

    /// [`RunSpec::to_request`] on the operator's host: also refuses a `[home]` that is
    /// `user_home` (the operator's own `$HOME`) or one of its ancestors (an agent never owns
    /// its operator's home), and checks the programs beneath its grants for links outside
    /// them, reading this host's files (see [`crate::interpreters`]).
    pub fn to_request_for(
        &self,
        user_home: Option<&str>,
    ) -> Result<pb::MintReceiptRequest, SpecError> {
        let mut request = self.request(user_home)?;
        let mode = match &self.exec.interpreters {
            Some(text) => crate::interpreters::Interpreters::parse("exec.interpreters", text)?,
            None => crate::interpreters::Interpreters::default(),
        };
        crate::interpreters::check_interpreters(&mut request, mode)?;
        Ok(request)
    }

    fn request(&self, user_home: Option<&str>) -> Result<pb::MintReceiptRequest, SpecError> {
        if let Some(profile) = &self.profile {
            return Err(invalid(
                "profile",
                format!("{profile:?} is not expanded yet: mint it with tollgate mint, which expands profiles"),
            ));
        }
        if !self.vars.is_empty() {
            return Err(invalid(
                "vars",
                "only a spec that names a profile has variables: add profile = \"NAME\" or drop [vars]",
            ));
        }
        if self.subject.trim().is_empty() {
            return Err(invalid(
                "subject",
                "missing: give the agent's name, e.g. subject = \"coder\"",
            ));
        }
        if self.ttl.trim().is_empty() {
            return Err(invalid(
                "ttl",
                "missing: give the receipt's lifetime, e.g. ttl = \"30m\"",
            ));
        }
        if self.audience.is_empty() {
            return Err(invalid(
                "audience",
                "must name at least one supervisor id, e.g. audience = [\"workstation\"]",
            ));
        }
        let ttl = parse_duration("ttl", &self.ttl)?;
        let mut fs = fs_to_proto(&self.fs)?;
        let home = match &self.home {
            Some(home) => {
                let mount = home
                    .mount
                    .clone()
                    .unwrap_or_else(|| crate::paths::DEFAULT_HOME_MOUNT.into());
                fs.push(pb::FsGrant {
                    path: home.path.clone(),
                    access: pb::FsAccess::Write as i32,
                    mount: mount.clone(),
                    exec: home.exec,
                    ask: false,
                    ask_reads: false,
                });
                crate::paths::check_home(&mount, &fs, user_home)
                    .map_err(|e| invalid("home.path", e.to_string()))?;
                mount
            }
            None => String::new(),
        };
        Ok(pb::MintReceiptRequest {
            subject: self.subject.clone(),
            ttl_seconds: ttl.as_secs(),
            audience: self.audience.clone(),
            agent: self.agent.as_ref().map(|agent| pb::AgentSpec {
                argv: agent.argv.clone(),
                env: agent.env.clone().into_iter().collect(),
                workdir: agent.workdir.clone().unwrap_or_default(),
            }),
            limits: Some(self.limits.to_proto()?),
            fs,
            home,
            workspace_exec: self.workspace.as_ref().is_some_and(|w| w.exec),
            exec: self.exec.allow.clone(),
            gateway_exec: self.exec.gateway_grants()?,
            routes: routes_to_proto(&self.routes)?,
            delegate: self.delegate.as_ref().map(|d| pb::Delegation {
                max_depth: d.max_depth,
                ask: d.ask,
            }),
            not_before: None,
            rootfs: match &self.rootfs {
                Some(rootfs) => rootfs.to_field()?,
                None => String::new(),
            },
            workspace_keep_seconds: match self.workspace.as_ref().and_then(|w| w.keep.as_ref()) {
                Some(keep) => {
                    let keep = parse_duration("workspace.keep", keep)?;
                    if keep > MAX_WORKSPACE_KEEP {
                        return Err(invalid("workspace.keep", "must be at most 30 days"));
                    }
                    keep.as_secs()
                }
                None => 0,
            },
            egress: egress_to_proto(&self.egress)?,
            approval_timeout_seconds: match &self.approvals {
                Some(approvals) => {
                    let timeout = parse_duration("approvals.timeout", &approvals.timeout)?;
                    if timeout.is_zero() || timeout > MAX_APPROVAL_TIMEOUT {
                        return Err(invalid("approvals.timeout", "must be between 1s and 1 day"));
                    }
                    timeout.as_secs()
                }
                None => 0,
            },
        })
    }
}

/// An operator ceiling: the most an operator may grant.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CeilingSpec {
    /// Longest ttl, e.g. `"8h"`.
    pub max_ttl: String,
    /// Allowed supervisor ids; empty means any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audience: Vec<String>,
    /// Allowed executables; an entry ending in `/` covers a directory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exec: Vec<String>,
    /// Executables granted only through the gateway, each run approved (`[exec] ask` of a run
    /// spec); an entry ending in `/` covers a directory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exec_ask: Vec<String>,
    /// Highest delegation depth.
    #[serde(default)]
    pub max_delegate_depth: u32,
    /// Every delegate grant minted under it must ask.
    #[serde(default, skip_serializing_if = "is_false")]
    pub delegate_ask: bool,
    /// Path grants that cover requested paths beneath them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fs: Vec<FsSpec>,
    /// Routes (`"*"` for any).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<RouteSpec>,
    /// Caps; absent means uncapped.
    #[serde(default, skip_serializing_if = "LimitsSpec::is_empty")]
    pub limits: LimitsSpec,
    /// Outbound connections operators may grant (`host = "*"`: any host).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<EgressSpec>,
}

impl CeilingSpec {
    /// Parses a ceiling from TOML text.
    pub fn parse(text: &str) -> Result<Self, SpecError> {
        parse_toml(text).map_err(SpecError::Syntax)
    }

    /// The ceiling as a protocol message.
    pub fn to_proto(&self) -> Result<pb::Ceiling, SpecError> {
        Ok(pb::Ceiling {
            fs: fs_to_proto(&self.fs)?,
            exec: self.exec.clone(),
            routes: routes_to_proto(&self.routes)?,
            limits: Some(self.limits.to_proto()?),
            max_ttl_seconds: parse_duration("max_ttl", &self.max_ttl)?.as_secs(),
            audience: self.audience.clone(),
            max_delegate_depth: self.max_delegate_depth,
            delegate_ask: self.delegate_ask,
            egress: egress_to_proto(&self.egress)?,
            exec_ask: self.exec_ask.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    mod building;

    use super::*;

    /// DESIGN.md's example run spec, as shipped in examples/.
    const DESIGN_EXAMPLE: &str = include_str!("../../examples/run.toml");

    #[test]
    fn toml_errors_name_the_line_and_the_key() {
        let text = "subject = \"s\"\nttl = \"1m\"\naudience = [\"sup\"]\n\n[exec]\nallow = \"x\"\n";
        let shown = RunSpec::parse(text).unwrap_err().in_file("run.toml");
        assert_eq!(
            shown,
            "run.toml:6: exec.allow: invalid type: string \"x\", expected a sequence"
        );
        // In an array of tables, the entry is named by its index; an unknown key by itself.
        let text = "subject = \"s\"\nttl = \"1m\"\naudience = [\"sup\"]\n[[fs]]\npath = \"/a\"\naccess = \"read\"\n[[fs]]\npath = \"/b\"\nacess = \"read\"\n";
        let shown = RunSpec::parse(text).unwrap_err().in_file("run.toml");
        assert!(
            shown.starts_with("run.toml:9: fs[1].acess: unknown field"),
            "{shown}"
        );
        // A ceiling file goes through the same path.
        let shown = CeilingSpec::parse("max_ttl = \"1h\"\n[limits]\nmemory = [1]\n")
            .unwrap_err()
            .in_file("ceiling.toml");
        assert!(
            shown.starts_with("ceiling.toml:3: limits.memory: "),
            "{shown}"
        );
        assert!(!shown.contains("byte"), "{shown}");
    }

    #[test]
    fn design_example_parses_to_the_expected_request() {
        let request = RunSpec::parse(DESIGN_EXAMPLE)
            .unwrap()
            .to_request()
            .unwrap();
        assert_eq!(request.ttl_seconds, 600);
        let limits = request.limits.unwrap();
        assert_eq!(limits.memory_bytes, 512 * 1024 * 1024);
        assert_eq!(limits.cpu_millicores, 1000);
        assert_eq!(limits.output_bytes, 5 * 1024 * 1024);
        assert_eq!(limits.pids, 64);
        assert_eq!(request.fs[0].access, pb::FsAccess::Read as i32);
        assert_eq!(request.fs[0].mount, "/project");
        assert_eq!(
            request.routes[1].max_sensitivity,
            pb::Sensitivity::Low as i32
        );
        assert_eq!(request.delegate.unwrap().max_depth, 1);
        assert_eq!(request.agent.unwrap().argv[0], "/project/.venv/bin/python");
        assert_eq!(request.exec[0], "/project/.venv/bin/python");
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_field() {
        let typo = "subject='a'\nttl='1m'\naudience=['w']\n[limits]\nmemroy='1GiB'\n";
        let error = RunSpec::parse(typo).unwrap_err().to_string();
        assert!(error.contains("memroy"), "{error}");
        assert!(!error.contains('\n'));

        let bad_size = "subject='a'\nttl='1m'\naudience=['w']\n[limits]\nmemory='lots'\n";
        let error = RunSpec::parse(bad_size).unwrap().to_request().unwrap_err();
        assert!(error.to_string().starts_with("limits.memory:"), "{error}");

        let bad_ttl = "subject='a'\nttl='soon'\naudience=['w']\n";
        let error = RunSpec::parse(bad_ttl).unwrap().to_request().unwrap_err();
        assert!(error.to_string().starts_with("ttl:"), "{error}");

        let bad_access = "subject='a'\nttl='1m'\naudience=['w']\n[[fs]]\npath='/x'\naccess='rw'\n";
        let error = RunSpec::parse(bad_access)
            .unwrap()
            .to_request()
            .unwrap_err();
        assert!(error.to_string().starts_with("fs[0].access:"), "{error}");

        let no_audience = "subject='a'\nttl='1m'\naudience=[]\n";
        let error = RunSpec::parse(no_audience)
            .unwrap()
            .to_request()
            .unwrap_err();
        assert!(error.to_string().starts_with("audience:"), "{error}");
    }

    #[test]
    fn gateway_only_programs_are_listed_once_each() {
        let spec = |exec: &str| {
            RunSpec::parse(&format!(
                "subject='a'\nttl='1m'\naudience=['w']\n[exec]\n{exec}\n"
            ))
            .unwrap()
            .to_request()
        };
        let request =
            spec("allow = ['/bin/sh']\ngateway = ['/usr/bin/make']\nask = ['/usr/bin/git']")
                .unwrap();
        assert_eq!(request.exec, ["/bin/sh"]);
        let gateway: Vec<(&str, bool)> = request
            .gateway_exec
            .iter()
            .map(|g| (g.program.as_str(), g.ask))
            .collect();
        assert_eq!(gateway, [("/usr/bin/make", false), ("/usr/bin/git", true)]);
        for bad in [
            "allow = ['/usr/bin/git']\nask = ['/usr/bin/git']",
            "gateway = ['/usr/bin/git']\nask = ['/usr/bin/git']",
        ] {
            let error = spec(bad).unwrap_err().to_string();
            assert!(error.contains("listed twice"), "{bad}: {error}");
        }
    }

    #[test]
    fn a_rootfs_is_a_path_or_a_name() {
        let spec = |rootfs: &str| {
            RunSpec::parse(&format!(
                "subject='a'\nttl='1m'\naudience=['w']\n[rootfs]\n{rootfs}\n"
            ))
            .unwrap()
            .to_request()
        };
        assert_eq!(spec("path = '/srv/trixie'").unwrap().rootfs, "/srv/trixie");
        assert_eq!(spec("name = 'trixie'").unwrap().rootfs, "trixie");
        for (bad, field) in [
            ("path = 'trixie'", "rootfs.path:"),
            ("name = '/srv/x'", "rootfs.name:"),
            ("path = '/a'\nname = 'b'", "rootfs:"),
            ("name = '../x'", "rootfs.name:"),
        ] {
            let error = spec(bad).unwrap_err().to_string();
            assert!(error.starts_with(field), "{bad}: {error}");
        }
    }

    #[test]
    fn shipped_ceiling_parses() {
        let ceiling = CeilingSpec::parse(include_str!("../../examples/ceiling.toml")).unwrap();
        assert_eq!(
            ceiling.to_proto().unwrap().limits.unwrap().cpu_millicores,
            2000
        );
    }

    #[test]
    fn ceiling_parses() {
        let text = r#"
max_ttl = "8h"
exec = ["/usr/bin/"]
[[fs]]
path = "/home/me"
access = "write"
[[routes]]
name = "*"
max_sensitivity = "medium"
[limits]
memory = "2GiB"
"#;
        let ceiling = CeilingSpec::parse(text).unwrap().to_proto().unwrap();
        assert_eq!(ceiling.max_ttl_seconds, 8 * 3600);
        assert_eq!(ceiling.limits.unwrap().memory_bytes, 2 << 30);
        assert_eq!(ceiling.limits.unwrap().pids, 0);
    }
}
