//! The tower layer that bounds a gateway request before tonic decodes it: the body of each
//! method [`Shapes::walked`] names is collected (its bytes already capped and timed by the
//! `RequestLimits` layer outside this one), walked on the wire (see `shape`) and either
//! refused — audited as a refused call, `INVALID_ARGUMENT` with a one-line reason — or
//! handed on as it came.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body_util::BodyExt as _;
use tonic::body::Body;

use super::run::RunGateway;
use super::shape::Shapes;

/// The layer for one run's gateway server.
#[derive(Debug, Clone)]
pub(super) struct Prewalk {
    run: Arc<RunGateway>,
}

impl Prewalk {
    /// Requests refused by the walk are audited as `run`'s refused calls.
    pub(super) fn new(run: Arc<RunGateway>) -> Self {
        Self { run }
    }
}

impl<S> tower_layer::Layer<S> for Prewalk {
    type Service = Prewalked<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Prewalked {
            inner,
            run: self.run.clone(),
        }
    }
}

/// A service whose walked methods' requests are checked before the inner service decodes
/// them.
#[derive(Debug, Clone)]
pub(super) struct Prewalked<S> {
    inner: S,
    run: Arc<RunGateway>,
}

/// The audit name of a refused call to `path`, as the call itself would be audited (a tool
/// call's tool is not known before decoding).
fn audit_name(path: &str) -> &'static str {
    match path.rsplit('/').next() {
        Some("Complete") => "model.complete",
        Some("CountTokens") => "model.count_tokens",
        Some("Delegate") => "delegate",
        Some("StartChild") => "child.start",
        _ => "tool",
    }
}

type Answer<R, E> = Pin<Box<dyn Future<Output = Result<http::Response<R>, E>> + Send>>;

impl<S, ResBody> tower_service::Service<http::Request<Body>> for Prewalked<S>
where
    S: tower_service::Service<http::Request<Body>, Response = http::Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Answer<ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // The service made ready is the one called; this one keeps a fresh clone.
        let fresh = self.inner.clone();
        let mut ready = std::mem::replace(&mut self.inner, fresh);
        let shapes = Shapes::gateway();
        let Some(message) = shapes.walked(request.uri().path()) else {
            return Box::pin(ready.call(request));
        };
        let run = self.run.clone();
        Box::pin(async move {
            // The status travels in the headers; the body is empty.
            let refused = |status: tonic::Status| Ok(status.into_http::<ResBody>());
            let path = request.uri().path().to_owned();
            let (parts, body) = request.into_parts();
            let bytes = match body.collect().await {
                Ok(collected) => collected.to_bytes(),
                // Past the method's cap, the budget or the deadline: the limits' own status.
                Err(status) => return refused(status),
            };
            if let Err(problem) = shapes.check_frame(message, &bytes) {
                tracing::info!(run_id = %run.gate.run_id, method = %path, reason = %problem, "request refused before decoding");
                let status = tokio::task::block_in_place(|| {
                    run.gate
                        .refuse_input(audit_name(&path), problem.to_string())
                });
                return refused(status);
            }
            let request =
                http::Request::from_parts(parts, Body::new(http_body_util::Full::new(bytes)));
            ready.call(request).await
        })
    }
}
