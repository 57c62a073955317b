//! `tollgate-bench models`: a streamed chat completion with tools from inside a sandbox,
//! through the sandbox's model endpoint, the gateway and the router, beside the same client
//! going straight to the same upstream from the host.
//!
//! The upstream is a small OpenAI-style server on 127.0.0.1 (TCP_NODELAY, one write per
//! server-sent event) that answers every call with a streamed tool call: a role chunk, the
//! call's id and name, `--chunks` argument fragments `--gap-ms` apart, the finish reason,
//! usage and `[DONE]`. The client is Python's `http.client` (a new connection per call),
//! timing the first event and the last. Per call:
//! * time to first chunk (request sent → first `data:` line);
//! * time per chunk after the first ((last − first) / (events − 1)), whose excess over the
//!   direct client's is what the path adds to each chunk.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tollgate_proto::v1 as pb;
use tollgate_tests::{authed, AuthorityProcess, SupervisorProcess};

/// The bench's supervisor name and host-id range (its own: never shared with a test).
const TEST_NAME: &str = "bench-models";
const HOST_ID_BASE: u32 = 242_000;
const PYTHON: &str = "/usr/bin/python3";

/// The client, inside the sandbox (base URL from OPENAI_BASE_URL) or on the host (argv).
/// Prints one line per call: `call TTFT_MS TOTAL_MS EVENTS`.
const CLIENT_PY: &str = r#"
import http.client, json, os, sys, time, urllib.parse
calls = int(sys.argv[1])
base = sys.argv[2] if len(sys.argv) > 2 else os.environ["OPENAI_BASE_URL"]
url = urllib.parse.urlsplit(base)
path = url.path.rstrip("/") + "/chat/completions"
body = json.dumps({
    "model": "bench", "stream": True,
    "messages": [{"role": "user", "content": "list the files in the project"}],
    "tools": [{"type": "function", "function": {"name": "shell", "description": "run a command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}}],
}).encode()
for i in range(calls + 1):
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    started = time.perf_counter()
    conn.request("POST", path, body, {"content-type": "application/json", "authorization": "Bearer none"})
    response = conn.getresponse()
    first = last = None
    events = 0
    while True:
        line = response.fp.readline()
        if not line:
            break
        if line.startswith(b"data:"):
            now = time.perf_counter()
            if line.strip() == b"data: [DONE]":
                last = now
                break
            events += 1
            if first is None:
                first = now
            last = now
    conn.close()
    if response.status != 200 or first is None:
        print("failed", response.status, flush=True)
        sys.exit(1)
    if i > 0:  # the first call warms up both paths
        print("call %.3f %.3f %d" % ((first - started) * 1e3, (last - first) * 1e3, events), flush=True)
"#;

/// One call's timings.
#[derive(Debug, Clone, Copy)]
struct Call {
    first_ms: f64,
    rest_ms: f64,
    events: u32,
}

impl Call {
    fn per_chunk_ms(self) -> f64 {
        self.rest_ms / f64::from(self.events.saturating_sub(1).max(1))
    }
}

fn parse(output: &str) -> anyhow::Result<Vec<Call>> {
    let calls: Vec<Call> = output
        .lines()
        .filter_map(|line| {
            let mut words = line.strip_prefix("call ")?.split_whitespace();
            Some(Call {
                first_ms: words.next()?.parse().ok()?,
                rest_ms: words.next()?.parse().ok()?,
                events: words.next()?.parse().ok()?,
            })
        })
        .collect();
    anyhow::ensure!(
        !calls.is_empty(),
        "the client timed no call; it said:\n{output}"
    );
    Ok(calls)
}

fn percentile(mut values: Vec<f64>, p: f64) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    let at = ((values.len() as f64 - 1.0) * p).round() as usize;
    values[at.min(values.len() - 1)]
}

/// The SSE events of one streamed tool call, each sent as its own write.
fn events(chunks: usize) -> Vec<String> {
    let chunk = |delta: serde_json::Value, finish: serde_json::Value| {
        format!(
            "data: {}\n\n",
            serde_json::json!({"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": "bench",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    let mut events = vec![
        chunk(
            serde_json::json!({"role": "assistant", "content": null}),
            serde_json::Value::Null,
        ),
        chunk(
            serde_json::json!({"tool_calls": [{"index": 0, "id": "call_Bench0001", "type": "function", "function": {"name": "shell", "arguments": ""}}]}),
            serde_json::Value::Null,
        ),
    ];
    for i in 0..chunks {
        let piece = match i {
            0 => "{\"cmd\": \"ls".to_owned(),
            _ if i + 1 == chunks => " -la\"}".to_owned(),
            _ => format!(" dir{i}"),
        };
        events.push(chunk(
            serde_json::json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}),
            serde_json::Value::Null,
        ));
    }
    events.push(chunk(
        serde_json::json!({}),
        serde_json::json!("tool_calls"),
    ));
    events.push(format!(
        "data: {}\n\n",
        serde_json::json!({"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": "bench", "choices": [],
            "usage": {"prompt_tokens": 40, "completion_tokens": chunks + 4, "total_tokens": chunks + 44}})
    ));
    events.push("data: [DONE]\n\n".into());
    events
}

/// Serves one connection: reads one request (headers and a Content-Length body); answers a
/// `GET` (the supervisor's probe) with the model list, and a `POST` by streaming the
/// events with `gap` between them in chunked encoding, and closes.
async fn serve(mut stream: tokio::net::TcpStream, chunks: usize, gap: Duration) {
    let _ = stream.set_nodelay(true);
    let mut request = Vec::new();
    let mut buffer = [0u8; 16 << 10];
    loop {
        let Ok(read) = stream.read(&mut buffer).await else {
            return;
        };
        if read == 0 {
            return;
        }
        request.extend_from_slice(&buffer[..read]);
        let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&request[..end]).to_ascii_lowercase();
        let length = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .and_then(|value| value.trim().parse::<usize>().ok())
            .unwrap_or(0);
        if request.len() >= end + 4 + length {
            break;
        }
    }
    if request.starts_with(b"GET ") {
        // The supervisor's start-up probe of a local route: its model list.
        let list =
            r#"{"object":"list","data":[{"id":"bench","object":"model","owned_by":"bench"}]}"#;
        let reply = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n{list}",
            list.len()
        );
        let _ = stream.write_all(reply.as_bytes()).await;
        let _ = stream.shutdown().await;
        return;
    }
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\
                transfer-encoding: chunked\r\nconnection: close\r\n\r\n";
    if stream.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    for event in events(chunks) {
        let framed = format!("{:x}\r\n{event}\r\n", event.len());
        if stream.write_all(framed.as_bytes()).await.is_err() {
            return;
        }
        tokio::time::sleep(gap).await;
    }
    let _ = stream.write_all(b"0\r\n\r\n").await;
    let _ = stream.shutdown().await;
}

/// Runs the benchmark and prints the table.
pub(crate) fn bench(calls: usize, chunks: usize, gap_ms: u64, runs: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        nix::unistd::geteuid().is_root(),
        "tollgate-bench models must run as root: it starts a supervisor (sandboxes, cgroups)"
    );
    anyhow::ensure!(
        Path::new(PYTHON).exists(),
        "{PYTHON} is missing (apt-get install python3)"
    );
    anyhow::ensure!(chunks >= 2, "--chunks must be 2 or more");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(measure(calls, chunks, Duration::from_millis(gap_ms), runs))
}

async fn measure(calls: usize, chunks: usize, gap: Duration, runs: usize) -> anyhow::Result<()> {
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = upstream.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = upstream.accept().await {
            tokio::spawn(serve(stream, chunks, gap));
        }
    });

    let dir = tempfile::tempdir()?;
    tollgate_tests::private_dir(dir.path());
    let script = dir.path().join("client.py");
    std::fs::write(&script, CLIENT_PY)?;
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644))?;
    }
    let routes = dir.path().join("routes.toml");
    std::fs::write(
        &routes,
        format!(
            "[[route]]\nname = \"bench\"\nkind = \"local\"\napi = \"openai\"\n\
             endpoint = \"http://{address}\"\nmodel = \"bench\"\n"
        ),
    )?;
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let supervisor = SupervisorProcess::start_with_flags(
        &dir.path().join("supervisor"),
        authority.addr(),
        TEST_NAME,
        HOST_ID_BASE,
        vec!["--routes".into(), routes.display().to_string()],
    );

    println!(
        "upstream: 127.0.0.1, TCP_NODELAY, {} events per call ({chunks} argument fragments) {} ms apart; \
         client: Python http.client, a new connection per call, {calls} calls per round",
        chunks + 5,
        gap.as_millis()
    );
    let (mut direct, mut gateway) = (Vec::new(), Vec::new());
    for round in 0..runs {
        let host = tokio::process::Command::new(PYTHON)
            .arg(&script)
            .arg(calls.to_string())
            .arg(format!("http://{address}/v1"))
            .env_clear()
            .kill_on_drop(true)
            .output()
            .await
            .context("run the host's client")?;
        let host = parse(&String::from_utf8_lossy(&host.stdout))?;

        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        let request = pb::MintReceiptRequest {
            subject: "models-bench".into(),
            ttl_seconds: 600,
            audience: vec!["workstation".into()],
            agent: Some(pb::AgentSpec {
                argv: vec![PYTHON.into(), "/bench/client.py".into(), calls.to_string()],
                ..Default::default()
            }),
            exec: vec![PYTHON.into()],
            fs: vec![pb::FsGrant {
                path: dir.path().display().to_string(),
                access: pb::FsAccess::Read as i32,
                mount: "/bench".into(),
                ..Default::default()
            }],
            routes: vec![pb::RouteGrant {
                name: "bench".into(),
                max_sensitivity: pb::Sensitivity::High as i32,
                ask: false,
            }],
            // The machine's cores, as the host's client has: the quota is not what is
            // measured.
            limits: Some(pb::Limits {
                cpu_millicores: cores * 1000,
                ..Default::default()
            }),
            ..Default::default()
        };
        let minted = authority
            .client()
            .await
            .mint_receipt(authed(&authority.admin_token(), request))
            .await
            .context("mint the run's receipt")?
            .into_inner();
        let run_id = supervisor.start_run(minted.text).await;
        let output = supervisor.output(&run_id).await;
        supervisor
            .wait_ended(&run_id, Duration::from_secs(300))
            .await;
        let sandboxed = parse(&output)?;
        let p50 = |calls: &[Call], f: fn(Call) -> f64| {
            percentile(calls.iter().map(|c| f(*c)).collect(), 0.5)
        };
        println!(
            "round {}: time to first chunk p50 direct {:.3} ms, through the gateway {:.3} ms | per chunk p50 direct {:.3} ms, gateway {:.3} ms",
            round + 1,
            p50(&host, |c| c.first_ms),
            p50(&sandboxed, |c| c.first_ms),
            p50(&host, Call::per_chunk_ms),
            p50(&sandboxed, Call::per_chunk_ms),
        );
        direct.extend(host);
        gateway.extend(sandboxed);
    }
    drop(supervisor);
    drop(authority);

    let stat = |calls: &[Call], f: fn(Call) -> f64, p: f64| {
        percentile(calls.iter().map(|c| f(*c)).collect(), p)
    };
    println!();
    println!(
        "{} calls each way over {runs} rounds (ms)   {:>10} {:>10} {:>10}",
        direct.len(),
        "direct",
        "gateway",
        "added"
    );
    for (name, f) in [
        (
            "time to first chunk",
            (|c: Call| c.first_ms) as fn(Call) -> f64,
        ),
        ("time per chunk after the first", Call::per_chunk_ms),
    ] {
        for (label, p) in [("p50", 0.5), ("p90", 0.9)] {
            let (d, g) = (stat(&direct, f, p), stat(&gateway, f, p));
            println!(
                "{:<44} {d:>10.3} {g:>10.3} {:>10.3}",
                format!("{name}, {label}"),
                g - d
            );
        }
    }
    let added_first = stat(&gateway, |c| c.first_ms, 0.5) - stat(&direct, |c| c.first_ms, 0.5);
    let added_chunk =
        stat(&gateway, Call::per_chunk_ms, 0.5) - stat(&direct, Call::per_chunk_ms, 0.5);
    let verdict = |met: bool| if met { "met" } else { "MISSED" };
    println!();
    println!(
        "target: <= 2 ms added to the time to first chunk at p50: {added_first:.3} ms ({})",
        verdict(added_first <= 2.0)
    );
    println!(
        "target: <= 0.2 ms added per chunk at p50: {added_chunk:.3} ms ({})",
        verdict(added_chunk <= 0.2)
    );
    Ok(())
}
