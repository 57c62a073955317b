//! `tollgate-shim tool read|list|stat PATH`: the agent's side of the gateway, usable from a
//! shell inside the sandbox. It speaks gRPC to the supervisor's `Gateway` service on the
//! run's socket (`TOLLGATE_GATEWAY`, default `unix:/run/tollgate/gateway.sock`); agents in
//! other languages can do the same with any gRPC client.
//!
//! Exit codes: 0 done; 1 refused (the reason and the call id on stderr); 2 usage; 69 the
//! gateway cannot be reached.

use std::io::Write as _;

use tollgate_proto::v1;
use v1::call_tool_request::Tool;
use v1::call_tool_response::Result as ToolResult;

use crate::plan::GATEWAY_IN_SANDBOX;

/// Exit status: the gateway refused the call.
pub const EXIT_REFUSED: i32 = 1;
/// Exit status: bad arguments.
pub const EXIT_USAGE: i32 = 2;
/// Exit status: the gateway cannot be reached.
pub const EXIT_UNAVAILABLE: i32 = 69;

const USAGE: &str = "usage: tollgate-shim tool read PATH [--offset N] [--length N]\n       \
                     tollgate-shim tool list PATH [--json]\n       \
                     tollgate-shim tool stat PATH [--json]\n\
                     PATH is a host path beneath one of the receipt's fs grants.";

fn usage() -> i32 {
    eprintln!("{USAGE}");
    EXIT_USAGE
}

fn kind_name(kind: i32) -> &'static str {
    match v1::FileKind::try_from(kind) {
        Ok(v1::FileKind::File) => "file",
        Ok(v1::FileKind::Directory) => "directory",
        Ok(v1::FileKind::Symlink) => "symlink",
        Ok(v1::FileKind::Other) => "other",
        _ => "unknown",
    }
}

/// Runs `tollgate-shim tool ARGS...`; returns the exit status.
pub fn main(args: &[String]) -> i32 {
    let (verb, path) = match (args.first(), args.get(1)) {
        (Some(verb), Some(path)) => (verb.clone(), path.clone()),
        _ => return usage(),
    };
    let (mut offset, mut length, mut json) = (0u64, 0u64, false);
    let mut rest = args[2..].iter();
    while let Some(flag) = rest.next() {
        let mut number = || rest.next().and_then(|v| v.parse::<u64>().ok());
        match flag.as_str() {
            "--offset" => match number() {
                Some(n) => offset = n,
                None => return usage(),
            },
            "--length" => match number() {
                Some(n) => length = n,
                None => return usage(),
            },
            "--json" => json = true,
            _ => return usage(),
        }
    }
    let target =
        std::env::var("TOLLGATE_GATEWAY").unwrap_or_else(|_| format!("unix:{GATEWAY_IN_SANDBOX}"));
    // One thread: the sandbox's pids limit counts threads.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("tollgate-shim: {e}");
            return EXIT_UNAVAILABLE;
        }
    };
    runtime.block_on(async move {
        let endpoint = match tonic::transport::Endpoint::from_shared(target.clone()) {
            Ok(endpoint) => endpoint,
            Err(e) => {
                eprintln!("tollgate-shim: bad gateway address {target}: {e}");
                return EXIT_USAGE;
            }
        };
        let mut client = match endpoint.connect().await {
            Ok(channel) => v1::gateway_client::GatewayClient::new(channel),
            Err(e) => {
                eprintln!("tollgate-shim: cannot reach the gateway at {target}: {e}");
                return EXIT_UNAVAILABLE;
            }
        };
        let call = |tool: Tool| v1::CallToolRequest { tool: Some(tool) };
        let refused = |status: tonic::Status| {
            let call_id = status
                .metadata()
                .get("tollgate-call-id")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-")
                .to_owned();
            eprintln!("tollgate-shim: refused: {} (call {call_id})", status.message());
            EXIT_REFUSED
        };
        match verb.as_str() {
            "read" => {
                // Read on until EOF (or `length`): each chunk is one call, within the budget.
                let mut stdout = std::io::stdout().lock();
                let mut left = length;
                loop {
                    let request = call(Tool::FsRead(v1::FsReadRequest {
                        path: path.clone(),
                        offset,
                        length: left,
                    }));
                    let data = match client.call_tool(request).await {
                        Ok(response) => match response.into_inner().result {
                            Some(ToolResult::FsRead(data)) => data,
                            _ => return EXIT_REFUSED,
                        },
                        Err(status) => return refused(status),
                    };
                    if stdout.write_all(&data.data).is_err() {
                        return EXIT_REFUSED;
                    }
                    offset += data.data.len() as u64;
                    if length > 0 {
                        left = left.saturating_sub(data.data.len() as u64);
                    }
                    if data.eof || data.data.is_empty() || (length > 0 && left == 0) {
                        return 0;
                    }
                }
            }
            "list" | "stat" => {
                let tool = if verb == "list" {
                    Tool::FsList(v1::FsListRequest { path })
                } else {
                    Tool::FsStat(v1::FsStatRequest { path })
                };
                let entries = match client.call_tool(call(tool)).await {
                    Ok(response) => match response.into_inner().result {
                        Some(ToolResult::FsList(list)) => list.entries,
                        Some(ToolResult::FsStat(stat)) => stat.info.into_iter().collect(),
                        _ => return EXIT_REFUSED,
                    },
                    Err(status) => return refused(status),
                };
                for info in entries {
                    let kind = kind_name(info.kind);
                    if json {
                        println!(
                            "{}",
                            serde_json::json!({
                                "name": info.name, "kind": kind, "size": info.size, "mode": info.mode
                            })
                        );
                    } else {
                        println!("{kind}\t{}\t{:o}\t{}", info.size, info.mode, info.name);
                    }
                }
                0
            }
            _ => usage(),
        }
    })
}
