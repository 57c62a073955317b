//! `tollgate-shim receipt [--json]`: the run's own powers, seen from inside — its grants,
//! limits, expiry, routes and sensitivity caps, delegation, and the budgets left — so an agent
//! can plan within them instead of learning them by being refused. Asked of the gateway
//! (`GetRunReceipt`): the supervisor's view, never the signature or anything secret.
//!
//! Exit codes: 0 shown; 2 usage; 69 the gateway cannot be reached.

use serde_json::{json, Value};
use tollgate_proto::{access_name, sensitivity_name, v1};

use crate::tool::{with_gateway, EXIT_UNAVAILABLE, EXIT_USAGE};

const USAGE: &str = "usage: tollgate-shim receipt [--json]\n\
                     Shows what this run may do: its file grants, programs, model routes (and the \
                     most sensitive text each may carry), limits, expiry, delegation, and the tool \
                     calls and tokens it has left.\n\
                     --json  one JSON object (the same fields, machine-readable)";

/// `tollgate-shim receipt ...`; returns the exit code.
pub fn main(args: &[String]) -> i32 {
    let json = match args {
        [] => false,
        [flag] if flag == "--json" => true,
        [flag] if flag == "--help" || flag == "-h" => {
            println!("{USAGE}");
            return 0;
        }
        _ => {
            eprintln!("{USAGE}");
            return EXIT_USAGE;
        }
    };
    with_gateway(|mut gateway| async move {
        let response = match gateway.get_run_receipt(v1::GetRunReceiptRequest {}).await {
            Ok(response) => response.into_inner(),
            Err(status) => {
                eprintln!(
                    "tollgate-shim: the gateway did not say: {}",
                    status.message()
                );
                return EXIT_UNAVAILABLE;
            }
        };
        let powers = Powers::of(&response, unix_now());
        if json {
            println!("{}", powers.json());
        } else {
            print!("{}", powers.text());
        }
        0
    })
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// The run's powers, as shown.
struct Powers<'a> {
    response: &'a v1::GetRunReceiptResponse,
    receipt: v1::Receipt,
    now: i64,
}

impl<'a> Powers<'a> {
    fn of(response: &'a v1::GetRunReceiptResponse, now: i64) -> Self {
        Self {
            response,
            receipt: response.receipt.clone().unwrap_or_default(),
            now,
        }
    }

    fn expires_at(&self) -> i64 {
        self.receipt.expires_at.as_ref().map_or(0, |t| t.seconds)
    }

    fn json(&self) -> Value {
        let r = &self.receipt;
        let limits = r.limits.unwrap_or_default();
        json!({
            "run_id": r.receipt_id,
            "subject": r.subject,
            "owner": r.owner,
            "issuer": r.issuer,
            "depth": r.depth,
            "parent_run_id": r.parent_receipt_id,
            "expires_at": self.expires_at(),
            "seconds_left": (self.expires_at() - self.now).max(0),
            "agent": r.agent.as_ref().map(|a| json!({"argv": a.argv, "workdir": a.workdir})),
            "fs": r.fs.iter().map(|g| json!({
                "path": g.path,
                "access": access_name(g.access),
                "mount": if g.mount.is_empty() { Value::Null } else { Value::from(g.mount.clone()) },
                "executable": g.is_executable(&r.exec),
                "ask": g.ask,
                "ask_reads": g.ask_reads,
            })).collect::<Vec<_>>(),
            "exec": r.exec,
            "gateway_exec": r.gateway_exec.iter().map(|g| json!({
                "program": g.program,
                "ask": g.ask,
            })).collect::<Vec<_>>(),
            "routes": r.routes.iter().map(|g| json!({
                "name": g.name,
                "max_sensitivity": sensitivity_name(g.max_sensitivity),
                "served": self.response.routes_served.contains(&g.name),
            })).collect::<Vec<_>>(),
            "egress": r.egress.iter().map(|g| json!({
                "host": g.host,
                "ports": g.ports,
                "max_sensitivity": sensitivity_name(g.max_sensitivity),
                "inspected": g.is_inspected(),
                "methods": g.methods,
                "paths": g.paths,
            })).collect::<Vec<_>>(),
            "limits": {
                "memory_bytes": limits.memory_bytes,
                "pids": limits.pids,
                "cpu_millicores": limits.cpu_millicores,
                "output_bytes": limits.output_bytes,
                "tmpfs_bytes": limits.tmpfs_bytes,
                "tool_calls": limits.tool_calls,
                "tokens": limits.tokens,
                "files": limits.files,
            },
            "left": {
                "tool_calls": self.response.tool_calls_left,
                "tokens": self.response.tokens_left,
            },
            "delegate_depth": r.delegate.map_or(0, |d| d.max_depth),
            "workspace_exec": r.workspace_exec,
            "home": r.home,
        })
    }

    fn text(&self) -> String {
        let r = &self.receipt;
        let limits = r.limits.unwrap_or_default();
        let mut out = String::new();
        let mut line = |label: &str, value: String| {
            out.push_str(&format!("{label:<9} {value}\n"));
        };
        line(
            "run",
            format!("{} ({}, owner {})", r.receipt_id, r.subject, r.owner),
        );
        if r.depth > 0 {
            line(
                "parent",
                format!("{} (depth {})", r.parent_receipt_id, r.depth),
            );
        }
        let left = (self.expires_at() - self.now).max(0);
        line(
            "expires",
            format!(
                "unix {} (in {}m {:02}s)",
                self.expires_at(),
                left / 60,
                left % 60
            ),
        );
        if let Some(agent) = &r.agent {
            line(
                "agent",
                if agent.argv.is_empty() {
                    "not pinned: the command was given when the run started".into()
                } else {
                    agent.argv.join(" ")
                },
            );
        }
        if r.fs.is_empty() {
            line("fs", "none".into());
        }
        for (i, grant) in r.fs.iter().enumerate() {
            let place = if grant.mount.is_empty() {
                "through the gateway only".to_owned()
            } else if grant.is_writable_executable() {
                format!(
                    "mounted at {} (writable and executable: you may run what you build there)",
                    grant.mount
                )
            } else if grant.is_executable(&r.exec) {
                format!("mounted at {} (executable)", grant.mount)
            } else if grant.access == v1::FsAccess::Write as i32 {
                // What fails here (a program built, a compiled wheel) fails with the kernel's
                // words; this names the setting that lifts it.
                format!(
                    "mounted at {} (noexec: nothing built here runs or loads without exec = true on this grant in the run spec)",
                    grant.mount
                )
            } else {
                format!("mounted at {}", grant.mount)
            };
            let asks = match (grant.ask_reads, grant.ask) {
                (true, true) => ", each read and change approved first",
                (true, false) => ", each read approved first",
                (false, true) => ", each change approved first",
                (false, false) => "",
            };
            line(
                if i == 0 { "fs" } else { "" },
                format!("{} {} {place}{asks}", grant.path, access_name(grant.access)),
            );
        }
        let programs: Vec<String> = r
            .exec
            .iter()
            .cloned()
            .chain(r.gateway_exec.iter().map(|g| {
                let ask = if g.ask { ", each run approved" } else { "" };
                format!("{} (only with tollgate-shim tool exec{ask})", g.program)
            }))
            .collect();
        line(
            "exec",
            if programs.is_empty() {
                "none".into()
            } else {
                programs.join(", ")
            },
        );
        if r.workspace_exec {
            line(
                "work",
                "/work is executable: you may run what you build there".into(),
            );
        }
        if !r.home.is_empty() {
            line("home", format!("{} ($HOME, kept across runs)", r.home));
        }
        let routes: Vec<String> = r
            .routes
            .iter()
            .map(|g| {
                let served = if self.response.routes_served.contains(&g.name) {
                    ""
                } else {
                    " (not served here)"
                };
                format!(
                    "{} up to {}{served}",
                    g.name,
                    sensitivity_name(g.max_sensitivity)
                )
            })
            .collect();
        line(
            "routes",
            if routes.is_empty() {
                "none".into()
            } else {
                routes.join(", ")
            },
        );
        let egress: Vec<String> = r.egress.iter().map(v1::EgressGrant::summary).collect();
        line(
            "egress",
            if egress.is_empty() {
                "none (no network beyond this sandbox)".into()
            } else {
                format!(
                    "{} (through the proxy at 127.0.0.1:7711)",
                    egress.join("; ")
                )
            },
        );
        line(
            "limits",
            format!(
                "memory {} MiB, pids {}, cpu {:.2}, output {} KiB, /tmp {} MiB, files {}",
                limits.memory_bytes >> 20,
                limits.pids,
                f64::from(limits.cpu_millicores) / 1000.0,
                limits.output_bytes >> 10,
                limits.tmpfs_bytes >> 20,
                limits.files
            ),
        );
        line(
            "left",
            format!(
                "{} of {} tool calls, {} of {} tokens",
                self.response.tool_calls_left,
                limits.tool_calls,
                self.response.tokens_left,
                limits.tokens
            ),
        );
        line(
            "delegate",
            match r.delegate.map_or(0, |d| d.max_depth) {
                0 => "no".into(),
                depth => format!("up to {depth} level(s) of children"),
            },
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response() -> v1::GetRunReceiptResponse {
        v1::GetRunReceiptResponse {
            receipt: Some(v1::Receipt {
                receipt_id: "r1".into(),
                subject: "summarizer".into(),
                owner: "admin".into(),
                expires_at: Some(tollgate_proto::prost_types::Timestamp {
                    seconds: 1_000,
                    nanos: 0,
                }),
                fs: vec![
                    v1::FsGrant {
                        path: "/home/me/p".into(),
                        access: v1::FsAccess::Read as i32,
                        mount: "/project".into(),
                        exec: false,
                        ask: false,
                        ask_reads: false,
                    },
                    v1::FsGrant {
                        path: "/home/me/out".into(),
                        access: v1::FsAccess::Write as i32,
                        mount: String::new(),
                        exec: false,
                        ask: false,
                        ask_reads: false,
                    },
                ],
                exec: vec!["/project/.venv/bin/python".into()],
                routes: vec![
                    v1::RouteGrant {
                        name: "local".into(),
                        max_sensitivity: v1::Sensitivity::High as i32,
                        ask: false,
                    },
                    v1::RouteGrant {
                        name: "claude".into(),
                        max_sensitivity: v1::Sensitivity::Low as i32,
                        ask: false,
                    },
                ],
                limits: Some(v1::Limits {
                    tool_calls: 10,
                    tokens: 100,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            tool_calls_left: 7,
            tokens_left: 40,
            routes_served: vec!["local".into()],
        }
    }

    #[test]
    fn the_text_names_every_power_and_what_is_left() {
        let response = response();
        let text = Powers::of(&response, 900).text();
        for expected in [
            "run       r1 (summarizer, owner admin)",
            "expires   unix 1000 (in 1m 40s)",
            "fs        /home/me/p read mounted at /project (executable)",
            "          /home/me/out write through the gateway only",
            "routes    local up to high, claude up to low (not served here)",
            "left      7 of 10 tool calls, 40 of 100 tokens",
            "delegate  no",
        ] {
            assert!(text.contains(expected), "{expected:?} in\n{text}");
        }
    }

    #[test]
    fn the_json_has_the_same_fields() {
        let response = response();
        let json = Powers::of(&response, 2_000).json();
        assert_eq!(json["seconds_left"], 0);
        assert_eq!(json["fs"][0]["executable"], true);
        assert_eq!(json["fs"][1]["mount"], Value::Null);
        assert_eq!(json["routes"][1]["served"], false);
        assert_eq!(json["left"]["tokens"], 40);
    }
}
