//! Standard output: every byte the CLI prints for its caller goes through here, and a write
//! that fails is an error the command returns ([`CliError::Stdout`], exit 74) rather than a
//! panic (`println!` panics on any error but a closed pipe). A closed pipe
//! ([`CliError::StdoutClosed`]) ends the command quietly, as a Unix filter ends.

use std::io::{self, Write as _};

use crate::error::CliError;

/// Writes `bytes` to stdout as they are, flushed, so a failure shows at the write that met it.
pub fn bytes(bytes: &[u8]) -> Result<(), CliError> {
    let mut stdout = io::stdout().lock();
    stdout
        .write_all(bytes)
        .and_then(|()| stdout.flush())
        .map_err(error)
}

/// Writes `text` and a newline to stdout (the text as it is: escape human views first).
pub fn line(text: &str) -> Result<(), CliError> {
    let mut stdout = io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.write_all(b"\n"))
        .and_then(|()| stdout.flush())
        .map_err(error)
}

/// Writes `text` to stderr as it is. A failed write is dropped: stderr is where failures are
/// reported, so one there has nowhere left to go (`eprint!` would panic instead).
pub fn stderr(text: &str) {
    let mut stderr = io::stderr().lock();
    let _ = stderr
        .write_all(text.as_bytes())
        .and_then(|()| stderr.flush());
}

/// The error a failed write to stdout ends the command with.
pub fn error(e: io::Error) -> CliError {
    if e.kind() == io::ErrorKind::BrokenPipe {
        CliError::StdoutClosed
    } else {
        CliError::Stdout(e)
    }
}

/// Writes one raw line (`format!` arguments) to stdout: JSON, tokens and receipts, which
/// must reach a program byte for byte. Evaluates to `Result<(), CliError>`.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::out::line(&format!($($arg)*))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_pipe_is_quiet_and_anything_else_is_an_error() {
        let closed = error(io::Error::from(io::ErrorKind::BrokenPipe));
        assert!(matches!(closed, CliError::StdoutClosed));
        let full = error(io::Error::from_raw_os_error(28));
        assert_eq!(full.exit_code(), 74);
        assert!(full
            .to_string()
            .starts_with("cannot write to standard output: "));
    }
}
