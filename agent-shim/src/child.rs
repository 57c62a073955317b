//! `tollgate-shim child delegate|start|list|watch|stop`: delegation from inside a sandbox.
//! An agent whose receipt has a `delegate` grant asks its gateway for a narrower child
//! receipt, starts it in a sandbox of its own, follows it and stops it. The child receipt
//! stays with the supervisor; the agent only ever sees its id and its decoded grants.
//!
//! Exit codes as `tollgate-shim tool`: 0 done (for `watch`: the child's exit code); 1
//! refused (the reason and the call id on stderr); 2 usage; 69 the gateway cannot be reached.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};

use serde::Deserialize;
use tokio_stream::StreamExt as _;
use tollgate_proto::v1;

use crate::tool::{refused, with_gateway, GatewayClient, EXIT_UNAVAILABLE, EXIT_USAGE};

const USAGE: &str = "usage: tollgate-shim child delegate < SPEC.json   (prints the child receipt's id)\n       \
                     tollgate-shim child start ID [-- ARGV...]      (prints the child run's id)\n       \
                     tollgate-shim child list [--json]\n       \
                     tollgate-shim child watch ID                   (relays its output; exits with its code)\n       \
                     tollgate-shim child stop ID [--reason TEXT]\n\
                     SPEC.json: {\"subject\": \"reader\", \"ttl_seconds\": 0, \"agent\": {\"argv\": [...]},\n  \
                     \"limits\": {\"memory_bytes\": 0, ...}, \"fs\": [{\"path\": \"/host/dir\", \"access\": \"read\", \"mount\": \"/data\"}],\n  \
                     \"exec\": [\"/bin/sh\"], \"gateway_exec\": [{\"program\": \"/usr/bin/git\", \"ask\": true}],\n  \
                     \"routes\": [{\"name\": \"local\", \"max_sensitivity\": \"high\"}], \"delegate\": {\"max_depth\": 0, \"ask\": false}}\n\
                     Every grant must lie within this run's receipt; ttl 0 means until this run expires; zero\n\
                     limits take this run's, except tool_calls, tokens and output_bytes: half of what this run\n\
                     has left (they are carved from it).";

fn usage() -> i32 {
    eprintln!("{USAGE}");
    EXIT_USAGE
}

/// A child spec as JSON: `ChildSpec` with access and sensitivity as words.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpecJson {
    subject: String,
    #[serde(default)]
    ttl_seconds: u64,
    #[serde(default)]
    agent: Option<AgentJson>,
    #[serde(default)]
    limits: LimitsJson,
    #[serde(default)]
    fs: Vec<FsJson>,
    #[serde(default)]
    exec: Vec<String>,
    #[serde(default)]
    routes: Vec<RouteJson>,
    #[serde(default)]
    delegate: Option<DelegateJson>,
    #[serde(default)]
    egress: Vec<EgressJson>,
    #[serde(default)]
    gateway_exec: Vec<GatewayExecJson>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentJson {
    argv: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    workdir: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsJson {
    #[serde(default)]
    memory_bytes: u64,
    #[serde(default)]
    pids: u32,
    #[serde(default)]
    cpu_millicores: u32,
    #[serde(default)]
    output_bytes: u64,
    #[serde(default)]
    tmpfs_bytes: u64,
    #[serde(default)]
    tool_calls: u64,
    #[serde(default)]
    tokens: u64,
    #[serde(default)]
    files: u32,
    #[serde(default)]
    egress_connections: u32,
    #[serde(default)]
    egress_bytes: u64,
    #[serde(default)]
    egress_idle_seconds: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EgressJson {
    host: String,
    #[serde(default)]
    ports: Vec<u32>,
    #[serde(default)]
    max_sensitivity: Option<String>,
    #[serde(default)]
    inject: String,
    #[serde(default)]
    methods: Vec<String>,
    #[serde(default)]
    paths: Vec<String>,
    #[serde(default)]
    inspect: bool,
    #[serde(default)]
    ask: bool,
}

/// `low` / `medium` / `high`, or why not.
fn sensitivity(field: &str, text: &str) -> Result<v1::Sensitivity, String> {
    match text {
        "low" => Ok(v1::Sensitivity::Low),
        "medium" => Ok(v1::Sensitivity::Medium),
        "high" => Ok(v1::Sensitivity::High),
        other => Err(format!(
            "spec: {field} is {other:?}; use \"low\", \"medium\" or \"high\""
        )),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FsJson {
    path: String,
    access: String,
    #[serde(default)]
    mount: String,
    #[serde(default)]
    exec: bool,
    /// Changes through the gateway wait for an operator (required beneath an asking grant
    /// of the parent: the authority refuses a child that would skip it).
    #[serde(default)]
    ask: bool,
    /// Reads through the gateway wait for an operator too (required beneath a grant of the
    /// parent that asks before reads).
    #[serde(default)]
    ask_reads: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteJson {
    name: String,
    max_sensitivity: String,
    #[serde(default)]
    ask: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DelegateJson {
    max_depth: u32,
    /// Each grandchild waits for an operator (required where this run's delegate grant asks).
    #[serde(default)]
    ask: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GatewayExecJson {
    program: String,
    /// Each run waits for an operator (required where this run's grant of it asks).
    #[serde(default)]
    ask: bool,
}

/// Parses a JSON child spec; one line naming what is wrong.
fn parse_spec(text: &str) -> Result<v1::ChildSpec, String> {
    let spec: SpecJson = serde_json::from_str(text).map_err(|e| format!("spec: {e}"))?;
    let fs = spec
        .fs
        .into_iter()
        .enumerate()
        .map(|(i, grant)| {
            let access = match grant.access.as_str() {
                "read" => v1::FsAccess::Read,
                "write" => v1::FsAccess::Write,
                other => {
                    return Err(format!(
                        "spec: fs[{i}].access is {other:?}; use \"read\" or \"write\""
                    ))
                }
            };
            Ok(v1::FsGrant {
                path: grant.path,
                access: access as i32,
                mount: grant.mount,
                exec: grant.exec,
                ask: grant.ask,
                ask_reads: grant.ask_reads,
            })
        })
        .collect::<Result<_, _>>()?;
    let routes = spec
        .routes
        .into_iter()
        .enumerate()
        .map(|(i, route)| {
            let sensitivity = sensitivity(
                &format!("routes[{i}].max_sensitivity"),
                &route.max_sensitivity,
            )?;
            Ok(v1::RouteGrant {
                name: route.name,
                max_sensitivity: sensitivity as i32,
                ask: route.ask,
            })
        })
        .collect::<Result<_, String>>()?;
    let egress = spec
        .egress
        .into_iter()
        .enumerate()
        .map(|(i, grant)| {
            let max_sensitivity = match &grant.max_sensitivity {
                Some(text) => sensitivity(&format!("egress[{i}].max_sensitivity"), text)?,
                None => v1::Sensitivity::Low,
            };
            Ok(v1::EgressGrant {
                host: grant.host,
                ports: grant.ports,
                max_sensitivity: max_sensitivity as i32,
                inject: grant.inject,
                methods: grant.methods,
                paths: grant.paths,
                inspect: grant.inspect,
                ask: grant.ask,
            })
        })
        .collect::<Result<_, String>>()?;
    let l = spec.limits;
    Ok(v1::ChildSpec {
        subject: spec.subject,
        ttl_seconds: spec.ttl_seconds,
        agent: spec.agent.map(|agent| v1::AgentSpec {
            argv: agent.argv,
            env: agent.env.into_iter().collect(),
            workdir: agent.workdir,
        }),
        limits: Some(v1::Limits {
            memory_bytes: l.memory_bytes,
            pids: l.pids,
            cpu_millicores: l.cpu_millicores,
            output_bytes: l.output_bytes,
            tmpfs_bytes: l.tmpfs_bytes,
            tool_calls: l.tool_calls,
            tokens: l.tokens,
            files: l.files,
            egress_connections: l.egress_connections,
            egress_bytes: l.egress_bytes,
            egress_idle_seconds: l.egress_idle_seconds,
        }),
        fs,
        exec: spec.exec,
        routes,
        egress,
        delegate: spec.delegate.map(|d| v1::Delegation {
            max_depth: d.max_depth,
            ask: d.ask,
        }),
        gateway_exec: spec
            .gateway_exec
            .into_iter()
            .map(|grant| v1::GatewayExecGrant {
                program: grant.program,
                ask: grant.ask,
            })
            .collect(),
    })
}

fn state_name(state: i32) -> String {
    v1::RunState::try_from(state)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("RUN_STATE_")
                .to_ascii_lowercase()
        })
        .unwrap_or_else(|_| "unknown".into())
}

/// What the command line asks for.
enum Verb {
    Delegate,
    Start { id: String, argv: Vec<String> },
    List { json: bool },
    Watch { id: String },
    Stop { id: String, reason: String },
}

fn parse(args: &[String]) -> Option<Verb> {
    let (verb, rest) = args.split_first()?;
    match (verb.as_str(), rest) {
        ("delegate", []) => Some(Verb::Delegate),
        ("start", [id]) => Some(Verb::Start {
            id: id.clone(),
            argv: Vec::new(),
        }),
        ("start", [id, dashes, argv @ ..]) if dashes == "--" && !argv.is_empty() => {
            Some(Verb::Start {
                id: id.clone(),
                argv: argv.to_vec(),
            })
        }
        ("list", []) => Some(Verb::List { json: false }),
        ("list", [json]) if json == "--json" => Some(Verb::List { json: true }),
        ("watch", [id]) => Some(Verb::Watch { id: id.clone() }),
        ("stop", [id]) => Some(Verb::Stop {
            id: id.clone(),
            reason: String::new(),
        }),
        ("stop", [id, flag, reason]) if flag == "--reason" => Some(Verb::Stop {
            id: id.clone(),
            reason: reason.clone(),
        }),
        _ => None,
    }
}

/// `tollgate-shim child ...`; returns the exit code.
pub fn main(args: &[String]) -> i32 {
    let Some(verb) = parse(args) else {
        return usage();
    };
    let spec = if matches!(verb, Verb::Delegate) {
        let mut text = String::new();
        if let Err(e) = std::io::stdin().lock().read_to_string(&mut text) {
            eprintln!("tollgate-shim: reading the spec from stdin: {e}");
            return EXIT_USAGE;
        }
        match parse_spec(&text) {
            Ok(spec) => Some(spec),
            Err(e) => {
                eprintln!("tollgate-shim: {e}");
                return EXIT_USAGE;
            }
        }
    } else {
        None
    };
    with_gateway(|mut client| async move {
        match verb {
            Verb::Delegate => delegate(&mut client, spec).await,
            Verb::Start { id, argv } => {
                let request = v1::StartChildRequest {
                    receipt_id: id,
                    argv,
                };
                match client.start_child(request).await {
                    Ok(response) => {
                        println!("{}", response.into_inner().run_id);
                        0
                    }
                    Err(status) => refused(status),
                }
            }
            Verb::List { json } => list(&mut client, json).await,
            Verb::Watch { id } => watch(&mut client, id).await,
            Verb::Stop { id, reason } => {
                let request = v1::StopChildRequest { run_id: id, reason };
                match client.stop_child(request).await {
                    Ok(response) => {
                        let run = response.into_inner().run.unwrap_or_default();
                        println!("{}\t{}", run.run_id, state_name(run.state));
                        0
                    }
                    Err(status) => refused(status),
                }
            }
        }
    })
}

/// `delegate`: asks the gateway for a child receipt; prints its id.
async fn delegate(client: &mut GatewayClient, spec: Option<v1::ChildSpec>) -> i32 {
    let request = v1::DelegateRequest { child: spec };
    match client.delegate(request).await {
        Ok(response) => {
            let response = response.into_inner();
            let receipt = response.receipt.unwrap_or_default();
            println!("{}", receipt.receipt_id);
            eprintln!(
                "tollgate-shim: child receipt {} ({}), depth {}, expires at unix {}; this run has {} tool calls and {} tokens left",
                receipt.receipt_id,
                receipt.subject,
                receipt.depth,
                receipt.expires_at.map_or(0, |t| t.seconds),
                response.tool_calls_left,
                response.tokens_left
            );
            0
        }
        Err(status) => refused(status),
    }
}

/// `list`: this run's children, minted and started, one line (or JSON object) each.
async fn list(client: &mut GatewayClient, json: bool) -> i32 {
    match client.list_children(v1::ListChildrenRequest {}).await {
        Ok(tree) => {
            let tree = tree.into_inner();
            for run in &tree.runs {
                let exit = run.report.as_ref().and_then(|r| r.exit_code);
                if json {
                    println!(
                        "{}",
                        serde_json::json!({
                            "run_id": run.run_id,
                            "parent_run_id": run.parent_run_id,
                            "depth": run.depth,
                            "subject": run.subject,
                            "state": state_name(run.state),
                            "exit_code": exit,
                        })
                    );
                } else {
                    println!(
                        "{}\t{}\t{}\t{}\t{}",
                        run.run_id,
                        run.depth,
                        run.subject,
                        state_name(run.state),
                        exit.map_or("-".into(), |c| c.to_string())
                    );
                }
            }
            for child in &tree.pending {
                if json {
                    println!(
                        "{}",
                        serde_json::json!({
                            "run_id": child.receipt_id,
                            "parent_run_id": child.parent_run_id,
                            "subject": child.subject,
                            "state": "minted",
                        })
                    );
                } else {
                    println!("{}\t-\t{}\tminted\t-", child.receipt_id, child.subject);
                }
            }
            0
        }
        Err(status) => refused(status),
    }
}

/// `watch`: relays a child's output until it ends; its exit code.
async fn watch(client: &mut GatewayClient, id: String) -> i32 {
    let request = v1::WatchChildRequest { run_id: id };
    let mut stream = match client.watch_child(request).await {
        Ok(stream) => stream.into_inner(),
        Err(status) => return refused(status),
    };
    while let Some(event) = stream.next().await {
        match event.map(|e| e.event) {
            Ok(Some(v1::run_event::Event::Output(chunk))) => {
                if chunk.stream == v1::OutputStream::Stderr as i32 {
                    let _ = std::io::stderr().lock().write_all(&chunk.data);
                } else {
                    let _ = std::io::stdout().lock().write_all(&chunk.data);
                }
            }
            Ok(Some(v1::run_event::Event::Ended(run))) => {
                let report = run.report.unwrap_or_default();
                let exited = run.state == v1::RunState::Exited as i32;
                return match (report.exit_code, report.signal) {
                    (Some(code), _) if exited => code,
                    (_, Some(signal)) if exited => 128 + signal,
                    _ => {
                        eprintln!(
                            "tollgate-shim: child {} ended: {} ({})",
                            run.run_id,
                            state_name(run.state),
                            report.reason
                        );
                        137
                    }
                };
            }
            Ok(None) => {}
            Err(status) => return refused(status),
        }
    }
    eprintln!("tollgate-shim: the watch ended before the child did");
    EXIT_UNAVAILABLE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_spec_becomes_a_child_spec() {
        let spec = parse_spec(
            r#"{"subject": "reader", "ttl_seconds": 30, "limits": {"memory_bytes": 1048576},
                "fs": [{"path": "/srv/p", "access": "write", "mount": "/p"}],
                "exec": ["/bin/sh"], "routes": [{"name": "local", "max_sensitivity": "high"}],
                "delegate": {"max_depth": 1}}"#,
        )
        .unwrap();
        assert_eq!(spec.subject, "reader");
        assert_eq!(spec.fs[0].access, v1::FsAccess::Write as i32);
        assert_eq!(spec.routes[0].max_sensitivity, v1::Sensitivity::High as i32);
        assert_eq!(spec.limits.unwrap().memory_bytes, 1 << 20);
        assert_eq!(spec.delegate.unwrap().max_depth, 1);
    }

    #[test]
    fn a_bad_spec_is_named() {
        let bad = parse_spec(r#"{"subject": "x", "fs": [{"path": "/a", "access": "rw"}]}"#);
        assert!(bad.unwrap_err().contains("fs[0].access"));
        let unknown = parse_spec(r#"{"subject": "x", "ttl": 5}"#).unwrap_err();
        assert!(unknown.contains("unknown field `ttl`"), "{unknown}");
    }
}
