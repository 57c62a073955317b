//! Rendering receipts and keys for people (aligned text) and programs (JSON).

use prost_types::Timestamp;
use serde_json::{json, Value};
use tollgate_proto::v1 as pb;
use tollgate_receipt::unix_now;

/// RFC 3339 form of a timestamp ("-" when absent).
pub fn time_text(t: Option<&Timestamp>) -> String {
    match t {
        // humantime formats years up to 9999 only; show anything beyond as raw seconds.
        Some(t) if (0..=253_402_300_799).contains(&t.seconds) => {
            let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(t.seconds as u64);
            humantime::format_rfc3339_seconds(at).to_string()
        }
        Some(t) => format!("unix {}", t.seconds),
        _ => "-".into(),
    }
}

/// "in 9m 58s" / "4m 2s ago" relative to now.
pub fn relative(t: Option<&Timestamp>) -> String {
    let Some(t) = t else { return String::new() };
    let delta = t.seconds - unix_now();
    let span = humantime::format_duration(std::time::Duration::from_secs(delta.unsigned_abs()));
    if delta >= 0 {
        format!("in {span}")
    } else {
        format!("{span} ago")
    }
}

/// A byte count for people: `256 MiB`, `1.5 KiB`, `12 B` (JSON output keeps the number).
pub(crate) fn size(bytes: u64) -> String {
    // A whole number of units without its `.0`: `256 MiB`, not `256.0 MiB`.
    bytesize::ByteSize::b(bytes)
        .display()
        .iec()
        .to_string()
        .replace(".0 ", " ")
}

pub use tollgate_receipt::spec::{access_name as access, sensitivity_name as sensitivity};

fn seconds(t: Option<&Timestamp>) -> Value {
    t.map_or(Value::Null, |t| json!(t.seconds))
}

/// A receipt as JSON (times as Unix seconds and RFC 3339).
pub fn receipt_json(r: &pb::Receipt) -> Value {
    let limits = r.limits.unwrap_or_default();
    json!({
        "receipt_id": r.receipt_id,
        "issuer": r.issuer,
        "key_id": r.key_id,
        "owner": r.owner,
        "subject": r.subject,
        "audience": r.audience,
        "issued_at": seconds(r.issued_at.as_ref()),
        "not_before": seconds(r.not_before.as_ref()),
        "expires_at": seconds(r.expires_at.as_ref()),
        "expires_at_rfc3339": time_text(r.expires_at.as_ref()),
        "policy_version": r.policy_version,
        "parent_receipt_id": r.parent_receipt_id,
        "depth": r.depth,
        "agent": r.agent.as_ref().map(|a| json!({
            "argv": a.argv, "env": a.env, "workdir": a.workdir,
        })),
        "limits": {
            "memory_bytes": limits.memory_bytes,
            "pids": limits.pids,
            "cpu_millicores": limits.cpu_millicores,
            "output_bytes": limits.output_bytes,
            "tmpfs_bytes": limits.tmpfs_bytes,
            "tool_calls": limits.tool_calls,
            "tokens": limits.tokens,
            "files": tollgate_proto::effective_files(limits.files),
            "egress_connections": tollgate_proto::effective_egress(&limits).0,
            "egress_bytes": tollgate_proto::effective_egress(&limits).1,
            "egress_idle_seconds": tollgate_proto::effective_egress(&limits).2,
        },
        "fs": r.fs.iter().map(|g| json!({
            "path": g.path, "access": access(g.access), "mount": g.mount,
            "executable": g.is_executable(&r.exec), "ask": g.ask,
            "ask_reads": g.ask_reads,
        })).collect::<Vec<_>>(),
        "approval_timeout_seconds": r.approval_timeout_seconds,
        "exec": r.exec,
        "gateway_exec": r.gateway_exec.iter().map(|g| json!({
            "program": g.program, "ask": g.ask,
        })).collect::<Vec<_>>(),
        "routes": r.routes.iter().map(|g| json!({
            "name": g.name, "max_sensitivity": sensitivity(g.max_sensitivity),
        })).collect::<Vec<_>>(),
        "egress": r.egress.iter().map(|g| json!({
            "host": g.host, "ports": g.ports,
            "max_sensitivity": sensitivity(g.max_sensitivity),
            "inspected": g.is_inspected(), "inject": g.inject,
            "methods": g.methods, "paths": g.paths,
        })).collect::<Vec<_>>(),
        "network": "loopback_only",
        "delegate": r.delegate.map(|d| json!({"max_depth": d.max_depth})),
        "rootfs": r.rootfs,
        "workspace_keep_seconds": r.workspace_keep_seconds,
        "workspace_exec": r.workspace_exec,
        "home": r.home,
    })
}

/// A receipt as aligned lines for a terminal.
pub fn receipt_text(r: &pb::Receipt) -> String {
    receipt_lines(r).join("\n")
}

/// A decoded receipt for people, one field a line (unescaped: a human view prints each
/// line through `human`).
pub fn receipt_lines(r: &pb::Receipt) -> Vec<String> {
    let mut lines = vec![
        ("receipt", r.receipt_id.clone()),
        ("issuer", format!("{} (key {})", r.issuer, r.key_id)),
        ("owner", r.owner.clone()),
        ("subject", r.subject.clone()),
        ("audience", r.audience.join(", ")),
        ("issued", time_text(r.issued_at.as_ref())),
        ("valid from", time_text(r.not_before.as_ref())),
        (
            "expires",
            format!(
                "{} ({})",
                time_text(r.expires_at.as_ref()),
                relative(r.expires_at.as_ref())
            ),
        ),
    ];
    if !r.parent_receipt_id.is_empty() {
        lines.push((
            "parent",
            format!("{} (depth {})", r.parent_receipt_id, r.depth),
        ));
    }
    if let Some(agent) = &r.agent {
        lines.push((
            "agent",
            if agent.argv.is_empty() {
                "not pinned: the command is given when the run starts".into()
            } else {
                agent.argv.join(" ")
            },
        ));
    }
    if let Some(l) = r.limits {
        lines.push((
            "limits",
            format!(
                "memory {} · pids {} · cpu {:.2} · output {} · tmpfs {} · tool calls {} · tokens {} · files {}",
                size(l.memory_bytes),
                l.pids,
                f64::from(l.cpu_millicores) / 1000.0,
                size(l.output_bytes),
                size(l.tmpfs_bytes),
                l.tool_calls,
                l.tokens,
                tollgate_proto::effective_files(l.files)
            ),
        ));
    }
    for g in &r.fs {
        let mount = if g.mount.is_empty() {
            " (gateway only)".to_owned()
        } else if g.is_writable_executable() {
            format!(" -> {} (writable and executable: W^X lifted)", g.mount)
        } else if g.is_executable(&r.exec) {
            format!(" -> {} (executable)", g.mount)
        } else {
            format!(" -> {}", g.mount)
        };
        let ask = match (g.ask_reads, g.ask) {
            (true, true) => format!(
                ", reads and changes wait for an operator (up to {} s)",
                r.approval_timeout_seconds
            ),
            (true, false) => format!(
                ", reads wait for an operator (up to {} s)",
                r.approval_timeout_seconds
            ),
            (false, true) => format!(
                ", changes wait for an operator (up to {} s)",
                r.approval_timeout_seconds
            ),
            (false, false) => String::new(),
        };
        lines.push((
            "fs",
            format!("{:<5} {}{mount}{ask}", access(g.access), g.path),
        ));
    }
    if !r.exec.is_empty() {
        lines.push(("exec", r.exec.join(", ")));
    }
    for g in &r.gateway_exec {
        let ask = if g.ask { ", asks" } else { "" };
        lines.push(("exec", format!("{} (gateway only{ask})", g.program)));
    }
    for g in &r.routes {
        lines.push((
            "route",
            format!("{} (up to {})", g.name, sensitivity(g.max_sensitivity)),
        ));
    }
    if !r.rootfs.is_empty() {
        lines.push(("rootfs", r.rootfs.clone()));
    }
    for g in &r.egress {
        lines.push(("egress", g.summary()));
    }
    lines.push((
        "network",
        if r.egress.is_empty() {
            "loopback only".into()
        } else {
            "loopback only; egress through the supervisor".into()
        },
    ));
    if let Some(d) = r.delegate {
        lines.push(("delegate", format!("max depth {}", d.max_depth)));
    }
    lines.push(("workspace", workspace_keep_text(r.workspace_keep_seconds)));
    if r.workspace_exec {
        lines.push(("", "/work is executable (W^X lifted for /work)".into()));
    }
    if let Some(home) =
        r.fs.iter()
            .find(|g| !r.home.is_empty() && g.mount == r.home)
    {
        lines.push((
            "home",
            format!(
                "{} -> {} ($HOME, kept across runs{})",
                home.path,
                r.home,
                if home.exec { ", executable" } else { "" }
            ),
        ));
    }
    lines
        .into_iter()
        .map(|(k, v)| format!("{k:<11}{v}"))
        .collect()
}

/// What a receipt's `workspace_keep_seconds` means, for people.
pub fn workspace_keep_text(seconds: u64) -> String {
    if seconds == 0 {
        "/work is removed when the run ends".into()
    } else {
        format!(
            "/work is kept {} after the run ends (however it ends), for `tollgate cp`",
            humantime::format_duration(std::time::Duration::from_secs(seconds))
        )
    }
}

/// A public key as JSON.
pub fn key_json(k: &pb::PublicKey) -> Value {
    json!({
        "key_id": k.key_id,
        "public_key_hex": hex::encode(&k.public_key),
        "active": k.active,
        "created_at": seconds(k.created_at.as_ref()),
        "retired_at": seconds(k.retired_at.as_ref()),
        "verify_until": seconds(k.verify_until.as_ref()),
    })
}

/// A run state as the CLI prints it.
pub(crate) fn run_state_name(state: i32) -> &'static str {
    match pb::RunState::try_from(state) {
        Ok(pb::RunState::Starting) => "starting",
        Ok(pb::RunState::Running) => "running",
        Ok(pb::RunState::Exited) => "exited",
        Ok(pb::RunState::Failed) => "failed",
        Ok(pb::RunState::Stopped) => "stopped",
        Ok(pb::RunState::Expired) => "expired",
        Ok(pb::RunState::Revoked) => "revoked",
        Ok(pb::RunState::LimitExceeded) => "limit_exceeded",
        Ok(pb::RunState::ShimDied) => "shim_died",
        Ok(pb::RunState::SupervisorShutdown) => "supervisor_shutdown",
        Ok(pb::RunState::Lost) => "lost",
        Ok(pb::RunState::ParentEnded) => "parent_ended",
        Ok(pb::RunState::FailedBeforeStart) => "failed_before_start",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_receipt_shows_how_long_its_workspace_is_kept() {
        let receipt = pb::Receipt {
            workspace_keep_seconds: 7200,
            ..Default::default()
        };
        let lines = receipt_lines(&receipt).join("\n");
        assert!(
            lines.contains("workspace  /work is kept 2h after the run ends"),
            "{lines}"
        );
        assert_eq!(receipt_json(&receipt)["workspace_keep_seconds"], 7200);
        let lines = receipt_lines(&pb::Receipt::default()).join("\n");
        assert!(
            lines.contains("workspace  /work is removed when the run ends"),
            "{lines}"
        );
    }

    #[test]
    fn a_receipt_shows_where_w_xor_x_is_lifted_and_its_home() {
        let grant = |path: &str, mount: &str, exec: bool| pb::FsGrant {
            path: path.into(),
            access: pb::FsAccess::Write as i32,
            mount: mount.into(),
            exec,
            ..Default::default()
        };
        let receipt = pb::Receipt {
            fs: vec![
                grant("/srv/proj", "/proj", true),
                grant("/srv/agents/a", "/home/agent", false),
            ],
            workspace_exec: true,
            home: "/home/agent".into(),
            ..Default::default()
        };
        let lines = receipt_lines(&receipt).join("\n");
        for shown in [
            "/srv/proj -> /proj (writable and executable: W^X lifted)",
            "/work is executable (W^X lifted for /work)",
            "home       /srv/agents/a -> /home/agent ($HOME, kept across runs)",
        ] {
            assert!(lines.contains(shown), "{shown}: {lines}");
        }
        let json = receipt_json(&receipt);
        assert_eq!(json["home"], "/home/agent");
        assert_eq!(json["workspace_exec"], true);
        assert_eq!(json["fs"][0]["executable"], true);
    }
}
