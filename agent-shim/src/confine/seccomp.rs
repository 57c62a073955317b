//! Seccomp: the system calls the agent may not make, compiled once into a single classic BPF
//! program that searches the call numbers as a balanced tree.

use seccompiler::{BpfProgram, TargetArch};

use super::error::ConfineError;

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

/// `fchmodat2` (Linux 6.6): 452 in the generic table and on x86_64 alike; the libc crate
/// names it on x86_64 only.
const SYS_FCHMODAT2: i64 = 452;
#[cfg(target_arch = "x86_64")]
const _: () = assert!(SYS_FCHMODAT2 == libc::SYS_fchmodat2);

/// The mode bits no call from inside may ask for: a set-uid or set-gid file in a write grant
/// outlives the run on the host, owned by a host id a later run gets again.
const SET_ID_BITS: u32 = libc::S_ISUID | libc::S_ISGID;

/// The `ioctl` requests no agent may make, whatever the host's sysctls say: `TIOCSTI` pushes
/// bytes into a terminal's input queue as if typed there (the keystrokes a shell reading that
/// terminal after the agent would run), and `TIOCLINUX` reads and sets a virtual console's
/// selection. Linux 6.2 refuses `TIOCSTI` only when `dev.tty.legacy_tiocsti` is 0, which a
/// host may leave at 1.
const DENIED_IOCTLS: &[u32] = &[libc::TIOCSTI as u32, libc::TIOCLINUX as u32];

/// What the syscall program does with one system call number (anything not listed is
/// allowed). Arguments are checked in their low 32 bits only: every argument checked here is
/// an `int`, `umode_t`, an `ioctl` request (an `unsigned int` to the kernel) or the low flags
/// of a `clone`, which the kernel truncates to those bits itself, so bits above cannot change
/// what the call does (nor slip past the rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    /// Always refused with this errno.
    Refuse(u32),
    /// Refused with `errno` when argument `arg` has any of `bits`.
    RefuseBits {
        /// The argument's index.
        arg: u8,
        /// The bits.
        bits: u32,
        /// The errno.
        errno: u32,
    },
    /// Refused with `errno` when argument `arg` equals one of `values`.
    RefuseValues {
        /// The argument's index.
        arg: u8,
        /// The values.
        values: &'static [u32],
        /// The errno.
        errno: u32,
    },
    /// An `open`: when argument `flags` creates a file (`O_CREAT`, or `O_TMPFILE`), refused
    /// with EPERM if argument `mode` asks for set-uid or set-gid. Without them the kernel
    /// ignores the mode, and so does the rule.
    CreatingOpen {
        /// The flags argument's index.
        flags: u8,
        /// The mode argument's index.
        mode: u8,
    },
    /// `socket`/`socketpair`: only `AF_UNIX`, `AF_INET`, `AF_INET6`, and `AF_NETLINK` with
    /// `NETLINK_ROUTE`. Another family gets EAFNOSUPPORT and another netlink protocol
    /// EPROTONOSUPPORT: what the kernel itself answers for a family or protocol it was built
    /// without, so programs take their "not available here" path instead of failing hard.
    Socket,
}

/// Every rule of the agent's syscall program, by number.
fn syscall_rules() -> Vec<(i64, Rule)> {
    let eperm = libc::EPERM as u32;
    let set_id = |arg: u8| Rule::RefuseBits {
        arg,
        bits: SET_ID_BITS,
        errno: eperm,
    };
    let mut rules: Vec<(i64, Rule)> = denied_syscalls()
        .into_iter()
        .map(|nr| (nr, Rule::Refuse(eperm)))
        .collect();
    rules.extend([
        // No new user namespace: inside one the agent would hold every capability again.
        (
            libc::SYS_clone,
            Rule::RefuseBits {
                arg: 0,
                bits: libc::CLONE_NEWUSER as u32,
                errno: eperm,
            },
        ),
        (
            libc::SYS_unshare,
            Rule::RefuseBits {
                arg: 0,
                bits: libc::CLONE_NEWUSER as u32,
                errno: eperm,
            },
        ),
        // clone3's flags live in memory a filter cannot read; ENOSYS makes libc fall back to
        // clone, whose flags it can.
        (libc::SYS_clone3, Rule::Refuse(libc::ENOSYS as u32)),
        // No set-uid or set-gid file, by any call that sets a mode.
        (libc::SYS_fchmod, set_id(1)),
        (libc::SYS_fchmodat, set_id(2)),
        (SYS_FCHMODAT2, set_id(2)),
        (libc::SYS_mkdirat, set_id(2)),
        (libc::SYS_mknodat, set_id(2)),
        (libc::SYS_openat, Rule::CreatingOpen { flags: 2, mode: 3 }),
        // openat2 carries flags and mode in a struct a filter cannot read: ENOSYS, as on a
        // kernel before 5.6, which every caller of openat2 handles (glibc and musl never call
        // it for open(); Go, Python and Rust's std use openat; libraries that use openat2,
        // like systemd's or Go's securejoin, fall back to openat on ENOSYS).
        (libc::SYS_openat2, Rule::Refuse(libc::ENOSYS as u32)),
        (libc::SYS_socket, Rule::Socket),
        (libc::SYS_socketpair, Rule::Socket),
        // No keystrokes pushed into a terminal, no console selection.
        (
            libc::SYS_ioctl,
            Rule::RefuseValues {
                arg: 1,
                values: DENIED_IOCTLS,
                errno: eperm,
            },
        ),
    ]);
    #[cfg(target_arch = "x86_64")]
    rules.extend([
        (libc::SYS_chmod, set_id(1)),
        (libc::SYS_creat, set_id(1)),
        (libc::SYS_mkdir, set_id(1)),
        (libc::SYS_mknod, set_id(1)),
        (libc::SYS_open, Rule::CreatingOpen { flags: 1, mode: 2 }),
    ]);
    rules.sort_unstable_by_key(|(nr, _)| *nr);
    rules
}

fn target_arch() -> Result<TargetArch, ConfineError> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(|e| ConfineError::Seccomp(e.to_string()))
}

/// The agent's seccomp program, compiled ahead of time: the shim builds it while it waits
/// for its plan, so a run's start only pays for installing it.
#[derive(Debug, Clone)]
pub struct SeccompPrograms(Vec<BpfProgram>);

impl SeccompPrograms {
    /// Compiles the filter: one program holding every rule of [`syscall_rules`] (the deny
    /// list, and on x86_64 every x32 call, refused with EPERM; new user namespaces; `clone3`
    /// and `openat2` with ENOSYS; set-uid/set-gid modes; socket families; `TIOCSTI` and
    /// `TIOCLINUX`).
    pub fn compile() -> Result<Self, ConfineError> {
        target_arch()?;
        Ok(Self(vec![syscall_program(&syscall_rules())?]))
    }

    /// Installs every program on this thread (and so on everything it executes).
    pub fn install(&self) -> Result<(), ConfineError> {
        for program in &self.0 {
            seccompiler::apply_filter(program).map_err(|e| ConfineError::Seccomp(e.to_string()))?;
        }
        Ok(())
    }
}

/// Classic BPF opcodes and seccomp return values used by [`syscall_program`].
mod bpf {
    pub(super) const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    pub(super) const JA: u16 = 0x05; // BPF_JMP | BPF_JA
    pub(super) const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    pub(super) const JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
    pub(super) const JSET_K: u16 = 0x45; // BPF_JMP | BPF_JSET | BPF_K
    pub(super) const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    pub(super) const RET_ALLOW: u32 = 0x7fff_0000;
    pub(super) const RET_ERRNO: u32 = 0x0005_0000;
    pub(super) const RET_KILL_PROCESS: u32 = 0x8000_0000;
    /// Offsets in `struct seccomp_data`.
    pub(super) const NR: u32 = 0;
    pub(super) const ARCH: u32 = 4;
    /// The low 32 bits of argument `index` (both supported architectures are little-endian).
    pub(super) const fn arg_low(index: u8) -> u32 {
        16 + 8 * index as u32
    }
    /// Numbers with this bit set are x32 system calls.
    pub(super) const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    #[cfg(target_arch = "x86_64")]
    pub(super) const AUDIT_ARCH: u32 = 0xc000_003e;
    #[cfg(target_arch = "aarch64")]
    pub const AUDIT_ARCH: u32 = 0xc000_00b7;
}

fn op(code: u16, jt: u8, jf: u8, k: u32) -> seccompiler::sock_filter {
    seccompiler::sock_filter { code, jt, jf, k }
}

fn errno(errno: u32) -> seccompiler::sock_filter {
    op(bpf::RET_K, 0, 0, bpf::RET_ERRNO | errno)
}

/// The agent's whole filter as one program: another architecture's calls kill the process
/// (their numbers mean other calls), x32 calls (numbers with bit 30 set share the x86_64 arch
/// value) get EPERM, and each number in `rules` is handled by its rule; everything else is
/// allowed.
///
/// Built here rather than with `seccompiler`, whose programs test the numbers one after the
/// other: the kernel pre-evaluates a filter for every system call number when it is installed
/// (the seccomp action cache), which for a 40-entry linear chain cost ~150 µs on every
/// sandbox start. This program searches the sorted numbers as a balanced tree instead, a few
/// instructions per number; a refused number returns at its leaf, and a number whose rule
/// reads arguments jumps to that rule's code after the tree (one block per distinct rule).
/// One program rather than several also means one filter run per call.
fn syscall_program(rules: &[(i64, Rule)]) -> Result<BpfProgram, ConfineError> {
    let mut sorted = rules
        .iter()
        .map(|&(nr, rule)| {
            u32::try_from(nr)
                .map(|nr| (nr, rule))
                .map_err(|_| ConfineError::Seccomp(format!("bad number {nr}")))
        })
        .collect::<Result<Vec<(u32, Rule)>, _>>()?;
    sorted.sort_unstable_by_key(|(nr, _)| *nr);
    if sorted.windows(2).any(|pair| pair[0].0 == pair[1].0) {
        return Err(ConfineError::Seccomp("a number with two rules".into()));
    }
    let mut program = vec![
        op(bpf::LD_W_ABS, 0, 0, bpf::ARCH),
        op(bpf::JEQ_K, 1, 0, bpf::AUDIT_ARCH),
        op(bpf::RET_K, 0, 0, bpf::RET_KILL_PROCESS),
        op(bpf::LD_W_ABS, 0, 0, bpf::NR),
    ];
    #[cfg(target_arch = "x86_64")]
    program.extend([
        op(bpf::JGE_K, 0, 1, bpf::X32_SYSCALL_BIT),
        errno(libc::EPERM as u32),
    ]);
    // Jumps to a rule's block, patched once the blocks are placed: (instruction, rule).
    let mut jumps: Vec<(usize, Rule)> = Vec::new();
    let start = program.len();
    let mut tree = Vec::new();
    search_program(&sorted, &mut tree, &mut jumps)?;
    program.extend(tree);
    let mut blocks: Vec<(Rule, usize)> = Vec::new();
    for (at, rule) in jumps {
        let at = start + at;
        let block = match blocks.iter().find(|(r, _)| *r == rule) {
            Some(&(_, block)) => block,
            None => {
                let block = program.len();
                program.extend(rule_block(rule));
                blocks.push((rule, block));
                block
            }
        };
        program[at].k = u32::try_from(block - at - 1)
            .map_err(|_| ConfineError::Seccomp("program too long".into()))?;
    }
    if program.len() > usize::from(u16::MAX) {
        return Err(ConfineError::Seccomp("program too long".into()));
    }
    Ok(program)
}

/// Appends code that applies each number's rule when the loaded number is in `sorted` and
/// returns ALLOW otherwise: a balanced binary search, every path ending in a return or in a
/// jump to a rule's block (recorded in `jumps`, relative to the start of `program`).
fn search_program(
    sorted: &[(u32, Rule)],
    program: &mut Vec<seccompiler::sock_filter>,
    jumps: &mut Vec<(usize, Rule)>,
) -> Result<(), ConfineError> {
    if sorted.len() <= 3 {
        for &(nr, rule) in sorted {
            program.push(op(bpf::JEQ_K, 0, 1, nr));
            match rule {
                Rule::Refuse(code) => program.push(errno(code)),
                _ => {
                    jumps.push((program.len(), rule));
                    program.push(op(bpf::JA, 0, 0, 0));
                }
            }
        }
        program.push(op(bpf::RET_K, 0, 0, bpf::RET_ALLOW));
        return Ok(());
    }
    let (low, high) = sorted.split_at(sorted.len() / 2);
    let mut below = Vec::new();
    let mut below_jumps = Vec::new();
    search_program(low, &mut below, &mut below_jumps)?;
    // Conditional jumps reach at most 255 instructions ahead.
    let skip = u8::try_from(below.len())
        .map_err(|_| ConfineError::Seccomp("rule list too long for one program".into()))?;
    program.push(op(bpf::JGE_K, skip, 0, high[0].0));
    let offset = program.len();
    jumps.extend(
        below_jumps
            .into_iter()
            .map(|(at, rule)| (offset + at, rule)),
    );
    program.extend(below);
    let offset = program.len();
    let mut above = Vec::new();
    let mut above_jumps = Vec::new();
    search_program(high, &mut above, &mut above_jumps)?;
    jumps.extend(
        above_jumps
            .into_iter()
            .map(|(at, rule)| (offset + at, rule)),
    );
    program.extend(above);
    Ok(())
}

/// The code of a rule that reads arguments; every path ends in a return.
fn rule_block(rule: Rule) -> Vec<seccompiler::sock_filter> {
    let allow = || op(bpf::RET_K, 0, 0, bpf::RET_ALLOW);
    match rule {
        Rule::Refuse(code) => vec![errno(code)],
        Rule::RefuseBits {
            arg,
            bits,
            errno: code,
        } => vec![
            op(bpf::LD_W_ABS, 0, 0, bpf::arg_low(arg)),
            op(bpf::JSET_K, 0, 1, bits),
            errno(code),
            allow(),
        ],
        Rule::RefuseValues {
            arg,
            values,
            errno: code,
        } => {
            // Each value jumps to the refusal past the remaining comparisons and the allow.
            let mut block = vec![op(bpf::LD_W_ABS, 0, 0, bpf::arg_low(arg))];
            for (at, &value) in values.iter().enumerate() {
                let to_refusal = u8::try_from(values.len() - at).unwrap_or(u8::MAX);
                block.push(op(bpf::JEQ_K, to_refusal, 0, value));
            }
            block.extend([allow(), errno(code)]);
            block
        }
        Rule::CreatingOpen { flags, mode } => {
            // O_TMPFILE is __O_TMPFILE | O_DIRECTORY; its own bit is what creates.
            let creates = (libc::O_CREAT | (libc::O_TMPFILE & !libc::O_DIRECTORY)) as u32;
            vec![
                op(bpf::LD_W_ABS, 0, 0, bpf::arg_low(flags)),
                op(bpf::JSET_K, 1, 0, creates),
                allow(),
                op(bpf::LD_W_ABS, 0, 0, bpf::arg_low(mode)),
                op(bpf::JSET_K, 0, 1, SET_ID_BITS),
                errno(libc::EPERM as u32),
                allow(),
            ]
        }
        Rule::Socket => vec![
            op(bpf::LD_W_ABS, 0, 0, bpf::arg_low(0)),
            op(bpf::JEQ_K, 7, 0, libc::AF_UNIX as u32),
            op(bpf::JEQ_K, 6, 0, libc::AF_INET as u32),
            op(bpf::JEQ_K, 5, 0, libc::AF_INET6 as u32),
            op(bpf::JEQ_K, 1, 0, libc::AF_NETLINK as u32),
            errno(libc::EAFNOSUPPORT as u32),
            op(bpf::LD_W_ABS, 0, 0, bpf::arg_low(2)),
            op(bpf::JEQ_K, 1, 0, libc::NETLINK_ROUTE as u32),
            errno(libc::EPROTONOSUPPORT as u32),
            allow(),
        ],
    }
}

#[cfg(test)]
mod tests {
    // The kernel test forks and makes raw system calls: `unsafe` is allowed in these tests,
    // and every block carries its `// SAFETY:` line (clippy::undocumented_unsafe_blocks).
    #![allow(unsafe_code)]

    use super::*;
    use crate::confine::no_new_privs;

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

    /// The `struct seccomp_data` a program sees: (arch, nr, args).
    struct Call {
        arch: u32,
        nr: u32,
        args: [u64; 6],
    }

    fn call(nr: i64, args: &[u64]) -> Call {
        let mut all = [0u64; 6];
        all[..args.len()].copy_from_slice(args);
        Call {
            arch: bpf::AUDIT_ARCH,
            nr: u32::try_from(nr).unwrap(),
            args: all,
        }
    }

    /// Runs a classic BPF seccomp program on `call` with a minimal interpreter of the opcodes
    /// `syscall_program` uses.
    fn evaluate(program: &[seccompiler::sock_filter], call: &Call) -> u32 {
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let insn = &program[pc];
            pc += 1;
            match insn.code {
                bpf::LD_W_ABS => {
                    acc = match insn.k {
                        bpf::NR => call.nr,
                        bpf::ARCH => call.arch,
                        k if (16..64).contains(&k) && k % 4 == 0 => {
                            let arg = call.args[(k as usize - 16) / 8];
                            // Little-endian: the low word first.
                            if k % 8 == 0 {
                                arg as u32
                            } else {
                                (arg >> 32) as u32
                            }
                        }
                        other => panic!("load at {other}"),
                    }
                }
                bpf::JEQ_K | bpf::JGE_K | bpf::JSET_K => {
                    let taken = match insn.code {
                        bpf::JEQ_K => acc == insn.k,
                        bpf::JGE_K => acc >= insn.k,
                        _ => acc & insn.k != 0,
                    };
                    pc += usize::from(if taken { insn.jt } else { insn.jf });
                }
                bpf::JA => pc += insn.k as usize,
                bpf::RET_K => return insn.k,
                other => panic!("unexpected opcode {other:#x}"),
            }
        }
    }

    fn refused(errno: i32) -> u32 {
        bpf::RET_ERRNO | errno as u32
    }

    #[test]
    fn the_program_refuses_exactly_the_deny_list_and_applies_each_rule() {
        let rules = syscall_rules();
        let program = syscall_program(&rules).unwrap();
        let denied = denied_syscalls();
        for nr in 0..1024u32 {
            // With all arguments zero every argument rule allows (socket family 0 is
            // AF_UNSPEC, which only the socket rule refuses).
            let expected = match rules.iter().find(|(n, _)| *n == i64::from(nr)) {
                Some((_, Rule::Refuse(errno))) => bpf::RET_ERRNO | errno,
                Some((_, Rule::Socket)) => refused(libc::EAFNOSUPPORT),
                Some(_) => bpf::RET_ALLOW,
                None => bpf::RET_ALLOW,
            };
            if denied.contains(&i64::from(nr)) {
                assert_eq!(expected, refused(libc::EPERM));
            }
            let plain = call(i64::from(nr), &[]);
            assert_eq!(evaluate(&program, &plain), expected, "nr {nr}");
            #[cfg(target_arch = "x86_64")]
            assert_eq!(
                evaluate(
                    &program,
                    &Call {
                        nr: nr | bpf::X32_SYSCALL_BIT,
                        ..plain
                    }
                ),
                refused(libc::EPERM)
            );
            let foreign = Call {
                arch: 0x4000_0003,
                ..call(i64::from(nr), &[])
            };
            assert_eq!(evaluate(&program, &foreign), bpf::RET_KILL_PROCESS);
        }
        // A few instructions per number, not the whole list: the point of the tree.
        assert!(
            program.len() < 3 * rules.len() + 40,
            "{} instructions",
            program.len()
        );
    }

    #[test]
    fn new_user_namespaces_and_clone3_are_refused() {
        let program = syscall_program(&syscall_rules()).unwrap();
        let new_user = libc::CLONE_NEWUSER as u64;
        for nr in [libc::SYS_clone, libc::SYS_unshare] {
            assert_eq!(
                evaluate(&program, &call(nr, &[new_user | libc::CLONE_NEWNS as u64])),
                refused(libc::EPERM)
            );
            assert_eq!(
                evaluate(&program, &call(nr, &[libc::CLONE_NEWNS as u64])),
                bpf::RET_ALLOW
            );
        }
        assert_eq!(
            evaluate(&program, &call(libc::SYS_clone3, &[])),
            refused(libc::ENOSYS)
        );
    }

    /// Every call that sets a mode, with the index of its mode argument.
    fn mode_calls() -> Vec<(i64, usize)> {
        let mut calls = vec![
            (libc::SYS_fchmod, 1),
            (libc::SYS_fchmodat, 2),
            (SYS_FCHMODAT2, 2),
            (libc::SYS_mkdirat, 2),
            (libc::SYS_mknodat, 2),
        ];
        #[cfg(target_arch = "x86_64")]
        calls.extend([
            (libc::SYS_chmod, 1),
            (libc::SYS_creat, 1),
            (libc::SYS_mkdir, 1),
            (libc::SYS_mknod, 1),
        ]);
        calls
    }

    #[test]
    fn set_id_modes_are_refused_by_every_call_that_sets_a_mode() {
        let program = syscall_program(&syscall_rules()).unwrap();
        let with_mode = |nr: i64, at: usize, mode: u64| {
            let mut args = [0u64; 6];
            args[at] = mode;
            evaluate(&program, &call(nr, &args))
        };
        let file = libc::S_IFREG as u64;
        for (nr, at) in mode_calls() {
            for mode in [0o4755, 0o2755, 0o6777, file | 0o4755, 0o4000] {
                assert_eq!(
                    with_mode(nr, at, mode),
                    refused(libc::EPERM),
                    "{nr} {mode:o}"
                );
            }
            // The high word is not part of a mode: the kernel never sees it.
            for mode in [0o755, 0o1777, file | 0o644, 0o755 | (0o6000 << 32)] {
                assert_eq!(with_mode(nr, at, mode), bpf::RET_ALLOW, "{nr} {mode:o}");
            }
        }
        let opens = {
            let mut opens = vec![(libc::SYS_openat, 2, 3)];
            #[cfg(target_arch = "x86_64")]
            opens.push((libc::SYS_open, 1, 2));
            opens
        };
        let creat = libc::O_CREAT as u64 | libc::O_WRONLY as u64;
        let tmpfile = libc::O_TMPFILE as u64 | libc::O_RDWR as u64;
        for (nr, flags_at, mode_at) in opens {
            let open = |flags: u64, mode: u64| {
                let mut args = [0u64; 6];
                args[flags_at] = flags;
                args[mode_at] = mode;
                evaluate(&program, &call(nr, &args))
            };
            for flags in [creat, tmpfile, creat | libc::O_EXCL as u64] {
                assert_eq!(open(flags, 0o4755), refused(libc::EPERM));
                assert_eq!(open(flags, 0o2700), refused(libc::EPERM));
                assert_eq!(open(flags, 0o644), bpf::RET_ALLOW);
            }
            // Without O_CREAT or O_TMPFILE the kernel ignores the mode.
            assert_eq!(open(libc::O_RDONLY as u64, 0o6755), bpf::RET_ALLOW);
            assert_eq!(
                open(libc::O_RDWR as u64 | (1 << 40), 0o6755),
                bpf::RET_ALLOW
            );
        }
        // openat2's flags and mode are out of reach: refused as if it did not exist.
        assert_eq!(
            evaluate(&program, &call(libc::SYS_openat2, &[])),
            refused(libc::ENOSYS)
        );
    }

    #[test]
    fn only_unix_inet_and_route_netlink_sockets_are_allowed() {
        let program = syscall_program(&syscall_rules()).unwrap();
        let high = 1u64 << 32;
        for nr in [libc::SYS_socket, libc::SYS_socketpair] {
            let socket = |domain: i32, protocol: i32| {
                evaluate(
                    &program,
                    &call(
                        nr,
                        &[domain as u64, libc::SOCK_STREAM as u64, protocol as u64],
                    ),
                )
            };
            for domain in [libc::AF_UNIX, libc::AF_INET, libc::AF_INET6] {
                assert_eq!(socket(domain, 0), bpf::RET_ALLOW);
            }
            assert_eq!(
                socket(libc::AF_NETLINK, libc::NETLINK_ROUTE),
                bpf::RET_ALLOW
            );
            for protocol in [
                libc::NETLINK_KOBJECT_UEVENT,
                libc::NETLINK_AUDIT,
                libc::NETLINK_SOCK_DIAG,
            ] {
                assert_eq!(
                    socket(libc::AF_NETLINK, protocol),
                    refused(libc::EPROTONOSUPPORT)
                );
            }
            for domain in [
                libc::AF_VSOCK,
                libc::AF_PACKET,
                libc::AF_ALG,
                libc::AF_BLUETOOTH,
                libc::AF_UNSPEC,
                libc::AF_KEY,
            ] {
                assert_eq!(socket(domain, 0), refused(libc::EAFNOSUPPORT));
            }
            // The kernel reads an int: bits above it change nothing, either way.
            let with_high =
                |domain: i32| evaluate(&program, &call(nr, &[high | domain as u64, 1, 0]));
            assert_eq!(with_high(libc::AF_VSOCK), refused(libc::EAFNOSUPPORT));
            assert_eq!(with_high(libc::AF_UNIX), bpf::RET_ALLOW);
        }
    }

    // `libc::Ioctl` is a u64 on glibc's x86_64 and aarch64 but an int on musl.
    #[allow(clippy::unnecessary_cast)]
    #[test]
    fn terminal_injection_ioctls_are_refused_in_their_low_32_bits() {
        let program = syscall_program(&syscall_rules()).unwrap();
        let ioctl = |request: u64| evaluate(&program, &call(libc::SYS_ioctl, &[0, request, 0]));
        for request in [libc::TIOCSTI as u64, libc::TIOCLINUX as u64] {
            assert_eq!(ioctl(request), refused(libc::EPERM), "{request:#x}");
            // The kernel reads an unsigned int: a set high word is the same request.
            for high in [1u64 << 32, 0xffff_ffff_0000_0000] {
                assert_eq!(
                    ioctl(high | request),
                    refused(libc::EPERM),
                    "{:#x}",
                    high | request
                );
            }
        }
        for request in [
            libc::TCGETS as u64,
            libc::TCSETS as u64,
            libc::TIOCGWINSZ as u64,
            libc::TIOCSWINSZ as u64,
            libc::FIONREAD as u64,
            libc::TIOCSTI as u64 + 1,
            libc::TIOCSTI as u64 - 1,
        ] {
            assert_eq!(ioctl(request), bpf::RET_ALLOW, "{request:#x}");
        }
    }

    /// In a forked child: installs the programs, then makes calls each rule must refuse or
    /// allow. Returns 0 when every check holds, else 10 + the index of the first that does
    /// not; `None` when the programs could not be installed.
    fn checks_under_the_filter(
        programs: &SeccompPrograms,
        file: &std::ffi::CStr,
        created: &std::ffi::CStr,
    ) -> Option<i32> {
        no_new_privs().ok()?;
        programs.install().ok()?;
        // SAFETY: raw system calls whose pointer arguments are null or point to the
        // NUL-terminated paths `file` and `created`, alive until the caller's `_exit`: each is
        // refused or harmless.
        let errno = |nr: i64, args: [i64; 4]| unsafe {
            let result = libc::syscall(nr, args[0], args[1], args[2], args[3], 0, 0);
            if result < 0 {
                *libc::__errno_location()
            } else {
                if matches!(nr, libc::SYS_socket | libc::SYS_openat) {
                    libc::close(result as i32);
                }
                0
            }
        };
        let path = file.as_ptr() as i64;
        let fdcwd = i64::from(libc::AT_FDCWD);
        let creating = i64::from(libc::O_CREAT | libc::O_WRONLY);
        let refused = [
            libc::SYS_mount,
            libc::SYS_bpf,
            libc::SYS_keyctl,
            libc::SYS_ptrace,
        ]
        .iter()
        .all(|&nr| errno(nr, [0; 4]) == libc::EPERM);
        #[cfg(target_arch = "x86_64")]
        let refused = refused
            && errno(libc::SYS_getpid | i64::from(bpf::X32_SYSCALL_BIT), [0; 4]) == libc::EPERM;
        let new_user =
            errno(libc::SYS_unshare, [i64::from(libc::CLONE_NEWUSER), 0, 0, 0]) == libc::EPERM;
        let clone3 = errno(libc::SYS_clone3, [0; 4]) == libc::ENOSYS;
        let set_id = errno(SYS_FCHMODAT2, [fdcwd, path, 0o4755, 0]) == libc::EPERM
            && errno(libc::SYS_fchmodat, [fdcwd, path, 0o2755, 0]) == libc::EPERM
            && errno(
                libc::SYS_openat,
                [fdcwd, created.as_ptr() as i64, creating, 0o4755],
            ) == libc::EPERM;
        let plain_mode = errno(libc::SYS_fchmodat, [fdcwd, path, 0o755, 0]) == 0
            && errno(
                libc::SYS_openat,
                [fdcwd, created.as_ptr() as i64, creating, 0o644],
            ) == 0;
        let openat2 = errno(libc::SYS_openat2, [0; 4]) == libc::ENOSYS;
        let sockets = errno(
            libc::SYS_socket,
            [
                i64::from(libc::AF_VSOCK),
                i64::from(libc::SOCK_STREAM),
                0,
                0,
            ],
        ) == libc::EAFNOSUPPORT
            && errno(
                libc::SYS_socket,
                [
                    i64::from(libc::AF_NETLINK),
                    i64::from(libc::SOCK_RAW),
                    i64::from(libc::NETLINK_KOBJECT_UEVENT),
                    0,
                ],
            ) == libc::EPROTONOSUPPORT
            && errno(
                libc::SYS_socket,
                [i64::from(libc::AF_UNIX), i64::from(libc::SOCK_STREAM), 0, 0],
            ) == 0;
        // Refused before the kernel looks at the descriptor (which would answer EBADF).
        let ioctls = [
            libc::TIOCSTI as i64,
            libc::TIOCLINUX as i64,
            1 << 32 | libc::TIOCSTI as i64,
        ]
        .iter()
        .all(|&request| errno(libc::SYS_ioctl, [-1, request, 0, 0]) == libc::EPERM)
            && errno(libc::SYS_ioctl, [-1, libc::TCGETS as i64, 0, 0]) == libc::EBADF;
        let allowed = errno(libc::SYS_getpid, [0; 4]) == 0;
        let all = [
            refused, new_user, clone3, set_id, plain_mode, openat2, sockets, ioctls, allowed,
        ];
        // Which check failed, as the exit code: 10 + its index.
        Some(all.iter().position(|ok| !ok).map_or(0, |at| 10 + at as i32))
    }

    #[test]
    fn the_kernel_enforces_the_compiled_programs() {
        let programs = SeccompPrograms::compile().unwrap();
        let dir = std::env::temp_dir().join(format!("tollgate-seccomp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("file");
        std::fs::write(&file, b"").unwrap();
        let file = std::ffi::CString::new(file.as_os_str().as_encoded_bytes()).unwrap();
        let created =
            std::ffi::CString::new(dir.join("created").as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: the child only makes system calls and exits; it never returns into the
        // test harness.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                let code = checks_under_the_filter(&programs, &file, &created).unwrap_or(2);
                // SAFETY: leaves the forked child at once, without running the parent's
                // destructors or atexit handlers.
                unsafe { libc::_exit(code) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                let status = nix::sys::wait::waitpid(child, None).unwrap();
                let mode = std::os::unix::fs::MetadataExt::mode(
                    &std::fs::metadata(dir.join("file")).unwrap(),
                );
                std::fs::remove_dir_all(&dir).unwrap();
                assert_eq!(status, nix::sys::wait::WaitStatus::Exited(child, 0));
                assert_eq!(mode & 0o7777, 0o755);
            }
        }
    }
}
