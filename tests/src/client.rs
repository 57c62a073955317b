//! Client-side helpers: an authorised request, a daemon's reflected services, and its
//! metrics scraped and parsed with the reference parser.

use std::path::Path;
use std::process::{Command, Stdio};

use tonic::transport::Channel;

/// Wraps a message with `authorization: Bearer <token>`.
pub fn authed<T>(token: &str, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("header"),
    );
    request
}

/// The services a daemon's reflection lists, over `grpc.reflection.v1` and `v1alpha`
/// (sorted).
pub async fn reflected_services(channel: Channel) -> (Vec<String>, Vec<String>) {
    use tokio_stream::StreamExt as _;
    use tonic_reflection::pb::{v1, v1alpha};
    let mut client = v1::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let reply = client
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .expect("reflection v1")
        .into_inner()
        .next()
        .await
        .expect("a v1 reply")
        .expect("v1 reply");
    let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        reply.message_response
    else {
        panic!("unexpected v1 reflection reply");
    };
    let mut v1_names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    v1_names.sort();
    let mut client = v1alpha::server_reflection_client::ServerReflectionClient::new(channel);
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let reply = client
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .expect("reflection v1alpha")
        .into_inner()
        .next()
        .await
        .expect("a v1alpha reply")
        .expect("v1alpha reply");
    let Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        reply.message_response
    else {
        panic!("unexpected v1alpha reflection reply");
    };
    let mut v1alpha_names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    v1alpha_names.sort();
    (v1_names, v1alpha_names)
}

/// Scrapes the `/metrics` of the daemon whose metrics address is in `addr_file`, checks it is
/// OpenMetrics text, and parses it with the reference parser (Python `prometheus_client`):
/// one `name [(label, value), …] value` line a sample.
pub fn scrape_metrics(addr_file: &Path) -> String {
    use std::io::{Read as _, Write as _};
    let addr = std::fs::read_to_string(addr_file).expect("metrics.addr");
    let mut stream = std::net::TcpStream::connect(addr.trim()).expect("metrics endpoint");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: metrics\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("application/openmetrics-text"), "{head}");
    let python = std::env::var("TOLLGATE_PYTHON").unwrap_or_else(|_| "python3".into());
    let mut parse = Command::new(python)
        .args([
            "-c",
            "import sys\n\
             from prometheus_client.openmetrics.parser import text_string_to_metric_families\n\
             for family in text_string_to_metric_families(sys.stdin.read()):\n\
             \x20   for s in family.samples:\n\
             \x20       print(s.name, sorted(s.labels.items()), s.value)\n",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python for the OpenMetrics parser");
    parse
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let parsed = parse.wait_with_output().unwrap();
    assert!(parsed.status.success(), "{parsed:?}\n{body}");
    String::from_utf8_lossy(&parsed.stdout).into_owned()
}

/// The value of the first sample line of `samples` (from [`scrape_metrics`]) starting with
/// `line_start`.
pub fn sample(samples: &str, line_start: &str) -> f64 {
    samples
        .lines()
        .find(|line| line.starts_with(line_start))
        .unwrap_or_else(|| panic!("no {line_start:?} in\n{samples}"))
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}
