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
}
