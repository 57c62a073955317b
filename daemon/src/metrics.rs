//! `--metrics-listen`, for both daemons: their metrics as Prometheus scrapes them, `GET
//! /metrics` over plain HTTP/1.1 (OpenMetrics text, from a `prometheus-client` registry).
//! Off by default; bind it to loopback or a management network, since it says how busy the
//! host is (never what runs do: the daemons' labels hold no ids or paths).

use std::convert::Infallible;
use std::net::SocketAddr;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Content type of the OpenMetrics text format.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The OpenMetrics text of every metric in `registry`.
pub fn encode(registry: &prometheus_client::registry::Registry) -> String {
    let mut text = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut text, registry);
    text
}

/// The text `/metrics` answers with, made at each scrape.
pub type Encode = std::sync::Arc<dyn Fn() -> String + Send + Sync>;

/// Serves `/metrics` on `listener` until the process ends.
pub fn serve(listener: TcpListener, encode: Encode) {
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
            tokio::spawn(answer(stream, peer, encode.clone()));
        }
    });
}

async fn answer(stream: tokio::net::TcpStream, peer: SocketAddr, encode: Encode) {
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let encode = encode.clone();
        async move { Ok::<_, Infallible>(respond(&request, &encode)) }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await;
    if let Err(e) = served {
        tracing::debug!(%peer, error = %e, "metrics connection ended with an error");
    }
}

fn respond(request: &Request<Incoming>, encode: &Encode) -> Response<Full<Bytes>> {
    let response = if request.uri().path() == "/metrics" {
        Response::builder()
            .header("content-type", OPENMETRICS)
            .body(Full::new(Bytes::from(encode())))
    } else {
        Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(Full::new(Bytes::from_static(b"metrics are at /metrics\n")))
    };
    response.unwrap_or_default()
}
