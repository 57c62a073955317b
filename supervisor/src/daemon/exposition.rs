//! `--metrics-listen`: the metrics as Prometheus scrapes them, `GET /metrics` over plain
//! HTTP/1.1 (OpenMetrics text). Off by default; bind it to loopback or a management network,
//! since it says how busy the host is (never what runs do: labels hold no run ids or paths).

use std::convert::Infallible;
use std::net::SocketAddr;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Content type of the OpenMetrics text format.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves `/metrics` on `listener` until the process ends.
pub(super) fn serve(listener: TcpListener) {
    tokio::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics listener: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            tokio::spawn(answer(stream, peer));
        }
    });
}

async fn answer(stream: tokio::net::TcpStream, peer: SocketAddr) {
    let service = hyper::service::service_fn(|request: Request<Incoming>| async move {
        let response = if request.uri().path() == "/metrics" {
            Response::builder()
                .header("content-type", OPENMETRICS)
                .body(Full::new(Bytes::from(crate::metrics::get().encode())))
        } else {
            Response::builder()
                .status(StatusCode::NOT_FOUND)
                .body(Full::new(Bytes::from_static(b"metrics are at /metrics\n")))
        };
        Ok::<_, Infallible>(response.unwrap_or_default())
    });
    let served = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await;
    if let Err(e) = served {
        tracing::debug!(%peer, error = %e, "metrics connection ended with an error");
    }
}
