//! `scripted-models AGENT ENDPOINT_FILE REPORT_FILE`: serves the coding-agent script of AGENT
//! (`tollgate_tests::scripted_models::agents`) on 127.0.0.1, from inside a sandbox beside the
//! agent (tests/tests/coding_agents.rs): writes its endpoint (`http://127.0.0.1:PORT`) to
//! ENDPOINT_FILE, then, every 100 ms until it is killed, its state to REPORT_FILE (replaced
//! whole): a first line `finished=BOOL problems=N`, then `ScriptedModels::report`.

use std::time::Duration;

use anyhow::Context as _;
use tollgate_tests::scripted_models::{agents, ScriptedModels};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [agent, endpoint_file, report_file] = args.as_slice() else {
        anyhow::bail!("usage: scripted-models AGENT ENDPOINT_FILE REPORT_FILE");
    };
    // The agent works in the sandbox's /project (the shipped specs' mount).
    let models = ScriptedModels::start(agents::script(agent, "/project"));
    std::fs::write(endpoint_file, format!("{}\n", models.endpoint))
        .with_context(|| format!("writing {endpoint_file}"))?;
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let state = format!(
            "finished={} problems={}\n{}",
            models.finished(),
            models.problems().len(),
            models.report()
        );
        // Whole or not at all: the sandbox may end between any two writes.
        let partial = format!("{report_file}.partial");
        std::fs::write(&partial, state).with_context(|| format!("writing {partial}"))?;
        std::fs::rename(&partial, report_file)
            .with_context(|| format!("renaming {partial} to {report_file}"))?;
    }
}
