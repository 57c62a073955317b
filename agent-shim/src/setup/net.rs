//! The sandbox's network namespace: only loopback, brought up.

/// Brings up `lo` in the (new, empty) network namespace: the only interface the sandbox has.
pub(super) fn loopback_up() -> std::io::Result<()> {
    // SAFETY: plain socket(2) call; the result is checked and the fd closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, byte) in request.ifr_name.iter_mut().zip(b"lo\0") {
        *slot = *byte as libc::c_char;
    }
    // SAFETY: `fd` is an open socket and `request` a valid ifreq naming "lo"; SIOCGIFFLAGS
    // and SIOCSIFFLAGS read and write only that struct.
    let result = unsafe {
        if libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut request) < 0 {
            -1
        } else {
            request.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            libc::ioctl(fd, libc::SIOCSIFFLAGS, &request)
        }
    };
    let error = std::io::Error::last_os_error();
    // SAFETY: `fd` is ours and closed exactly once.
    unsafe { libc::close(fd) };
    if result < 0 {
        Err(error)
    } else {
        Ok(())
    }
}
