//! `tollgate`: the operator CLI. Parses flags and hands over to the library.
// One audited `unsafe` block: restoring SIGPIPE's default action, below.
#![deny(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // First, while this is the only thread.
    end_quietly_on_a_closed_pipe();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_start(network_errors_are_errors)
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tollgate_cli::out::stderr(&format!(
                "tollgate: error: cannot start the async runtime: {e}\n"
            ));
            return ExitCode::from(70);
        }
    };
    runtime.block_on(run())
}

async fn run() -> ExitCode {
    let cli = tollgate_cli::Cli::parse();
    match tollgate_cli::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // A run that ended after starting passes on the agent's status; its reason is
            // printed only when the agent did not exit by itself.
            match &error {
                tollgate_cli::CliError::RunEnded { reason, .. } if reason.is_empty() => {}
                // A closed pipe ends a command quietly, as it ends any Unix filter.
                tollgate_cli::CliError::StdoutClosed => {}
                _ => tollgate_cli::out::stderr(&format!(
                    "tollgate: error: {}\n",
                    tollgate_cli::human::line(&error.to_string())
                )),
            }
            ExitCode::from(error.exit_code())
        }
    }
}

/// The runtime's worker threads, which do every connection's I/O (the command itself runs on
/// the main thread and prints there), keep SIGPIPE blocked: a daemon that closes a connection
/// (a TLS daemon refusing plaintext) is an error with a message, not a silent death.
fn network_errors_are_errors() {
    let mut pipe = nix::sys::signal::SigSet::empty();
    pipe.add(nix::sys::signal::Signal::SIGPIPE);
    let _ = nix::sys::signal::pthread_sigmask(
        nix::sys::signal::SigmaskHow::SIG_BLOCK,
        Some(&pipe),
        None,
    );
}

/// Rust starts programs with SIGPIPE ignored, which turns every write to a closed pipe
/// (`tollgate ps --all | head`) into an error each print would have to handle (and
/// `println!` panics on). A command-line tool should stop quietly instead, as every Unix
/// filter does: SIGPIPE's default action.
#[allow(unsafe_code)]
fn end_quietly_on_a_closed_pipe() {
    // SAFETY: called first in `main`, before any other thread exists; SIG_DFL installs no
    // handler code of ours, so no async-signal-safety rule applies.
    let _ = unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigDfl,
        )
    };
}
