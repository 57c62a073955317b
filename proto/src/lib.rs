//! Generated types and gRPC services of the `tollgate.v1` protocol.
//!
//! The `.proto` files under `proto/tollgate/v1/` at the repository root are the source of
//! truth and the API documentation for clients in other languages; this crate only compiles
//! them (with protox, so no system `protoc` is needed).
#![forbid(unsafe_code)]

/// The `tollgate.v1` package: messages, enums, clients and servers.
#[allow(missing_docs, clippy::all, unused_qualifications)]
pub mod v1 {
    tonic::include_proto!("tollgate.v1");
}

/// `Limits.files` when a receipt leaves it at 0: RLIMIT_NOFILE of the agent and its exec'd
/// commands.
pub const DEFAULT_FILES: u32 = 1024;
/// Highest `Limits.files` a receipt may carry (Linux's default `fs.nr_open`, above which
/// `setrlimit` fails).
pub const MAX_FILES: u32 = 1 << 20;

/// The open-file limit a receipt's `Limits.files` gives its sandbox: 0 means [`DEFAULT_FILES`].
pub fn effective_files(files: u32) -> u32 {
    if files == 0 {
        DEFAULT_FILES
    } else {
        files
    }
}

/// `Limits.egress_connections` when a receipt leaves it at 0: outbound connections open at once.
pub const DEFAULT_EGRESS_CONNECTIONS: u32 = 16;
/// `Limits.egress_bytes` when a receipt leaves it at 0: bytes each way over the whole run.
pub const DEFAULT_EGRESS_BYTES: u64 = 1 << 30;
/// `Limits.egress_idle_seconds` when a receipt leaves it at 0.
pub const DEFAULT_EGRESS_IDLE_SECONDS: u32 = 60;

/// What a hand-off connection to a gateway socket sends first, before its token and with the
/// client's socket attached (see the gateway's `Egress` call). Its first byte tells it from an
/// HTTP/2 connection (`PRI …`).
pub const EGRESS_TUNNEL_PREFACE: &[u8; 18] = b"TOLLGATE-TUNNEL/1\n";
/// Bytes in an egress hand-off's token (`EgressOpened.tunnel_token`).
pub const EGRESS_TUNNEL_TOKEN_LEN: usize = 16;
/// Metadata on the status that ends an `Egress` call whose plain HTTP request was refused
/// before any answer reached the client: the supervisor left the client's connection open
/// for the proxy to answer with the refusal.
pub const EGRESS_UNANSWERED: &str = "tollgate-egress-unanswered";

/// The egress bounds a receipt's limits give its run, each 0 replaced by its default:
/// (connections open at once, bytes each way, idle seconds).
pub fn effective_egress(limits: &v1::Limits) -> (u32, u64, u32) {
    let or = |value: u64, default: u64| if value == 0 { default } else { value };
    (
        or(
            limits.egress_connections.into(),
            DEFAULT_EGRESS_CONNECTIONS.into(),
        ) as u32,
        or(limits.egress_bytes, DEFAULT_EGRESS_BYTES),
        or(
            limits.egress_idle_seconds.into(),
            DEFAULT_EGRESS_IDLE_SECONDS.into(),
        ) as u32,
    )
}

/// Directories every sandbox shows read-only at the same path: from the host (those it has;
/// `/etc` generated, not the host's) or from the run's root file system. No grant may be
/// mounted at or beneath one (the shim would follow links there as root); the supervisor
/// shows exactly this list, so what it shows and what a receipt may not cover cannot drift
/// apart.
pub const SYSTEM_PATHS: [&str; 8] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
];

/// The lowercase name of an `FsAccess` value (`"unspecified"` for unknown values).
pub fn access_name(value: i32) -> &'static str {
    match v1::FsAccess::try_from(value) {
        Ok(v1::FsAccess::Read) => "read",
        Ok(v1::FsAccess::Write) => "write",
        _ => "unspecified",
    }
}

/// The lowercase name of a `Sensitivity` value (`"unspecified"` for unknown values).
pub fn sensitivity_name(value: i32) -> &'static str {
    match v1::Sensitivity::try_from(value) {
        Ok(v1::Sensitivity::Low) => "low",
        Ok(v1::Sensitivity::Medium) => "medium",
        Ok(v1::Sensitivity::High) => "high",
        _ => "unspecified",
    }
}

/// Whether `path` equals or lies beneath `prefix` (both normalised), by whole components:
/// `/home/me` does not cover `/home/meow`. `/` covers everything.
pub fn path_within(path: &str, prefix: &str) -> bool {
    prefix == "/"
        || path == prefix
        || (path.starts_with(prefix) && path.as_bytes().get(prefix.len()) == Some(&b'/'))
}

/// One entry of a receipt's `exec` list: the path (without the trailing `/` of a directory
/// entry) and whether it is a directory (`"/usr/bin/"`: every program beneath it).
pub fn exec_entry(entry: &str) -> (&str, bool) {
    match entry.strip_suffix('/') {
        Some("") => ("/", true),
        Some(dir) => (dir, true),
        None => (entry, false),
    }
}

/// Whether a receipt's `exec` list lets the agent run `program` (a path inside the sandbox):
/// listed as a file, or beneath a directory entry.
pub fn exec_allows(exec: &[String], program: &str) -> bool {
    exec.iter().any(|entry| match exec_entry(entry) {
        (dir, true) => program != dir && path_within(program, dir),
        (file, false) => file == program,
    })
}

impl v1::FsGrant {
    /// Whether this grant is mounted executable (without `noexec`): a WRITE grant with a
    /// mount that says `exec` (W^X lifted for it alone), or a READ grant with a mount that
    /// says `exec` or whose mount holds one of the receipt's `exec` paths or lies beneath one
    /// of its directory entries.
    pub fn is_executable(&self, exec: &[String]) -> bool {
        if self.mount.is_empty() {
            return false;
        }
        if self.access == v1::FsAccess::Write as i32 {
            return self.exec;
        }
        self.access == v1::FsAccess::Read as i32
            && (self.exec
                || exec.iter().any(|entry| {
                    let (path, directory) = exec_entry(entry);
                    path_within(path, &self.mount) || (directory && path_within(&self.mount, path))
                }))
    }

    /// Whether this is a WRITE grant whose mount the receipt makes executable: W^X lifted
    /// for it alone, everything beneath its mount may run.
    pub fn is_writable_executable(&self) -> bool {
        self.access == v1::FsAccess::Write as i32 && self.exec && !self.mount.is_empty()
    }
}

/// Encoded `FileDescriptorSet` of every tollgate proto file, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/tollgate_descriptor.bin"));

pub use prost;
pub use prost_types;

impl v1::EgressGrant {
    /// Whether the supervisor reads this grant's requests: `inspect`, or anything that
    /// needs it (`inject`, `methods`, `paths`).
    pub fn is_inspected(&self) -> bool {
        self.inspect
            || !self.inject.is_empty()
            || !self.methods.is_empty()
            || !self.paths.is_empty()
    }

    /// One line for people: `api.github.com:443 up to low, inspected: GET under /repos/acme/,
    /// injects github`.
    pub fn summary(&self) -> String {
        let ports: Vec<String> = self.ports.iter().map(u32::to_string).collect();
        let mut text = format!(
            "{}:{} up to {}",
            self.host,
            if ports.is_empty() {
                "*".to_owned()
            } else {
                ports.join(",")
            },
            sensitivity_name(self.max_sensitivity)
        );
        if self.is_inspected() {
            text.push_str(", inspected");
            if !self.methods.is_empty() {
                text.push_str(&format!(": {}", self.methods.join(" ")));
            }
            if !self.paths.is_empty() {
                text.push_str(&format!(" under {}", self.paths.join(" ")));
            }
            if !self.inject.is_empty() {
                text.push_str(&format!(", injects {}", self.inject));
            }
        } else {
            text.push_str(", opaque");
        }
        text
    }
}
