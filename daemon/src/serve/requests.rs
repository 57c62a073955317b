//! Requests: a header check before any body byte, per-method caps, a budget of request
//! bytes in flight, and a deadline for a body.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tonic::body::Body;
use tonic::Status;

/// A check on a request's method path and headers, before any of its body is read
/// (authentication): `Err` answers with that status at once.
pub type HeaderCheck = dyn Fn(&str, &http::HeaderMap) -> Result<(), Status> + Send + Sync;

/// What an [`Authenticate`] check answers: once it resolves, `Err` answers with that status
/// (the body still unread), `Ok` passes the request on with these extensions added (who the
/// caller is, for the handler).
pub type AuthenticateFuture =
    Pin<Box<dyn Future<Output = Result<http::Extensions, Status>> + Send>>;

/// A check on a request's method path, headers and connection (its extensions: the peer's
/// certificate) that may have to wait — for another daemon to say whose a token is — before
/// any of its body is read.
pub type Authenticate =
    dyn Fn(&str, &http::HeaderMap, &http::Extensions) -> AuthenticateFuture + Send + Sync;

/// What one listener's requests may make the daemon hold: a tower layer for
/// `Server::layer`.
#[derive(Clone)]
pub struct RequestLimits {
    shared: Arc<Shared>,
}

struct Shared {
    /// Method path → most request bytes (the gRPC framing included).
    caps: Vec<(&'static str, usize)>,
    /// Client-streaming methods whose body has no total cap and no deadline (an interactive
    /// session's input): what the daemon holds of them is bounded by the HTTP/2 stream
    /// window and the service's per-message limit instead.
    streams: Vec<&'static str>,
    default_cap: usize,
    /// Bytes of every request that do not count against `in_flight_max`: small calls are
    /// never refused for the budget (the stream and connection limits bound them instead).
    allowance: usize,
    in_flight_max: usize,
    in_flight: AtomicUsize,
    body_deadline: Duration,
    check: Option<Box<HeaderCheck>>,
    authenticate: Option<Box<Authenticate>>,
}

impl std::fmt::Debug for RequestLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestLimits")
            .field("caps", &self.shared.caps)
            .field("default_cap", &self.shared.default_cap)
            .field("in_flight_max", &self.shared.in_flight_max)
            .finish_non_exhaustive()
    }
}

/// Builds [`RequestLimits`].
pub struct RequestLimitsBuilder {
    shared: Shared,
}

impl RequestLimits {
    /// Requests of at most `default_cap` bytes, at most `in_flight` bytes of them held at
    /// once beyond a 64 KiB allowance each, every body complete within `body_deadline`.
    pub fn builder(
        default_cap: usize,
        in_flight: usize,
        body_deadline: Duration,
    ) -> RequestLimitsBuilder {
        RequestLimitsBuilder {
            shared: Shared {
                caps: Vec::new(),
                streams: Vec::new(),
                default_cap,
                allowance: 64 << 10,
                in_flight_max: in_flight,
                in_flight: AtomicUsize::new(0),
                body_deadline,
                check: None,
                authenticate: None,
            },
        }
    }

    /// Request bytes held now beyond the allowances (for tests and metrics).
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::Relaxed)
    }

    fn cap_of(&self, path: &str) -> usize {
        self.shared
            .caps
            .iter()
            .find(|(method, _)| *method == path)
            .map_or(self.shared.default_cap, |(_, cap)| *cap)
    }
}

impl RequestLimitsBuilder {
    /// Requests to `path` (`/package.Service/Method`) may carry up to `bytes`.
    pub fn cap(mut self, path: &'static str, bytes: usize) -> Self {
        self.shared.caps.push((path, bytes));
        self
    }

    /// Requests to `path` are a long-lived input stream: no total cap, no body deadline (the
    /// header check still applies; the HTTP/2 window and the per-message limit bound them).
    pub fn stream(mut self, path: &'static str) -> Self {
        self.shared.streams.push(path);
        self
    }

    /// Runs `check` on every request's path and headers before its body is read.
    pub fn check(
        mut self,
        check: impl Fn(&str, &http::HeaderMap) -> Result<(), Status> + Send + Sync + 'static,
    ) -> Self {
        self.shared.check = Some(Box::new(check));
        self
    }

    /// Runs `authenticate` on every request's path, headers and connection before its body is
    /// read, and passes it on only once it resolves `Ok` (with the extensions it adds); after
    /// [`Self::check`], when both are given.
    pub fn authenticate(
        mut self,
        authenticate: impl Fn(&str, &http::HeaderMap, &http::Extensions) -> AuthenticateFuture
            + Send
            + Sync
            + 'static,
    ) -> Self {
        self.shared.authenticate = Some(Box::new(authenticate));
        self
    }

    /// The limits.
    pub fn build(self) -> RequestLimits {
        RequestLimits {
            shared: Arc::new(self.shared),
        }
    }
}

impl<S> tower_layer::Layer<S> for RequestLimits {
    type Service = Limited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Limited {
            inner,
            limits: self.clone(),
        }
    }
}

/// A service whose requests are held to [`RequestLimits`].
#[derive(Debug, Clone)]
pub struct Limited<S> {
    inner: S,
    limits: RequestLimits,
}

/// The bytes one request holds beyond its allowance, given back when both its body and its
/// call are done.
#[derive(Debug)]
pub struct Charge {
    limits: RequestLimits,
    counted: AtomicUsize,
}

impl Drop for Charge {
    fn drop(&mut self) {
        let counted = self.counted.load(Ordering::Relaxed);
        self.limits
            .shared
            .in_flight
            .fetch_sub(counted, Ordering::Relaxed);
    }
}

impl<S, ResBody> tower_service::Service<http::Request<Body>> for Limited<S>
where
    S: tower_service::Service<http::Request<Body>, Response = http::Response<ResBody>> + Clone,
    ResBody: Default,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = LimitedFuture<S>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let path = request.uri().path();
        if let Some(check) = &self.limits.shared.check {
            if let Err(status) = check(path, request.headers()) {
                return LimitedFuture::Refused {
                    response: Some(status.into_http()),
                };
            }
        }
        if let Some(authenticate) = &self.limits.shared.authenticate {
            let check = authenticate(path, request.headers(), request.extensions());
            // The service made ready is the one called once the check resolves; this one
            // keeps a fresh clone for the next call (the usual tower hand-over).
            let fresh = self.inner.clone();
            let ready = std::mem::replace(&mut self.inner, fresh);
            return LimitedFuture::Authenticating {
                check,
                waiting: Some((ready, self.limits.clone(), request)),
            };
        }
        pass_on(&mut self.inner, &self.limits, request)
    }
}

/// Calls `inner` with `request`, its body held to `limits`.
fn pass_on<S, ResBody>(
    inner: &mut S,
    limits: &RequestLimits,
    request: http::Request<Body>,
) -> LimitedFuture<S>
where
    S: tower_service::Service<http::Request<Body>, Response = http::Response<ResBody>>,
{
    let path = request.uri().path().to_owned();
    let charge = Arc::new(Charge {
        limits: limits.clone(),
        counted: AtomicUsize::new(0),
    });
    if limits.shared.streams.iter().any(|stream| *stream == path) {
        return LimitedFuture::Called {
            future: inner.call(request),
            _charge: charge,
        };
    }
    let cap = limits.cap_of(&path);
    let deadline = tokio::time::Instant::now() + limits.shared.body_deadline;
    let request = request.map(|body| {
        Body::new(LimitedBody {
            inner: body,
            charge: charge.clone(),
            method: path,
            cap,
            seen: 0,
            deadline,
            timer: None,
            done: false,
        })
    });
    LimitedFuture::Called {
        future: inner.call(request),
        _charge: charge,
    }
}

pin_project_lite::pin_project! {
    /// The response of a [`Limited`] service: refused on its headers, waiting for its
    /// authentication, or the inner call, holding the request's charge until it is answered.
    #[project = LimitedFutureProj]
    #[allow(missing_docs)] // variant fields are described on their variants
    pub enum LimitedFuture<S>
    where
        S: tower_service::Service<http::Request<Body>>,
    {
        /// Refused before the body was read: the refusal, taken when answered.
        Refused { response: Option<http::Response<Body>> },
        /// Waiting for the authentication check; then the ready service, the limits and
        /// the request (its body unread).
        Authenticating {
            check: AuthenticateFuture,
            waiting: Option<(S, RequestLimits, http::Request<Body>)>,
        },
        /// Passed on: the inner call, and the request's bytes, held until it is answered.
        Called {
            #[pin]
            future: S::Future,
            _charge: Arc<Charge>,
        },
    }
}

impl<S, ResBody> Future for LimitedFuture<S>
where
    S: tower_service::Service<http::Request<Body>, Response = http::Response<ResBody>>,
    ResBody: Default,
{
    type Output = Result<http::Response<ResBody>, S::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let next = match self.as_mut().project() {
                LimitedFutureProj::Refused { response } => {
                    let response = response.take().unwrap_or_default();
                    // The status travels in the headers; the body is empty.
                    return Poll::Ready(Ok(response.map(|_| ResBody::default())));
                }
                LimitedFutureProj::Called { future, .. } => return future.poll(cx),
                LimitedFutureProj::Authenticating { check, waiting } => {
                    let checked = std::task::ready!(check.as_mut().poll(cx));
                    let Some((mut inner, limits, mut request)) = waiting.take() else {
                        // Cannot happen (the state is replaced as soon as it is taken); a
                        // status rather than a panic if it ever did.
                        let refusal = Status::internal("request polled after its check");
                        let response: http::Response<Body> = refusal.into_http();
                        return Poll::Ready(Ok(response.map(|_| ResBody::default())));
                    };
                    match checked {
                        Ok(extensions) => {
                            request.extensions_mut().extend(extensions);
                            pass_on(&mut inner, &limits, request)
                        }
                        Err(status) => LimitedFuture::Refused {
                            response: Some(status.into_http()),
                        },
                    }
                }
            };
            self.set(next);
        }
    }
}

/// A request body that counts what it hands on and ends with a status past a limit.
struct LimitedBody {
    inner: Body,
    charge: Arc<Charge>,
    method: String,
    cap: usize,
    seen: usize,
    /// When the body must have arrived.
    deadline: tokio::time::Instant,
    /// Armed only once the body makes the call wait: most bodies arrive in the first poll,
    /// and a timer per call would cost every call.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    done: bool,
}

impl LimitedBody {
    /// Counts `len` more bytes; the status that ends the request, if a limit is passed.
    fn count(&mut self, len: usize) -> Result<(), Status> {
        let before = self.seen;
        self.seen = self.seen.saturating_add(len);
        if self.seen > self.cap {
            return Err(Status::resource_exhausted(format!(
                "request to {} is larger than its limit of {} bytes",
                self.method, self.cap
            )));
        }
        let shared = &self.charge.limits.shared;
        let beyond =
            self.seen.saturating_sub(shared.allowance) - before.saturating_sub(shared.allowance);
        if beyond > 0 {
            self.charge.counted.fetch_add(beyond, Ordering::Relaxed);
            let now = shared.in_flight.fetch_add(beyond, Ordering::Relaxed) + beyond;
            if now > shared.in_flight_max {
                return Err(Status::resource_exhausted(format!(
                    "requests in flight on this connection's listener exceed {} bytes; retry once a large call has finished",
                    shared.in_flight_max
                )));
            }
        }
        Ok(())
    }
}

impl http_body::Body for LimitedBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        if self.done {
            return Poll::Ready(None);
        }
        let expired = match &mut self.timer {
            Some(timer) => timer.as_mut().poll(cx).is_ready(),
            None => tokio::time::Instant::now() >= self.deadline,
        };
        if expired {
            self.done = true;
            let deadline = self.charge.limits.shared.body_deadline;
            return Poll::Ready(Some(Err(Status::deadline_exceeded(format!(
                "the request to {} did not arrive within {} s",
                self.method,
                deadline.as_secs()
            )))));
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if let Err(status) = self.count(data.len()) {
                        self.done = true;
                        return Poll::Ready(Some(Err(status)));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                self.done = true;
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(None)
            }
            Poll::Pending => {
                if self.timer.is_none() {
                    let mut timer = Box::pin(tokio::time::sleep_until(self.deadline));
                    // Registers the wake-up at the deadline.
                    if timer.as_mut().poll(cx).is_ready() {
                        self.done = true;
                        return Poll::Ready(Some(Err(Status::deadline_exceeded(format!(
                            "the request to {} did not arrive in time",
                            self.method
                        )))));
                    }
                    self.timer = Some(timer);
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;
    use tokio::sync::mpsc;

    fn body_of(chunks: Vec<usize>) -> Body {
        let stream = tokio_stream::iter(
            chunks
                .into_iter()
                .map(|n| Ok::<_, Status>(Frame::data(Bytes::from(vec![0u8; n])))),
        );
        Body::new(http_body_util::StreamBody::new(stream))
    }

    fn limited(limits: &RequestLimits, path: &str, body: Body) -> LimitedBody {
        let charge = Arc::new(Charge {
            limits: limits.clone(),
            counted: AtomicUsize::new(0),
        });
        LimitedBody {
            inner: body,
            charge,
            method: path.into(),
            cap: limits.cap_of(path),
            seen: 0,
            deadline: tokio::time::Instant::now() + limits.shared.body_deadline,
            timer: None,
            done: false,
        }
    }

    #[tokio::test]
    async fn bodies_past_their_method_cap_or_the_budget_end_with_resource_exhausted() {
        let limits = RequestLimits::builder(1000, 200 << 10, Duration::from_secs(5))
            .cap("/big", 1 << 20)
            .build();
        // Within the default cap.
        let small = limited(&limits, "/small", body_of(vec![500, 400]));
        assert_eq!(small.collect().await.unwrap().to_bytes().len(), 900);
        // Past it.
        let err = limited(&limits, "/small", body_of(vec![500, 600]))
            .collect()
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        // A big method: 64 KiB free, then the budget (200 KiB) counts; held while alive.
        let mut first = limited(&limits, "/big", body_of(vec![64 << 10, 150 << 10]));
        while let Some(frame) = first.frame().await {
            frame.unwrap();
        }
        assert_eq!(limits.in_flight(), 150 << 10);
        let err = limited(&limits, "/big", body_of(vec![64 << 10, 100 << 10]))
            .collect()
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        // Small calls still pass while the budget is spent.
        assert!(limited(&limits, "/small", body_of(vec![900]))
            .collect()
            .await
            .is_ok());
        drop(first);
        assert_eq!(limits.in_flight(), 0, "every charge is given back");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_ends_at_its_deadline() {
        let limits = RequestLimits::builder(1000, 1000, Duration::from_secs(5)).build();
        let (_sender, receiver) = mpsc::channel::<Result<Frame<Bytes>, Status>>(1);
        let stalled = Body::new(http_body_util::StreamBody::new(
            tokio_stream::wrappers::ReceiverStream::new(receiver),
        ));
        let err = limited(&limits, "/m", stalled).collect().await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::DeadlineExceeded);
    }
}
