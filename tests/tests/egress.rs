//! Outbound connections (egress) with real daemons and real sandboxes. The "remote" hosts are
//! the suite's own servers in network namespaces it creates (`tollgate_tests::remote`), named
//! for the supervisor by `--egress-hosts`; the one outside address is the package registry
//! this machine reaches (the `pip install` test).

use std::path::Path;
use std::time::{Duration, Instant};

use tollgate_audit::{AuditReader, Decision, Entry, EntryFilter, EntryKind, MetaValue};
use tollgate_proto::v1 as pb;
use tollgate_tests::remote::{RemoteNet, RemoteServer, TestCa};
use tollgate_tests::{authed, require_root, AuthorityProcess, SupervisorProcess};

/// A TLS client that opens a tunnel to `api.example.test` through the sandbox's proxy and
/// then asks for another server in its ClientHello (fronting).
const FRONTING: &str = r#"
import socket, ssl, sys
s = socket.create_connection(("127.0.0.1", 7711))
s.sendall(b"CONNECT api.example.test:443 HTTP/1.1\r\nHost: api.example.test:443\r\n\r\n")
head = s.recv(4096)
print("tunnel:", head.split(b"\r\n")[0].decode())
context = ssl.create_default_context(cafile="/certs/ca.pem")
context.check_hostname = False
try:
    t = context.wrap_socket(s, server_hostname="other.example.test")
    t.sendall(b"GET / HTTP/1.1\r\nHost: other.example.test\r\n\r\n")
    print("fronting got:", t.recv(4096)[:40])
except Exception as e:
    print("fronting cut:", type(e).__name__)
"#;

/// The daemons, the remote host and its server, for one test.
struct Egress {
    dir: tempfile::TempDir,
    /// The secret `api` the supervisor injects (`Authorization: Bearer …`).
    token: String,
    authority: AuthorityProcess,
    supervisor: SupervisorProcess,
    server: RemoteServer,
    /// The same names' plain HTTP server, on port 80.
    plain: RemoteServer,
    _net: RemoteNet,
}

impl Egress {
    /// Daemons whose supervisor resolves the test names to a server in namespace `slot`:
    /// `api.example.test`, `other.example.test` and `git.example.test` there (one TLS
    /// server on 443 holding a certificate for all three), `internal.example.test` at a
    /// private address. `/certs` holds the test CA and the fronting client.
    async fn start(test: &str, slot: u8, host_id_base: u32, files: Option<&Path>) -> Self {
        Self::start_with(test, slot, host_id_base, files, Vec::new()).await
    }

    /// [`Egress::start`], the supervisor given `flags` besides.
    async fn start_with(
        test: &str,
        slot: u8,
        host_id_base: u32,
        files: Option<&Path>,
        flags: Vec<String>,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let net = RemoteNet::create(slot);
        let ca = TestCa::new();
        let tls = ca.server(&["api.example.test", "other.example.test", "git.example.test"]);
        let server = RemoteServer::start(net.listen(443), Some(tls), files.map(Path::to_owned));
        let plain = RemoteServer::start(net.listen(80), None, None);
        let certs = dir.path().join("certs");
        std::fs::create_dir(&certs).unwrap();
        std::fs::write(certs.join("ca.pem"), &ca.pem).unwrap();
        std::fs::write(certs.join("front.py"), FRONTING).unwrap();
        tollgate_tests::private_dir(dir.path());
        open_to_all(dir.path());
        open_to_all(&certs);
        let hosts = dir.path().join("egress-hosts");
        std::fs::write(
            &hosts,
            format!(
                "{} api.example.test other.example.test git.example.test\n10.0.0.5 internal.example.test\n",
                net.address
            ),
        )
        .unwrap();
        // A secret only the supervisor reads (root, 0600), and the test CA it verifies the
        // remote server with.
        let token = format!("tg-secret-{}", uuid::Uuid::now_v7().simple());
        let secrets_dir = dir.path().join("secrets");
        std::fs::create_dir(&secrets_dir).unwrap();
        tollgate_tests::private_dir(&secrets_dir);
        let token_file = secrets_dir.join("api-token");
        std::fs::write(&token_file, &token).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let secrets = secrets_dir.join("secrets.toml");
        std::fs::write(
            &secrets,
            format!(
                "[[secret]]\nname = \"api\"\nvalue = \"file:{}\"\n",
                token_file.display()
            ),
        )
        .unwrap();
        let roots = secrets_dir.join("roots.pem");
        std::fs::write(&roots, &ca.pem).unwrap();
        let authority = AuthorityProcess::start(&dir.path().join("authority"));
        let supervisor = SupervisorProcess::start_with_flags(
            &dir.path().join("supervisor"),
            authority.addr(),
            test,
            host_id_base,
            vec![
                "--egress-hosts".into(),
                hosts.display().to_string(),
                "--egress-secrets".into(),
                secrets.display().to_string(),
                "--egress-extra-roots".into(),
                roots.display().to_string(),
            ]
            .into_iter()
            .chain(flags)
            .collect(),
        );
        Self {
            dir,
            token,
            authority,
            supervisor,
            server,
            plain,
            _net: net,
        }
    }

    /// A run of `script` (sh) with these egress grants and limits, `/certs` mounted.
    fn request(
        &self,
        script: &str,
        egress: Vec<pb::EgressGrant>,
        limits: pb::Limits,
    ) -> pb::MintReceiptRequest {
        pb::MintReceiptRequest {
            subject: "egress-agent".into(),
            ttl_seconds: 300,
            audience: vec!["workstation".into()],
            agent: Some(pb::AgentSpec {
                argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
                env: [
                    ("SSL_CERT_FILE".to_owned(), "/certs/ca.pem".to_owned()),
                    ("GIT_SSL_CAINFO".to_owned(), "/certs/ca.pem".to_owned()),
                ]
                .into(),
                ..Default::default()
            }),
            exec: [
                "/bin/sh",
                "/usr/bin/curl",
                "/usr/bin/python3",
                "/usr/bin/sleep",
                "/usr/bin/grep",
                "/usr/bin/tail",
                "/usr/bin/env",
                "/usr/bin/sort",
                "/usr/local/bin/git",
                "/usr/local/libexec/git-core/git",
                "/usr/local/libexec/git-core/git-remote-https",
            ]
            .map(String::from)
            .to_vec(),
            fs: vec![pb::FsGrant {
                path: self.dir.path().join("certs").display().to_string(),
                access: pb::FsAccess::Read as i32,
                mount: "/certs".into(),
                exec: false,
                ask: false,
                ask_reads: false,
            }],
            limits: Some(limits),
            egress,
            ..Default::default()
        }
    }

    async fn mint(&self, request: pb::MintReceiptRequest) -> pb::MintReceiptResponse {
        self.authority
            .client()
            .await
            .mint_receipt(authed(&self.authority.admin_token(), request))
            .await
            .expect("mint")
            .into_inner()
    }

    /// The run's `egress` entries in the supervisor's audit log.
    fn entries(&self, run_id: &str) -> Vec<Entry> {
        let filter = EntryFilter {
            run_id: Some(run_id.to_owned()),
            ..Default::default()
        };
        AuditReader::open(&self.supervisor.data_dir().join("audit"))
            .expect("open the audit log")
            .filtered(filter)
            .filter_map(Result::ok)
            .filter(|entry| entry.kind == EntryKind::Egress)
            .collect()
    }
}

fn open_to_all(path: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn grant(host: &str, ports: &[u32]) -> pb::EgressGrant {
    pb::EgressGrant {
        host: host.into(),
        ports: ports.to_vec(),
        ..Default::default()
    }
}

fn text<'a>(entry: &'a Entry, key: &str) -> &'a str {
    match entry.metadata.get(key) {
        Some(MetaValue::Str(text)) => text,
        _ => "",
    }
}

fn number(entry: &Entry, key: &str) -> i64 {
    match entry.metadata.get(key) {
        Some(MetaValue::Int(n)) => *n,
        _ => -1,
    }
}

/// The entries for `host` in `phase`.
fn find<'a>(entries: &'a [Entry], host: &str, phase: &str) -> Vec<&'a Entry> {
    entries
        .iter()
        .filter(|e| text(e, "host") == host && text(e, "phase") == phase)
        .collect()
}

/// One sandbox, unmodified clients: curl and Python's urllib reach the granted host; a host
/// not granted, a port not granted, a name that resolves to a private address and a
/// ClientHello naming another server are each refused, with the reason, and audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_granted_host_is_reached_and_everything_else_is_refused_and_audited() {
    if !require_root() {
        return;
    }
    let egress = Egress::start("egress-basic", 1, 209_300, None).await;
    let script = r#"
echo "== curl"; curl -sS --max-time 20 https://api.example.test/ 2>&1; echo "rc=$?"
echo "== urllib"; python3 -c 'import urllib.request; print(urllib.request.urlopen("https://api.example.test/", timeout=20).read().decode().strip())' 2>&1; echo "rc=$?"
echo "== not granted"; python3 -c 'import urllib.request; urllib.request.urlopen("https://other.example.test/", timeout=20)' 2>&1 | tail -n 1; echo "rc=$?"
echo "== wrong port"; curl -sS --max-time 20 https://api.example.test:8443/ 2>&1; echo "rc=$?"
echo "== private"; curl -sS -v --max-time 20 https://internal.example.test/ 2>&1 | grep -E '^< HTTP|curl:'; echo "rc=$?"
echo "== fronting"; python3 /certs/front.py 2>&1
echo "== env"; env | grep -i _proxy | sort
echo "== powers"; tollgate-shim receipt | grep "^egress"
"#;
    let request = egress.request(
        script,
        vec![
            grant("api.example.test", &[443]),
            grant("internal.example.test", &[443]),
        ],
        pb::Limits::default(),
    );
    let minted = egress.mint(request).await;
    assert_eq!(minted.receipt.as_ref().unwrap().egress[0].ports, [443]);
    let run_id = egress.supervisor.start_run(minted.text).await;
    let output = egress.supervisor.output(&run_id).await;
    let section = |name: &str| {
        output
            .split("== ")
            .find(|s| s.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} section in:\n{output}"))
            .to_owned()
    };
    assert!(
        section("curl").contains("hello from the remote host") && section("curl").contains("rc=0"),
        "{output}"
    );
    assert!(
        section("urllib").contains("hello from the remote host"),
        "{output}"
    );
    assert!(
        section("not granted").contains("403")
            && section("not granted").contains("egress to other.example.test:443 is not granted"),
        "{output}"
    );
    assert!(!section("wrong port").contains("rc=0"), "{output}");
    assert!(
        section("private").contains("403") && section("private").contains("not public"),
        "{output}"
    );
    assert!(
        section("fronting").contains("tunnel: HTTP/1.1 200"),
        "{output}"
    );
    assert!(section("fronting").contains("fronting cut"), "{output}");
    assert!(
        section("powers").contains("api.example.test:443 up to low, opaque"),
        "{output}"
    );
    for variable in [
        "HTTPS_PROXY=http://127.0.0.1:7711",
        "https_proxy=",
        "NO_PROXY=",
        "ALL_PROXY=",
    ] {
        assert!(section("env").contains(variable), "{variable}: {output}");
    }

    let entries = egress.entries(&run_id);
    let opened = find(&entries, "api.example.test", "open");
    assert!(
        opened
            .iter()
            .filter(|e| e.decision == Some(Decision::Allow))
            .count()
            >= 3,
        "{entries:#?}"
    );
    assert_eq!(
        text(opened[0], "address"),
        format!("{}:443", egress._net.address)
    );
    let closed = find(&entries, "api.example.test", "closed");
    assert!(
        closed
            .iter()
            .any(|e| number(e, "bytes_received") > 0 && number(e, "bytes_sent") > 0),
        "{entries:#?}"
    );
    let refused = |host: &str, port: i64, code: &str| {
        assert!(
            entries.iter().any(|e| text(e, "host") == host
                && number(e, "port") == port
                && e.decision == Some(Decision::Deny)
                && text(e, "code") == code),
            "{host}:{port} {code}: {entries:#?}"
        );
    };
    refused("other.example.test", 443, "egress_not_granted");
    refused("api.example.test", 8443, "egress_not_granted");
    refused("internal.example.test", 443, "egress_address");
    // The fronting attempt: its tunnel opened, then was cut at the ClientHello.
    let fronted = closed
        .iter()
        .find(|e| text(e, "code") == "egress_sni")
        .unwrap_or_else(|| panic!("no fronting entry: {entries:#?}"));
    assert_eq!(fronted.decision, Some(Decision::Deny));
    assert!(
        fronted
            .reason
            .as_deref()
            .unwrap_or("")
            .contains("other.example.test"),
        "{fronted:?}"
    );
    // `tollgate calls` shows each connection with how it ended.
    let calls = std::process::Command::new(tollgate_tests::bin_path("tollgate"))
        .args(["calls", &run_id])
        .arg(egress.supervisor.data_dir().join("audit"))
        .output()
        .unwrap();
    let calls = String::from_utf8_lossy(&calls.stdout);
    assert!(
        calls.lines().any(|l| l.contains("egress")
            && l.contains("allow")
            && l.contains("api.example.test:443")
            && l.contains("received")),
        "{calls}"
    );
    assert!(
        calls.lines().any(|l| l.contains("deny")
            && l.contains("other.example.test:443")
            && l.contains("is not granted")),
        "{calls}"
    );
    // Nothing of the refused names reached the server.
    assert!(
        egress.server.requests().iter().all(|r| !r
            .headers
            .iter()
            .any(|(k, v)| k == "host" && v.contains("other"))),
        "{:?}",
        egress.server.requests()
    );
}

/// Limits hold and a revocation closes open tunnels within a second: the third connection
/// of a run allowed two is refused; revoking the receipt ends the two held ones at the
/// remote end; a run allowed 1 MB cannot download 3 MB, and nothing after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_and_byte_limits_hold_and_revocation_closes_tunnels() {
    if !require_root() {
        return;
    }
    let egress = Egress::start("egress-limits", 2, 209_400, None).await;
    let script = r#"
curl -sS --max-time 120 -o /dev/null https://api.example.test/hold &
curl -sS --max-time 120 -o /dev/null https://api.example.test/hold &
sleep 2
echo "== third"; curl -sS -v --max-time 20 https://api.example.test/ 2>&1 | grep -E '^< HTTP/1.1 4'; echo "rc=$?"
echo "== held"
wait
"#;
    let limits = pb::Limits {
        egress_connections: 2,
        ..Default::default()
    };
    let minted = egress
        .mint(egress.request(script, vec![grant("api.example.test", &[443])], limits))
        .await;
    let receipt_id = minted.receipt.as_ref().unwrap().receipt_id.clone();
    assert_eq!(
        minted
            .receipt
            .as_ref()
            .unwrap()
            .limits
            .unwrap()
            .egress_connections,
        2
    );
    let run_id = egress.supervisor.start_run(minted.text).await;
    // The two held answers are streaming and the third connection has been tried.
    let deadline = Instant::now() + Duration::from_secs(30);
    while egress
        .server
        .log
        .holding
        .load(std::sync::atomic::Ordering::SeqCst)
        < 2
        || !find(&egress.entries(&run_id), "api.example.test", "open")
            .iter()
            .any(|e| text(e, "code") == "egress_connections")
    {
        assert!(
            Instant::now() < deadline,
            "the held connections never opened: {:#?}",
            egress.entries(&run_id)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let revoked = Instant::now();
    egress
        .authority
        .client()
        .await
        .revoke_receipt(authed(
            &egress.authority.admin_token(),
            pb::RevokeReceiptRequest {
                receipt_id: receipt_id.clone(),
                reason: "egress test".into(),
            },
        ))
        .await
        .expect("revoke");
    while egress
        .server
        .log
        .holding
        .load(std::sync::atomic::Ordering::SeqCst)
        > 0
    {
        assert!(
            revoked.elapsed() < Duration::from_secs(1),
            "held tunnels still open {:?} after the revocation",
            revoked.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let output = egress.supervisor.output(&run_id).await;
    assert!(output.contains("429"), "{output}");
    egress
        .supervisor
        .wait_ended(&run_id, Duration::from_secs(10))
        .await;
    let entries = egress.entries(&run_id);
    let third = find(&entries, "api.example.test", "open")
        .into_iter()
        .find(|e| text(e, "code") == "egress_connections")
        .expect("the third connection's refusal");
    assert!(
        third
            .reason
            .as_deref()
            .unwrap_or("")
            .contains("egress_connections = 2"),
        "{third:?}"
    );
    let ended = find(&entries, "api.example.test", "closed");
    assert!(
        ended
            .iter()
            .filter(|e| text(e, "code") == "egress_run_ended")
            .count()
            >= 2
            || ended.len() >= 2,
        "{entries:#?}"
    );

    // Bytes: 1 MB each way for the whole run.
    let script = r#"
echo "== big"; curl -sS --max-time 60 -o /dev/null https://api.example.test/bytes/3000000 2>&1; echo "rc=$?"
echo "== after"; curl -sS -v --max-time 20 https://api.example.test/ 2>&1 | grep -E '^< HTTP/1.1 4'; echo "rc=$?"
"#;
    let limits = pb::Limits {
        egress_bytes: 1_000_000,
        ..Default::default()
    };
    let minted = egress
        .mint(egress.request(script, vec![grant("api.example.test", &[443])], limits))
        .await;
    let run_id = egress.supervisor.start_run(minted.text).await;
    let output = egress.supervisor.output(&run_id).await;
    assert!(!output.contains("== big\nrc=0"), "{output}");
    assert!(output.contains("429"), "{output}");
    let entries = egress.entries(&run_id);
    let cut = find(&entries, "api.example.test", "closed")
        .into_iter()
        .find(|e| text(e, "code") == "egress_bytes")
        .unwrap_or_else(|| panic!("no byte-limit entry: {entries:#?}"));
    assert!(number(cut, "bytes_received") <= 1_000_000, "{cut:?}");

    // A plain request cut by the byte bound before any answer is answered with the reason
    // (the supervisor leaves the client's connection to the proxy for that).
    let script = r#"
echo "== upload"; printf '%05000d' 0 | curl -sS --max-time 20 -w ' %{http_code}' --data-binary @- http://api.example.test/echo 2>&1; echo
"#;
    let limits = pb::Limits {
        egress_bytes: 1_000,
        ..Default::default()
    };
    let minted = egress
        .mint(egress.request(script, vec![grant("api.example.test", &[80])], limits))
        .await;
    let run_id = egress.supervisor.start_run(minted.text).await;
    let output = egress.supervisor.output(&run_id).await;
    assert!(
        output.contains("limits.egress_bytes") && output.trim_end().ends_with("429"),
        "{output}"
    );
    let entries = egress.entries(&run_id);
    let cut = find(&entries, "api.example.test", "closed")
        .into_iter()
        .find(|e| text(e, "code") == "egress_bytes")
        .unwrap_or_else(|| panic!("no byte-limit entry: {entries:#?}"));
    assert_eq!(number(cut, "bytes_received"), 0, "{cut:?}");
}

/// From inside a sandbox, `pip install` from the package registry this machine reaches, with
/// only the registry's hosts granted; the `requests` it installed then reaches the registry
/// through the proxy variables and is refused the test server (not granted); the same install
/// with no egress grant fails at once, with a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pip_installs_from_the_registry_through_the_proxy_and_fails_cleanly_without_a_grant() {
    if !require_root() {
        return;
    }
    let egress = Egress::start("egress-pip", 3, 209_500, None).await;
    // Pure-Python wheels only (/work is mounted noexec); the registry's certificate is
    // signed by this machine's own CA, which pip's bundled one does not hold.
    let pip = "PIP_CERT=/etc/ssl/certs/ca-certificates.crt python3 -m pip install \
               --disable-pip-version-check --no-cache-dir --retries 0 --timeout 60 \
               --target /work/lib --platform any --only-binary=:all: --python-version 3.11 \
               --index-url https://pypi.org/simple";
    let script = format!(
        r#"
echo "== pip"; {pip} requests 2>&1 | tail -n 2; echo "rc=$?"; ls /work/lib | grep -c .
echo "== requests"; REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt PYTHONPATH=/work/lib python3 -c 'import requests; print(requests.get("https://pypi.org/simple/six/", timeout=30).status_code)' 2>&1 | tail -n 1
echo "== refused"; PYTHONPATH=/work/lib python3 -c 'import requests; requests.get("https://api.example.test/", timeout=20)' 2>&1 | tail -n 1
"#
    );
    let mut request = egress.request(
        &script,
        vec![
            grant("pypi.org", &[443]),
            grant("files.pythonhosted.org", &[443]),
        ],
        pb::Limits::default(),
    );
    request.ttl_seconds = 600;
    request.exec.push("/usr/bin/ls".into());
    let minted = egress.mint(request).await;
    let run_id = egress.supervisor.start_run(minted.text).await;
    let output = egress.supervisor.output(&run_id).await;
    assert!(output.contains("Successfully installed"), "{output}");
    assert!(output.contains("== requests\n200"), "{output}");
    assert!(
        output.contains("egress to api.example.test:443 is not granted"),
        "{output}"
    );
    let entries = egress.entries(&run_id);
    assert!(
        !find(&entries, "files.pythonhosted.org", "open").is_empty(),
        "{entries:#?}"
    );

    // No egress grant: no proxy, no route, no name server.
    let script = format!(
        r#"start=$(date +%s); {pip} six 2>&1 | tail -n 1; echo "seconds=$(( $(date +%s) - start ))""#
    );
    let mut request = egress.request(&script, Vec::new(), pb::Limits::default());
    request.exec.push("/usr/bin/date".into());
    let minted = egress.mint(request).await;
    let run_id = egress.supervisor.start_run(minted.text).await;
    let output = egress.supervisor.output(&run_id).await;
    assert!(
        output.contains("No matching distribution found for six"),
        "{output}"
    );
    let seconds: u64 = output
        .rsplit("seconds=")
        .next()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(u64::MAX);
    assert!(seconds < 30, "pip took {seconds} s to fail: {output}");
    assert!(egress.entries(&run_id).is_empty());
}

/// A Node.js agent's fetch (Node 20: undici's EnvHttpProxyAgent reads the proxy variables)
/// and `git clone` over HTTPS both reach their granted hosts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_clone_and_node_fetch_go_out_through_the_proxy() {
    if !require_root() {
        return;
    }
    let repos = tempfile::tempdir().unwrap();
    let git = |args: &[&str], dir: &Path| {
        let status = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.test"])
            .args(args)
            .current_dir(dir)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "git {args:?}");
    };
    let work = repos.path().join("work");
    std::fs::create_dir(&work).unwrap();
    git(&["init", "-q", "-b", "main"], &work);
    std::fs::write(work.join("README"), "cloned through the gateway\n").unwrap();
    git(&["add", "README"], &work);
    git(&["commit", "-q", "-m", "first"], &work);
    let served = repos.path().join("served");
    std::fs::create_dir(&served).unwrap();
    git(&["clone", "-q", "--bare", "../work", "repo.git"], &served);
    git(&["update-server-info"], &served.join("repo.git"));

    let egress = Egress::start("egress-git-node", 4, 209_600, Some(&served)).await;
    let script = r#"
echo "== git"; git clone -q https://git.example.test/repo.git /work/clone 2>&1; cat /work/clone/README
echo "== node"; node -e '
const { EnvHttpProxyAgent, setGlobalDispatcher } = require("undici");
setGlobalDispatcher(new EnvHttpProxyAgent());
fetch("https://api.example.test/").then(r => r.text()).then(t => console.log(t.trim()), e => console.log("failed", e.cause || e));
' 2>&1
"#;
    let node_modules = tollgate_tests::run_fixture::agent_node();
    let mut request = egress.request(
        script,
        vec![
            grant("git.example.test", &[443]),
            grant("api.example.test", &[443]),
        ],
        pb::Limits {
            memory_bytes: 512 << 20,
            ..Default::default()
        },
    );
    request.fs.push(pb::FsGrant {
        path: node_modules.display().to_string(),
        access: pb::FsAccess::Read as i32,
        mount: "/agent".into(),
        exec: false,
        ask: false,
        ask_reads: false,
    });
    request
        .exec
        .extend(["/usr/bin/node", "/usr/bin/cat"].map(String::from));
    let agent = request.agent.as_mut().unwrap();
    agent
        .env
        .insert("NODE_PATH".into(), "/agent/node_modules".into());
    agent
        .env
        .insert("NODE_EXTRA_CA_CERTS".into(), "/certs/ca.pem".into());
    // undici says EnvHttpProxyAgent is experimental, on stderr.
    agent.env.insert("NODE_NO_WARNINGS".into(), "1".into());
    let minted = egress.mint(request).await;
    let run_id = egress.supervisor.start_run(minted.text).await;
    let output = egress.supervisor.output(&run_id).await;
    assert!(
        output.contains("== git\ncloned through the gateway"),
        "{output}"
    );
    assert!(
        output.contains("== node\nhello from the remote host"),
        "{output}"
    );
}

/// A client that keeps one connection per host through the proxy and prints each answer.
const INSPECTED: &str = r#"
import http.client, ssl
context = ssl.create_default_context()  # SSL_CERT_FILE: the run's bundle
def connect(host):
    c = http.client.HTTPSConnection("127.0.0.1", 7711, context=context, timeout=20)
    c.set_tunnel(host, 443)
    return c
def ask(c, method, path, body=None):
    c.request(method, path, body=body)
    r = c.getresponse()
    print(method, path, r.status, r.read().decode(errors="replace").strip()[:300])
api = connect("api.example.test")
ask(api, "GET", "/public/hello")
ask(api, "POST", "/public/hello", b"x")
ask(api, "GET", "/private/x")
ask(api, "GET", "/public/%2e%2e/private")
ask(api, "GET", "/public/again")
other = connect("other.example.test")
ask(other, "POST", "/echo", b"harmless text")
ask(other, "POST", "/echo", b"aws_access_key_id=AKIAIOSFODNN7EXAMPLE aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
"#;

/// Inspected hosts: the run's own CA is trusted in the sandbox; the supervisor adds the
/// grant's secret (which reaches the server and nothing else: not the sandbox's environment,
/// files or /proc, not either audit log); a POST to a GET-only grant and a path outside its
/// prefixes are refused per request on the same connection that serves the allowed GETs; a
/// body carrying a cloud key is refused on its way to a `low` host, with the detector named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspected_hosts_get_their_secret_and_each_request_is_checked() {
    if !require_root() {
        return;
    }
    let egress = Egress::start("egress-inspect", 5, 209_700, None).await;
    std::fs::write(egress.dir.path().join("certs/inspected.py"), INSPECTED).unwrap();
    let script = r#"
echo "== requests"; python3 /certs/inspected.py 2>&1
echo "== search"
env
cat /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n'
cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\0' ' '
grep -rsa . /work /tmp /run /etc/ssl /certs 2>/dev/null | cut -c1-300
echo "== end"
"#;
    let mut request = egress.request(
        script,
        vec![
            pb::EgressGrant {
                host: "api.example.test".into(),
                inject: "api".into(),
                methods: vec!["GET".into()],
                paths: vec!["/public/".into()],
                ..Default::default()
            },
            pb::EgressGrant {
                host: "other.example.test".into(),
                inspect: true,
                ..Default::default()
            },
        ],
        pb::Limits {
            output_bytes: 16 << 20,
            ..Default::default()
        },
    );
    request
        .exec
        .extend(["/usr/bin/cat", "/usr/bin/tr", "/usr/bin/cut"].map(String::from));
    // The run's CA is what the sandbox trusts: nothing of the test's own.
    request.agent.as_mut().unwrap().env.clear();
    let minted = egress.mint(request).await;
    assert!(minted.receipt.as_ref().unwrap().egress[0].inspect);
    let run_id = egress.supervisor.start_run(minted.text).await;
    let output = egress.supervisor.output(&run_id).await;
    let requests = output
        .split("== search")
        .next()
        .unwrap_or_default()
        .to_owned();
    let line = |start: &str| {
        requests
            .lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no {start:?} in:\n{output}"))
            .to_owned()
    };
    assert!(
        line("GET /public/hello ").contains(" 200 public /public/hello"),
        "{output}"
    );
    let post = line("POST /public/hello ");
    assert!(
        post.contains(" 403 ") && post.contains("POST is not among the methods"),
        "{post}"
    );
    let private = line("GET /private/x ");
    assert!(
        private.contains(" 403 ") && private.contains("not beneath the paths"),
        "{private}"
    );
    assert!(
        line("GET /public/%2e%2e/private ").contains(" 403 "),
        "{output}"
    );
    assert!(line("GET /public/again ").contains(" 200 "), "{output}");
    assert!(line("POST /echo 200").contains("harmless text"), "{output}");
    let key = requests
        .lines()
        .filter(|l| l.starts_with("POST /echo "))
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    assert!(
        key.contains(" 403 ") && key.contains("classified high") && key.contains("above the low"),
        "{output}"
    );
    assert!(
        !key.contains("AKIA"),
        "the refusal never repeats the text: {key}"
    );

    // The server: the allowed requests only, each with the secret; one connection for api.
    let seen = egress.server.requests();
    let api: Vec<_> = seen
        .iter()
        .filter(|r| r.path.starts_with("/public/"))
        .collect();
    assert_eq!(api.len(), 2, "{seen:?}");
    for request in &api {
        assert!(
            request
                .headers
                .iter()
                .any(|(k, v)| k == "authorization" && *v == format!("Bearer {}", egress.token)),
            "{request:?}"
        );
    }
    assert!(seen.iter().all(|r| r.method != "POST" || r.path == "/echo"));
    assert!(!seen
        .iter()
        .any(|r| String::from_utf8_lossy(&r.body).contains("AKIA")));
    assert_eq!(
        egress
            .server
            .log
            .connections
            .load(std::sync::atomic::Ordering::SeqCst),
        2,
        "one upstream connection per host"
    );

    // The secret is nowhere the agent could look, nor in either audit log.
    assert!(output.contains("== end"), "{output}");
    assert!(
        output.contains("SSL_CERT_FILE=/run/tollgate/egress/bundle.pem"),
        "{output}"
    );
    assert!(
        !output.contains(&egress.token),
        "the sandbox saw the secret"
    );
    for log in [
        egress.supervisor.data_dir().join("audit"),
        egress.authority.data_dir().join("audit"),
    ] {
        for file in std::fs::read_dir(&log).unwrap() {
            let bytes = std::fs::read(file.unwrap().path()).unwrap();
            assert!(
                !String::from_utf8_lossy(&bytes).contains(&egress.token),
                "{} holds the secret",
                log.display()
            );
        }
    }
    let entries = egress.entries(&run_id);
    let checked: Vec<_> = entries
        .iter()
        .filter(|e| text(e, "phase") == "request")
        .collect();
    assert!(
        checked.iter().any(|e| text(e, "method") == "POST"
            && e.decision == Some(Decision::Deny)
            && text(e, "code") == "egress_request"),
        "{checked:#?}"
    );
    assert!(
        checked
            .iter()
            .any(|e| text(e, "code") == "egress_sensitivity" && text(e, "sensitivity") == "high"),
        "{checked:#?}"
    );
    assert!(
        checked
            .iter()
            .any(|e| e.metadata.get("injected") == Some(&MetaValue::Bool(true))),
        "{checked:#?}"
    );
}

/// Plain HTTP through the proxy (absolute form) is read like an inspected host's requests: a
/// request is served, one carrying a cloud key to a `low` host is answered 403 naming the
/// detectors, and a request whose Host names another server is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_is_read_and_held_to_the_grants_sensitivity() {
    if !require_root() {
        return;
    }
    let egress = Egress::start("egress-plain", 6, 209_800, None).await;
    let script = r#"
echo "== get"; curl -sS --max-time 20 http://api.example.test/ 2>&1
echo "== key"; curl -sS --max-time 20 -w ' %{http_code}' --data 'aws_access_key_id=AKIAIOSFODNN7EXAMPLE aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY' http://api.example.test/echo 2>&1
echo "== host"; curl -sS --max-time 20 -w ' %{http_code}' -H 'Host: other.example.test' http://api.example.test/ 2>&1
echo "== end"
"#;
    let minted = egress
        .mint(egress.request(
            script,
            vec![grant("api.example.test", &[80])],
            pb::Limits::default(),
        ))
        .await;
    let run_id = egress.supervisor.start_run(minted.text).await;
    let output = egress.supervisor.output(&run_id).await;
    assert!(
        output.contains("== get\nhello from the remote host"),
        "{output}"
    );
    let key = output
        .split("== key")
        .nth(1)
        .and_then(|s| s.split("== host").next())
        .unwrap_or_default();
    assert!(
        key.contains("classified high") && key.trim_end().ends_with("403"),
        "{output}"
    );
    assert!(!key.contains("AKIA"), "{key}");
    let host = output
        .split("== host")
        .nth(1)
        .and_then(|s| s.split("== end").next())
        .unwrap_or_default();
    assert!(host.trim_end().ends_with("403"), "{output}");
    let seen = egress.plain.requests();
    assert_eq!(
        seen.len(),
        1,
        "only the allowed request reached the server: {seen:?}"
    );
    let entries = egress.entries(&run_id);
    assert!(
        entries.iter().any(|e| text(e, "phase") == "open"
            && e.metadata.get("inspected") == Some(&MetaValue::Bool(true))),
        "{entries:#?}"
    );
}

/// A host granted with `ask = true`: each new connection waits for an operator before the
/// supervisor resolves or connects anything; approved with `remember`, the run's next
/// connection to the same host and port goes through unasked; denied, the client gets no
/// connection and the host never sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_to_a_host_that_asks_wait_for_an_operator() {
    if !require_root() {
        return;
    }
    let egress = Egress::start("egress-ask", 11, 211_500, None).await;
    let script = r#"
echo "== first"; curl -sS --max-time 60 https://api.example.test/ 2>&1; echo "rc=$?"
echo "== again"; curl -sS --max-time 60 https://api.example.test/ 2>&1; echo "rc=$?"
echo "== other"; curl -sS --max-time 60 https://other.example.test/ 2>&1; echo "rc=$?"
echo "== end"
"#;
    let asking = |host: &str| pb::EgressGrant {
        ask: true,
        ..grant(host, &[443])
    };
    let minted = egress
        .mint(egress.request(
            script,
            vec![asking("api.example.test"), asking("other.example.test")],
            pb::Limits::default(),
        ))
        .await;
    let admin = egress.supervisor.token();
    let run_id = egress.supervisor.start_run(minted.text).await;
    let asked = egress
        .supervisor
        .decide_pending(&admin, &run_id, 2, |call| {
            assert_eq!(call.tool, "egress");
            // Nothing has reached the host while the connection waits.
            assert!(egress.server.requests().is_empty() || call.path.starts_with("other"));
            let approve = call.path == "api.example.test:443";
            (approve, approve, if approve { "" } else { "not that one" })
        })
        .await;
    let asked: Vec<&str> = asked.iter().map(|call| call.path.as_str()).collect();
    assert_eq!(asked, ["api.example.test:443", "other.example.test:443"]);
    let output = egress.supervisor.output(&run_id).await;
    let section = |name: &str| {
        output
            .split(&format!("== {name}"))
            .nth(1)
            .and_then(|s| s.split("\n== ").next())
            .unwrap_or_default()
            .to_owned()
    };
    assert!(
        section("first").contains("hello from the remote host"),
        "{output}"
    );
    assert!(
        section("again").contains("hello from the remote host"),
        "{output}"
    );
    assert!(!section("other").contains("rc=0"), "{output}");
    let entries = egress.entries(&run_id);
    let opens = find(&entries, "api.example.test", "open");
    assert_eq!(opens.len(), 2, "{entries:#?}");
    assert!(opens.iter().all(|e| e.decision == Some(Decision::Allow)));
    assert_eq!(text(opens[0], "approved_by"), "admin");
    assert_eq!(text(opens[1], "approved_by"), "(remembered)");
    let other = find(&entries, "other.example.test", "open");
    assert_eq!(other.len(), 1, "{entries:#?}");
    assert_eq!(other[0].decision, Some(Decision::Deny));
    assert!(
        other[0]
            .reason
            .as_deref()
            .unwrap_or_default()
            .contains("not that one"),
        "{other:#?}"
    );
}

/// Requests crafted byte by byte: each goes through the sandbox's proxy on a connection of
/// its own and prints its label and the status line it got (or how the connection ended).
const CRAFTED: &str = r#"
import socket, ssl
context = ssl.create_default_context()  # SSL_CERT_FILE: the run's bundle
def drain(s):
    out = b""
    try:
        while True:
            data = s.recv(65536)
            if not data:
                break
            out += data
    except Exception as e:
        out += ("<%s>" % type(e).__name__).encode()
    return out.split(b"\r\n")[0].decode(errors="replace")[:200]
def tunnel(port):
    s = socket.create_connection(("127.0.0.1", 7711), timeout=20)
    s.sendall(b"CONNECT api.example.test:%d HTTP/1.1\r\nHost: api.example.test:%d\r\n\r\n" % (port, port))
    head = b""
    while b"\r\n\r\n" not in head:
        data = s.recv(1)
        if not data:
            break
        head += data
    return s, head.split(b"\r\n")[0].decode(errors="replace")
def clear_tunnel(label, port, raw):
    s, line = tunnel(port)
    s.sendall(raw)
    print(label, "|", line, "|", drain(s))
def plain(label, raw):
    s = socket.create_connection(("127.0.0.1", 7711), timeout=20)
    s.sendall(raw)
    print(label, "|", drain(s))
def tls(label, raw):
    s, line = tunnel(443)
    try:
        t = context.wrap_socket(s, server_hostname="api.example.test")
        t.sendall(raw)
        print(label, "|", drain(t))
    except Exception as e:
        print(label, "| cut", type(e).__name__)
def get(target, *headers, host=b"api.example.test"):
    lines = [b"GET " + target + b" HTTP/1.1"]
    if host is not None:
        lines.append(b"Host: " + host)
    lines += list(headers) + [b"Connection: close", b"", b""]
    return b"\r\n".join(lines)
clear_tunnel("clear-80", 80, get(b"/public/clear-80"))
clear_tunnel("clear-443", 443, get(b"/public/clear-443"))
plain("plain-http", get(b"http://api.example.test/public/plain"))
tls("ok", get(b"/public/ok"))
tls("absolute-same", get(b"https://api.example.test/public/absolute"))
tls("two-hosts", get(b"/public/two-hosts", b"Host: other.example.test"))
tls("absolute-other", get(b"https://other.example.test/public/absolute-other"))
tls("absolute-other-no-host", get(b"https://other.example.test/public/absolute-other-no-host", host=None))
tls("host-port", get(b"/public/host-port", host=b"api.example.test:8443"))
tls("x-forwarded-host", get(b"/public/x-forwarded-host", b"X-Forwarded-Host: other.example.test"))
tls("forwarded", get(b"/public/forwarded", b"Forwarded: host=other.example.test"))
tls("x-original-url", get(b"/public/x-original-url", b"X-Original-URL: /admin"))
tls("x-rewrite-url", get(b"/public/x-rewrite-url", b"X-Rewrite-URL: /admin"))
tls("x-host", get(b"/public/x-host", b"X-Host: other.example.test"))
tls("dotdot-semicolon", get(b"/public/..;/admin"))
tls("semicolon", get(b"/public;x/admin"))
tls("double-encoded", get(b"/public/%252e%252e/admin"))
tls("overlong", get(b"/public/%c0%ae%c0%ae/admin"))
tls("encoded-slash", get(b"/public/..%2fadmin"))
tls("empty-segment", get(b"/public//admin"))
print("== done")
"#;

/// Each way a request could carry an injected secret somewhere else than the granted host
/// over TLS the supervisor verified: plain text on a tunnel to an inspected grant, plain HTTP
/// to an injecting grant, a second `Host`, an absolute-form target or a `Host` port naming
/// another server, host-override headers, and path spellings that a server decodes out of
/// the granted prefix. Every one is refused, and the servers on both ports never see the
/// secret except on the requests that were allowed (which reach them in origin form).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_injected_secret_goes_only_to_the_granted_host_over_verified_tls() {
    if !require_root() {
        return;
    }
    let egress = Egress::start("egress-crafted", 23, 241_300, None).await;
    std::fs::write(egress.dir.path().join("certs/crafted.py"), CRAFTED).unwrap();
    let mut request = egress.request(
        "python3 /certs/crafted.py 2>&1",
        vec![pb::EgressGrant {
            host: "api.example.test".into(),
            ports: vec![443, 80],
            inject: "api".into(),
            paths: vec!["/public/".into()],
            ..Default::default()
        }],
        pb::Limits::default(),
    );
    request.agent.as_mut().unwrap().env.clear();
    let minted = egress.mint(request).await;
    let run_id = egress.supervisor.start_run(minted.text).await;
    let output = egress.supervisor.output(&run_id).await;
    assert!(output.contains("== done"), "{output}");
    let line = |label: &str| {
        output
            .lines()
            .find(|l| l.starts_with(&format!("{label} |")))
            .unwrap_or_else(|| panic!("no {label:?} in:\n{output}"))
            .to_owned()
    };
    assert!(line("ok").contains(" 200 "), "{output}");
    assert!(line("absolute-same").contains(" 200 "), "{output}");
    for refused in [
        "clear-80",
        "clear-443",
        "plain-http",
        "two-hosts",
        "absolute-other",
        "absolute-other-no-host",
        "host-port",
        "x-forwarded-host",
        "forwarded",
        "x-original-url",
        "x-rewrite-url",
        "x-host",
        "dotdot-semicolon",
        "semicolon",
        "double-encoded",
        "overlong",
        "encoded-slash",
        "empty-segment",
    ] {
        // What the request itself got (after the tunnel's own answer, where there is one).
        let got = line(refused);
        let answer = got.rsplit(" | ").next().unwrap_or_default();
        assert!(!answer.contains(" 200 "), "{refused} was served: {output}");
    }
    // What the servers received: the two allowed requests, in origin form, each with one
    // Host (the granted one) and the secret; nothing else carries the secret, on either port.
    let secret = format!("Bearer {}", egress.token);
    let tls_seen = egress.server.requests();
    let plain_seen = egress.plain.requests();
    let carrying: Vec<_> = tls_seen
        .iter()
        .chain(plain_seen.iter())
        .filter(|r| r.headers.iter().any(|(_, v)| v.contains(&egress.token)))
        .collect();
    let paths: Vec<&str> = carrying.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        paths,
        ["/public/ok", "/public/absolute"],
        "the secret went out with: {carrying:#?}"
    );
    for request in &carrying {
        let hosts: Vec<_> = request
            .headers
            .iter()
            .filter(|(k, _)| k == "host")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(hosts, ["api.example.test"], "{request:?}");
        assert_eq!(
            request.target, request.path,
            "origin form only: {request:?}"
        );
        assert!(
            request
                .headers
                .iter()
                .any(|(k, v)| k == "authorization" && *v == secret),
            "{request:?}"
        );
    }
    assert!(
        plain_seen.is_empty(),
        "plain text reached port 80: {plain_seen:#?}"
    );
}

/// Inspected connections are bounded together, across runs: with a 2 MiB budget, two plain
/// requests stalled one byte short of their 400 kB bodies hold most of it, and a third
/// request's body is refused 503 naming the budget (never queued). When the run ends with
/// its stalled connections still open, what they held is returned: the next run's same
/// request is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspected_connections_share_one_budget_returned_when_the_run_ends() {
    if !require_root() {
        return;
    }
    let egress = Egress::start_with(
        "egress-budget",
        27,
        237_100,
        None,
        vec!["--egress-inspect-budget".into(), (2usize << 20).to_string()],
    )
    .await;
    // Two connections whose bodies stay one byte short, held by a process that outlives
    // the agent; then the same size of body, tried until the stalled ones are read.
    let stalled = r#"
python3 - <<'PY'
import os, socket, time
def request(n, whole):
    s = socket.create_connection(("127.0.0.1", 7711))
    head = "POST http://api.example.test/echo HTTP/1.1\r\nHost: api.example.test\r\nContent-Length: %d\r\n\r\n" % (n + (0 if whole else 1))
    s.sendall(head.encode() + b"y" * n)
    return s
def answer(s):
    data = b""
    while b"\r\n\r\n" not in data:
        more = s.recv(65536)
        if not more:
            break
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    length = [int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")]
    while length and len(body) < length[0]:
        more = s.recv(65536)
        if not more:
            break
        body += more
    return head.split(b"\r\n")[0].decode(), body.decode(errors="replace")
held = [request(400000, False) for _ in range(2)]
status, body = "none", ""
for _ in range(50):
    s = request(400000, True)
    status, body = answer(s)
    s.close()
    if " 503 " in status:
        break
    time.sleep(0.2)
print("== third", status)
print(body)
print("== end", flush=True)
# The stalled connections outlive the agent: the run ends with them open.
if os.fork() == 0:
    time.sleep(600)
PY
"#;
    let grants = || vec![grant("api.example.test", &[80])];
    let minted = egress
        .mint(egress.request(stalled, grants(), pb::Limits::default()))
        .await;
    let run_id = egress.supervisor.start_run(minted.text).await;
    let output = egress.supervisor.output(&run_id).await;
    assert!(output.contains("== third HTTP/1.1 503"), "{output}");
    assert!(output.contains("--egress-inspect-budget"), "{output}");
    let entries = egress.entries(&run_id);
    assert!(
        entries.iter().any(|e| text(e, "code") == "egress_budget"),
        "{entries:#?}"
    );
    // The first run is over, its stalled connections with it: the budget is whole again.
    let again = r#"
python3 -c 'import sys; sys.stdout.write("y" * 400000)' > /tmp/body
echo "== again $(curl -sS --max-time 20 -o /dev/null -w '%{http_code}' --data-binary @/tmp/body http://api.example.test/echo 2>&1)"
"#;
    let minted = egress
        .mint(egress.request(again, grants(), pb::Limits::default()))
        .await;
    let run_id = egress.supervisor.start_run(minted.text).await;
    let output = egress.supervisor.output(&run_id).await;
    assert!(output.contains("== again 200"), "{output}");
}

/// The supervisor's resident memory, in bytes.
fn resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|kib| kib.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS")
        << 10
}

/// The first week's measurement, repeated: 320 inspected connections whose bodies stay one
/// byte short grew the supervisor from 219 MB to 630 MB, and it stayed at 625 MB after the run
/// ended. They may make it hold no more than the supervisor-wide inspection budget (its
/// default, 256 MiB) and a margin, and each run's end gives back what its connections held:
/// a second such run leaves the supervisor no larger than the first did. (Before the
/// allocator's threshold was fixed: +79 MiB after the first run, +206 to +268 MiB after the
/// second. Since: the second run leaves +5 to +11 MiB or, about half the time, +27 to +33 MiB
/// more than the first, on a quiet machine; hence the 48 MiB margin.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_inspected_connections_hold_at_most_the_budget_and_free_it_at_the_run_end() {
    if !require_root() {
        return;
    }
    const MIB: u64 = 1 << 20;
    let egress = Egress::start("egress-stalled", 31, 242_100, None).await;
    let pid = egress.supervisor.pid();
    let before = resident_bytes(pid);
    let stalled = r#"
python3 - <<'PY'
import socket, time
held = []
for _ in range(320):
    s = socket.create_connection(("127.0.0.1", 7711))
    n = 1 << 20
    head = "POST http://api.example.test/echo HTTP/1.1\r\nHost: api.example.test\r\nContent-Length: %d\r\n\r\n" % (n + 1)
    try:
        s.sendall(head.encode() + b"y" * n)
    except OSError:
        pass
    held.append(s)
time.sleep(3)
print("== end", flush=True)
PY
"#;
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(before));
    let sampler = tokio::spawn({
        let peak = peak.clone();
        async move {
            loop {
                peak.fetch_max(resident_bytes(pid), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    let mut after = Vec::new();
    for _ in 0..2 {
        let limits = pb::Limits {
            egress_connections: 400,
            ..Default::default()
        };
        let minted = egress
            .mint(egress.request(stalled, vec![grant("api.example.test", &[80])], limits))
            .await;
        let run_id = egress.supervisor.start_run(minted.text).await;
        let output = egress.supervisor.output(&run_id).await;
        assert!(output.contains("== end"), "{output}");
        tokio::time::sleep(Duration::from_secs(3)).await;
        after.push(resident_bytes(pid));
    }
    sampler.abort();
    let peak = peak.load(std::sync::atomic::Ordering::Relaxed);
    let seen = format!(
        "supervisor RSS: {} MiB before, {} MiB at the peak, {:?} MiB after each run",
        before / MIB,
        peak / MIB,
        after.iter().map(|a| a / MIB).collect::<Vec<_>>()
    );
    assert!(
        peak <= before + 320 * MIB,
        "more than the budget held: {seen}"
    );
    assert!(
        after[1] <= after[0] + 48 * MIB,
        "a second run left more behind: {seen}"
    );
    assert!(
        after[1] <= before + 96 * MIB,
        "the runs' memory was not given back: {seen}"
    );
}
