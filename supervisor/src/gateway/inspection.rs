//! Reading an outbound connection, request by request: for a grant the supervisor inspects
//! (its TLS terminated with the run's own certificate authority, the upstream's certificate
//! verified; a tunnel to such a grant carries TLS or nothing), and for the sandbox proxy's
//! plain HTTP. Each request is checked (one host named, the granted one, in `Host` and any
//! absolute-form target, no routing override: `egress::request_rules`) and against the grant
//! (method, path prefix in one spelling); it goes on in origin form; its request line, headers
//! and body are classified and refused above the grant's `max_sensitivity` (403 naming the
//! detectors, never the text), the grant's secret is added as its header (replacing any the
//! agent sent; only over TLS verified for the host, never plain HTTP), and it goes on over
//! the one upstream connection made for this stream. Every request gets an `egress` entry
//! (`phase` `request`: method, path, status, sensitivity; never the query, a header's value
//! or the body).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full};
use hyper::header::{HeaderValue, HOST};
use hyper::{Request, Response, StatusCode};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, ReadBuf};
use tollgate_audit::{Decision, EntryDraft, EntryKind};
use tollgate_proto::v1 as pb;
use tollgate_receipt::egress::Host;
use tollgate_router::{Classification, Sensitivity};
use tonic::Status;

use super::gate::{new_call_id, CallGate, Refusal};
use crate::egress::body;
use crate::egress::ca::RunCa;
use crate::egress::config::{EgressConfig, InjectedHeader};
use crate::egress::request_rules;
use crate::COMPONENT;

/// Largest request body read (and classified) before it is sent on; a larger one is refused
/// as too large to inspect.
pub const MAX_INSPECTED_BODY: usize = 1 << 20;
/// How long a request body may take to arrive whole.
const BODY_DEADLINE: Duration = Duration::from_secs(30);
/// Most bytes hyper buffers reading one connection's requests.
const MAX_READ_BUFFER: usize = 64 << 10;
/// What one inspected connection holds besides its request bodies, reserved from the
/// supervisor-wide budget while it is served: the relay's pipe to it (256 KiB) and hyper's
/// read buffer.
pub const CONNECTION_BUFFERS: usize = (256 << 10) + MAX_READ_BUFFER;
/// How long a TLS handshake (either side) may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most bytes read looking for a plain request's first line.
const MAX_FIRST_LINE: usize = 8 << 10;

/// Classifies a text, with the supervisor's classifier (the routes file's when it has one).
pub type Classify = Arc<dyn Fn(&str) -> Classification + Send + Sync>;

type Body = BoxBody<Bytes, hyper::Error>;

/// Everything one inspected stream needs.
pub struct Inspection {
    /// The run's gate: audit entries, and the run still alive.
    pub gate: Arc<CallGate>,
    /// The host the stream was opened to.
    pub host: Host,
    /// Its port.
    pub port: u16,
    /// The grant that allowed it.
    pub grant: pb::EgressGrant,
    /// Secrets, upstream roots.
    pub config: Arc<EgressConfig>,
    /// The run's CA; none when the receipt inspects nothing (plain HTTP only).
    pub ca: Option<Arc<RunCa>>,
    /// The classifier.
    pub classify: Classify,
    /// The stream's call id (each request gets its own, and names this one).
    pub call_id: String,
    /// The stream carries plain HTTP (the proxy's absolute-form forwarding): never TLS.
    pub plain: bool,
}

impl Inspection {
    fn refuse(&self, reason: String) -> Refusal {
        Refusal::denied(&self.gate.run_id, reason).coded("egress_inspection")
    }

    /// Serves the sandbox's side of the stream (`client`) against `upstream` until either
    /// ends.
    pub(crate) async fn serve<C, U>(self, mut client: C, upstream: U) -> Result<(), Refusal>
    where
        C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        U: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        // Held until the connection ends (or its task is cancelled with the run).
        let _buffers = self
            .config
            .inspect_budget
            .reserve(CONNECTION_BUFFERS)
            .map_err(|spent| {
                Refusal::with(Status::resource_exhausted, spent.to_string()).coded("egress_budget")
            })?;
        let mut first = vec![0u8; 1];
        if client
            .read(&mut first)
            .await
            .map_err(|_| self.refuse("the sandbox's side failed".into()))?
            == 0
        {
            return Ok(());
        }
        if first[0] == 0x16 && !self.plain {
            let Some(ca) = self.ca.clone() else {
                return Err(self.refuse("no certificate authority for this run".into()));
            };
            let server = ca
                .server_for(&self.host)
                .map_err(|e| self.refuse(format!("no certificate for {}: {e}", self.host)))?;
            let accepted = tokio::time::timeout(
                HANDSHAKE_TIMEOUT,
                tokio_rustls::TlsAcceptor::from(server).accept(Rewind::new(first, client)),
            )
            .await;
            let client = match accepted {
                Ok(Ok(client)) => client,
                _ => {
                    return Err(self.refuse(format!(
                        "the sandbox's TLS handshake for {} failed: does the client trust /run/tollgate/egress/ca.pem (SSL_CERT_FILE)?",
                        self.host
                    )))
                }
            };
            let name = rustls::pki_types::ServerName::try_from(self.host.to_string())
                .map_err(|_| self.refuse(format!("{} is not a TLS server name", self.host)))?;
            let connector = tokio_rustls::TlsConnector::from(self.config.upstream_tls.clone());
            let upstream =
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, connector.connect(name, upstream))
                    .await
                {
                    Ok(Ok(upstream)) => Ok(upstream),
                    Ok(Err(e)) => Err(format!("the TLS handshake with {} failed: {e}", self.host)),
                    Err(_) => Err(format!(
                        "{} did not finish its TLS handshake within 10 s",
                        self.host
                    )),
                };
            return self.serve_http(client, upstream).await;
        }
        if !self.plain {
            // A tunnel to an inspected grant carries TLS the supervisor terminates and
            // verifies again towards the host, or nothing: plain text on it would go to the
            // host's port in the clear, its secret with it.
            return Err(self.refuse(format!(
                "the tunnel to {}:{} is inspected and carries only TLS; the sandbox sent something else (use https://)",
                self.host, self.port
            )));
        }
        // The proxy's plain HTTP: it must be HTTP/1.x.
        let mut head = first;
        while !head.contains(&b'\n') && head.len() < MAX_FIRST_LINE {
            let mut more = [0u8; 1024];
            let n = client.read(&mut more).await.unwrap_or(0);
            if n == 0 {
                break;
            }
            head.extend_from_slice(&more[..n]);
        }
        if !looks_like_http(&head) {
            return Err(self.refuse(format!(
                "the connection to {} is read as plain HTTP, and the sandbox did not speak HTTP/1.x on it",
                self.host
            )));
        }
        self.serve_http(Rewind::new(head, client), Ok(upstream))
            .await
    }

    /// Serves HTTP/1.1 requests from `client`, each checked, classified, given its secret and
    /// sent over `upstream` (or answered 502 with why it could not be reached).
    async fn serve_http<C, U>(self, client: C, upstream: Result<U, String>) -> Result<(), Refusal>
    where
        C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        U: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let sender = match upstream {
            Ok(upstream) => {
                match hyper::client::conn::http1::handshake::<_, Full<Bytes>>(
                    hyper_util::rt::TokioIo::new(upstream),
                )
                .await
                {
                    Ok((sender, connection)) => {
                        tokio::spawn(async move {
                            let _ = connection.await;
                        });
                        Ok(Arc::new(tokio::sync::Mutex::new(sender)))
                    }
                    Err(e) => Err(format!("HTTP with {} failed: {e}", self.host)),
                }
            }
            Err(why) => Err(why),
        };
        let this = Arc::new(self);
        let served = this.clone();
        let service = hyper::service::service_fn(move |request| {
            let (this, sender) = (served.clone(), sender.clone());
            async move { Ok::<_, Infallible>(this.answer(request, sender).await) }
        });
        hyper::server::conn::http1::Builder::new()
            .max_buf_size(MAX_READ_BUFFER)
            .serve_connection(hyper_util::rt::TokioIo::new(client), service)
            .await
            .map_err(|e| {
                Refusal::with(Status::unavailable, format!("HTTP from the sandbox: {e}")).ran()
            })
    }

    /// One request: refused here, or sent on and its answer streamed back.
    async fn answer(
        &self,
        mut request: Request<hyper::body::Incoming>,
        sender: Result<
            Arc<tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Full<Bytes>>>>,
            String,
        >,
    ) -> Response<Body> {
        let started = Instant::now();
        let call_id = new_call_id();
        let method = request.method().as_str().to_owned();
        let path = request.uri().path().to_owned();
        let mut seen = Seen {
            method: method.clone(),
            path: clip(&path, 256),
            sensitivity: None,
            injected: false,
        };
        // Checked, then sent on in origin form with the one Host it names.
        let checked = self.check(&request).map(|(origin, host)| {
            *request.uri_mut() = origin;
            request.headers_mut().insert(HOST, host);
        });
        let (parts, body) = request.into_parts();
        // What this request holds in memory, until it is answered.
        let mut held = self.config.inspect_budget.reservation();
        let outcome = match checked {
            Err(reason) => Err((StatusCode::FORBIDDEN, reason, "egress_request")),
            Ok(()) => body::read_body(body, MAX_INSPECTED_BODY, &mut held, BODY_DEADLINE)
                .await
                .map_err(|e| {
                    let (status, code) = match &e {
                        body::BodyError::TooLarge(_) => {
                            (StatusCode::PAYLOAD_TOO_LARGE, "egress_too_large")
                        }
                        body::BodyError::Spent(_) => {
                            (StatusCode::SERVICE_UNAVAILABLE, "egress_budget")
                        }
                        body::BodyError::Deadline(_) => {
                            (StatusCode::REQUEST_TIMEOUT, "egress_body_deadline")
                        }
                        body::BodyError::Failed(_) => (StatusCode::BAD_REQUEST, "egress_body"),
                    };
                    (status, e.to_string(), code)
                }),
        };
        let outcome = outcome.and_then(|body| {
            let allowed = allowed_sensitivity(self.grant.max_sensitivity);
            let inspected = body::request_text(
                &method,
                &parts,
                &body,
                &self.host,
                MAX_INSPECTED_BODY,
                &mut held,
            )
            .map_err(|spent| {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    spent.to_string(),
                    "egress_budget",
                )
            })?;
            // What the classifier cannot read passes only where anything may.
            if let Some(why) = inspected.unreadable.filter(|_| allowed < Sensitivity::High) {
                return Err((
                    StatusCode::FORBIDDEN,
                    format!("{why}; {} may receive only text up to {}", self.host, allowed.name()),
                    "egress_unreadable",
                ));
            }
            let classification = (self.classify)(&inspected.text);
            seen.sensitivity = Some(classification.sensitivity);
            if classification.sensitivity > allowed {
                let mut detectors: Vec<&str> =
                    classification.reasons.iter().map(|r| r.detector.as_str()).collect();
                detectors.dedup();
                return Err((
                    StatusCode::FORBIDDEN,
                    format!(
                        "the request carries text classified {} ({}), above the {} that {} may receive",
                        classification.sensitivity.name(),
                        detectors.join(", "),
                        allowed.name(),
                        self.host
                    ),
                    "egress_sensitivity",
                ));
            }
            Ok(body)
        });
        let response = match outcome {
            Err((status, reason, code)) => {
                self.record(&call_id, &seen, status, Some((&reason, code)), started);
                return refusal_response(status, &self.gate.run_id, &reason, &call_id);
            }
            Ok(body) => {
                let mut upstream_request = Request::from_parts(parts, Full::new(body));
                // Only over the TLS the supervisor verified for the granted host (`check`
                // refuses a plain request to a grant that injects).
                if let Some(secret) = self.secret().filter(|_| !self.plain) {
                    upstream_request.headers_mut().remove(&secret.name);
                    upstream_request
                        .headers_mut()
                        .insert(secret.name.clone(), secret.value.clone());
                    seen.injected = true;
                }
                match sender {
                    Err(why) => Err(why),
                    Ok(sender) => {
                        let mut sender = sender.lock().await;
                        match sender.ready().await {
                            Err(e) => Err(format!("{} closed the connection: {e}", self.host)),
                            Ok(()) => sender
                                .send_request(upstream_request)
                                .await
                                .map_err(|e| format!("{} did not answer: {e}", self.host)),
                        }
                    }
                }
            }
        };
        match response {
            Ok(response) => {
                self.record(&call_id, &seen, response.status(), None, started);
                response.map(|body| body.boxed())
            }
            Err(why) => {
                self.record(
                    &call_id,
                    &seen,
                    StatusCode::BAD_GATEWAY,
                    Some((&why, "egress_upstream")),
                    started,
                );
                refusal_response(StatusCode::BAD_GATEWAY, &self.gate.run_id, &why, &call_id)
            }
        }
    }

    /// The grant's secret, when it names one the supervisor holds.
    fn secret(&self) -> Option<&InjectedHeader> {
        if self.grant.inject.is_empty() {
            return None;
        }
        self.config.secrets.get(&self.grant.inject)
    }

    /// The grant's per-request rules: the run alive, the secret there (and the connection
    /// TLS when there is one to add), exactly one host named and it the granted host, no
    /// routing override, the method allowed, the path in one spelling and under an allowed
    /// prefix. Returns the target in origin form and the `Host` it goes on with.
    fn check(
        &self,
        request: &Request<hyper::body::Incoming>,
    ) -> Result<(http::Uri, HeaderValue), String> {
        if let Err(refusal) = self.gate.check_alive() {
            return Err(refusal.reason);
        }
        if !self.grant.inject.is_empty() && self.secret().is_none() {
            return Err(format!(
                "secret {:?} is not in this supervisor's configuration (--egress-secrets)",
                self.grant.inject
            ));
        }
        if !self.grant.inject.is_empty() && self.plain {
            return Err(format!(
                "the grant for {} adds a secret, which goes only over TLS verified for that host; use https://",
                self.host
            ));
        }
        let method = request.method().as_str();
        let (origin, host) =
            request_rules::check_target(request.headers(), request.uri(), &self.host, self.port)
                .map_err(|rule| rule.to_string())?;
        request_rules::check_overrides(request.headers(), !self.grant.methods.is_empty(), method)
            .map_err(|rule| rule.to_string())?;
        let host = HeaderValue::from_str(&host)
            .map_err(|_| "the request's Host is not text".to_owned())?;
        if !self.grant.methods.is_empty() && !self.grant.methods.iter().any(|m| m == method) {
            return Err(format!(
                "{method} is not among the methods granted for {} ({})",
                self.host,
                self.grant.methods.join(", ")
            ));
        }
        if !self.grant.paths.is_empty() {
            let path = origin.path();
            request_rules::check_path_spelling(path).map_err(|rule| rule.to_string())?;
            if !self
                .grant
                .paths
                .iter()
                .any(|prefix| path.starts_with(prefix.as_str()))
            {
                return Err(format!(
                    "{} is not beneath the paths granted for {} ({})",
                    clip(path, 120),
                    self.host,
                    self.grant.paths.join(", ")
                ));
            }
        }
        Ok((origin, host))
    }

    /// One request's `egress` entry (counted against the run's audit quota).
    fn record(
        &self,
        call_id: &str,
        seen: &Seen,
        status: StatusCode,
        refused: Option<(&str, &'static str)>,
        started: Instant,
    ) {
        let decision = if refused.is_some() && status != StatusCode::BAD_GATEWAY {
            Decision::Deny
        } else {
            Decision::Allow
        };
        crate::metrics::get().call("egress.request", decision.as_str());
        // A spent run's refusals are summarised (bounded audit), as its tool calls' are.
        if decision == Decision::Deny {
            let reason = refused.map_or("", |(reason, _)| reason);
            if let Ok(true) = self.gate.summarised("egress.request", call_id, reason) {
                return;
            }
        }
        let mut entry = EntryDraft::new(COMPONENT, EntryKind::Egress)
            .receipt(self.gate.run_id.as_str())
            .run(self.gate.run_id.as_str())
            .call(call_id)
            .decision(decision)
            .meta("phase", "request")
            .meta("connection", self.call_id.as_str())
            .meta("host", self.host.to_string())
            .meta("port", i64::from(self.port))
            .meta("method", seen.method.as_str())
            .meta("path", seen.path.as_str())
            .meta("status", i64::from(status.as_u16()))
            .meta("injected", seen.injected)
            .meta(
                "duration_us",
                i64::try_from(started.elapsed().as_micros()).unwrap_or(i64::MAX),
            );
        if let Some(sensitivity) = seen.sensitivity {
            entry = entry.meta("sensitivity", sensitivity.name());
        }
        if let Some((reason, code)) = refused {
            entry = entry.reason(reason).meta("code", code);
        }
        let written = tokio::task::block_in_place(|| self.gate.audited(entry, false));
        if let Err(e) = written {
            tracing::error!(run_id = %self.gate.run_id, error = %e.message(), "could not audit an outbound request");
        }
    }
}

/// What a request's entry says about it.
struct Seen {
    method: String,
    path: String,
    sensitivity: Option<Sensitivity>,
    injected: bool,
}

/// The most sensitive text a grant lets leave (unset: LOW).
fn allowed_sensitivity(max: i32) -> Sensitivity {
    match pb::Sensitivity::try_from(max) {
        Ok(pb::Sensitivity::High) => Sensitivity::High,
        Ok(pb::Sensitivity::Medium) => Sensitivity::Medium,
        _ => Sensitivity::Low,
    }
}

/// A supervisor's answer to a refused request: the status, the reason as text, the call id.
fn refusal_response(
    status: StatusCode,
    run_id: &str,
    reason: &str,
    call_id: &str,
) -> Response<Body> {
    let body = format!("refused by receipt {run_id}: {reason}\n");
    let mut response = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never: Infallible| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        "content-type",
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if let Ok(value) = HeaderValue::from_str(call_id) {
        headers.insert("x-tollgate-call-id", value);
    }
    response
}

/// Whether a first line is an HTTP/1.x request line.
fn looks_like_http(head: &[u8]) -> bool {
    let line = head.split(|b| *b == b'\n').next().unwrap_or(&[]);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut words = line.split(|b| *b == b' ');
    let (Some(method), Some(target), Some(version), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return false;
    };
    !method.is_empty()
        && method.iter().all(u8::is_ascii_uppercase)
        && !target.is_empty()
        && (version == b"HTTP/1.1" || version == b"HTTP/1.0")
}

fn clip(text: &str, chars: usize) -> String {
    text.chars()
        .filter(|c| !c.is_control())
        .take(chars)
        .collect()
}

/// A stream whose first bytes were already read: they are read again first.
pub struct Rewind<T> {
    prefix: Vec<u8>,
    at: usize,
    inner: T,
}

impl<T> Rewind<T> {
    /// `inner`, with `prefix` read before it.
    pub fn new(prefix: Vec<u8>, inner: T) -> Self {
        Self {
            prefix,
            at: 0,
            inner,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Rewind<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.at < self.prefix.len() {
            let n = buf.remaining().min(self.prefix.len() - self.at);
            let at = self.at;
            buf.put_slice(&self.prefix[at..at + n]);
            self.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Rewind<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines() {
        assert!(looks_like_http(b"GET / HTTP/1.1\r\nHost: x\r\n"));
        assert!(looks_like_http(b"POST /a?b HTTP/1.0\r\n"));
        assert!(!looks_like_http(b"SSH-2.0-OpenSSH\r\n"));
        assert!(!looks_like_http(b"get / HTTP/1.1\r\n"));
        assert!(!looks_like_http(b"PRI * HTTP/2.0\r\n"));
    }

    #[tokio::test]
    async fn rewind_reads_its_prefix_first() {
        let (mut a, b) = tokio::io::duplex(64);
        tokio::io::AsyncWriteExt::write_all(&mut a, b"world")
            .await
            .unwrap();
        drop(a);
        let mut rewound = Rewind::new(b"hello ".to_vec(), b);
        let mut all = String::new();
        rewound.read_to_string(&mut all).await.unwrap();
        assert_eq!(all, "hello world");
    }
}

#[cfg(test)]
mod classified {
    use super::*;
    use std::io::Write as _;

    const KEY: &str = "aws_access_key_id=AKIAIOSFODNN7EXAMPLE aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

    fn sensitivity(request: Request<Vec<u8>>, granted: &str) -> Sensitivity {
        let (parts, body) = request.into_parts();
        let budget = crate::egress::budget::InspectBudget::new(64 << 20);
        let text = body::request_text(
            parts.method.as_str(),
            &parts,
            &Bytes::from(body),
            &Host::parse(granted).unwrap(),
            MAX_INSPECTED_BODY,
            &mut budget.reservation(),
        )
        .unwrap()
        .text;
        let classifier =
            tollgate_router::Classifier::new(&tollgate_router::ClassifierConfig::default())
                .unwrap();
        classifier.classify(&text).sensitivity
    }

    fn post(headers: &[(&str, &str)], body: Vec<u8>) -> Request<Vec<u8>> {
        let mut request = Request::post("/echo").header("host", "api.example.test");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(body).unwrap()
    }

    #[test]
    fn encoded_bodies_are_classified_decoded() {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD.encode(KEY);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(KEY.as_bytes()).unwrap();
        let gz = gz.finish().unwrap();
        let mut zlib = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        zlib.write_all(KEY.as_bytes()).unwrap();
        let zlib = zlib.finish().unwrap();
        let utf16: Vec<u8> = KEY.encode_utf16().flat_map(u16::to_le_bytes).collect();
        let multipart = format!(
            "--XX\r\nContent-Disposition: form-data; name=\"f\"\r\nContent-Transfer-Encoding: base64\r\n\r\n{b64}\r\n--XX--\r\n"
        );
        let percent: String = KEY.bytes().map(|b| format!("%{b:02X}")).collect();
        let cases = [
            ("plain", post(&[], KEY.into())),
            ("gzip", post(&[("content-encoding", "gzip")], gz)),
            ("deflate", post(&[("content-encoding", "deflate")], zlib)),
            ("base64", post(&[], b64.clone().into())),
            (
                "multipart base64",
                post(
                    &[("content-type", "multipart/form-data; boundary=XX")],
                    multipart.into(),
                ),
            ),
            ("utf-16le", post(&[], utf16)),
            (
                "percent-encoded query",
                Request::get(format!("/echo?q={percent}"))
                    .header("host", "api.example.test")
                    .body(Vec::new())
                    .unwrap(),
            ),
        ];
        for (name, request) in cases {
            assert_eq!(
                sensitivity(request, "api.example.test"),
                Sensitivity::High,
                "{name}"
            );
        }
    }

    #[test]
    fn the_granted_destination_is_not_classified() {
        for granted in ["10.213.77.2", "mirror.corp.internal"] {
            let request = Request::get(format!("http://{granted}:8080/simple/"))
                .header("host", format!("{granted}:8080"))
                .body(Vec::new())
                .unwrap();
            assert_eq!(sensitivity(request, granted), Sensitivity::Low, "{granted}");
        }
        // Elsewhere in the request, a private address still counts.
        let request = Request::get("http://10.213.77.2:8080/fetch?from=10.1.2.3")
            .header("host", "10.213.77.2:8080")
            .body(Vec::new())
            .unwrap();
        assert!(sensitivity(request, "10.213.77.2") > Sensitivity::Low);
    }
}
