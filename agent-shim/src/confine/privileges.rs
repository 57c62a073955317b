//! The agent process's own privileges: capabilities (the bounding set too), ids and groups,
//! `no_new_privs`, inherited descriptors and core dumps.

// The privileged steps of confining the agent call the kernel directly: `unsafe` is allowed in this
// module, and every block carries its `// SAFETY:` line (clippy::undocumented_unsafe_blocks).
#![allow(unsafe_code)]

use std::os::fd::RawFd;

use nix::unistd::{setresgid, setresuid, Gid, Uid};

use super::error::ConfineError;

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
