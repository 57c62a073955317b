//! `tollgate`: the operator CLI. Parses flags and hands over to the library.

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = tollgate_cli::Cli::parse();
    match tollgate_cli::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tollgate: error: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}
