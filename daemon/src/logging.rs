//! A daemon's log: structured events to stderr, as text for people or one JSON object a line
//! for collectors; colour only when stderr is a terminal, never into a file or a journal.
//! The level comes from `RUST_LOG` (default `info`).

use std::io::IsTerminal as _;
use std::str::FromStr;

/// How log events are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// One line of text an event (coloured on a terminal).
    #[default]
    Text,
    /// One JSON object a line: `timestamp`, `level`, `target`, `fields` (with `message`).
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(format!("{other:?} is not a log format: use text or json")),
        }
    }
}

/// Installs the daemon's log subscriber (once, first thing in `main`).
pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.json().with_ansi(false).init(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_by_name() {
        assert_eq!("json".parse::<LogFormat>(), Ok(LogFormat::Json));
        assert_eq!("text".parse::<LogFormat>(), Ok(LogFormat::Text));
        assert!("yaml"
            .parse::<LogFormat>()
            .unwrap_err()
            .contains("text or json"));
    }
}
