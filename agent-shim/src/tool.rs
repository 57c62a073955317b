//! `tollgate-shim tool read|write|list|stat|delete|exec`: the agent's side of the gateway,
//! usable from a shell inside the sandbox. It speaks gRPC to the supervisor's `Gateway` service on the
//! run's socket (`TOLLGATE_GATEWAY`, default `unix:/run/tollgate/gateway.sock`); agents in
//! other languages can do the same with any gRPC client.
//!
//! Exit codes: 0 done; 1 refused (the reason and the call id on stderr); 2 usage; 69 the
//! gateway cannot be reached.

use std::io::Write as _;

use tollgate_proto::v1;
use tollgate_shim_protocol::plan::{GATEWAY_IN_SANDBOX, MAX_WRITE_BYTES};
use v1::call_tool_request::Tool;
use v1::call_tool_response::Result as ToolResult;

/// Exit status: the gateway refused the call.
pub const EXIT_REFUSED: i32 = 1;
/// Exit status: bad arguments.
pub const EXIT_USAGE: i32 = 2;
/// Exit status: the gateway cannot be reached.
pub const EXIT_UNAVAILABLE: i32 = 69;

const USAGE: &str = "usage: tollgate-shim tool read PATH [--offset N] [--length N]\n       \
                     tollgate-shim tool write PATH [--create | --append] < DATA\n       \
                     tollgate-shim tool list PATH [--json]\n       \
                     tollgate-shim tool stat PATH [--json]\n       \
                     tollgate-shim tool delete PATH\n       \
                     tollgate-shim tool exec [--timeout SECONDS] [--cwd DIR] [--stdin] -- ARGV...\n\
                     PATH is a host path beneath one of the receipt's fs grants (write and delete \
                     need a write grant);\n\
                     exec runs ARGV inside this sandbox (ARGV[0] must be in the receipt's exec list, or \
                     granted only through the gateway), prints its output and exits with its status.\n\
                     A call whose grant asks waits for an operator's approval (said on stderr).";

/// Largest response the client accepts: an exec result carries up to 5 MiB of output.
const MAX_RESPONSE: usize = 16 << 20;

/// A client of this sandbox's gateway (`TOLLGATE_GATEWAY`, default the run's socket).
pub(crate) type GatewayClient = v1::gateway_client::GatewayClient<tonic::transport::Channel>;

/// Runs `session` with a connected gateway client on a current-thread runtime; returns its
/// exit code, or 2 / 69 when the gateway address is bad / unreachable.
pub(crate) fn with_gateway<F, Fut>(session: F) -> i32
where
    F: FnOnce(GatewayClient) -> Fut,
    Fut: std::future::Future<Output = i32>,
{
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
        match endpoint.connect().await {
            Ok(channel) => {
                session(GatewayClient::new(channel).max_decoding_message_size(MAX_RESPONSE)).await
            }
            Err(e) => {
                eprintln!("tollgate-shim: cannot reach the gateway at {target}: {e}");
                EXIT_UNAVAILABLE
            }
        }
    })
}

/// Reports a refused call (its reason and call id) on stderr; the exit code for it.
pub(crate) fn refused(status: tonic::Status) -> i32 {
    let call_id = status
        .metadata()
        .get("tollgate-call-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_owned();
    eprintln!(
        "tollgate-shim: refused: {} (call {call_id})",
        status.message()
    );
    EXIT_REFUSED
}

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

/// What the command line asks for, besides the verb.
#[derive(Debug, Default)]
struct Options {
    path: String,
    offset: u64,
    length: u64,
    json: bool,
    mode: i32,
    timeout_ms: u64,
    cwd: String,
    stdin: bool,
    argv: Vec<String>,
}

fn parse(verb: &str, args: &[String]) -> Option<Options> {
    let mut options = Options::default();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let mut number = || rest.next().and_then(|v| v.parse::<u64>().ok());
        match (verb, arg.as_str()) {
            (_, "--offset") => options.offset = number()?,
            (_, "--length") => options.length = number()?,
            (_, "--timeout") => options.timeout_ms = number()?.checked_mul(1000)?,
            ("exec", "--cwd") => options.cwd = rest.next()?.clone(),
            ("exec", "--stdin") => options.stdin = true,
            ("exec", "--") => {
                options.argv = rest.by_ref().cloned().collect();
            }
            (_, "--json") => options.json = true,
            ("write", "--create") => options.mode = v1::WriteMode::Create as i32,
            ("write", "--append") => options.mode = v1::WriteMode::Append as i32,
            ("exec", flag) if !flag.starts_with("--") => {
                options.argv = std::iter::once(arg.clone())
                    .chain(rest.by_ref().cloned())
                    .collect();
            }
            (_, flag) if !flag.starts_with("--") && options.path.is_empty() => {
                options.path = flag.to_owned();
            }
            _ => return None,
        }
    }
    let complete = if verb == "exec" {
        !options.argv.is_empty()
    } else {
        !options.path.is_empty()
    };
    complete.then_some(options)
}

/// Runs `tollgate-shim tool ARGS...`; returns the exit status.
pub fn main(args: &[String]) -> i32 {
    let Some(verb) = args.first().cloned() else {
        return usage();
    };
    let Some(options) = parse(&verb, &args[1..]) else {
        return usage();
    };
    // Data to write comes from stdin, read before connecting.
    let mut input = Vec::new();
    if verb == "write" || (verb == "exec" && options.stdin) {
        use std::io::Read as _;
        if let Err(e) = std::io::stdin().lock().read_to_end(&mut input) {
            eprintln!("tollgate-shim: reading stdin: {e}");
            return EXIT_USAGE;
        }
    }
    with_gateway(|mut client| async move {
        match verb.as_str() {
            "read" => read(&mut client, options).await,
            "list" | "stat" => list_or_stat(&mut client, &verb, options).await,
            "write" => write(&mut client, options, input).await,
            "delete" => {
                let path = options.path.clone();
                let request = call(Tool::FsDelete(v1::FsDeleteRequest { path: options.path }));
                changed(&mut client, "fs.delete", &path, request).await
            }
            "exec" => exec(&mut client, options, input).await,
            _ => usage(),
        }
    })
}

/// One gateway call for `tool`.
fn call(tool: Tool) -> v1::CallToolRequest {
    v1::CallToolRequest { tool: Some(tool) }
}

/// `read`: reads on until EOF (or `--length`), each chunk one call, within the budget.
async fn read(client: &mut GatewayClient, options: Options) -> i32 {
    let Options {
        path,
        mut offset,
        length,
        ..
    } = options;
    let mut stdout = std::io::stdout().lock();
    let mut left = length;
    loop {
        let request = call(Tool::FsRead(v1::FsReadRequest {
            path: path.clone(),
            offset,
            length: left,
        }));
        let data = match awaited(client, "fs.read", &path, request).await {
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

/// `list` and `stat`: one line per entry, tab-separated or (`--json`) a JSON object.
async fn list_or_stat(client: &mut GatewayClient, verb: &str, options: Options) -> i32 {
    let Options { path, json, .. } = options;
    let (name, tool) = if verb == "list" {
        (
            "fs.list",
            Tool::FsList(v1::FsListRequest { path: path.clone() }),
        )
    } else {
        (
            "fs.stat",
            Tool::FsStat(v1::FsStatRequest { path: path.clone() }),
        )
    };
    let entries = match awaited(client, name, &path, call(tool)).await {
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

/// `write`: one call, one atomic change (appending builds larger files).
async fn write(client: &mut GatewayClient, options: Options, input: Vec<u8>) -> i32 {
    if input.len() > MAX_WRITE_BYTES {
        eprintln!(
            "tollgate-shim: {} bytes on stdin; one write carries at most {MAX_WRITE_BYTES} \
             (write the rest with --append, or use a writable mount)",
            input.len()
        );
        return EXIT_USAGE;
    }
    let path = options.path.clone();
    let request = call(Tool::FsWrite(v1::FsWriteRequest {
        path: options.path,
        data: input,
        mode: options.mode,
    }));
    changed(client, "fs.write", &path, request).await
}

/// A change (`write`, `delete`): the call, saying so while it waits for an operator.
async fn changed(
    client: &mut GatewayClient,
    tool: &str,
    path: &str,
    request: v1::CallToolRequest,
) -> i32 {
    match awaited(client, tool, path, request).await {
        Ok(_) => 0,
        Err(status) => refused(status),
    }
}

/// A call that may wait for an operator's approval (its grant asks): the call, and — while it
/// waits — a line on stderr saying so.
async fn awaited(
    client: &mut GatewayClient,
    tool: &str,
    path: &str,
    request: v1::CallToolRequest,
) -> Result<tonic::Response<v1::CallToolResponse>, tonic::Status> {
    let mut asker = client.clone();
    let call = client.call_tool(request);
    tokio::pin!(call);
    let said = tokio::select! {
        done = &mut call => Some(done),
        () = tokio::time::sleep(std::time::Duration::from_millis(300)) => None,
    };
    let done = match said {
        Some(done) => done,
        None => {
            if let Ok(waiting) = asker
                .list_pending_calls(v1::ListPendingCallsRequest {})
                .await
            {
                for pending in waiting
                    .into_inner()
                    .calls
                    .iter()
                    .filter(|c| c.tool == tool && c.path == path)
                {
                    eprintln!(
                        "tollgate-shim: waiting for an operator to approve {tool} of {path} (call {}; denied at unix {} unless decided)",
                        pending.call_id,
                        pending.deadline.as_ref().map_or(0, |t| t.seconds)
                    );
                }
            }
            call.await
        }
    };
    done
}

/// `exec`: runs the command in this sandbox, relays its output and exits with its status.
async fn exec(client: &mut GatewayClient, options: Options, input: Vec<u8>) -> i32 {
    let program = options.argv.first().cloned().unwrap_or_default();
    let request = call(Tool::Exec(v1::ExecRequest {
        argv: options.argv,
        stdin: input,
        cwd: options.cwd,
        timeout_ms: options.timeout_ms,
    }));
    let ran = match awaited(client, "exec", &program, request).await {
        Ok(response) => match response.into_inner().result {
            Some(ToolResult::Exec(ran)) => ran,
            _ => return EXIT_REFUSED,
        },
        Err(status) => return refused(status),
    };
    let _ = std::io::stdout().lock().write_all(&ran.stdout);
    let _ = std::io::stderr().lock().write_all(&ran.stderr);
    if ran.truncated {
        eprintln!("tollgate-shim: output beyond the gateway's cap was dropped");
    }
    if ran.timed_out {
        eprintln!("tollgate-shim: the command was stopped at its time limit");
    }
    match (ran.exit_code, ran.signal) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        _ => EXIT_REFUSED,
    }
}
