//! A live run's input: the supervisor's end of its agent's stdin pipe or terminal, written by
//! `Attach` (`tollgate run -i`/`-t`, `tollgate attach`).

use std::io::Write as _;
use std::os::fd::AsRawFd as _;

use super::RunManager;
use crate::error::InputError;

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
            Some(end) => end.write_all(bytes).map_err(InputError::Write),
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
