//! `tollgate doctor`: whether this host can run a supervisor, check by check, each failure
//! with its fix. It reads `/proc` and `/sys`, asks `tollgate-shim probe` what the kernel
//! offers confinement (the CLI links no sandbox code), reads the supervisors' registry, and
//! asks the authority for its key set.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::args::GlobalArgs;
use crate::client::{connect, DEFAULT_AUTHORITY};
use crate::error::CliError;

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Fine.
    Ok,
    /// Works, but something is worth knowing or fixing.
    Warn,
    /// The supervisor will not start, or a run will fail.
    Fail,
}

impl Verdict {
    fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Warn => "warn",
            Self::Fail => "FAIL",
        }
    }
}

/// One check's finding: what was seen and, when not ok, the fix.
#[derive(Debug)]
struct Check {
    name: &'static str,
    verdict: Verdict,
    seen: String,
    fix: Option<String>,
}

impl Check {
    fn ok(name: &'static str, seen: impl Into<String>) -> Self {
        Self {
            name,
            verdict: Verdict::Ok,
            seen: seen.into(),
            fix: None,
        }
    }

    fn bad(
        name: &'static str,
        verdict: Verdict,
        seen: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            name,
            verdict,
            seen: seen.into(),
            fix: Some(fix.into()),
        }
    }
}

/// What `tollgate doctor` is asked to look at besides the host itself.
#[derive(Debug)]
pub(crate) struct DoctorArgs {
    /// The supervisor's data directory, if one is planned or exists.
    pub(crate) data_dir: Option<PathBuf>,
    /// The shim binary; default: next to `tollgate`.
    pub(crate) shim: Option<PathBuf>,
    /// The host ids the supervisor would hand out.
    pub(crate) host_ids: std::ops::Range<u32>,
    /// Where live supervisors register (the supervisor's `--run-dir`).
    pub(crate) run_dir: PathBuf,
    /// One JSON object instead of text.
    pub(crate) json: bool,
}

/// Where the supervisor planned is registered, or would register.
struct Planned<'a> {
    /// The host ids it would hand out.
    host_ids: &'a std::ops::Range<u32>,
    /// Where live supervisors register.
    run_dir: &'a Path,
    /// Its data directory: a live claim of this directory is its own.
    data_dir: Option<&'a Path>,
}

/// The checks of this host alone (no data directory, no authority).
fn host_checks(shim: Option<&Path>, planned: &Planned<'_>) -> Vec<Check> {
    vec![
        root(),
        user_namespaces(),
        shim_probe(shim),
        seccomp(),
        cgroups(),
        memfd_noexec(),
        idmapped_mounts(),
        host_ids(planned),
        capacity(planned.host_ids),
    ]
}

/// Prints checks for people: verdict, name, what was seen, and the fix under it.
fn print(checks: &[Check]) -> Result<(), CliError> {
    for check in checks {
        say!(
            "{:<5} {:<16} {}",
            check.verdict.as_str(),
            check.name,
            check.seen
        )?;
        if let Some(fix) = &check.fix {
            say!("{:<22} fix: {fix}", "")?;
        }
    }
    Ok(())
}

/// For `tollgate quickstart`: the host checks, printed; how many failed.
pub(crate) fn check_host(ids: &std::ops::Range<u32>, run_dir: &Path) -> Result<usize, CliError> {
    let planned = Planned {
        host_ids: ids,
        run_dir,
        data_dir: None,
    };
    let checks = host_checks(None, &planned);
    print(&checks)?;
    Ok(checks.iter().filter(|c| c.verdict == Verdict::Fail).count())
}

/// Runs every check; `Err` (exit 1) when one fails.
pub(crate) async fn doctor(global: &GlobalArgs, args: DoctorArgs) -> Result<(), CliError> {
    let planned = Planned {
        host_ids: &args.host_ids,
        run_dir: &args.run_dir,
        data_dir: args.data_dir.as_deref(),
    };
    let mut checks = host_checks(args.shim.as_deref(), &planned);
    if let Some(dir) = &args.data_dir {
        checks.push(data_dir(dir));
    }
    checks.push(authority(global).await);
    let failed = checks.iter().filter(|c| c.verdict == Verdict::Fail).count();
    if args.json {
        let list: Vec<_> = checks
            .iter()
            .map(|c| {
                json!({
                    "check": c.name,
                    "verdict": c.verdict.as_str().to_lowercase(),
                    "seen": c.seen,
                    "fix": c.fix,
                })
            })
            .collect();
        out!("{}", json!({ "ready": failed == 0, "checks": list }))?;
    } else {
        for check in &checks {
            say!(
                "{:<5} {:<16} {}",
                check.verdict.as_str(),
                check.name,
                check.seen
            )?;
            if let Some(fix) = &check.fix {
                say!("{:<22} fix: {fix}", "")?;
            }
        }
        if failed == 0 {
            say!("this host can run tollgate-supervisor")?;
        }
    }
    if failed == 0 {
        Ok(())
    } else {
        Err(CliError::Doctor(failed))
    }
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|text| text.trim().to_owned())
}

fn root() -> Check {
    if nix::unistd::geteuid().is_root() {
        Check::ok("root", "running as root")
    } else {
        Check::bad(
            "root",
            Verdict::Fail,
            "not root: the supervisor builds namespaces and cgroups",
            "run tollgate-supervisor (and this check) as root",
        )
    }
}

fn user_namespaces() -> Check {
    match read("/proc/sys/user/max_user_namespaces").and_then(|n| n.parse::<u64>().ok()) {
        Some(0) => Check::bad(
            "user namespaces",
            Verdict::Fail,
            "user.max_user_namespaces = 0",
            "sysctl -w user.max_user_namespaces=15000 (and in /etc/sysctl.d/)",
        ),
        Some(n) => Check::ok("user namespaces", format!("user.max_user_namespaces = {n}")),
        None => Check::bad(
            "user namespaces",
            Verdict::Fail,
            "this kernel has no user namespaces",
            "use a kernel built with CONFIG_USER_NS",
        ),
    }
}

/// The shim's own probe: Landlock as the sandbox will use it.
fn shim_probe(shim: Option<&Path>) -> Check {
    let shim = shim.map(Path::to_owned).unwrap_or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|dir| dir.join("tollgate-shim")))
            .unwrap_or_else(|| PathBuf::from("tollgate-shim"))
    });
    let output = match std::process::Command::new(&shim).arg("probe").output() {
        Ok(output) if output.status.success() => output,
        Ok(output) => {
            return Check::bad(
                "landlock",
                Verdict::Fail,
                format!(
                    "{} probe failed: {}",
                    shim.display(),
                    String::from_utf8_lossy(&output.stderr).trim()
                ),
                "install tollgate-shim from the same release as tollgate",
            )
        }
        Err(e) => {
            return Check::bad(
                "landlock",
                Verdict::Fail,
                format!("cannot run {}: {e}", shim.display()),
                "install tollgate-shim next to tollgate, or pass --shim PATH",
            )
        }
    };
    let probe: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
    let required = probe["landlock_required"].as_u64().unwrap_or(3);
    match probe["landlock_abi"].as_u64() {
        Some(abi) if abi >= required => {
            Check::ok("landlock", format!("ABI v{abi} (v{required} needed)"))
        }
        Some(abi) => Check::bad(
            "landlock",
            Verdict::Fail,
            format!("ABI v{abi}, v{required} needed (truncate and rename rules)"),
            "use a kernel 6.2 or newer",
        ),
        None => Check::bad(
            "landlock",
            Verdict::Fail,
            format!(
                "not available: {}",
                probe["landlock_error"].as_str().unwrap_or("unknown")
            ),
            "boot with landlock in the lsm= list (e.g. lsm=landlock,lockdown,yama,apparmor)",
        ),
    }
}

fn seccomp() -> Check {
    match read("/proc/sys/kernel/seccomp/actions_avail") {
        Some(actions) if actions.contains("kill_process") && actions.contains("errno") => {
            Check::ok("seccomp", format!("filters with {actions}"))
        }
        Some(actions) => Check::bad(
            "seccomp",
            Verdict::Fail,
            format!("filters lack kill_process or errno ({actions})"),
            "use a kernel with CONFIG_SECCOMP_FILTER",
        ),
        None => Check::bad(
            "seccomp",
            Verdict::Fail,
            "no seccomp filters",
            "use a kernel with CONFIG_SECCOMP_FILTER",
        ),
    }
}

/// The cgroup layout and the controllers runs need (memory, pids, cpu).
fn cgroups() -> Check {
    const WANTED: [&str; 3] = ["memory", "pids", "cpu"];
    if let Some(controllers) = read("/sys/fs/cgroup/cgroup.controllers") {
        let missing: Vec<_> = WANTED
            .iter()
            .filter(|c| !controllers.split_whitespace().any(|have| have == **c))
            .collect();
        // cgroup.kill came with 5.14. Every child of the root has it; a host may have no
        // child yet (no systemd, a fresh container), so the kernel's version decides then.
        let kill = std::fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
            .any(|entry| entry.path().join("cgroup.kill").exists())
            || kernel_at_least(
                &read("/proc/sys/kernel/osrelease").unwrap_or_default(),
                5,
                14,
            );
        return match (missing.is_empty(), kill) {
            (true, true) => Check::ok(
                "cgroups",
                format!("unified (v2): {controllers}; cgroup.kill available"),
            ),
            (true, false) => Check::bad(
                "cgroups",
                Verdict::Warn,
                "unified (v2) without cgroup.kill: teardown kills process by process",
                "use a kernel 5.14 or newer",
            ),
            (false, _) => Check::bad(
                "cgroups",
                Verdict::Fail,
                format!("unified (v2) without {missing:?}"),
                "enable the memory, pids and cpu controllers (cgroup_enable=memory on the kernel command line)",
            ),
        };
    }
    let missing: Vec<_> = WANTED
        .iter()
        .filter(|c| !Path::new("/sys/fs/cgroup").join(c).is_dir())
        .collect();
    let hybrid = Path::new("/sys/fs/cgroup/unified").is_dir();
    let mode = if hybrid { "hybrid" } else { "legacy (v1)" };
    if missing.is_empty() {
        Check::ok(
            "cgroups",
            format!("{mode}: v1 memory, pids and cpu controllers mounted"),
        )
    } else {
        Check::bad(
            "cgroups",
            Verdict::Fail,
            format!("{mode} without {missing:?}"),
            "mount the memory, pids and cpu cgroup controllers",
        )
    }
}

/// Whether a kernel release such as `6.12.95+deb12-amd64` is at least `major.minor`.
fn kernel_at_least(release: &str, major: u32, minor: u32) -> bool {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|part| part.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(have_major), Some(have_minor)) => (have_major, have_minor) >= (major, minor),
        _ => false,
    }
}

fn memfd_noexec() -> Check {
    match read("/proc/sys/vm/memfd_noexec") {
        Some(value) => Check::ok("memfd_noexec", format!("vm.memfd_noexec = {value}")),
        None => Check::bad(
            "memfd_noexec",
            Verdict::Warn,
            "this kernel has no vm.memfd_noexec (before 6.3): seccomp alone keeps agents from executing memory files",
            "use a kernel 6.3 or newer for a second line of defence",
        ),
    }
}

/// Whether grants under `/home` (where people keep what they grant; `/` without one) can be
/// id-mapped, as a grant owned by an unprivileged user is: tried on a detached copy of its
/// mount, which nothing else sees and which goes when its descriptor closes.
fn idmapped_mounts() -> Check {
    use tollgate_files::idmap::{filesystem_name, IdmapNamespace};
    const NAME: &str = "idmapped mounts";
    let place = if Path::new("/home").is_dir() {
        "/home"
    } else {
        "/"
    };
    if !nix::unistd::geteuid().is_root() {
        return Check::bad(
            NAME,
            Verdict::Warn,
            "not checked (needs root)",
            "run tollgate doctor as root",
        );
    }
    let tried = tollgate_files::beneath::GrantRoot::open(place)
        .map_err(|e| e.to_string())
        .and_then(|root| tollgate_files::beneath::detached_mount(&root).map_err(|e| e.to_string()))
        .and_then(|mount| {
            let name = filesystem_name(&mount);
            IdmapNamespace::new(65534, 65534, 65534)
                .and_then(|ns| ns.apply(&mount))
                .map(|()| name.clone())
                .map_err(|e| format!("{name}: {e}"))
        });
    match tried {
        Ok(name) => Check::ok(
            NAME,
            format!("{place} ({name}) can be id-mapped: grants owned by a user read as the agent's own"),
        ),
        Err(why) => Check::bad(
            NAME,
            Verdict::Warn,
            format!("{place} cannot be id-mapped ({why}): a grant there owned by a user other than root is refused"),
            "keep granted directories on ext4, xfs, btrfs or tmpfs, or grant root-owned directories readable by others",
        ),
    }
}

/// The host ids must be free: no user of this host and no live supervisor registered in the
/// run directory holds them (that supervisor would refuse this one), unless it is the
/// supervisor of the data directory checked: then they are its own.
fn host_ids(planned: &Planned<'_>) -> Check {
    let range = planned.host_ids;
    let users: Vec<String> = read("/etc/passwd")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(':');
            let name = fields.next()?;
            let uid: u32 = fields.nth(1)?.parse().ok()?;
            range.contains(&uid).then(|| format!("{name} ({uid})"))
        })
        .collect();
    if !users.is_empty() {
        return Check::bad(
            "host ids",
            Verdict::Fail,
            format!(
                "{}..{} holds users of this host: {}",
                range.start,
                range.end,
                users.join(", ")
            ),
            "give the supervisor another --host-id-base",
        );
    }
    let run_dir = planned.run_dir;
    let live = match tollgate_daemon::host::live_claims(run_dir) {
        Ok(live) => live,
        Err(e) => {
            return Check::bad(
                "host ids",
                Verdict::Warn,
                format!("the live supervisors' registrations cannot be read: {e}"),
                format!("check {}", run_dir.join("supervisors").display()),
            )
        }
    };
    let overlapping = live
        .iter()
        .filter(|c| c.host_ids.start < range.end && range.start < c.host_ids.end);
    let (own, others): (Vec<_>, Vec<_>) = overlapping.partition(|c| {
        planned
            .data_dir
            .is_some_and(|dir| same_dir(dir, &c.data_dir))
    });
    let named = |claims: &[&tollgate_daemon::host::Claim]| {
        claims
            .iter()
            .map(|c| format!("{} ({}..{})", c.holder(), c.host_ids.start, c.host_ids.end))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if !others.is_empty() {
        return Check::bad(
            "host ids",
            Verdict::Fail,
            format!(
                "{}..{} overlaps live supervisors registered in {}: {}",
                range.start,
                range.end,
                run_dir.display(),
                named(&others)
            ),
            "give this supervisor its own --host-id-base (a live one refuses the overlap)",
        );
    }
    if own.is_empty() {
        Check::ok(
            "host ids",
            format!(
                "{}..{} free (no live supervisor in {} holds them)",
                range.start,
                range.end,
                run_dir.display()
            ),
        )
    } else {
        Check::ok(
            "host ids",
            format!(
                "{}..{} held by the supervisor of --data-dir itself: {}",
                range.start,
                range.end,
                named(&own)
            ),
        )
    }
}

/// Whether two paths name one directory (as given, or resolved).
fn same_dir(a: &Path, b: &Path) -> bool {
    a == b
        || matches!(
            (std::fs::canonicalize(a), std::fs::canonicalize(b)),
            (Ok(a), Ok(b)) if a == b
        )
}

fn data_dir(dir: &Path) -> Check {
    match std::fs::metadata(dir) {
        Ok(meta) if meta.mode() & 0o077 != 0 => Check::bad(
            "data dir",
            Verdict::Fail,
            format!(
                "{} is mode {:o}: others can enter it",
                dir.display(),
                meta.mode() & 0o7777
            ),
            format!("chmod 700 {}", dir.display()),
        ),
        Ok(meta) if meta.uid() != 0 => Check::bad(
            "data dir",
            Verdict::Warn,
            format!("{} is owned by uid {}, not root", dir.display(), meta.uid()),
            format!("chown root {}", dir.display()),
        ),
        Ok(_) => Check::ok("data dir", format!("{}: 0700, root", dir.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Check::ok(
            "data dir",
            format!("{} will be created 0700", dir.display()),
        ),
        Err(e) => Check::bad(
            "data dir",
            Verdict::Fail,
            format!("{}: {e}", dir.display()),
            "give the supervisor a data directory root can create",
        ),
    }
}

async fn authority(global: &GlobalArgs) -> Check {
    let mut client = match connect(&global.authority, &global.tls()).await {
        Ok(client) => client,
        // Nothing at the default address is no fault of this host: a supervisor may trust a
        // key file instead.
        Err(e) if global.authority == DEFAULT_AUTHORITY => {
            return Check::bad(
                "authority",
                Verdict::Warn,
                format!("none at the default address: {e}"),
                "pass --authority ADDR (or the path of its authority.addr) to check the one the supervisor will follow",
            )
        }
        Err(e) => {
            return Check::bad(
                "authority",
                Verdict::Fail,
                e.to_string(),
                "start tollgate-authority, or pass the --authority ADDR the supervisor will follow",
            )
        }
    };
    match client
        .get_key_set(tollgate_proto::v1::GetKeySetRequest {})
        .await
    {
        Ok(set) => {
            let set = set.into_inner();
            let active = set.keys.iter().filter(|k| k.active).count();
            Check::ok(
                "authority",
                format!(
                    "{} answers (issuer {}): {} key(s), {active} active",
                    global.authority,
                    set.issuer,
                    set.keys.len()
                ),
            )
        }
        Err(status) => Check::bad(
            "authority",
            Verdict::Fail,
            format!(
                "{} refused its key set: {}",
                global.authority,
                status.message()
            ),
            "check that --authority names a tollgate-authority",
        ),
    }
}

/// Descriptors a supervisor holds per live run at most (`tollgate_supervisor::host_limits`).
const FDS_PER_RUN: u64 = 3;
/// Host pids a sandbox takes at least: its pid 1 and the agent (the shim that forks pid 1
/// exits).
const PIDS_PER_RUN: u64 = 2;
/// Host memory a sleeping sandbox and the supervisor's share of it take (measured: about
/// 2.5 MiB a sandbox, well under 0.5 MiB of the supervisor's a run).
const MEMORY_PER_RUN: u64 = 3 << 20;
/// Descriptors the supervisor keeps for itself (its log, database, listeners, clients).
const FDS_RESERVED: u64 = 256;

/// How many live runs this host's limits allow one supervisor, and which limit binds.
fn capacity(host_ids: &std::ops::Range<u32>) -> Check {
    let number = |path: &str| read(path).and_then(|text| text.parse::<u64>().ok());
    // The limit the daemon would run with: it raises its own as far as the kernel lets it
    // (to fs.nr_open with the privilege, else to its hard limit), as this process does here.
    let files = tollgate_daemon::raise_open_files_limit().unwrap_or(1024);
    let pid_max = number("/proc/sys/kernel/pid_max").unwrap_or(32_768);
    let threads_max = number("/proc/sys/kernel/threads-max").unwrap_or(u64::MAX);
    // /proc/loadavg's fourth field: running/total scheduling entities (threads) now.
    let tasks = read("/proc/loadavg")
        .and_then(|text| {
            text.split_whitespace()
                .nth(3)?
                .split('/')
                .nth(1)?
                .parse()
                .ok()
        })
        .unwrap_or(0u64);
    let memory = read("/proc/meminfo")
        .and_then(|text| {
            text.lines()
                .find_map(|line| line.strip_prefix("MemAvailable:"))?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .map_or(0, |kib| kib * 1024);
    Check::ok(
        "capacity",
        capacity_of(
            files,
            pid_max.min(threads_max).saturating_sub(tasks),
            memory,
            host_ids,
            format!("kernel.pid_max {pid_max}, threads-max {threads_max}, {tasks} in use"),
        ),
    )
}

/// What the host's limits allow, in live runs: the least of them first, then each with what
/// it came from. `pids` are those left for new processes; `memory` is available bytes.
fn capacity_of(
    files: u64,
    pids: u64,
    memory: u64,
    host_ids: &std::ops::Range<u32>,
    pids_from: String,
) -> String {
    let limits = [
        (
            "open files",
            files.saturating_sub(FDS_RESERVED) / FDS_PER_RUN,
            format!("RLIMIT_NOFILE {files} as raised"),
        ),
        ("pids", pids / PIDS_PER_RUN, pids_from),
        (
            "memory",
            memory / MEMORY_PER_RUN,
            format!("{} MiB available", memory >> 20),
        ),
        (
            "host ids",
            u64::from(host_ids.end.saturating_sub(host_ids.start)),
            format!("--host-id-count {}", host_ids.len()),
        ),
    ];
    let (binding, runs, _) = limits
        .iter()
        .min_by_key(|(_, runs, _)| *runs)
        .unwrap_or(&limits[0]);
    format!(
        "about {runs} live runs, bound by {binding} ({})",
        limits
            .iter()
            .map(|(name, runs, why)| format!("{name}: {runs} from {why}"))
            .collect::<Vec<_>>()
            .join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::{capacity_of, kernel_at_least};

    #[test]
    fn capacity_names_the_limit_that_binds() {
        // 20,000 files at 3 a run (256 kept) is 6,581 runs; pids and memory allow more.
        let seen = capacity_of(
            20_000,
            30_000,
            64 << 30,
            &(100_000..165_536),
            "pid_max".into(),
        );
        assert!(
            seen.starts_with("about 6581 live runs, bound by open files"),
            "{seen}"
        );
        // A narrow host-id range binds before anything else.
        let seen = capacity_of(
            20_000,
            30_000,
            64 << 30,
            &(100_000..100_016),
            "pid_max".into(),
        );
        assert!(
            seen.starts_with("about 16 live runs, bound by host ids"),
            "{seen}"
        );
        // Too few pids left: two a sandbox.
        let seen = capacity_of(1 << 20, 300, 64 << 30, &(0..65_536), "pid_max".into());
        assert!(
            seen.starts_with("about 150 live runs, bound by pids"),
            "{seen}"
        );
    }

    #[test]
    fn kernel_releases_compare_by_major_and_minor() {
        assert!(kernel_at_least("6.12.95+deb12-amd64", 5, 14));
        assert!(kernel_at_least("5.14.0-rc1", 5, 14));
        assert!(!kernel_at_least("5.10.0-28-amd64", 5, 14));
        assert!(!kernel_at_least("4.19", 5, 14));
        assert!(!kernel_at_least("weird", 5, 14));
    }
}
