//! Commands that run locally, talking to no daemon: `classify` (the router's classifier),
//! `restore` (a file put back from the supervisor's snapshots) and `completions`.

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::args::Cli;
use crate::error::CliError;
use crate::files::read_input;

/// The classifier `tollgate classify` uses: the default policy, or a routes file's.
pub(crate) fn policy_classifier(
    routes: Option<&Path>,
) -> Result<tollgate_router::Classifier, CliError> {
    let config = match routes {
        Some(path) => tollgate_router::config::Routes::load(path)
            .map_err(|e| CliError::Other(e.to_string()))?
            .policy
            .classifier_config(),
        None => tollgate_router::ClassifierConfig::default(),
    };
    tollgate_router::Classifier::new(&config)
        .map_err(|e| CliError::Other(format!("the policy's detectors do not compile: {e}")))
}

/// `tollgate classify --explain-policy`: every detector, its level, what it looks for.
pub(crate) fn explain_policy(
    classifier: &tollgate_router::Classifier,
    json_out: bool,
) -> Result<(), CliError> {
    let rows: Vec<_> = classifier
        .detectors()
        .map(|(id, level)| {
            (
                id.as_str().to_owned(),
                level.name(),
                tollgate_router::Classifier::describe(id.as_str()),
            )
        })
        .collect();
    if json_out {
        let list: Vec<_> = rows
            .iter()
            .map(|(id, level, what)| json!({"detector": id, "level": level, "what": what}))
            .collect();
        out!("{}", json!({ "detectors": list }))?;
    } else {
        say!("{:<24} {:<7} what it finds", "detector", "level")?;
        for (id, level, what) in rows {
            say!("{id:<24} {level:<7} {what}")?;
        }
    }
    Ok(())
}

/// `tollgate classify`: the text given, "-" for stdin, or a file's contents.
pub(crate) fn classify_input(
    classifier: &tollgate_router::Classifier,
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
    classify(classifier, &input, json_out)
}

/// `tollgate classify`.
fn classify(
    classifier: &tollgate_router::Classifier,
    text: &str,
    json_out: bool,
) -> Result<(), CliError> {
    let found = classifier.classify(text);
    if json_out {
        let reasons: Vec<_> = found
            .reasons
            .iter()
            .map(|r| {
                json!({
                    "detector": r.detector.as_str(),
                    "what": r.description,
                    "sensitivity": r.sensitivity.name(),
                    "start": r.span.start,
                    "end": r.span.end,
                })
            })
            .collect();
        out!(
            "{}",
            json!({"sensitivity": found.sensitivity.name(), "reasons": reasons})
        )?;
    } else {
        say!("sensitivity: {}", found.sensitivity.name())?;
        for reason in &found.reasons {
            say!("  {reason}")?;
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
        out!(
            "{}",
            serde_json::json!({
                "run_id": run_id,
                "call_id": call_id,
                "path": restored.path,
                "removed": restored.removed,
                "size": restored.size,
            })
        )?;
    } else if restored.removed {
        say!("removed {} (call {call_id} had created it)", restored.path)?;
    } else {
        say!(
            "restored {} ({}) as it was before call {call_id}",
            restored.path,
            crate::show::size(restored.size)
        )?;
    }
    Ok(())
}

/// `tollgate completions SHELL`: the completion script on stdout.
pub(crate) fn completions(shell: clap_complete::Shell) -> Result<(), CliError> {
    use clap::CommandFactory as _;
    // Made in memory first: `generate` panics when its writer fails.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "tollgate", &mut script);
    crate::out::bytes(&script)
}
