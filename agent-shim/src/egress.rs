//! `tollgate-shim egress`: the sandbox's HTTP proxy on `127.0.0.1`, so curl, pip, git, npm
//! and the language runtimes reach the hosts a receipt grants, unmodified, through the
//! `HTTP(S)_PROXY` variables pid 1 gives the agent.
//!
//! Pid 1 starts it before the agent, confined exactly as the agent is: it holds no power the
//! agent lacks, and every decision is the supervisor's. Each client connection becomes one
//! gateway `Egress` stream (its control); once the supervisor has connected, the proxy hands
//! the client's connection itself to the supervisor (over the gateway socket, with the token
//! the stream's `opened` gave), which relays it to the upstream: `CONNECT host:port` (TLS, and
//! anything else tunnelled) is answered `200`, then bytes pass both ways; a plain HTTP request in
//! absolute form (`GET http://host/path`) is sent on in origin form with `Connection: close`
//! (one request per connection, so a connection never carries a second host's request). A
//! refusal is an HTTP error whose reason phrase is the supervisor's one-line reason (403
//! refused by the receipt, 429 a limit, 502 unreachable), with the call id in
//! `X-Tollgate-Call-Id`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::mpsc;
use tollgate_proto::v1 as pb;
use tollgate_proto::v1::egress_frame::Frame;
use tollgate_proto::{EGRESS_TUNNEL_PREFACE, EGRESS_TUNNEL_TOKEN_LEN};
use tollgate_shim_protocol::plan::EGRESS_PORT;

/// Longest request head read (the CONNECT line, or a plain request's line and headers).
const MAX_HEAD: usize = 64 << 10;
/// How long a client may take to send its request head.
const HEAD_DEADLINE: Duration = Duration::from_secs(30);

type Gateway = pb::gateway_client::GatewayClient<tonic::transport::Channel>;

/// Runs `tollgate-shim egress [--port N] [--channels N]`; returns the exit status.
pub fn main(args: &[String]) -> i32 {
    let mut port = EGRESS_PORT;
    let mut channels = 1usize;
    let mut rest = args.iter();
    while let Some(flag) = rest.next() {
        let value = rest.next().and_then(|v| v.parse::<u16>().ok());
        match (flag.as_str(), value) {
            ("--port", Some(value)) => port = value,
            ("--channels", Some(value)) if value > 0 => channels = usize::from(value.min(8)),
            _ => return usage(),
        }
    }
    let target = crate::helper::gateway_target();
    // Tunnels are connections to the gateway's socket itself.
    let Some(socket) = target.strip_prefix("unix:").map(PathBuf::from) else {
        eprintln!("tollgate-shim egress: the gateway address {target} is not unix:PATH");
        return 64;
    };
    let socket = Arc::new(socket);
    let runtime = match crate::helper::runtime("egress") {
        Ok(runtime) => runtime,
        Err(status) => return status,
    };
    runtime.block_on(async move {
        let endpoint = match tonic::transport::Endpoint::from_shared(target.clone()) {
            Ok(endpoint) => endpoint,
            Err(e) => {
                eprintln!("tollgate-shim egress: bad gateway address {target}: {e}");
                return 64;
            }
        };
        // Each gateway connection carries at most 16 streams at once: a receipt allowing
        // more connections gets more of them.
        let gateways: Arc<[Gateway]> = (0..channels)
            .map(|_| pb::gateway_client::GatewayClient::new(endpoint.connect_lazy()))
            .collect();
        let listener = match tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
            Ok(listener) => listener,
            Err(e) => {
                eprintln!("tollgate-shim egress: cannot listen on 127.0.0.1:{port}: {e}");
                return 69;
            }
        };
        let next = AtomicUsize::new(0);
        loop {
            let Ok((client, _)) = listener.accept().await else {
                continue;
            };
            let _ = client.set_nodelay(true);
            let gateway = gateways[next.fetch_add(1, Ordering::Relaxed) % gateways.len()].clone();
            tokio::spawn(serve(client, gateway, socket.clone()));
        }
    })
}

fn usage() -> i32 {
    eprintln!(
        "usage: tollgate-shim egress [--port N] [--channels N] (started by the sandbox's pid 1)"
    );
    2
}

/// What a client asked the proxy for.
#[derive(Debug, PartialEq, Eq)]
struct Request {
    host: String,
    port: u16,
    /// A tunnel (`CONNECT`): answered `200` once open. Otherwise a plain HTTP request.
    tunnel: bool,
    /// Bytes to send upstream first: what followed a CONNECT head, or the rewritten request.
    first: Vec<u8>,
}

/// Why a request head cannot be served: the status and the reason phrase.
type Refused = (u16, String);

/// Parses a request head (`head` ends with the blank line) and what came after it.
fn parse_request(head: &[u8], after: &[u8]) -> Result<Request, Refused> {
    let bad = |why: &str| Err((400, why.to_owned()));
    let Ok(text) = std::str::from_utf8(head) else {
        return bad("the request head is not text");
    };
    let mut lines = text.split("\r\n");
    let line = lines.next().unwrap_or("");
    let mut words = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return bad("the request line is not METHOD TARGET VERSION");
    };
    if !version.starts_with("HTTP/1.") {
        return bad("only HTTP/1.x requests reach the proxy");
    }
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = split_authority(target, None)?;
        return Ok(Request {
            host,
            port,
            tunnel: true,
            first: after.to_vec(),
        });
    }
    let Some(rest) = strip_prefix_ignore_case(target, "http://") else {
        return if strip_prefix_ignore_case(target, "https://").is_some() {
            bad("https:// goes through CONNECT (set HTTPS_PROXY)")
        } else {
            bad("this is a proxy: send CONNECT host:port, or a request for an absolute http:// URL")
        };
    };
    let split = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(split);
    if authority.contains('@') {
        return bad("credentials in the URL are not passed on");
    }
    let (host, port) = split_authority(authority, Some(80))?;
    let path = match path {
        "" => "/".to_owned(),
        p if p.starts_with('/') => p.to_owned(),
        p => format!("/{p}"),
    };
    // Origin form, no hop-by-hop headers of the client's, one request per connection.
    let mut first = format!("{method} {path} {version}\r\n").into_bytes();
    for header in lines.filter(|l| !l.is_empty()) {
        let name = header.split(':').next().unwrap_or("").trim();
        if [
            "proxy-connection",
            "proxy-authorization",
            "connection",
            "keep-alive",
        ]
        .iter()
        .any(|hop| name.eq_ignore_ascii_case(hop))
        {
            continue;
        }
        first.extend_from_slice(header.as_bytes());
        first.extend_from_slice(b"\r\n");
    }
    first.extend_from_slice(b"Connection: close\r\n\r\n");
    first.extend_from_slice(after);
    Ok(Request {
        host,
        port,
        tunnel: false,
        first,
    })
}

fn strip_prefix_ignore_case<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    text.get(..prefix.len())
        .filter(|head| head.eq_ignore_ascii_case(prefix))
        .map(|_| &text[prefix.len()..])
}

/// `host:port` (`[v6]:port`); the port may be left out only where `default` gives one.
fn split_authority(authority: &str, default: Option<u16>) -> Result<(String, u16), Refused> {
    let bad = || (400, format!("{:?} is not host:port", clip(authority, 80)));
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, rest) = v6.split_once(']').ok_or_else(bad)?;
        (host, rest.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port = match (port, default) {
        (Some(port), _) => port
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(bad)?,
        (None, Some(default)) => default,
        (None, None) => return Err(bad()),
    };
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host.to_owned(), port))
}

fn clip(text: &str, chars: usize) -> String {
    text.chars().take(chars).collect()
}

/// An HTTP error answer: the reason phrase carries the reason (clients print it: Python's
/// "Tunnel connection failed: 403 …", curl's `-v`), the body too.
fn error_answer(code: u16, reason: &str, call_id: Option<&str>) -> Vec<u8> {
    // A reason phrase is visible ASCII and spaces.
    let phrase: String = reason
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .take(300)
        .collect();
    let body = format!("{phrase}\n");
    let mut answer = format!(
        "HTTP/1.1 {code} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if let Some(call_id) = call_id {
        answer.push_str(&format!("X-Tollgate-Call-Id: {call_id}\r\n"));
    }
    answer.push_str("\r\n");
    answer.push_str(&body);
    answer.into_bytes()
}

/// The HTTP answer to a gateway status.
fn refused(status: &tonic::Status) -> Vec<u8> {
    let code = match status.code() {
        tonic::Code::PermissionDenied => 403,
        tonic::Code::ResourceExhausted => 429,
        tonic::Code::InvalidArgument => 400,
        tonic::Code::DeadlineExceeded => 504,
        _ => 502,
    };
    let call_id = status
        .metadata()
        .get("tollgate-call-id")
        .and_then(|v| v.to_str().ok());
    error_answer(code, status.message(), call_id)
}

/// Reads a request head: everything up to and including the blank line, and what followed.
async fn read_head(client: &mut TcpStream) -> Result<(Vec<u8>, Vec<u8>), Option<Refused>> {
    let mut buffer = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    let read = async {
        loop {
            let n = client.read(&mut chunk).await.map_err(|_| None)?;
            if n == 0 {
                return Err(None);
            }
            let searched_from = buffer.len().saturating_sub(3);
            buffer.extend_from_slice(&chunk[..n]);
            if let Some(at) = buffer[searched_from..]
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
            {
                let end = searched_from + at + 4;
                let after = buffer.split_off(end);
                return Ok((buffer, after));
            }
            if buffer.len() > MAX_HEAD {
                return Err(Some((
                    431,
                    "the request head is longer than 64 KiB".to_owned(),
                )));
            }
        }
    };
    tokio::time::timeout(HEAD_DEADLINE, read)
        .await
        .unwrap_or(Err(Some((408, "no request head within 30 s".to_owned()))))
}

/// One client connection, start to end.
async fn serve(mut client: TcpStream, mut gateway: Gateway, socket: Arc<PathBuf>) {
    let request = match read_head(&mut client).await {
        Ok((head, after)) => parse_request(&head, &after),
        Err(Some(refused)) => Err(refused),
        Err(None) => return,
    };
    let request = match request {
        Ok(request) => request,
        Err((code, reason)) => {
            let _ = client.write_all(&error_answer(code, &reason, None)).await;
            return;
        }
    };
    let (open, rx) = mpsc::channel::<pb::EgressFrame>(1);
    // The channel is new and empty: the first frame always fits. `open` stays held until
    // the connection ends.
    let _ = open.try_send(pb::EgressFrame {
        frame: Some(Frame::Open(pb::EgressOpen {
            host: request.host.clone(),
            port: u32::from(request.port),
            // A plain request is read (and classified) by the supervisor; a tunnel only
            // when its grant is inspected.
            http: !request.tunnel,
        })),
    });
    let mut control = match gateway
        .egress(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
    {
        Ok(response) => response.into_inner(),
        Err(status) => {
            let _ = client.write_all(&refused(&status)).await;
            return;
        }
    };
    let token = match control.message().await {
        Ok(Some(pb::EgressFrame {
            frame: Some(Frame::Opened(opened)),
        })) if opened.tunnel_token.len() == EGRESS_TUNNEL_TOKEN_LEN => opened.tunnel_token,
        Ok(_) => {
            let _ = client
                .write_all(&error_answer(
                    502,
                    "the gateway did not open the connection",
                    None,
                ))
                .await;
            return;
        }
        Err(status) => {
            let _ = client.write_all(&refused(&status)).await;
            return;
        }
    };
    if request.tunnel
        && client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await
            .is_err()
    {
        return;
    }
    if let Err(e) = hand_off(&client, &socket, &token, &request.first).await {
        // A tunnel's client has its 200 already and is mid-protocol: it is just closed.
        if !request.tunnel {
            let reason = format!("the gateway took no hand-off: {}", e.kind());
            let _ = client.write_all(&error_answer(502, &reason, None)).await;
        }
        return;
    }
    // The supervisor relays the client's connection now, and ends it on the socket itself.
    // This side only keeps its descriptor until the stream says the connection is over, and
    // answers a plain request the supervisor refused before any answer.
    if let Err(status) = control_end(&mut control).await {
        if status
            .metadata()
            .contains_key(tollgate_proto::EGRESS_UNANSWERED)
        {
            let _ = client.write_all(&refused(&status)).await;
        }
    }
    drop(open);
}

/// Hands `client`'s connection to the gateway for the connection `token` names: the tunnel
/// preface and the token with the client's socket attached (SCM_RIGHTS), then the bytes that
/// go upstream first, then the end.
async fn hand_off(
    client: &TcpStream,
    socket: &std::path::Path,
    token: &[u8],
    first: &[u8],
) -> std::io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    use std::os::fd::AsRawFd as _;
    let mut gateway = UnixStream::connect(socket).await?;
    let mut head = Vec::with_capacity(EGRESS_TUNNEL_PREFACE.len() + token.len());
    head.extend_from_slice(EGRESS_TUNNEL_PREFACE);
    head.extend_from_slice(token);
    let sent = loop {
        gateway.writable().await?;
        let raw = [client.as_raw_fd()];
        let rights = [ControlMessage::ScmRights(&raw)];
        let iov = [std::io::IoSlice::new(&head)];
        match gateway.try_io(tokio::io::Interest::WRITABLE, || {
            sendmsg::<()>(gateway.as_raw_fd(), &iov, &rights, MsgFlags::empty(), None)
                .map_err(std::io::Error::from)
        }) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            sent => break sent?,
        }
    };
    // The rest, if the socket took only part (the descriptor went with the first byte).
    gateway.write_all(&head[sent..]).await?;
    gateway.write_all(first).await?;
    gateway.shutdown().await
}

/// How the gateway ended a connection's control stream: `Ok` for a normal end.
async fn control_end(control: &mut tonic::Streaming<pb::EgressFrame>) -> Result<(), tonic::Status> {
    loop {
        match control.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => return Ok(()),
            Err(status) => return Err(status),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_and_absolute_form_are_parsed() {
        let connect = parse_request(
            b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n",
            b"\x16\x03",
        )
        .unwrap();
        assert_eq!(
            connect,
            Request {
                host: "pypi.org".into(),
                port: 443,
                tunnel: true,
                first: b"\x16\x03".to_vec()
            }
        );
        let v6 = parse_request(b"CONNECT [2001:db8::1]:8443 HTTP/1.1\r\n\r\n", b"").unwrap();
        assert_eq!((v6.host.as_str(), v6.port), ("2001:db8::1", 8443));
        let plain = parse_request(
            b"GET http://example.test:8080/a?b=1 HTTP/1.1\r\nHost: example.test:8080\r\nProxy-Connection: keep-alive\r\nAccept: */*\r\n\r\n",
            b"",
        )
        .unwrap();
        assert_eq!(
            (plain.host.as_str(), plain.port, plain.tunnel),
            ("example.test", 8080, false)
        );
        assert_eq!(
            String::from_utf8(plain.first).unwrap(),
            "GET /a?b=1 HTTP/1.1\r\nHost: example.test:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        let bare = parse_request(b"GET http://example.test HTTP/1.0\r\n\r\n", b"").unwrap();
        assert_eq!(bare.port, 80);
        assert!(String::from_utf8(bare.first)
            .unwrap()
            .starts_with("GET / HTTP/1.0\r\n"));
    }

    #[test]
    fn what_a_proxy_cannot_serve_is_a_400() {
        for head in [
            &b"GET / HTTP/1.1\r\n\r\n"[..],
            b"GET https://x.test/ HTTP/1.1\r\n\r\n",
            b"CONNECT x.test HTTP/1.1\r\n\r\n",
            b"CONNECT x.test:0 HTTP/1.1\r\n\r\n",
            b"GET http://user:pw@x.test/ HTTP/1.1\r\n\r\n",
            b"PRI * HTTP/2.0\r\n\r\n",
        ] {
            let (code, _) = parse_request(head, b"").unwrap_err();
            assert_eq!(code, 400, "{}", String::from_utf8_lossy(head));
        }
    }

    #[test]
    fn a_refusal_carries_its_reason_in_the_status_line() {
        let answer = error_answer(
            403,
            "receipt r: egress to x.test:443 is not granted\n",
            Some("c1"),
        );
        let text = String::from_utf8(answer).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 403 receipt r: egress to x.test:443 is not granted?\r\n"),
            "{text}"
        );
        assert!(text.contains("X-Tollgate-Call-Id: c1\r\n"));
    }
}
