//! How the daemon's allocator gives memory back to the system.
//!
//! Inspected egress connections hold large, short-lived buffers (bodies of up to many MiB,
//! bounded together by `--egress-inspect-budget`). glibc raises its mmap threshold each time
//! such a block is freed (up to 32 MiB); from then on blocks of that size come from the heap
//! arenas, and once freed they stay in the process. Measured: 320 inspected connections left
//! one byte short grew the supervisor to the budget, as they should, but it stayed ~80 MiB
//! larger after their run ended and ~270 MiB larger after the next such run. A fixed threshold
//! keeps every block of 128 KiB or more in its own mapping, handed back when it is freed, so a
//! run's end returns what its connections held.

/// glibc's default threshold, fixed: setting it also turns off the dynamic raising.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 128 * 1024;

/// Makes large blocks come from (and go back to) the system. Call once, first thing.
pub fn return_large_blocks_to_the_system() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets one of the allocator's parameters, under its own lock;
        // nothing is allocated through a pointer here.
        #[allow(unsafe_code)]
        let set = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) };
        if set != 1 {
            tracing::warn!("the allocator refused a fixed mmap threshold: freed buffers may stay in the process");
        }
    }
}
