//! Confining the agent process before it executes: capabilities, ids, `no_new_privs`,
//! Landlock and seccomp. Each step has its own [`ConfineError`] variant.

use std::os::fd::RawFd;
use std::path::Path;

use landlock::{
    Access, AccessFs, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, ABI,
};
use nix::unistd::{setresgid, setresuid, Gid, Uid};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use crate::plan::LandlockPlan;

/// The Landlock ABI the sandbox requires: read, write and execute rights, plus REFER (v2)
/// and TRUNCATE (v3), so a rename or truncate cannot reach outside the write list.
pub const REQUIRED_LANDLOCK_ABI: ABI = ABI::V3;

/// A confinement step failed; the agent is not started.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    /// Dropping a capability from the bounding set failed.
    #[error("dropping capability {cap} from the bounding set: {source}")]
    Bounding {
        /// The capability number.
        cap: u32,
        /// The error.
        source: std::io::Error,
    },
    /// Clearing supplementary groups failed.
    #[error("clearing supplementary groups: {0}")]
    Groups(nix::Error),
    /// Switching to the agent's uid/gid failed.
    #[error("switching to the agent's ids: {0}")]
    Ids(nix::Error),
    /// Clearing a capability set failed, or a capability survived.
    #[error("clearing capabilities: {0}")]
    Capabilities(String),
    /// Setting `no_new_privs` failed.
    #[error("setting no_new_privs: {0}")]
    NoNewPrivs(nix::Error),
    /// The kernel cannot enforce the Landlock rules the receipt promises (fail closed).
    #[error("landlock: {0}")]
    Landlock(String),
    /// Building or installing the seccomp filter failed.
    #[error("seccomp: {0}")]
    Seccomp(String),
    /// Marking inherited descriptors close-on-exec failed.
    #[error("closing inherited descriptors: {0}")]
    Fds(std::io::Error),
    /// Disabling core dumps failed.
    #[error("disabling core dumps: {0}")]
    CoreDumps(nix::Error),
}

/// Drops every capability from the bounding set, so nothing executed later can regain one.
/// Loops over all 64 possible numbers rather than the ones a crate knows, because the kernel
/// may know newer capabilities; numbers the kernel does not know fail with EINVAL and are
/// skipped.
pub fn drop_bounding_set() -> Result<(), ConfineError> {
    for cap in 0..64u32 {
        // SAFETY: PR_CAPBSET_DROP takes a capability number and no pointers.
        let result = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if result != 0 {
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::EINVAL) {
                continue;
            }
            return Err(ConfineError::Bounding { cap, source: error });
        }
    }
    Ok(())
}

/// Clears supplementary groups (the shim runs as root, whose groups must not leak).
pub fn clear_groups() -> Result<(), ConfineError> {
    nix::unistd::setgroups(&[]).map_err(ConfineError::Groups)
}

/// Becomes `id` (uid and gid) inside the agent's user namespace, then clears every capability
/// set. The kernel's automatic clearing on a uid change does not apply here (it compares with
/// uid 0 *of the namespace*, which is unmapped in the agent's), so each set is cleared
/// explicitly and all are checked to be empty after.
pub fn become_agent(id: u32) -> Result<(), ConfineError> {
    caps::clear(None, caps::CapSet::Inheritable)
        .map_err(|e| ConfineError::Capabilities(e.to_string()))?;
    caps::clear(None, caps::CapSet::Ambient)
        .map_err(|e| ConfineError::Capabilities(e.to_string()))?;
    let gid = Gid::from_raw(id);
    setresgid(gid, gid, gid).map_err(ConfineError::Ids)?;
    let uid = Uid::from_raw(id);
    setresuid(uid, uid, uid).map_err(ConfineError::Ids)?;
    for set in [caps::CapSet::Effective, caps::CapSet::Permitted] {
        caps::clear(None, set).map_err(|e| ConfineError::Capabilities(e.to_string()))?;
    }
    for set in [
        caps::CapSet::Effective,
        caps::CapSet::Permitted,
        caps::CapSet::Inheritable,
        caps::CapSet::Ambient,
    ] {
        let held = caps::read(None, set).map_err(|e| ConfineError::Capabilities(e.to_string()))?;
        if !held.is_empty() {
            return Err(ConfineError::Capabilities(format!(
                "{set:?} still holds {held:?}"
            )));
        }
    }
    Ok(())
}

/// Sets `no_new_privs`: no setuid binary or file capability can raise privileges after exec.
pub fn no_new_privs() -> Result<(), ConfineError> {
    nix::sys::prctl::set_no_new_privs().map_err(ConfineError::NoNewPrivs)
}

fn add_rules(
    ruleset: landlock::RulesetCreated,
    paths: &[std::path::PathBuf],
    access: BitFlags<AccessFs>,
) -> Result<landlock::RulesetCreated, ConfineError> {
    let mut ruleset = ruleset;
    for path in paths {
        let fd = PathFd::new(path)
            .map_err(|e| ConfineError::Landlock(format!("{}: {e}", path.display())))?;
        // A file (not a directory) only takes file rights.
        let access = if Path::new(path).is_dir() {
            access
        } else {
            access & AccessFs::from_file(REQUIRED_LANDLOCK_ABI)
        };
        ruleset = ruleset
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|e| ConfineError::Landlock(format!("{}: {e}", path.display())))?;
    }
    Ok(ruleset)
}

/// A Landlock ruleset built from the plan's allow-lists, not yet enforced. Building it (paths
/// opened, executables' interpreters read) is most of Landlock's cost, and needs no
/// privilege, so the agent process does it while pid 1 writes its id map.
#[derive(Debug)]
pub struct PreparedLandlock(landlock::RulesetCreated);

/// Builds the ruleset for the plan's read, write and execute allow-lists. Fails closed: a
/// kernel without Landlock ABI v3 is an error, never a silent downgrade.
pub fn prepare_landlock(plan: &LandlockPlan) -> Result<PreparedLandlock, ConfineError> {
    let all = AccessFs::from_all(REQUIRED_LANDLOCK_ABI);
    let read = AccessFs::ReadFile | AccessFs::ReadDir;
    let write = all & !AccessFs::Execute;
    let execute = AccessFs::Execute | AccessFs::ReadFile;
    let error = |e: landlock::RulesetError| ConfineError::Landlock(e.to_string());
    let ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(all)
        .map_err(error)?
        .create()
        .map_err(error)?;
    let ruleset = add_rules(ruleset, &plan.read, read)?;
    let ruleset = add_rules(ruleset, &plan.write, write)?;
    let executables = if plan.execute_resolved {
        plan.execute.clone()
    } else {
        with_interpreters(&plan.execute)
    };
    let ruleset = add_rules(ruleset, &executables, execute)?;
    Ok(PreparedLandlock(ruleset))
}

impl PreparedLandlock {
    /// Restricts this process (and everything it executes) to the ruleset; needs
    /// `no_new_privs`. Returns the ABI version enforced; anything short of full enforcement
    /// is an error.
    pub fn enforce(self) -> Result<u32, ConfineError> {
        let status = self
            .0
            .restrict_self()
            .map_err(|e| ConfineError::Landlock(e.to_string()))?;
        if status.ruleset != RulesetStatus::FullyEnforced {
            return Err(ConfineError::Landlock(format!(
                "the kernel enforces the ruleset only {:?}",
                status.ruleset
            )));
        }
        Ok(REQUIRED_LANDLOCK_ABI as u32)
    }
}

/// The executables plus what the kernel must also execute to run them: the ELF program
/// interpreter (the dynamic loader) and, for `#!` scripts, the script's interpreter (and its
/// loader). Paths that do not exist are dropped: the receipt may list tools this host lacks.
pub fn with_interpreters(executables: &[std::path::PathBuf]) -> Vec<std::path::PathBuf> {
    let mut out: Vec<std::path::PathBuf> = Vec::new();
    let mut pending: Vec<std::path::PathBuf> = executables.to_vec();
    while let Some(path) = pending.pop() {
        if out.contains(&path) || !path.exists() {
            continue;
        }
        if let Some(interpreter) = read_head(&path).and_then(|bytes| interpreter_of(&bytes)) {
            pending.push(interpreter);
        }
        out.push(path);
    }
    out
}

/// The first 64 KiB of a file: enough for a `#!` line and for ELF program headers and the
/// interpreter path, which linkers place at the start; reading whole binaries (python3 is
/// megabytes) on every sandbox start would be waste.
fn read_head(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read as _;
    let mut head = Vec::with_capacity(4096);
    std::fs::File::open(path)
        .ok()?
        .take(64 * 1024)
        .read_to_end(&mut head)
        .ok()?;
    Some(head)
}

/// The interpreter a file asks the kernel for: `PT_INTERP` of a 64-bit little-endian ELF, or
/// the first word of a `#!` line.
fn interpreter_of(bytes: &[u8]) -> Option<std::path::PathBuf> {
    if let Some(line) = bytes.strip_prefix(b"#!") {
        let line = line.split(|b| *b == b'\n').next()?;
        let text = std::str::from_utf8(line).ok()?;
        return text.split_whitespace().next().map(std::path::PathBuf::from);
    }
    // ELF64 little-endian: e_phoff at 32, e_phentsize at 54, e_phnum at 56.
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 || bytes[5] != 1 {
        return None;
    }
    let u16_at = |at: usize| Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?));
    let u64_at = |at: usize| Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?));
    let phoff = usize::try_from(u64_at(32)?).ok()?;
    let phentsize = usize::from(u16_at(54)?);
    let phnum = usize::from(u16_at(56)?);
    for index in 0..phnum {
        let header = phoff.checked_add(index.checked_mul(phentsize)?)?;
        let kind = u32::from_le_bytes(bytes.get(header..header + 4)?.try_into().ok()?);
        const PT_INTERP: u32 = 3;
        if kind == PT_INTERP {
            let offset = usize::try_from(u64_at(header + 8)?).ok()?;
            let size = usize::try_from(u64_at(header + 32)?).ok()?;
            let raw = bytes.get(offset..offset.checked_add(size)?)?;
            let raw = raw.split(|b| *b == 0).next()?;
            return Some(std::path::PathBuf::from(std::str::from_utf8(raw).ok()?));
        }
    }
    None
}

/// System calls the agent may never make, refused with EPERM.
fn denied_syscalls() -> Vec<i64> {
    let mut denied = vec![
        // The mount family: the file system view is fixed.
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_move_mount,
        libc::SYS_open_tree,
        libc::SYS_fsopen,
        libc::SYS_fsconfig,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_mount_setattr,
        // Inspecting or steering other processes.
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        // Kernel attack surface the agent does not need.
        libc::SYS_bpf,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_userfaultfd,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_perf_event_open,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_open_by_handle_at,
        libc::SYS_name_to_handle_at,
        libc::SYS_setns,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_reboot,
        libc::SYS_acct,
        libc::SYS_quotactl,
        libc::SYS_syslog,
    ];
    #[cfg(target_arch = "x86_64")]
    denied.extend([libc::SYS_iopl, libc::SYS_ioperm]);
    denied.sort_unstable();
    denied.dedup();
    denied
}

fn target_arch() -> Result<TargetArch, ConfineError> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(|e| ConfineError::Seccomp(e.to_string()))
}

/// The agent's seccomp programs, compiled ahead of time: the shim builds them while it waits
/// for its plan, so a run's start only pays for installing them.
#[derive(Debug, Clone)]
pub struct SeccompPrograms(Vec<BpfProgram>);

impl SeccompPrograms {
    /// Compiles the filters: the deny list (and on x86_64 every x32 call) and new user
    /// namespaces refused with EPERM, `clone3` with ENOSYS (its flags live in memory a filter
    /// cannot read, and ENOSYS makes libc fall back to `clone`, whose flags it can).
    pub fn compile() -> Result<Self, ConfineError> {
        let backend_error = |e: seccompiler::BackendError| ConfineError::Seccomp(e.to_string());
        let arch = target_arch()?;
        let mut new_user_rules: std::collections::BTreeMap<i64, Vec<SeccompRule>> =
            std::collections::BTreeMap::new();
        let new_user = libc::CLONE_NEWUSER as u64;
        for nr in [libc::SYS_clone, libc::SYS_unshare] {
            let condition = SeccompCondition::new(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(new_user),
                new_user,
            )
            .map_err(backend_error)?;
            new_user_rules.insert(
                nr,
                vec![SeccompRule::new(vec![condition]).map_err(backend_error)?],
            );
        }
        let no_new_user = SeccompFilter::new(
            new_user_rules,
            SeccompAction::Allow,
            SeccompAction::Errno(libc::EPERM as u32),
            arch,
        )
        .map_err(backend_error)?;
        let clone3 = SeccompFilter::new(
            [(libc::SYS_clone3, Vec::new())].into_iter().collect(),
            SeccompAction::Allow,
            SeccompAction::Errno(libc::ENOSYS as u32),
            arch,
        )
        .map_err(backend_error)?;
        let mut programs = vec![deny_list_program(&denied_syscalls())?];
        for filter in [no_new_user, clone3] {
            programs.push(filter.try_into().map_err(backend_error)?);
        }
        Ok(Self(programs))
    }

    /// Installs every program on this thread (and so on everything it executes).
    pub fn install(&self) -> Result<(), ConfineError> {
        for program in &self.0 {
            seccompiler::apply_filter(program).map_err(|e| ConfineError::Seccomp(e.to_string()))?;
        }
        Ok(())
    }
}

/// Classic BPF opcodes and seccomp return values used by [`deny_list_program`].
mod bpf {
    pub const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    pub const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    pub const JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
    pub const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    pub const RET_ALLOW: u32 = 0x7fff_0000;
    pub const RET_ERRNO: u32 = 0x0005_0000;
    pub const RET_KILL_PROCESS: u32 = 0x8000_0000;
    /// Offsets in `struct seccomp_data`.
    pub const NR: u32 = 0;
    pub const ARCH: u32 = 4;
    /// Numbers with this bit set are x32 system calls.
    pub const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    #[cfg(target_arch = "x86_64")]
    pub const AUDIT_ARCH: u32 = 0xc000_003e;
    #[cfg(target_arch = "aarch64")]
    pub const AUDIT_ARCH: u32 = 0xc000_00b7;
}

fn op(code: u16, jt: u8, jf: u8, k: u32) -> seccompiler::sock_filter {
    seccompiler::sock_filter { code, jt, jf, k }
}

/// The deny list as one program: another architecture's calls kill the process (their
/// numbers mean other calls), x32 calls (numbers with bit 30 set share the x86_64 arch value)
/// and every listed call get EPERM, everything else is allowed.
///
/// Built here rather than with `seccompiler`, whose programs test the numbers one after the
/// other: the kernel pre-evaluates a filter for every system call number when it is installed
/// (the seccomp action cache), which for a 40-entry linear chain cost ~150 µs on every
/// sandbox start. This program searches the sorted list as a balanced tree instead, a few
/// instructions per number.
fn deny_list_program(denied: &[i64]) -> Result<BpfProgram, ConfineError> {
    let mut numbers = denied
        .iter()
        .map(|&nr| u32::try_from(nr).map_err(|_| ConfineError::Seccomp(format!("bad number {nr}"))))
        .collect::<Result<Vec<u32>, _>>()?;
    numbers.sort_unstable();
    numbers.dedup();
    let mut program = vec![
        op(bpf::LD_W_ABS, 0, 0, bpf::ARCH),
        op(bpf::JEQ_K, 1, 0, bpf::AUDIT_ARCH),
        op(bpf::RET_K, 0, 0, bpf::RET_KILL_PROCESS),
        op(bpf::LD_W_ABS, 0, 0, bpf::NR),
    ];
    #[cfg(target_arch = "x86_64")]
    program.extend([
        op(bpf::JGE_K, 0, 1, bpf::X32_SYSCALL_BIT),
        op(bpf::RET_K, 0, 0, bpf::RET_ERRNO | libc::EPERM as u32),
    ]);
    search_program(&numbers, &mut program)?;
    Ok(program)
}

/// Appends code that returns EPERM when the loaded number is in `sorted` and ALLOW
/// otherwise: a balanced binary search, every path ending in a return.
fn search_program(
    sorted: &[u32],
    program: &mut Vec<seccompiler::sock_filter>,
) -> Result<(), ConfineError> {
    if sorted.len() <= 3 {
        for &nr in sorted {
            program.push(op(bpf::JEQ_K, 0, 1, nr));
            program.push(op(bpf::RET_K, 0, 0, bpf::RET_ERRNO | libc::EPERM as u32));
        }
        program.push(op(bpf::RET_K, 0, 0, bpf::RET_ALLOW));
        return Ok(());
    }
    let (low, high) = sorted.split_at(sorted.len() / 2);
    let mut below = Vec::new();
    search_program(low, &mut below)?;
    // Conditional jumps reach at most 255 instructions ahead.
    let skip = u8::try_from(below.len())
        .map_err(|_| ConfineError::Seccomp("deny list too long for one program".into()))?;
    program.push(op(bpf::JGE_K, skip, 0, high[0]));
    program.extend(below);
    search_program(high, program)
}

/// Marks every fd from `first` up close-on-exec, so the agent inherits only stdin, stdout and
/// stderr while this process can still report an exec failure through one of them. A failure
/// is an error: the control socket must never leak into the agent.
pub fn mark_fds_cloexec_from(first: RawFd) -> Result<(), ConfineError> {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: close_range(2) with CLOSE_RANGE_CLOEXEC only sets a flag on descriptors.
    let result = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    };
    if result == 0 {
        Ok(())
    } else {
        Err(ConfineError::Fds(std::io::Error::last_os_error()))
    }
}

/// No core dumps: a crashing agent must not write its memory (which may hold secrets it was
/// given) anywhere.
pub fn no_core_dumps() -> Result<(), ConfineError> {
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0)
        .map_err(ConfineError::CoreDumps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deny_list_covers_the_required_families() {
        let denied = denied_syscalls();
        for nr in [
            libc::SYS_mount,
            libc::SYS_ptrace,
            libc::SYS_bpf,
            libc::SYS_io_uring_setup,
            libc::SYS_userfaultfd,
            libc::SYS_keyctl,
            libc::SYS_perf_event_open,
            libc::SYS_kexec_load,
            libc::SYS_init_module,
            libc::SYS_open_by_handle_at,
        ] {
            assert!(denied.contains(&nr), "{nr} missing");
        }
        assert!(target_arch().is_ok());
    }

    /// Runs a classic BPF seccomp program on (arch, nr) with a minimal interpreter of the
    /// opcodes `deny_list_program` uses.
    fn evaluate(program: &[seccompiler::sock_filter], arch: u32, nr: u32) -> u32 {
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let insn = &program[pc];
            pc += 1;
            match insn.code {
                bpf::LD_W_ABS => acc = if insn.k == bpf::ARCH { arch } else { nr },
                bpf::JEQ_K | bpf::JGE_K => {
                    let taken = if insn.code == bpf::JEQ_K {
                        acc == insn.k
                    } else {
                        acc >= insn.k
                    };
                    pc += usize::from(if taken { insn.jt } else { insn.jf });
                }
                bpf::RET_K => return insn.k,
                other => panic!("unexpected opcode {other:#x}"),
            }
        }
    }

    #[test]
    fn deny_list_program_refuses_exactly_the_list() {
        let denied = denied_syscalls();
        let program = deny_list_program(&denied).unwrap();
        let eperm = bpf::RET_ERRNO | libc::EPERM as u32;
        for nr in 0..1024u32 {
            let expected = if denied.contains(&i64::from(nr)) {
                eperm
            } else {
                bpf::RET_ALLOW
            };
            assert_eq!(evaluate(&program, bpf::AUDIT_ARCH, nr), expected, "nr {nr}");
            #[cfg(target_arch = "x86_64")]
            assert_eq!(
                evaluate(&program, bpf::AUDIT_ARCH, nr | bpf::X32_SYSCALL_BIT),
                eperm
            );
            assert_eq!(evaluate(&program, 0x4000_0003, nr), bpf::RET_KILL_PROCESS);
        }
        // A few instructions per number, not the whole list: the point of the tree.
        assert!(
            program.len() < 3 * denied.len() + 10,
            "{} instructions",
            program.len()
        );
    }

    #[test]
    fn the_kernel_enforces_the_compiled_programs() {
        let programs = SeccompPrograms::compile().unwrap();
        // SAFETY: the child only makes system calls and exits; it never returns into the
        // test harness.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                let code = (|| {
                    no_new_privs().ok()?;
                    programs.install().ok()?;
                    // SAFETY: raw system calls with null or zero arguments: each is refused
                    // (EPERM) or harmless.
                    let errno = |nr: i64| unsafe {
                        let result = libc::syscall(nr, 0, 0, 0, 0, 0, 0);
                        if result < 0 {
                            *libc::__errno_location()
                        } else {
                            0
                        }
                    };
                    let refused = [
                        libc::SYS_mount,
                        libc::SYS_bpf,
                        libc::SYS_keyctl,
                        libc::SYS_ptrace,
                    ]
                    .iter()
                    .all(|&nr| errno(nr) == libc::EPERM);
                    #[cfg(target_arch = "x86_64")]
                    let refused = refused
                        && errno(libc::SYS_getpid | i64::from(bpf::X32_SYSCALL_BIT)) == libc::EPERM;
                    let clone3 = errno(libc::SYS_clone3) == libc::ENOSYS;
                    let allowed = errno(libc::SYS_getpid) == 0;
                    Some(if refused && clone3 && allowed { 0 } else { 1 })
                })()
                .unwrap_or(2);
                // SAFETY: leaves the forked child at once, without running the parent's
                // destructors or atexit handlers.
                unsafe { libc::_exit(code) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                let status = nix::sys::wait::waitpid(child, None).unwrap();
                assert_eq!(status, nix::sys::wait::WaitStatus::Exited(child, 0));
            }
        }
    }

    #[test]
    fn interpreters_of_binaries_and_scripts_are_added() {
        let sh = std::path::PathBuf::from("/bin/sh");
        let with = with_interpreters(std::slice::from_ref(&sh));
        assert!(with.contains(&sh));
        assert!(
            with.iter()
                .any(|p| p.to_string_lossy().contains("ld-linux")),
            "the dynamic loader of /bin/sh: {with:?}"
        );
        let dir = std::env::temp_dir().join(format!("tollgate-interp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("script");
        std::fs::write(&script, "#!/bin/sh -e\necho hi\n").unwrap();
        let with = with_interpreters(std::slice::from_ref(&script));
        assert!(with.contains(&sh), "{with:?}");
        assert!(with_interpreters(&[dir.join("missing")]).is_empty());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
