//! `tollgate run -i`/`-t` and `tollgate attach`: this process's stdin to a run's agent over
//! `Attach`, and the run's output back. With a terminal (`-t`, or `attach` from a terminal)
//! this terminal is put in raw mode for the duration — every key, Ctrl-C included, goes to
//! the agent's terminal, whose line discipline turns it into SIGINT there — and its size
//! follows this one's (SIGWINCH). Raw mode is undone however the command ends.

use std::io::{IsTerminal as _, Read as _};
use std::os::fd::AsFd as _;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tollgate_proto::v1 as pb;

use crate::client::authed;
use crate::error::CliError;

/// This terminal's size (stdout's, else stdin's), or 24 x 80 when neither is a terminal.
pub(crate) fn size() -> pb::TerminalSize {
    let found = terminal_size::terminal_size_of(std::io::stdout())
        .or_else(|| terminal_size::terminal_size_of(std::io::stdin()));
    match found {
        Some((terminal_size::Width(cols), terminal_size::Height(rows))) if rows > 0 && cols > 0 => {
            pb::TerminalSize {
                rows: u32::from(rows),
                cols: u32::from(cols),
            }
        }
        _ => pb::TerminalSize { rows: 24, cols: 80 },
    }
}

/// This terminal in raw mode until dropped.
pub(crate) struct RawMode(Option<nix::sys::termios::Termios>);

impl RawMode {
    fn enter() -> Self {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Self(None);
        }
        let Ok(saved) = nix::sys::termios::tcgetattr(stdin.as_fd()) else {
            return Self(None);
        };
        let mut raw = saved.clone();
        nix::sys::termios::cfmakeraw(&mut raw);
        if nix::sys::termios::tcsetattr(stdin.as_fd(), nix::sys::termios::SetArg::TCSANOW, &raw)
            .is_err()
        {
            return Self(None);
        }
        Self(Some(saved))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let _ = nix::sys::termios::tcsetattr(
                std::io::stdin().as_fd(),
                nix::sys::termios::SetArg::TCSANOW,
                saved,
            );
        }
    }
}

/// What the end of this process's stdin means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AtEndOfInput {
    /// The agent's input ends too (`tollgate run -i`: this process is the run's input).
    CloseInput,
    /// This attach ends; the agent's input stays open for the run and other attaches
    /// (`tollgate attach`).
    Detach,
}

/// A process wired to a run.
pub(crate) struct Attached {
    /// The run's events: its output, then its end.
    pub(crate) events: tonic::Streaming<pb::RunEvent>,
    /// Raw mode, undone when dropped.
    pub(crate) raw: Option<RawMode>,
    /// Completes when stdin ended with [`AtEndOfInput::Detach`]: the caller stops.
    pub(crate) detached: tokio::sync::oneshot::Receiver<()>,
}

/// Wires this process to `run_id`: stdin (read on a thread of its own) goes in; with
/// `terminal`, raw mode (until the returned guard drops) and resizes. Returns the run's
/// events (its output, then its end) for the caller to show.
pub(crate) async fn attach(
    client: &mut pb::supervisor_client::SupervisorClient<tonic::transport::Channel>,
    token: &str,
    run_id: &str,
    terminal: bool,
    at_end: AtEndOfInput,
) -> Result<Attached, CliError> {
    let (sender, receiver) = mpsc::channel::<pb::AttachRequest>(16);
    let first = pb::AttachRequest {
        run_id: run_id.to_owned(),
        resize: terminal.then(size),
        ..Default::default()
    };
    sender
        .send(first)
        .await
        .map_err(|_| CliError::Other("attach: the request stream closed".into()))?;
    let events = client
        .attach(authed(token, ReceiverStream::new(receiver))?)
        .await?
        .into_inner();
    let raw = terminal.then(RawMode::enter);
    // stdin: read on a thread (a blocking read), sent as it comes; its end closes the
    // agent's input or detaches, as `at_end` says (a terminal in raw mode never ends:
    // Ctrl-D is a byte for the agent).
    let input = sender.clone();
    let (detach, detached) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buffer = vec![0u8; 16 << 10];
        loop {
            match stdin.read(&mut buffer) {
                Ok(0) | Err(_) => {
                    match at_end {
                        AtEndOfInput::CloseInput => {
                            let _ = input.blocking_send(pb::AttachRequest {
                                close_input: true,
                                ..Default::default()
                            });
                        }
                        AtEndOfInput::Detach => {
                            let _ = detach.send(());
                        }
                    }
                    return;
                }
                Ok(n) => {
                    let message = pb::AttachRequest {
                        input: buffer[..n].to_vec(),
                        ..Default::default()
                    };
                    if input.blocking_send(message).is_err() {
                        return;
                    }
                }
            }
        }
    });
    if terminal {
        let resizes = sender;
        tokio::spawn(async move {
            let Ok(mut changes) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
            else {
                return;
            };
            while changes.recv().await.is_some() {
                let message = pb::AttachRequest {
                    resize: Some(size()),
                    ..Default::default()
                };
                if resizes.send(message).await.is_err() {
                    return;
                }
            }
        });
    }
    Ok(Attached {
        events,
        raw,
        detached,
    })
}
