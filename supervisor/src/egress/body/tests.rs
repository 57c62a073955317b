use std::io::Write as _;
use std::time::Duration;

use super::*;
use crate::egress::budget::InspectBudget;

fn parts(request: http::Request<()>) -> http::request::Parts {
    request.into_parts().0
}

fn post(headers: &[(&str, &str)]) -> http::request::Parts {
    let mut request = http::Request::post("/echo").header("host", "api.example.test");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    parts(request.body(()).unwrap())
}

fn inspect(parts: &http::request::Parts, body: &[u8], limit: usize) -> Inspected {
    let budget = InspectBudget::new(64 << 20);
    let mut held = budget.reservation();
    let granted = Host::parse("api.example.test").unwrap();
    request_text(
        "POST",
        parts,
        &Bytes::copy_from_slice(body),
        &granted,
        limit,
        &mut held,
    )
    .unwrap()
}

#[test]
fn a_zip_bomb_is_cut_at_the_limit_and_said_unreadable() {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&vec![b'a'; 8 << 20]).unwrap();
    let bomb = gz.finish().unwrap();
    assert!(bomb.len() < 64 << 10);
    let budget = InspectBudget::new(4 << 20);
    let mut held = budget.reservation();
    let granted = Host::parse("api.example.test").unwrap();
    let inspected = request_text(
        "POST",
        &post(&[("content-encoding", "gzip")]),
        &Bytes::from(bomb),
        &granted,
        1 << 20,
        &mut held,
    )
    .unwrap();
    let why = inspected.unreadable.expect("cut");
    assert!(why.contains("decompresses to more than"), "{why}");
    assert!(budget.held() <= 4 << 20);
    drop(held);
    assert_eq!(budget.held(), 0);
}

#[test]
fn what_the_classifier_cannot_read_is_said_so() {
    let unknown = inspect(
        &post(&[("content-encoding", "zstd")]),
        b"\x28\xb5\x2f\xfd",
        1 << 20,
    );
    assert!(unknown.unreadable.unwrap().contains("\"zstd\""));
    let binary = inspect(
        &post(&[]),
        &[0x89, b'P', b'N', b'G', 0xff, 0xfe, 0xfd],
        1 << 20,
    );
    assert!(binary.unreadable.unwrap().contains("binary"));
    let text = inspect(
        &post(&[("content-type", "application/json")]),
        b"{\"a\": 1}",
        1 << 20,
    );
    assert!(text.unreadable.is_none());
}

#[test]
fn base64_runs_and_forms_are_decoded() {
    let form = inspect(
        &post(&[("content-type", "application/x-www-form-urlencoded")]),
        b"q=hello+world%21",
        1 << 20,
    );
    assert!(form.text.contains("hello world!"), "{}", form.text);
    // base64 of base64 of the words.
    let twice = base64::engine::general_purpose::STANDARD
        .encode(base64::engine::general_purpose::STANDARD.encode("a secret sentence here"));
    let nested = inspect(&post(&[]), twice.as_bytes(), 1 << 20);
    assert!(
        nested.text.contains("a secret sentence here"),
        "{}",
        nested.text
    );
}

type Frame = Result<hyper::body::Frame<Bytes>, std::convert::Infallible>;
type Stalled = http_body_util::StreamBody<tokio_stream::wrappers::ReceiverStream<Frame>>;

/// A body fed by hand: it stalls while nothing is sent and its sender lives.
fn stalled_body() -> (tokio::sync::mpsc::Sender<Frame>, Stalled) {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    (
        tx,
        http_body_util::StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx)),
    )
}

#[tokio::test]
async fn a_body_reserves_what_it_holds_and_returns_it_when_cancelled() {
    let budget = InspectBudget::new(1000);
    // A body one byte short of what it promised: it stalls after its first 600 bytes.
    let (tx, stalled) = stalled_body();
    tx.send(Ok(hyper::body::Frame::data(Bytes::from(vec![b'x'; 600]))))
        .await
        .unwrap();
    let mut first_held = budget.reservation();
    let mut first = Box::pin(read_body(
        stalled,
        1 << 20,
        &mut first_held,
        Duration::from_secs(30),
    ));
    assert!(tokio::time::timeout(Duration::from_millis(50), &mut first)
        .await
        .is_err());
    assert_eq!(budget.held(), 600);
    // Another request cannot reserve past the budget: refused at once, naming the limit.
    let mut second_held = budget.reservation();
    let refused = read_body(
        http_body_util::Full::new(Bytes::from(vec![b'y'; 500])),
        1 << 20,
        &mut second_held,
        Duration::from_secs(30),
    )
    .await
    .unwrap_err();
    assert!(
        refused.to_string().contains("--egress-inspect-budget"),
        "{refused}"
    );
    drop(second_held);
    // Cancelled (the connection's task aborted at the run's end): everything is returned.
    drop(first);
    drop(first_held);
    drop(tx);
    assert_eq!(budget.held(), 0);
}

#[tokio::test]
async fn a_body_that_stalls_is_cut_at_its_deadline() {
    let budget = InspectBudget::new(1000);
    let (_tx, stalled) = stalled_body();
    let mut held = budget.reservation();
    let cut = read_body(stalled, 1 << 20, &mut held, Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(matches!(cut, BodyError::Deadline(_)), "{cut}");
}
