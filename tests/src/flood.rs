//! A hostile HTTP/2 client for the daemons' resource tests: many connections, each with many
//! gRPC calls whose request body stops one byte short of its end and is then held open — what
//! a peer does to make a server buffer as much as it will.

use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};

/// Open stalled calls; dropping it closes them.
pub struct Flood {
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Flood {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// A gRPC message frame (uncompressed) around `message`.
pub fn grpc_frame(message: &[u8]) -> Bytes {
    let mut frame = Vec::with_capacity(message.len() + 5);
    frame.push(0);
    frame.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    frame.extend_from_slice(message);
    frame.into()
}

/// Opens `connections` connections with `connect`, and on each `streams` calls to `path`
/// (`/package.Service/Method`) with `headers`, each sending all of `body` but its last byte
/// and then holding the stream open. Returns once every stream has been opened.
pub async fn stalled_calls<IO, F, Fut>(
    connect: F,
    connections: usize,
    streams: usize,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Flood
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = std::io::Result<IO>>,
{
    let mut tasks = Vec::new();
    let short = body.slice(..body.len() - 1);
    for _ in 0..connections {
        let io = connect().await.expect("connect");
        let (client, connection) = h2::client::Builder::new()
            .initial_window_size(1 << 20)
            .handshake::<_, Bytes>(io)
            .await
            .expect("HTTP/2 handshake");
        tasks.push(tokio::spawn(async move {
            let _ = connection.await;
        }));
        for _ in 0..streams {
            let client = client.clone();
            let mut request = http::Request::post(format!("http://localhost{path}"))
                .header("content-type", "application/grpc")
                .header("te", "trailers");
            for (name, value) in headers {
                request = request.header(*name, *value);
            }
            let request = request.body(()).unwrap();
            let short = short.clone();
            tasks.push(tokio::spawn(async move {
                let Ok(mut ready) = client.ready().await else {
                    return;
                };
                let Ok((response, mut send)) = ready.send_request(request, false) else {
                    return;
                };
                // h2 queues what the server's window does not take yet and sends it as the
                // window opens: the server decides how much of it to hold.
                if send.send_data(short, false).is_err() {
                    return;
                }
                let _ = response.await;
                // Held until the flood is dropped.
                std::future::pending::<()>().await;
            }));
        }
    }
    Flood { tasks }
}

/// The resident memory of process `pid`, in bytes.
pub fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| {
            value
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map_or(0, |kib| kib * 1024)
}

/// The most `pid`'s resident memory grows above `baseline` while sampled for `window`.
pub fn peak_growth(pid: u32, baseline: u64, window: Duration) -> u64 {
    let end = Instant::now() + window;
    let mut peak = 0;
    while Instant::now() < end {
        peak = peak.max(rss_bytes(pid).saturating_sub(baseline));
        std::thread::sleep(Duration::from_millis(50));
    }
    peak
}
