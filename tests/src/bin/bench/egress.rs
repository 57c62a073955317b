//! `tollgate-bench egress`: outbound HTTPS through the sandbox's proxy and the supervisor's
//! gateway, beside the same clients going straight to the same server from the host, in the
//! same run (root).
//!
//! The bench starts its own authority and supervisor (`--egress-hosts` naming
//! `bench.example.test` at a TLS server in a network namespace of its own, slot 9) and, each
//! round, one sandbox run whose receipt grants `bench.example.test:443` (opaque: bytes are
//! relayed, not inspected). In each round, from inside the sandbox and from the host alike:
//!
//! * an M MiB download of `/bytes/N` with curl (inside: through the proxy the sandbox's
//!   environment names; on the host: `--resolve` to the server's address);
//! * N small `GET /` over one keep-alive connection, timed inside a Python `http.client`
//!   client with `time.perf_counter` (the connection's set-up, CONNECT and handshake, is made
//!   and used once before the timed requests);
//! * N small `GET /`, each on a new connection: TCP (and, proxied, the CONNECT, the
//!   supervisor's checks, its resolution and connect and the connection's two audit entries),
//!   the TLS handshake, the request, the close.
//!
//! Round 0 warms up and is not counted; host and sandbox alternate which goes first. The
//! server sets `TCP_NODELAY`, as HTTPS servers commonly do.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use tollgate_audit::{AuditReader, Decision, EntryFilter, EntryKind, MetaValue};
use tollgate_proto::v1 as pb;
use tollgate_tests::remote::{RemoteNet, RemoteServer, TestCa};
use tollgate_tests::{authed, AuthorityProcess, SupervisorProcess};

/// The name the bench's server answers for and the receipt grants.
const HOST: &str = "bench.example.test";
/// The network namespace slot reserved for this bench (`RemoteNet`).
const SLOT: u8 = 9;
/// The supervisor's test name (its cgroup parent), reserved for this bench.
const TEST_NAME: &str = "bench-egress";
/// The first of the supervisor's host ids, reserved for this bench.
const HOST_ID_BASE: u32 = 209_900;
/// The download client, the same program on the host and in the sandbox.
const CURL: &str = "/usr/bin/curl";
/// The latency client's Python, the same program on the host and in the sandbox.
const PYTHON: &str = "/usr/bin/python3";
/// What curl prints after a download: bytes, total seconds, seconds to the first byte.
const CURL_FORMAT: &str = "download %{size_download} %{time_total} %{time_starttransfer}\\n";

/// The latency client: `latency.py keepalive|new COUNT CAFILE [ADDRESS]`. With an address it
/// connects straight to it (the name still checked against the certificate); without, it
/// tunnels through `HTTPS_PROXY` with `set_tunnel`. Prints
/// `latency MODE MEAN_MS MEDIAN_MS P90_MS SLOW` (SLOW: requests that took over 20 ms).
const LATENCY_PY: &str = r#"
import http.client, os, socket, ssl, statistics, sys, time, urllib.parse

mode, count, cafile = sys.argv[1], int(sys.argv[2]), sys.argv[3]
direct = sys.argv[4] if len(sys.argv) > 4 else None
HOST = "bench.example.test"
context = ssl.create_default_context(cafile=cafile)

if direct:
    # Connect to the server's address; TLS still names and checks bench.example.test.
    real_create_connection = socket.create_connection
    def create_connection(address, *args, **kwargs):
        if address[0] == HOST:
            address = (direct, address[1])
        return real_create_connection(address, *args, **kwargs)
    socket.create_connection = create_connection
    def connection():
        return http.client.HTTPSConnection(HOST, 443, context=context, timeout=30)
else:
    proxy = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
    def connection():
        c = http.client.HTTPSConnection(proxy.hostname, proxy.port, context=context, timeout=30)
        c.set_tunnel(HOST, 443)
        return c

def get(c):
    c.request("GET", "/")
    r = c.getresponse()
    body = r.read()
    if r.status != 200 or not body.startswith(b"hello"):
        raise SystemExit(f"unexpected answer {r.status} {body[:80]!r}")

times = []
if mode == "keepalive":
    c = connection()
    get(c)
    start = time.perf_counter()
    for _ in range(count):
        t = time.perf_counter()
        get(c)
        times.append(time.perf_counter() - t)
    total = time.perf_counter() - start
    c.close()
else:
    start = time.perf_counter()
    for _ in range(count):
        t = time.perf_counter()
        c = connection()
        get(c)
        c.close()
        times.append(time.perf_counter() - t)
    total = time.perf_counter() - start
times.sort()
p90 = times[round((len(times) - 1) * 0.9)]
slow = sum(1 for t in times if t > 0.02)
print(f"latency {mode} {total / count * 1e3:.4f} {statistics.median(times) * 1e3:.4f} {p90 * 1e3:.4f} {slow}", flush=True)
"#;

/// One download: bytes, seconds for the whole request, seconds to its first byte.
#[derive(Debug, Clone, Copy)]
struct Download {
    bytes: f64,
    total: f64,
    first_byte: f64,
}

impl Download {
    /// MB/s (10^6 bytes) over the whole request: connect, handshake (and CONNECT), body.
    fn whole(&self) -> f64 {
        self.bytes / self.total / 1e6
    }

    /// MB/s over the body alone: from its first byte to its last.
    fn body(&self) -> f64 {
        self.bytes / (self.total - self.first_byte).max(1e-9) / 1e6
    }
}

/// One latency loop: per-request mean, median and p90, in ms, and how many took over 20 ms.
#[derive(Debug, Clone, Copy)]
struct Latency {
    mean: f64,
    median: f64,
    p90: f64,
    slow: f64,
}

/// What one side (host or sandbox) measured in one round.
#[derive(Debug, Clone, Copy)]
struct Round {
    download: Download,
    keepalive: Latency,
    new: Latency,
}

/// Reads a round's figures from the clients' output lines.
fn parse(output: &str, expected_bytes: usize) -> anyhow::Result<Round> {
    let mut download = None;
    let (mut keepalive, mut new) = (None, None);
    for line in output.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let number = |i: usize| -> anyhow::Result<f64> {
            words
                .get(i)
                .and_then(|w| w.parse::<f64>().ok())
                .with_context(|| format!("no number {i} in {line:?}"))
        };
        match words.first().copied() {
            Some("download") => {
                download = Some(Download {
                    bytes: number(1)?,
                    total: number(2)?,
                    first_byte: number(3)?,
                });
            }
            Some("latency") => {
                let latency = Latency {
                    mean: number(2)?,
                    median: number(3)?,
                    p90: number(4)?,
                    slow: number(5)?,
                };
                match words.get(1).copied() {
                    Some("keepalive") => keepalive = Some(latency),
                    Some("new") => new = Some(latency),
                    _ => {}
                }
            }
            _ => {}
        }
    }
    let (Some(download), Some(keepalive), Some(new)) = (download, keepalive, new) else {
        anyhow::bail!("missing figures in the clients' output:\n{output}");
    };
    anyhow::ensure!(
        download.bytes as usize == expected_bytes,
        "downloaded {} bytes, expected {expected_bytes}:\n{output}",
        download.bytes
    );
    Ok(Round {
        download,
        keepalive,
        new,
    })
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn open_to_all(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
}

/// The daemons, the remote server and what the sandbox mounts, for the whole bench.
struct Setup {
    address: std::net::Ipv4Addr,
    // Dropped in this order: the supervisor (killed, its cgroups swept), the authority, the
    // server, the namespace, then the directory the daemons' data was in.
    supervisor: SupervisorProcess,
    authority: AuthorityProcess,
    _server: RemoteServer,
    _net: RemoteNet,
    dir: tempfile::TempDir,
}

impl Setup {
    /// Everything up; must be called within the runtime that serves the remote server.
    fn start() -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let net = RemoteNet::create(SLOT);
        let ca = TestCa::new();
        let server = RemoteServer::start(net.listen(443), Some(ca.server(&[HOST])), None);
        let certs = dir.path().join("certs");
        std::fs::create_dir(&certs)?;
        std::fs::write(certs.join("ca.pem"), &ca.pem)?;
        std::fs::write(certs.join("latency.py"), LATENCY_PY)?;
        tollgate_tests::private_dir(dir.path());
        open_to_all(dir.path())?;
        open_to_all(&certs)?;
        let hosts = dir.path().join("egress-hosts");
        std::fs::write(&hosts, format!("{} {HOST}\n", net.address))?;
        let authority = AuthorityProcess::start(&dir.path().join("authority"));
        let supervisor = SupervisorProcess::start_with_flags(
            &dir.path().join("supervisor"),
            authority.addr(),
            TEST_NAME,
            HOST_ID_BASE,
            vec!["--egress-hosts".into(), hosts.display().to_string()],
        );
        Ok(Self {
            address: net.address,
            dir,
            supervisor,
            authority,
            _server: server,
            _net: net,
        })
    }

    fn certs(&self) -> std::path::PathBuf {
        self.dir.path().join("certs")
    }

    /// The host's round: the same download and clients, straight to the server.
    async fn host_round(&self, bytes: usize, requests: usize) -> anyhow::Result<Round> {
        let ca = self.certs().join("ca.pem");
        let script = self.certs().join("latency.py");
        let run = |program: &str, args: Vec<String>| {
            let mut command = tokio::process::Command::new(program);
            command
                .args(args)
                .env_clear()
                .env("PATH", "/usr/bin:/bin")
                .stdin(std::process::Stdio::null())
                .kill_on_drop(true);
            command
        };
        let mut output = String::new();
        let mut commands = vec![run(
            CURL,
            vec![
                "-sS".into(),
                "--noproxy".into(),
                "*".into(),
                "--max-time".into(),
                "120".into(),
                "-o".into(),
                "/dev/null".into(),
                "--cacert".into(),
                ca.display().to_string(),
                "--resolve".into(),
                format!("{HOST}:443:{}", self.address),
                "-w".into(),
                CURL_FORMAT.into(),
                format!("https://{HOST}/bytes/{bytes}"),
            ],
        )];
        for mode in ["keepalive", "new"] {
            commands.push(run(
                PYTHON,
                vec![
                    script.display().to_string(),
                    mode.into(),
                    requests.to_string(),
                    ca.display().to_string(),
                    self.address.to_string(),
                ],
            ));
        }
        for mut command in commands {
            let done = command.output().await.context("run a host client")?;
            output.push_str(&String::from_utf8_lossy(&done.stdout));
            output.push_str(&String::from_utf8_lossy(&done.stderr));
        }
        parse(&output, bytes)
    }

    /// The sandbox's round: one run doing the download and both clients through its proxy.
    /// Also the number of connections the supervisor audited as opened for the run.
    async fn sandbox_round(&self, bytes: usize, requests: usize) -> anyhow::Result<(Round, usize)> {
        let script = format!(
            "{CURL} -sS --max-time 120 -o /dev/null --cacert /certs/ca.pem -w '{CURL_FORMAT}' \
             https://{HOST}/bytes/{bytes} 2>&1\n\
             {PYTHON} /certs/latency.py keepalive {requests} /certs/ca.pem 2>&1\n\
             {PYTHON} /certs/latency.py new {requests} /certs/ca.pem 2>&1\n"
        );
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        let request = pb::MintReceiptRequest {
            subject: "egress-bench".into(),
            ttl_seconds: 600,
            audience: vec!["workstation".into()],
            agent: Some(pb::AgentSpec {
                argv: vec!["/bin/sh".into(), "-c".into(), script],
                ..Default::default()
            }),
            exec: vec!["/bin/sh".into(), CURL.into(), PYTHON.into()],
            fs: vec![pb::FsGrant {
                path: self.certs().display().to_string(),
                access: pb::FsAccess::Read as i32,
                mount: "/certs".into(),
                exec: false,
                ask: false,
                ask_reads: false,
            }],
            // The machine's cores, as the host's clients have: the quota is not what is
            // measured.
            limits: Some(pb::Limits {
                cpu_millicores: cores * 1000,
                ..Default::default()
            }),
            egress: vec![pb::EgressGrant {
                host: HOST.into(),
                ports: vec![443],
                ..Default::default()
            }],
            ..Default::default()
        };
        let minted = self
            .authority
            .client()
            .await
            .mint_receipt(authed(&self.authority.admin_token(), request))
            .await
            .context("mint the run's receipt")?
            .into_inner();
        let run_id = self.supervisor.start_run(minted.text).await;
        let output = self.supervisor.output(&run_id).await;
        self.supervisor
            .wait_ended(&run_id, Duration::from_secs(120))
            .await;
        let round = parse(&output, bytes)?;
        let filter = EntryFilter {
            run_id: Some(run_id),
            ..Default::default()
        };
        let opened = AuditReader::open(&self.supervisor.data_dir().join("audit"))?
            .filtered(filter)
            .filter_map(Result::ok)
            .filter(|entry| {
                entry.kind == EntryKind::Egress
                    && entry.decision == Some(Decision::Allow)
                    && matches!(entry.metadata.get("phase"), Some(MetaValue::Str(p)) if p == "open")
            })
            .count();
        Ok((round, opened))
    }
}

/// Runs the benchmark and prints the table.
pub(crate) fn bench(requests: usize, mebibytes: usize, runs: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        nix::unistd::geteuid().is_root(),
        "tollgate-bench egress must run as root: it starts a supervisor (sandboxes, cgroups) \
         and makes a network namespace"
    );
    for program in [CURL, PYTHON, "/usr/sbin/ip"] {
        anyhow::ensure!(
            Path::new(program).exists()
                || (program == "/usr/sbin/ip" && Path::new("/sbin/ip").exists()),
            "{program} is missing (apt-get install curl python3 iproute2)"
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(measure(requests, mebibytes << 20, runs))
}

async fn measure(requests: usize, bytes: usize, runs: usize) -> anyhow::Result<()> {
    let setup = Setup::start()?;
    println!(
        "remote server: HTTPS (HTTP/1.1) in a network namespace over a veth link, TCP_NODELAY"
    );
    let (mut host, mut sandbox) = (Vec::new(), Vec::new());
    let mut audited = Vec::new();
    for round in 0..=runs {
        let (h, (s, opened)) = if round % 2 == 0 {
            let h = setup.host_round(bytes, requests).await?;
            (h, setup.sandbox_round(bytes, requests).await?)
        } else {
            let s = setup.sandbox_round(bytes, requests).await?;
            (setup.host_round(bytes, requests).await?, s)
        };
        let label = if round == 0 {
            "warm-up".to_owned()
        } else {
            format!("round {round}")
        };
        println!(
            "{label:<8} download MB/s direct {:>7.1} proxied {:>7.1} | keep-alive ms/req {:.3} / {:.3} | new connection ms/req {:.3} / {:.3} (over 20 ms: {} / {}) | audited {opened}",
            h.download.whole(),
            s.download.whole(),
            h.keepalive.mean,
            s.keepalive.mean,
            h.new.mean,
            s.new.mean,
            h.new.slow,
            s.new.slow,
        );
        if round > 0 {
            host.push(h);
            sandbox.push(s);
            audited.push(opened);
        }
    }
    drop(setup);

    let mib = bytes >> 20;
    let pick = |rounds: &[Round], f: &dyn Fn(&Round) -> f64| median(rounds.iter().map(f).collect());
    println!();
    println!("HTTPS download of {mib} MiB with curl, MB/s (10^6 bytes), median of {runs} rounds");
    println!(
        "{:<54} {:>10} {:>10} {:>16}",
        "", "direct", "proxied", "proxied/direct"
    );
    for (name, f) in [
        (
            "whole request (connect, TLS, body)",
            &(|r: &Round| r.download.whole()) as &dyn Fn(&Round) -> f64,
        ),
        ("body only (first byte to last)", &|r: &Round| {
            r.download.body()
        }),
    ] {
        let (d, p) = (pick(&host, f), pick(&sandbox, f));
        println!("{name:<54} {d:>10.1} {p:>10.1} {:>15.0}%", p / d * 100.0);
    }
    println!();
    println!(
        "{requests} HTTPS GET / (27-byte body) with Python http.client, ms per request, median of {runs} rounds"
    );
    println!(
        "{:<54} {:>10} {:>10} {:>16}",
        "", "direct", "proxied", "added"
    );
    for (kind, get) in [
        (
            "one keep-alive connection",
            &(|r: &Round| r.keepalive) as &dyn Fn(&Round) -> Latency,
        ),
        ("a new connection each", &|r: &Round| r.new),
    ] {
        for (stat, f) in [
            ("mean", &(|l: Latency| l.mean) as &dyn Fn(Latency) -> f64),
            ("median", &|l: Latency| l.median),
            ("p90", &|l: Latency| l.p90),
        ] {
            let (d, p) = (pick(&host, &|r| f(get(r))), pick(&sandbox, &|r| f(get(r))));
            println!(
                "{:<54} {d:>10.3} {p:>10.3} {:>13.3} ms",
                format!("{kind}: {stat}"),
                p - d
            );
        }
        let (d, p) = (
            pick(&host, &|r| get(r).slow),
            pick(&sandbox, &|r| get(r).slow),
        );
        println!(
            "{:<54} {d:>10.0} {p:>10.0}",
            format!("{kind}: requests over 20 ms")
        );
    }
    println!();
    let ratio = pick(&sandbox, &|r| r.download.whole()) / pick(&host, &|r| r.download.whole());
    let added = |get: &dyn Fn(&Round) -> f64| pick(&sandbox, get) - pick(&host, get);
    let verdict = |met: bool| if met { "met" } else { "MISSED" };
    println!(
        "target: proxied throughput >= 50% of direct: {:.0}% ({})",
        ratio * 100.0,
        verdict(ratio >= 0.5)
    );
    let keepalive = added(&|r| r.keepalive.mean);
    let new = added(&|r| r.new.mean);
    println!(
        "target: <= 1 ms added per request (mean): keep-alive {keepalive:.3} ms ({}), new connection {new:.3} ms ({})",
        verdict(keepalive <= 1.0),
        verdict(new <= 1.0)
    );
    println!(
        "connections the supervisor audited as opened per sandbox run: {audited:?} (expected {} each)",
        requests + 2
    );
    Ok(())
}
