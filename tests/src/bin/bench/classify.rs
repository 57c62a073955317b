//! `tollgate-bench classify`: the router's classifier on 1 MiB of mixed text, beside
//! detect-secrets (Yelp's scanner, from PyPI) on the same bytes in the same run.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::Context as _;
use tollgate_router::{Classifier, ClassifierConfig};

/// The Python that has detect-secrets: `TOLLGATE_PYTHON`, else the test suite's venv.
fn python() -> PathBuf {
    std::env::var_os("TOLLGATE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/pyenv/bin/python")
        })
}

/// Runs the benchmark on both inputs and prints the tables.
pub(crate) fn bench(bytes: usize, samples: usize) -> anyhow::Result<()> {
    let mixed = tollgate_router::bench::mixed_text(bytes, 7);
    one(
        &mixed,
        "mixed text (prose, code, logs, JSON; ~1 line in 20 sensitive)",
        samples,
    )?;
    let dense = tollgate_router::bench::dense_text(bytes, 7);
    one(
        &dense,
        "findings-dense text (a sensitive line after every two ordinary ones)",
        samples,
    )
}

/// One input: the classifier, then the peer on the same bytes.
fn one(text: &str, what: &str, samples: usize) -> anyhow::Result<()> {
    let classifier = Classifier::new(&ClassifierConfig::default())?;
    let mut rates = Vec::new();
    let mut reasons = 0;
    for _ in 0..samples {
        let start = Instant::now();
        let found = classifier.classify(text);
        rates.push(text.len() as f64 / start.elapsed().as_secs_f64() / 1e6);
        reasons = found.reasons.len();
    }
    rates.sort_by(f64::total_cmp);
    let ours = rates[rates.len() / 2];

    let dir = tempfile::tempdir()?;
    let file = dir.path().join("mixed.txt");
    std::fs::write(&file, text)?;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/bench_detect_secrets.py");
    let output = Command::new(python())
        .arg(&script)
        .arg(&file)
        .args(["--repeat", "3"])
        .output()
        .context(
            "running the detect-secrets peer (set TOLLGATE_PYTHON to a Python with detect-secrets)",
        )?;
    anyhow::ensure!(
        output.status.success(),
        "the detect-secrets peer failed: {}",
        String::from_utf8_lossy(&output.stderr).trim()
    );
    let report = String::from_utf8_lossy(&output.stdout);
    let words: Vec<&str> = report.split_whitespace().collect();
    let peer: f64 = match words.as_slice() {
        ["mbps", rate, "findings", _] => rate.parse()?,
        _ => anyhow::bail!("unexpected peer output: {report}"),
    };
    let peer_findings = words[3];
    println!("input: {} bytes of {what}", text.len());
    println!(
        "tollgate-router classifier (one pass, {} detectors)  {ours:>9.1} MB/s   ({reasons} findings, one per {} bytes; median of {samples})",
        classifier.detectors().count(),
        text.len() / reasons.max(1)
    );
    println!("peer: detect-secrets (default plugins and filters)    {peer:>9.2} MB/s   ({peer_findings} findings, median of 3)");
    println!(
        "ratio                                                 {:>9.0}x",
        ours / peer
    );
    Ok(())
}
