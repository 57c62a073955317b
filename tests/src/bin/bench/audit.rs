//! `tollgate-bench audit`: durable audit appends per second, beside their floor on the same
//! disk: writing the same bytes to a plain file with one `fdatasync` per line (what a naive
//! durable append costs, with no hashing and no batching).

use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate_audit::{AuditConfig, AuditLog, Decision, EntryDraft, EntryKind};

/// A typical gateway-call entry: ids, a decision and a few metadata fields.
fn draft(i: u64) -> EntryDraft {
    EntryDraft::new("supervisor", EntryKind::ToolCall)
        .receipt("01935c4e-7a1b-7c3d-9e8f-0a1b2c3d4e5f")
        .run("01935c4e-7a1b-7c3d-9e8f-0a1b2c3d4e5f")
        .call(format!("call-{i}"))
        .decision(Decision::Allow)
        .meta("tool", "fs.read")
        .meta("path", "/project/src/main.rs")
        .meta("bytes", 4096)
        .meta("duration_us", 87)
}

fn open(dir: &std::path::Path) -> anyhow::Result<AuditLog> {
    let key = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
    let mut config = AuditConfig::new(dir, "supervisor", key, "bench");
    let redactor = tollgate_router::SecretRedactor::with_defaults()?;
    config.redactor = Some(Arc::new(move |text: &str| redactor.redact(text)));
    Ok(AuditLog::open(config)?)
}

/// Durable appends per second from `threads` concurrent appenders.
fn audit_rate(threads: usize, per_thread: u64) -> anyhow::Result<f64> {
    let dir = tempfile::tempdir()?;
    let log = open(&dir.path().join("audit"))?;
    let start = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let log = log.clone();
            std::thread::spawn(move || -> anyhow::Result<()> {
                for i in 0..per_thread {
                    log.append(draft(t as u64 * per_thread + i))?;
                }
                Ok(())
            })
        })
        .collect();
    for worker in workers {
        worker
            .join()
            .map_err(|_| anyhow::anyhow!("appender panicked"))??;
    }
    let rate = (threads as u64 * per_thread) as f64 / start.elapsed().as_secs_f64();
    log.close()?;
    Ok(rate)
}

/// The floor: the same line written to a plain file, one fdatasync per line, one writer.
fn raw_rate(count: u64) -> anyhow::Result<f64> {
    let dir = tempfile::tempdir()?;
    let mut file = std::fs::File::create(dir.path().join("plain.jsonl"))?;
    let line = format!(
        "{{\"seq\":1,\"time\":\"2026-11-30T00:00:00.000Z\",\"component\":\"supervisor\",\"kind\":\"tool_call\",\"receipt_id\":\"01935c4e-7a1b-7c3d-9e8f-0a1b2c3d4e5f\",\"run_id\":\"01935c4e-7a1b-7c3d-9e8f-0a1b2c3d4e5f\",\"call_id\":\"call-1\",\"decision\":\"allow\",\"reason\":null,\"metadata\":{{\"bytes\":4096,\"duration_us\":87,\"path\":\"/project/src/main.rs\",\"tool\":\"fs.read\"}},\"prev_hash\":\"{0}\",\"hash\":\"{0}\"}}\n",
        "0".repeat(64)
    );
    let start = Instant::now();
    for _ in 0..count {
        file.write_all(line.as_bytes())?;
        file.sync_data()?;
    }
    Ok(count as f64 / start.elapsed().as_secs_f64())
}

/// Runs the benchmark and prints the table (each figure the median of `samples`).
pub(crate) fn bench(count: u64, samples: usize) -> anyhow::Result<()> {
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let mut rows: Vec<(String, Vec<f64>)> = Vec::new();
    for threads in [1usize, 4, 16] {
        rows.push((
            format!("audit: durable appends/s, {threads} appender(s)"),
            Vec::new(),
        ));
    }
    rows.push((
        "floor: write + fdatasync per line, 1 writer".into(),
        Vec::new(),
    ));
    for _ in 0..samples {
        for (i, threads) in [1usize, 4, 16].into_iter().enumerate() {
            let per_thread = (count / threads as u64).max(1);
            rows[i].1.push(audit_rate(threads, per_thread)?);
        }
        rows[3].1.push(raw_rate(count)?);
        std::thread::sleep(Duration::from_millis(50));
    }
    for (name, values) in rows {
        println!(
            "{name:<52} {:>9.0} /s   (median of {samples})",
            median(values)
        );
    }
    Ok(())
}
