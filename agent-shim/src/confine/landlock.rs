//! Landlock: the paths the agent may read, write and execute (with the interpreters its
//! executables need), built ahead of enforcement.

use std::path::Path;

use landlock::{
    Access, AccessFs, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, ABI,
};
use tollgate_shim_protocol::plan::LandlockPlan;

use super::error::ConfineError;

/// The Landlock ABI the sandbox requires: read, write and execute rights, plus REFER (v2)
/// and TRUNCATE (v3), so a rename or truncate cannot reach outside the write list.
pub const REQUIRED_LANDLOCK_ABI: ABI = ABI::V3;

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

/// A Landlock ruleset built from the plan's allow-lists, not yet enforced. Building it opens
/// the allowed paths, so the agent process does it only once pid 1 has written its id map:
/// before that, its capabilities reach no file whose owner is unmapped (an id-mapped grant in
/// a user's private directory would be refused).
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
    // A directory ("/usr/bin/", a writable executable grant, an executable /work) is a rule
    // beneath it: every program there may run.
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
        if let Some(interpreter) = interpreter_of(&path) {
            pending.push(interpreter);
        }
        out.push(path);
    }
    out
}

/// How much of a file is read first: a `#!` line is at most the kernel's 256 bytes, and
/// linkers put the ELF program headers and the interpreter path within the first page, so one
/// read of this size answers for nearly every file. Anything past it is read where it is
/// (reading a whole binary, or a fixed 64 KiB of one, on every sandbox start was waste: this
/// runs on every start, for every executable of the receipt).
const HEAD: usize = 4096;

/// The interpreter a file asks the kernel for: `PT_INTERP` of a 64-bit little-endian ELF, or
/// the first word of a `#!` line; `None` for anything else, or a file that cannot be read.
fn interpreter_of(path: &Path) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::FileExt as _;
    let file = std::fs::File::open(path).ok()?;
    let mut head = vec![0; HEAD];
    let mut len = 0;
    while len < HEAD {
        match file.read_at(&mut head[len..], len as u64) {
            Ok(0) => break,
            Ok(read) => len += read,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    head.truncate(len);
    // `len` bytes at `offset`: from the head where they are in it, else read from the file.
    let span = |offset: usize, len: usize| -> Option<Vec<u8>> {
        let end = offset.checked_add(len)?;
        if let Some(bytes) = head.get(offset..end) {
            return Some(bytes.to_vec());
        }
        let mut bytes = vec![0; len];
        file.read_exact_at(&mut bytes, u64::try_from(offset).ok()?)
            .ok()?;
        Some(bytes)
    };
    interpreter_in(&head, span)
}

/// [`interpreter_of`] over a file's first bytes (`head`), with `span(offset, len)` for any
/// part of the file past them.
fn interpreter_in(
    head: &[u8],
    span: impl Fn(usize, usize) -> Option<Vec<u8>>,
) -> Option<std::path::PathBuf> {
    if let Some(line) = head.strip_prefix(b"#!") {
        let line = line.split(|b| *b == b'\n').next()?;
        let text = std::str::from_utf8(line).ok()?;
        return text.split_whitespace().next().map(std::path::PathBuf::from);
    }
    // ELF64 little-endian: e_phoff at 32, e_phentsize at 54, e_phnum at 56.
    if head.len() < 64 || &head[..4] != b"\x7fELF" || head[4] != 2 || head[5] != 1 {
        return None;
    }
    let u16_at = |at: usize| Some(u16::from_le_bytes(head.get(at..at + 2)?.try_into().ok()?));
    let u64_at =
        |bytes: &[u8], at: usize| Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?));
    let phoff = usize::try_from(u64_at(head, 32)?).ok()?;
    let phentsize = usize::from(u16_at(54)?);
    let phnum = usize::from(u16_at(56)?);
    // The kernel executes no ELF whose program headers take more than 64 KiB, and a file
    // that claims more is not read for them.
    let table = phnum.checked_mul(phentsize)?;
    if phentsize < 40 || table > 64 * 1024 {
        return None;
    }
    let headers = span(phoff, table)?;
    for header in headers.chunks_exact(phentsize) {
        let kind = u32::from_le_bytes(header.get(..4)?.try_into().ok()?);
        const PT_INTERP: u32 = 3;
        if kind == PT_INTERP {
            let offset = usize::try_from(u64_at(header, 8)?).ok()?;
            // The kernel refuses an interpreter path longer than a page.
            let size = usize::try_from(u64_at(header, 32)?).ok()?.min(HEAD);
            let raw = span(offset, size)?;
            let raw = raw.split(|b| *b == 0).next()?;
            return Some(std::path::PathBuf::from(std::str::from_utf8(raw).ok()?));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// Program headers and an interpreter path past the first read are read where they are.
    #[test]
    fn an_interpreter_past_the_first_page_is_found() {
        let mut elf = vec![0u8; 7000];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        let (phoff, phentsize, interp_at) = (5000usize, 56usize, 6100usize);
        elf[32..40].copy_from_slice(&(phoff as u64).to_le_bytes());
        elf[54..56].copy_from_slice(&(phentsize as u16).to_le_bytes());
        elf[56..58].copy_from_slice(&2u16.to_le_bytes());
        // A PT_LOAD first, then the PT_INTERP.
        elf[phoff..phoff + 4].copy_from_slice(&1u32.to_le_bytes());
        let interp = phoff + phentsize;
        elf[interp..interp + 4].copy_from_slice(&3u32.to_le_bytes());
        let path = b"/lib64/ld-far-away.so.2\0";
        elf[interp + 8..interp + 16].copy_from_slice(&(interp_at as u64).to_le_bytes());
        elf[interp + 32..interp + 40].copy_from_slice(&(path.len() as u64).to_le_bytes());
        elf[interp_at..interp_at + path.len()].copy_from_slice(path);
        let dir = std::env::temp_dir().join(format!("tollgate-far-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("far");
        std::fs::write(&file, &elf).unwrap();
        let found = interpreter_of(&file);
        // Cut short before the interpreter's path: nothing, not a wrong path.
        std::fs::write(&file, &elf[..interp_at + 4]).unwrap();
        let cut = interpreter_of(&file);
        std::fs::remove_dir_all(dir).unwrap();
        assert_eq!(found, Some("/lib64/ld-far-away.so.2".into()));
        assert_eq!(cut, None);
        // A table of program headers larger than any the kernel executes is not read.
        let mut huge = elf.clone();
        huge[56..58].copy_from_slice(&u16::MAX.to_le_bytes());
        assert_eq!(interpreter_in(&huge[..4096], |_, _| unreachable!()), None);
    }
}
