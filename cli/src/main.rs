//! `tollgate`: the operator CLI. Parses flags and hands over to the library.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = tollgate_cli::Cli::parse();
    match tollgate_cli::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // A run that ended after starting passes on the agent's status; its reason is
            // printed only when the agent did not exit by itself.
            match &error {
                tollgate_cli::CliError::RunEnded { reason, .. } if reason.is_empty() => {}
                _ => eprintln!(
                    "tollgate: error: {}",
                    tollgate_cli::human::line(&error.to_string())
                ),
            }
            ExitCode::from(error.exit_code())
        }
    }
}
