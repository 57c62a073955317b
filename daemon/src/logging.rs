//! A daemon's log: structured events to stderr, as text for people or one JSON object a line
//! for collectors; colour only when stderr is a terminal, never into a file or a journal.
//! The level comes from `RUST_LOG` (default `info`).

use std::io::IsTerminal as _;
use std::str::FromStr;
use std::sync::OnceLock;

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

/// Changes the level of the installed subscriber (a reload), given an `EnvFilter` directive.
type SetLevel = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

static SET_LEVEL: OnceLock<SetLevel> = OnceLock::new();

/// Installs the daemon's log subscriber (once, first thing in `main`). The level is
/// `RUST_LOG` when set, else `level` (an `EnvFilter` directive such as `info` or
/// `tollgate_supervisor=debug`), else `info`.
pub fn init(format: LogFormat, level: Option<&str>) {
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_default_env()
            .ok()
            .or_else(|| level.and_then(|l| tracing_subscriber::EnvFilter::try_new(l).ok()))
            .unwrap_or_else(|| tracing_subscriber::EnvFilter::new("info"))
    };
    // Each format has its own subscriber type: keep a closure over its reload handle.
    match format {
        LogFormat::Text => {
            let builder = tracing_subscriber::fmt()
                .with_env_filter(filter())
                .with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal())
                .with_filter_reloading();
            let handle = builder.reload_handle();
            remember(Box::new(move |level| {
                handle
                    .reload(parse_level(level)?)
                    .map_err(|e| e.to_string())
            }));
            builder.init();
        }
        LogFormat::Json => {
            let builder = tracing_subscriber::fmt()
                .json()
                .with_env_filter(filter())
                .with_writer(std::io::stderr)
                .with_ansi(false)
                .with_filter_reloading();
            let handle = builder.reload_handle();
            remember(Box::new(move |level| {
                handle
                    .reload(parse_level(level)?)
                    .map_err(|e| e.to_string())
            }));
            builder.init();
        }
    }
}

fn parse_level(level: &str) -> Result<tracing_subscriber::EnvFilter, String> {
    tracing_subscriber::EnvFilter::try_new(level)
        .map_err(|e| format!("{level:?} is not a log level: {e}"))
}

fn remember(set_level: SetLevel) {
    let _ = SET_LEVEL.set(set_level);
}

/// Sets the running daemon's log level (an `EnvFilter` directive); `Err` names what is wrong
/// with it, or that no subscriber was installed by [`init`].
pub fn set_level(level: &str) -> Result<(), String> {
    match SET_LEVEL.get() {
        Some(set) => set(level),
        None => Err("no log subscriber of this crate is installed".into()),
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
