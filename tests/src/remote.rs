//! "Remote" hosts for the egress tests: the suite's own servers in network namespaces it
//! creates, on documentation addresses (198.51.100.0/24, TEST-NET-2, public as far as the
//! supervisor's address rules go), reached from the host over a veth pair. Never anything
//! outside this machine.
//!
//! Each test takes its own `slot` (0 to 63): its namespace, its veth pair and its /30
//! (`198.51.100.4·slot + 1` on the host, `+ 2` in the namespace). Everything is removed on
//! drop, and a leftover of a crashed run with the same slot is removed before use.

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::Frame;
use hyper::{Request, Response};

/// One network namespace with one veth link to the host.
#[derive(Debug)]
pub struct RemoteNet {
    netns: String,
    veth: String,
    /// The namespace's address: servers listen here.
    pub address: Ipv4Addr,
}

pub(crate) fn ip(args: &[&str]) {
    let status = Command::new("ip").args(args).status().expect("run ip");
    assert!(status.success(), "ip {}", args.join(" "));
}

pub(crate) fn ip_quiet(args: &[&str]) {
    let _ = Command::new("ip")
        .args(args)
        .stderr(std::process::Stdio::null())
        .status();
}

impl RemoteNet {
    /// The namespace of `slot` (0 to 63), made afresh.
    pub fn create(slot: u8) -> Self {
        assert!(slot < 64, "slots are 0 to 63");
        let netns = format!("tgeg{slot}");
        let veth = format!("tgeg{slot}h");
        let peer = format!("tgeg{slot}r");
        ip_quiet(&["netns", "del", &netns]);
        ip_quiet(&["link", "del", &veth]);
        let base = 4 * slot;
        let host = Ipv4Addr::new(198, 51, 100, base + 1);
        let address = Ipv4Addr::new(198, 51, 100, base + 2);
        ip(&["netns", "add", &netns]);
        let net = Self {
            netns: netns.clone(),
            veth: veth.clone(),
            address,
        };
        ip(&["link", "add", &veth, "type", "veth", "peer", "name", &peer]);
        ip(&["link", "set", &peer, "netns", &netns]);
        ip(&["addr", "add", &format!("{host}/30"), "dev", &veth]);
        ip(&["link", "set", &veth, "up"]);
        ip(&[
            "-n",
            &netns,
            "addr",
            "add",
            &format!("{address}/30"),
            "dev",
            &peer,
        ]);
        ip(&["-n", &netns, "link", "set", &peer, "up"]);
        ip(&["-n", &netns, "link", "set", "lo", "up"]);
        net
    }

    /// A listening socket on `port` of the namespace's address (made inside the namespace,
    /// by a thread of its own, so the rest of the process stays where it is).
    pub fn listen(&self, port: u16) -> std::net::TcpListener {
        let path = PathBuf::from(format!("/run/netns/{}", self.netns));
        let address = SocketAddr::from((self.address, port));
        std::thread::spawn(move || {
            let namespace = std::fs::File::open(&path).expect("open the namespace");
            nix::sched::setns(namespace, nix::sched::CloneFlags::CLONE_NEWNET)
                .expect("enter the namespace");
            let listener = std::net::TcpListener::bind(address).expect("listen");
            listener.set_nonblocking(true).expect("non-blocking");
            listener
        })
        .join()
        .expect("the listening thread")
    }
}

impl Drop for RemoteNet {
    fn drop(&mut self) {
        ip_quiet(&["netns", "del", &self.netns]);
        ip_quiet(&["link", "del", &self.veth]);
    }
}

/// A test certificate authority and what it signs.
pub struct TestCa {
    /// The CA certificate (PEM), for the clients' trust.
    pub pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl TestCa {
    /// A fresh CA.
    pub fn new() -> Self {
        let mut params = rcgen::CertificateParams::new(Vec::new()).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "Tollgate test CA");
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let key = rcgen::KeyPair::generate().expect("key");
        let pem = params.self_signed(&key).expect("CA").pem();
        Self {
            pem,
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// A TLS server configuration with one certificate for `names`.
    pub fn server(&self, names: &[&str]) -> Arc<rustls::ServerConfig> {
        let mut params = rcgen::CertificateParams::new(
            names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>(),
        )
        .expect("names");
        params
            .extended_key_usages
            .push(rcgen::ExtendedKeyUsagePurpose::ServerAuth);
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("leaf");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .expect("server config");
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

/// One request a server saw.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Method.
    pub method: String,
    /// Path and query.
    pub path: String,
    /// The request target as it arrived (origin form `/…`, or absolute form `https://…`).
    pub target: String,
    /// Headers, names lower case.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

/// What a [`RemoteServer`] has seen and done.
#[derive(Debug, Default)]
pub struct ServerLog {
    /// Every request, in order.
    pub requests: Mutex<Vec<Seen>>,
    /// Connections accepted.
    pub connections: AtomicUsize,
    /// `/hold` answers still being streamed.
    pub holding: AtomicUsize,
    /// When the last `/hold` answer found its client gone.
    pub hold_ended: Mutex<Option<Instant>>,
}

/// An HTTP/1.1 server (over TLS when given a configuration) in a [`RemoteNet`]:
/// `/` says hello, `/bytes/N` sends N bytes, `/hold` streams a byte every 100 ms for a
/// minute, `/echo` answers the request body, `/public/…` names its path; anything else is
/// served from `files` (a git repository for a dumb-HTTP clone) or is a 404.
pub struct RemoteServer {
    /// What it has seen.
    pub log: Arc<ServerLog>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RemoteServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Body = http_body_util::Either<
    Full<Bytes>,
    StreamBody<tokio_stream::wrappers::ReceiverStream<Result<Frame<Bytes>, Infallible>>>,
>;

impl RemoteServer {
    /// Serves `listener` on the current runtime.
    pub fn start(
        listener: std::net::TcpListener,
        tls: Option<Arc<rustls::ServerConfig>>,
        files: Option<PathBuf>,
    ) -> Self {
        let log = Arc::new(ServerLog::default());
        let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
        let shared = log.clone();
        let task = tokio::spawn(async move {
            let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                // As HTTPS servers commonly do: a small answer is not held back for the
                // previous segment's ACK (Nagle's algorithm meeting a delayed ACK: 40 ms).
                let _ = stream.set_nodelay(true);
                shared.connections.fetch_add(1, Ordering::SeqCst);
                let (log, files, acceptor) = (shared.clone(), files.clone(), acceptor.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let (log, files) = (log.clone(), files.clone());
                        async move { Ok::<_, Infallible>(answer(request, &log, files).await) }
                    });
                    let http = hyper::server::conn::http1::Builder::new();
                    match acceptor {
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(stream).await {
                                let _ = http
                                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                                    .await;
                            }
                        }
                        None => {
                            let _ = http
                                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                                .await;
                        }
                    }
                });
            }
        });
        Self { log, task }
    }

    /// The requests seen so far.
    pub fn requests(&self) -> Vec<Seen> {
        self.log.requests.lock().unwrap().clone()
    }
}

fn full(status: u16, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(http_body_util::Either::Left(Full::new(body.into())));
    *response.status_mut() = hyper::StatusCode::from_u16(status).expect("status");
    response
}

async fn answer(
    request: Request<hyper::body::Incoming>,
    log: &Arc<ServerLog>,
    files: Option<PathBuf>,
) -> Response<Body> {
    let method = request.method().to_string();
    let target = request.uri().to_string();
    let path = request
        .uri()
        .path_and_query()
        .map_or("/".into(), |p| p.as_str().to_owned());
    let headers = request
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = request
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes().to_vec())
        .unwrap_or_default();
    log.requests.lock().unwrap().push(Seen {
        method,
        path: path.clone(),
        target,
        headers,
        body: body.clone(),
    });
    if path == "/" {
        return full(200, "hello from the remote host\n");
    }
    if path == "/echo" {
        return full(200, body);
    }
    if path.starts_with("/public/") {
        return full(200, format!("public {path}\n"));
    }
    if let Some(count) = path
        .strip_prefix("/bytes/")
        .and_then(|n| n.parse::<usize>().ok())
    {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            let chunk = Bytes::from(vec![b'x'; 64 << 10]);
            let mut left = count;
            while left > 0 {
                let n = left.min(chunk.len());
                if tx.send(Ok(Frame::data(chunk.slice(..n)))).await.is_err() {
                    return;
                }
                left -= n;
            }
        });
        let mut response = Response::new(http_body_util::Either::Right(StreamBody::new(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )));
        response
            .headers_mut()
            .insert("content-length", count.to_string().parse().expect("length"));
        return response;
    }
    if path == "/hold" {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let log = log.clone();
        log.holding.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(async move {
            for _ in 0..600 {
                if tx
                    .send(Ok(Frame::data(Bytes::from_static(b"."))))
                    .await
                    .is_err()
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                if tx.is_closed() {
                    break;
                }
            }
            *log.hold_ended.lock().unwrap() = Some(Instant::now());
            log.holding.fetch_sub(1, Ordering::SeqCst);
        });
        return Response::new(http_body_util::Either::Right(StreamBody::new(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )));
    }
    if let Some(root) = files {
        let relative = path.split('?').next().unwrap_or("").trim_start_matches('/');
        if !relative.split('/').any(|part| part == "..") {
            if let Ok(bytes) = std::fs::read(root.join(relative)) {
                return full(200, bytes);
            }
        }
    }
    full(404, "not here\n")
}
