//! `RecordRefusedCall`: a request the sandbox's model endpoint refused before it became a
//! call (not JSON, an unknown path, too big, a shape it cannot carry) is a refused model
//! call in the audit log and in `tollgate calls`, so an operator sees why an agent failed.
//!
//! Everything in the request is the sandbox's, so it is bounded (see `input.rs`), reduced to
//! one printable line and classified: a field the classifier rates above low is recorded as
//! withheld. At most [`MAX_RECORDED_PER_SECOND`] are recorded one by one each second; the
//! rest are counted into one summary entry (written when the next second's first refusal
//! comes, or at teardown), so a looping agent cannot fill the log.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tollgate_audit::{Decision, EntryDraft, EntryKind};
use tollgate_proto::v1 as pb;
use tollgate_router::{Classifier, Sensitivity};

use super::super::gate::{new_call_id, CallGate};
use crate::COMPONENT;

/// Most refusals recorded one by one in a [`WINDOW`]; the rest are counted.
pub const MAX_RECORDED_PER_SECOND: u32 = 64;
const WINDOW: Duration = Duration::from_secs(1);
/// The APIs a refused request may name; anything else is recorded as `unknown`.
const APIS: [&str; 4] = [
    "openai-chat",
    "openai-responses",
    "anthropic-messages",
    "unknown",
];

/// The refusals of one run's model endpoint: this second's count and those only counted.
#[derive(Debug, Default)]
pub struct RefusedRequests {
    window: Mutex<Option<Window>>,
}

#[derive(Debug)]
struct Window {
    opened: Instant,
    recorded: u32,
    counted: u64,
    last_reason: String,
}

/// One field of the request as recorded: a single printable line, `<withheld>` when the
/// classifier finds anything above low in it.
fn shown(classifier: Option<&Classifier>, text: &str) -> String {
    let line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let line = line.trim();
    match classifier {
        Some(classifier) if classifier.classify(line).sensitivity > Sensitivity::Low => {
            "<withheld: the classifier rated it above low>".into()
        }
        Some(_) => line.to_owned(),
        // No routes, no classifier: only what cannot carry much is recorded.
        None if line.len() <= 128 && !line.contains(' ') => line.to_owned(),
        None => "<withheld: no classifier on this supervisor>".into(),
    }
}

/// `METHOD /path`, the query string left out (it could carry anything).
fn request_line(classifier: Option<&Classifier>, request: &str) -> String {
    let (method, path) = request.split_once(' ').unwrap_or(("", request));
    let method = if !method.is_empty()
        && method.len() <= 10
        && method.bytes().all(|b| b.is_ascii_uppercase())
    {
        method
    } else {
        "?"
    };
    let path = path.split(['?', '#']).next().unwrap_or_default();
    format!("{method} {}", shown(classifier, path))
}

impl RefusedRequests {
    /// Records (or counts) one refused request; the call id of its entry, empty when it was
    /// only counted.
    pub(crate) fn record(
        &self,
        gate: &CallGate,
        classifier: Option<&Classifier>,
        request: &pb::RecordRefusedCallRequest,
    ) -> String {
        let call_id = new_call_id();
        let reason = shown(classifier, &request.reason);
        let reason = if reason.is_empty() {
            "refused by the sandbox's model endpoint".to_owned()
        } else {
            reason
        };
        // A spent run's refusals are summarised with its other refusals.
        if gate
            .summarised("model.endpoint", &call_id, &reason)
            .unwrap_or(false)
        {
            return String::new();
        }
        crate::metrics::get().call("model.endpoint", "deny");
        let closed = {
            let mut window = self.window.lock().unwrap_or_else(|p| p.into_inner());
            let open = window.as_ref().is_some_and(|w| w.opened.elapsed() < WINDOW);
            let closed = if open { None } else { window.take() };
            let current = window.get_or_insert_with(|| Window {
                opened: Instant::now(),
                recorded: 0,
                counted: 0,
                last_reason: String::new(),
            });
            // Only an open window can be full (a new one has recorded nothing yet).
            if current.recorded >= MAX_RECORDED_PER_SECOND {
                current.counted += 1;
                current.last_reason = reason;
                return String::new();
            }
            current.recorded += 1;
            closed
        };
        if let Some(closed) = closed {
            Self::write_summary(gate, closed);
        }
        let api = if APIS.contains(&request.api.as_str()) {
            request.api.as_str()
        } else {
            "unknown"
        };
        let model = shown(classifier, &request.model);
        let entry = EntryDraft::new(COMPONENT, EntryKind::RouteDecision)
            .receipt(gate.run_id.as_str())
            .run(gate.run_id.as_str())
            .call(call_id.as_str())
            .decision(Decision::Deny)
            .reason(reason.as_str())
            .meta("refused_by", "endpoint")
            .meta("requested", model.as_str())
            .meta("model", model.as_str())
            .meta("api", api)
            .meta("request", request_line(classifier, &request.request))
            .meta("status", i64::from(request.status));
        match gate.audited(entry, false) {
            Ok(()) => call_id,
            Err(status) => {
                tracing::error!(run_id = %gate.run_id, error = %status.message(), "could not audit a refused model request");
                String::new()
            }
        }
    }

    /// Writes the summary of the requests only counted (at teardown).
    pub fn flush(&self, gate: &CallGate) {
        let open = self.window.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(open) = open {
            Self::write_summary(gate, open);
        }
    }

    fn write_summary(gate: &CallGate, window: Window) {
        if window.counted == 0 {
            return;
        }
        let entry = EntryDraft::new(COMPONENT, EntryKind::RouteDecision)
            .receipt(gate.run_id.as_str())
            .run(gate.run_id.as_str())
            .call(new_call_id().as_str())
            .decision(Decision::Deny)
            .reason(format!(
                "{} more requests refused by the sandbox's model endpoint within {} ms, counted but not recorded one by one (the last: {})",
                window.counted,
                window.opened.elapsed().as_millis(),
                window.last_reason
            ))
            .meta("refused_by", "endpoint")
            .meta("requested", "(refused requests)")
            .meta(
                "refused_requests",
                i64::try_from(window.counted).unwrap_or(i64::MAX),
            );
        if let Err(status) = gate.audited(entry, false) {
            tracing::error!(run_id = %gate.run_id, error = %status.message(), "could not audit refused model requests");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_one_line_and_secrets_are_withheld() {
        let classifier = Classifier::new(&Default::default()).unwrap();
        assert_eq!(
            shown(Some(&classifier), "tools are\nnot supported"),
            "tools are not supported"
        );
        let key = format!("{}{}", "AKIA", "Q7LM2XV3RT4KP6WS");
        assert!(shown(Some(&classifier), &format!("model {key}")).starts_with("<withheld"));
        assert_eq!(
            request_line(Some(&classifier), "POST /v1/embeddings?key=abc"),
            "POST /v1/embeddings"
        );
        assert_eq!(request_line(None, "post /x"), "? /x");
        assert!(shown(None, "a long sentence with words").starts_with("<withheld"));
    }
}
