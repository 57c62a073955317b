//! Gateway-only programs: covered so the agent cannot reach them, and shown again to the one
//! command the gateway runs with them.

use std::fs;
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

use super::error::SetupError;
use super::mounts::{restrict_recursively, Restrict};

/// Hides `programs` (sandbox paths of programs the agent may run only through the gateway's
/// exec tool) from the agent: `/dev/null` is bound over each, read-only, `nodev` (nothing can
/// open it), `noexec`, so neither `execve` nor the dynamic loader (`ld.so PROGRAM`, which
/// Landlock's execute right does not cover) reaches its content. Only the gateway's command
/// lifts the cover, in a mount namespace of its own (see [`reveal_program`]). Refused when the
/// agent would reach the program all the same: through another name (a hard link), or because
/// one of its own executables (`execute`), or the interpreter one of them runs through, is
/// that file. A program absent here hides nothing; one already hidden is left as it is.
pub(crate) fn hide_programs(programs: &[PathBuf], execute: &[PathBuf]) -> Result<(), SetupError> {
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
    if programs.is_empty() {
        return Ok(());
    }
    let refuse = |program: &Path, reason: String| SetupError::GatewayProgram {
        program: program.to_owned(),
        reason,
    };
    let mut hidden = Vec::new();
    for program in programs {
        let meta = match fs::metadata(program) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(refuse(program, e.to_string())),
        };
        if meta.file_type().is_char_device() {
            continue;
        }
        if !meta.is_file() {
            return Err(refuse(program, "not a regular file".into()));
        }
        if meta.nlink() > 1 {
            return Err(refuse(
                program,
                format!(
                    "it has {} hard links, and the agent could run it through another name; grant a program with one name only",
                    meta.nlink()
                ),
            ));
        }
        hidden.push((program, meta.dev(), meta.ino()));
    }
    for executable in crate::confine::with_interpreters(execute) {
        let Ok(meta) = fs::metadata(&executable) else {
            continue;
        };
        if let Some((program, ..)) = hidden
            .iter()
            .find(|(_, dev, ino)| (*dev, *ino) == (meta.dev(), meta.ino()))
        {
            return Err(refuse(
                program,
                format!(
                    "the agent's own executable {} is (or runs through) it: list the program in one place only",
                    executable.display()
                ),
            ));
        }
    }
    for (program, ..) in hidden {
        mount(
            Some("/dev/null"),
            program.as_path(),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| refuse(program, format!("covering it: {e}")))?;
        restrict_recursively(
            program,
            Restrict {
                read_only: true,
                devices: false,
                no_exec: true,
            },
        )?;
    }
    Ok(())
}

/// Lifts the cover [`hide_programs`] put over `program`, for this process (the gateway's
/// command) alone: a mount namespace of its own, private, without the cover. Every cover
/// stacked there goes (a program hidden again after an amendment re-added it).
pub(crate) fn reveal_program(program: &Path) -> Result<(), String> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("a mount namespace for the command: {e}"))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("making the command's mounts private: {e}"))?;
    for _ in 0..16 {
        match umount2(program, MntFlags::MNT_DETACH) {
            Ok(()) => continue,
            // Not (any more) a mount point: nothing covers it.
            Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => return Ok(()),
            Err(e) => return Err(format!("uncovering {}: {e}", program.display())),
        }
    }
    Err(format!("{} is covered too many times", program.display()))
}
