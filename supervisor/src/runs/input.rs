//! A live run's input: the supervisor's end of its agent's stdin pipe or terminal, written by
//! `Attach` (`tollgate run -i`/`-t`, `tollgate attach`).

use std::io::Write as _;
use std::os::fd::AsRawFd as _;

use super::RunManager;
use crate::error::InputError;

/// Writes all of `bytes`, waiting for room whenever the descriptor is full. A terminal's
/// master is also the output relay's, which reads it without blocking: the flag is on the
/// shared open file, so a write here can find it full (`EAGAIN`) instead of blocking.
fn write_all_waiting(end: &mut std::fs::File, mut bytes: &[u8]) -> std::io::Result<()> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd as _;
    while !bytes.is_empty() {
        match end.write(bytes) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let mut room = [PollFd::new(end.as_fd(), PollFlags::POLLOUT)];
                poll(&mut room, PollTimeout::NONE)?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl RunManager {
    /// Runs `act` on `run_id`'s input end (the slot itself, so it may take it), holding its
    /// lock: live run and input checked first.
    fn with_input<T>(
        &self,
        run_id: &str,
        act: impl FnOnce(&mut Option<std::fs::File>) -> Result<T, InputError>,
    ) -> Result<T, InputError> {
        let live = self
            .live_run(run_id)
            .ok_or_else(|| InputError::NotLive(run_id.to_owned()))?;
        let mut input = live.input.lock().unwrap_or_else(|p| p.into_inner());
        if input.is_none() {
            return Err(InputError::NoInput(run_id.to_owned()));
        }
        act(&mut input)
    }

    /// Writes `bytes` to `run_id`'s input (blocks while a pipe is full: the agent reads at
    /// its pace).
    pub fn write_input(&self, run_id: &str, bytes: &[u8]) -> Result<(), InputError> {
        self.with_input(run_id, |input| match input {
            Some(end) => write_all_waiting(end, bytes).map_err(InputError::Write),
            None => Ok(()),
        })
    }

    /// Ends `run_id`'s input: the agent reads end-of-file from a pipe (a terminal hangs up).
    pub fn close_input(&self, run_id: &str) -> Result<(), InputError> {
        self.with_input(run_id, |input| {
            input.take();
            Ok(())
        })
    }

    /// Whether `run_id` is live and takes input.
    pub fn takes_input(&self, run_id: &str) -> Result<(), InputError> {
        self.with_input(run_id, |_| Ok(()))
    }

    /// Sets the size of `run_id`'s terminal; the kernel sends its agent SIGWINCH. On a stdin
    /// pipe it does nothing.
    pub fn resize_terminal(&self, run_id: &str, rows: u16, cols: u16) -> Result<(), InputError> {
        self.with_input(run_id, |input| {
            let Some(end) = input else {
                return Ok(());
            };
            let size = libc::winsize {
                ws_row: rows,
                ws_col: cols,
                ws_xpixel: 0,
                ws_ypixel: 0,
            };
            // SAFETY: TIOCSWINSZ reads one `struct winsize`, which lives across the call, from
            // this descriptor. On a pipe it fails (ENOTTY), which is ignored: a pipe has no
            // size.
            #[allow(unsafe_code)]
            let _ = unsafe { libc::ioctl(end.as_raw_fd(), libc::TIOCSWINSZ, &size) };
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// More than a pipe holds, into a non-blocking write end: every byte arrives, in order.
    #[test]
    fn a_full_non_blocking_input_waits_for_room() {
        use nix::fcntl::{fcntl, FcntlArg, OFlag};
        use std::io::Read as _;
        let (mut reader, writer) = std::io::pipe().unwrap();
        let writer = std::os::fd::OwnedFd::from(writer);
        fcntl(&writer, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).unwrap();
        let mut end = std::fs::File::from(writer);
        let sent: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let reading = std::thread::spawn(move || {
            let mut got = Vec::new();
            reader.read_to_end(&mut got).unwrap();
            got
        });
        write_all_waiting(&mut end, &sent).unwrap();
        drop(end);
        assert_eq!(reading.join().unwrap(), sent);
    }
}
