//! Commands that run locally, talking to no daemon: `classify` (the router's classifier),
//! `restore` (a file put back from the supervisor's snapshots) and `completions`.

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::args::Cli;
use crate::error::CliError;
use crate::files::read_input;

/// `tollgate classify`: the text given, "-" for stdin, or a file's contents.
pub(crate) fn classify_input(
    text: Option<String>,
    file: Option<PathBuf>,
    json_out: bool,
) -> Result<(), CliError> {
    let input = match (text, file) {
        (_, Some(file)) => read_input(&file)?,
        (Some(text), None) if text == "-" => read_input(Path::new("-"))?,
        (Some(text), None) => text,
        (None, None) => String::new(),
    };
    classify(&input, json_out)
}

/// `tollgate classify`.
fn classify(text: &str, json_out: bool) -> Result<(), CliError> {
    let classifier =
        tollgate_router::Classifier::new(&tollgate_router::ClassifierConfig::default())
            .map_err(|e| CliError::Other(format!("the built-in detectors do not compile: {e}")))?;
    let found = classifier.classify(text);
    if json_out {
        let reasons: Vec<_> = found
            .reasons
            .iter()
            .map(|r| {
                json!({
                    "detector": r.detector.as_str(),
                    "sensitivity": r.sensitivity.name(),
                    "start": r.span.start,
                    "end": r.span.end,
                })
            })
            .collect();
        println!(
            "{}",
            json!({"sensitivity": found.sensitivity.name(), "reasons": reasons})
        );
    } else {
        say!("sensitivity: {}", found.sensitivity.name());
        for reason in &found.reasons {
            say!("  {reason}");
        }
    }
    Ok(())
}

/// `tollgate restore RUN CALL_ID --data-dir DIR`.
pub(crate) fn restore(
    run_id: &str,
    call_id: &str,
    data_dir: &Path,
    json_out: bool,
) -> Result<(), CliError> {
    let store = tollgate_files::snapshot::SnapshotStore::new(data_dir);
    let restored = store.restore(run_id, call_id)?;
    if json_out {
        println!(
            "{}",
            serde_json::json!({
                "run_id": run_id,
                "call_id": call_id,
                "path": restored.path,
                "removed": restored.removed,
                "size": restored.size,
            })
        );
    } else if restored.removed {
        say!("removed {} (call {call_id} had created it)", restored.path);
    } else {
        say!(
            "restored {} ({} bytes) as it was before call {call_id}",
            restored.path,
            restored.size
        );
    }
    Ok(())
}

/// `tollgate completions SHELL`: the completion script on stdout.
pub(crate) fn completions(shell: clap_complete::Shell) {
    use clap::CommandFactory as _;
    clap_complete::generate(
        shell,
        &mut Cli::command(),
        "tollgate",
        &mut std::io::stdout(),
    );
}
