//! The gateway's `Complete`: one model call, checked, routed, charged and audited.
//!
//! In order: the run is alive and its receipt neither expired nor revoked (as for tools),
//! the messages are well formed, this supervisor has routes, the router picks the route (the
//! named one, or for `auto` the most capable granted route that may carry the text; see
//! `tollgate_router::decide`), the tool-call budget counts the call, the token budget holds
//! the prompt and the completion cap (lowered to what is left). The `route_decision` entry
//! is on disk **before** any byte leaves the host; text sent to a backend cannot be
//! recalled. The backend call then runs on its own task, so a client that goes away never
//! skips the settling of the budget or the second entry (counts, finish, status). Entries
//! carry the route, sensitivities, findings (detector, message, byte span) and counts, never
//! the text.

mod outbound;
mod refused;
mod signatures;

pub use outbound::MAX_TOOL_NAME;
pub use refused::{RefusedRequests, MAX_RECORDED_PER_SECOND};
pub use signatures::{Signatures, MAX_SIGNATURES};

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tollgate_audit::{Decision, EntryDraft, EntryKind, MetaValue};
use tollgate_proto::v1 as pb;
use tollgate_router::config::{Route, RouteKind};
use tollgate_router::decide::{decide, Choice, NoRoute, Requested};
use tollgate_router::tokens::{
    estimate_call, estimate_completion, Ledger, TokenCount, TokenSource,
};
use tollgate_router::wire::{ChatRequest, Role, StreamItem};
use tollgate_router::Sensitivity;
use tollgate_router_backends::{has_tokenizer, BackendError, Backends, ModelRoutes, CALL_TIMEOUT};
use tonic::Status;

use super::approval::Asked;
use super::gate::{new_call_id, CallGate, Refusal};
use crate::records::RouteUsage;
use crate::COMPONENT;

/// How long a client may leave the stream unread before the call is dropped.
const CLIENT_IDLE: std::time::Duration = std::time::Duration::from_secs(120);

/// Most model calls of one run in flight at once.
pub const MAX_IN_FLIGHT: usize = 4;
/// Most bytes of message text in one call.
pub const MAX_TEXT: usize = 4 << 20;

/// One run's model calls: its budget and what is in flight.
#[derive(Debug)]
pub struct RunModels {
    /// The supervisor's routes.
    pub shared: Arc<ModelRoutes>,
    /// The run's token budget (`limits.tokens`).
    pub ledger: Mutex<Ledger>,
    /// Calls in flight.
    pub in_flight: AtomicUsize,
    /// What went out on each route, by route name.
    usage: Mutex<BTreeMap<String, RouteUsage>>,
    /// The reasoning signatures this run's backends issued: only those go back.
    pub signatures: Mutex<Signatures>,
}

impl RunModels {
    /// The models of a run whose receipt allows `tokens`.
    pub fn new(shared: Arc<ModelRoutes>, tokens: u64) -> Self {
        Self {
            shared,
            ledger: Mutex::new(Ledger::new(tokens)),
            in_flight: AtomicUsize::new(0),
            usage: Mutex::new(BTreeMap::new()),
            signatures: Mutex::default(),
        }
    }

    /// Counts one call that went out on `route` and what it was charged.
    fn record_use(&self, route: &str, prompt_tokens: u64, completion_tokens: u64) {
        let mut usage = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        let entry = usage.entry(route.to_owned()).or_insert_with(|| RouteUsage {
            route: route.to_owned(),
            ..Default::default()
        });
        entry.calls += 1;
        entry.prompt_tokens = entry.prompt_tokens.saturating_add(prompt_tokens);
        entry.completion_tokens = entry.completion_tokens.saturating_add(completion_tokens);
        crate::metrics::get().tokens(route, prompt_tokens, completion_tokens);
    }

    /// Tokens the run's settled calls have used.
    pub fn tokens_used(&self) -> u64 {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner()).used()
    }

    /// The run's token budget now.
    pub fn token_limit(&self) -> u64 {
        self.ledger
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .limit()
    }

    /// Lowers the run's token budget to `limit` (a narrowing; never raises it).
    pub fn lower_tokens(&self, limit: u64) {
        self.ledger
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .lower_to(limit);
    }

    /// Raises the run's token budget to `limit` (a signed amendment; never lowers it).
    pub fn raise_tokens(&self, limit: u64) {
        self.ledger
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .raise_to(limit);
    }

    /// Sets the run's token budget to `limit` (what a re-adopted run's amendments made of it).
    pub fn set_tokens(&self, limit: u64) {
        self.ledger
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .set_limit(limit);
    }

    /// Counts `used` tokens as spent before this supervisor re-adopted the run.
    pub fn charge_restored(&self, used: u64) {
        self.ledger
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .restore_used(used);
    }

    /// What the run has spent so far, per route (by name).
    pub fn usage(&self) -> Vec<RouteUsage> {
        self.usage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }
}

fn proto_sensitivity(s: Sensitivity) -> i32 {
    match s {
        Sensitivity::Low => pb::Sensitivity::Low as i32,
        Sensitivity::Medium => pb::Sensitivity::Medium as i32,
        Sensitivity::High => pb::Sensitivity::High as i32,
    }
}

fn proto_count(count: TokenCount) -> pb::TokenCount {
    pb::TokenCount {
        tokens: count.tokens,
        source: match count.source {
            TokenSource::Server => pb::TokenSource::Server,
            TokenSource::Tokenizer => pb::TokenSource::Tokenizer,
            TokenSource::Estimate => pb::TokenSource::Estimate,
        } as i32,
    }
}

fn source_name(count: TokenCount) -> &'static str {
    match count.source {
        TokenSource::Server => "server",
        TokenSource::Tokenizer => "tokenizer",
        TokenSource::Estimate => "estimate",
    }
}

/// The route a call asked for, as recorded: a route name, or `<invalid>` (the field is the
/// agent's and could hold anything).
fn requested_name(route: &str) -> &str {
    if route.is_empty() || route == "auto" || tollgate_router::config::valid_name(route) {
        route
    } else {
        "<invalid>"
    }
}

/// Most stop sequences a call may carry.
pub const MAX_STOPS: usize = 4;
/// Longest stop sequence.
pub const MAX_STOP_LEN: usize = 64;

/// A refusal: the status for the agent, the reason and metadata for the entry.
struct Refused {
    status: Status,
    reason: String,
    meta: Vec<(&'static str, MetaValue)>,
}

impl Refused {
    fn new(status: fn(String) -> Status, reason: String) -> Self {
        Self {
            status: status(reason.clone()),
            reason,
            meta: Vec::new(),
        }
    }
}

impl From<Refusal> for Refused {
    fn from(refusal: Refusal) -> Self {
        Self {
            status: refusal.status,
            reason: refusal.reason,
            meta: Vec::new(),
        }
    }
}

/// The model calls of one run (`Gateway.Complete`).
#[derive(Debug, Clone)]
pub struct ModelCalls {
    /// The run's call gate.
    pub gate: Arc<CallGate>,
    /// The run's models (its token budget); `None`: the supervisor has no routes.
    pub models: Option<Arc<RunModels>>,
    /// Where a call on a route that asks waits for an operator.
    pub approvals: super::approval::RunApprovals,
    /// The requests the sandbox's model endpoint refused (`RecordRefusedCall`).
    pub refused: Arc<RefusedRequests>,
}

/// Releases an in-flight slot when dropped.
struct Slot(Arc<RunModels>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The stream `Complete` answers with.
pub type CompleteStream = ReceiverStream<Result<pb::CompleteEvent, Status>>;

impl ModelCalls {
    /// Serves one `RecordRefusedCall`: the refusal recorded (or counted); its call id, empty
    /// when it was only counted.
    pub(crate) fn record_refused(&self, request: &pb::RecordRefusedCallRequest) -> String {
        let classifier = self.models.as_ref().map(|m| &m.shared.classifier);
        self.refused.record(&self.gate, classifier, request)
    }

    /// Writes the summary of refused requests only counted (at teardown).
    pub fn flush_refused(&self) {
        self.refused.flush(&self.gate);
    }

    /// Serves one `Complete` call.
    pub(crate) async fn complete(
        &self,
        request: pb::CompleteRequest,
    ) -> Result<CompleteStream, Status> {
        let started = Instant::now();
        let call_id = new_call_id();
        let audit =
            |decision: Decision, reason: Option<&str>, meta: &[(&'static str, MetaValue)]| {
                let mut entry = EntryDraft::new(COMPONENT, EntryKind::RouteDecision)
                    .receipt(self.gate.run_id.as_str())
                    .run(self.gate.run_id.as_str())
                    .call(call_id.as_str())
                    .decision(decision)
                    .meta("requested", requested_name(&request.route))
                    .meta("messages", request.messages.len() as i64);
                for (key, value) in meta {
                    entry = entry.meta(*key, value.clone());
                }
                if let Some(reason) = reason {
                    entry = entry.reason(reason);
                }
                entry
            };
        let prepared = self.prepare(&request, &call_id).await;
        let (plan, slot) = match prepared {
            Ok(prepared) => prepared,
            Err(refused) => {
                // A spent run's refusals are summarised like its tool calls'.
                let summarised = self
                    .gate
                    .summarised("model.complete", &call_id, &refused.reason)
                    .unwrap_or(false);
                if !summarised {
                    let entry = audit(Decision::Deny, Some(&refused.reason), &refused.meta);
                    if let Err(e) = self.gate.audited(entry, false) {
                        tracing::error!(run_id = %self.gate.run_id, error = %e.message(), "could not audit a model call");
                    }
                }
                crate::metrics::get().call("model.complete", "deny");
                let mut status = refused.status;
                for (key, value) in [
                    ("tollgate-call-id", Some(call_id.clone())),
                    (
                        "tollgate-sensitivity",
                        meta_str(&refused.meta, "sensitivity"),
                    ),
                    ("tollgate-reasons", meta_list(&refused.meta, "reasons")),
                ] {
                    if let Some(value) = value.and_then(|v| v.parse().ok()) {
                        status.metadata_mut().insert(key, value);
                    }
                }
                return Err(status);
            }
        };
        // On disk before any byte leaves the host.
        let entry = audit(Decision::Allow, None, &plan.meta);
        if let Err(status) = self.gate.audited(entry, true) {
            if let Ok(mut ledger) = slot.0.ledger.lock() {
                ledger.release(plan.reservation);
            }
            return Err(status);
        }
        *self
            .gate
            .last_call
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(call_id.clone());
        crate::metrics::get().call("model.complete", "allow");
        let (out, stream) = mpsc::channel(64);
        let run = self.clone();
        tokio::spawn(async move { run.run_call(call_id, plan, slot, out, started).await });
        Ok(ReceiverStream::new(stream))
    }

    /// Every check before a call is sent; the plan to send it.
    async fn prepare(
        &self,
        request: &pb::CompleteRequest,
        call_id: &str,
    ) -> Result<(CallPlan, Slot), Refused> {
        let made = self.gate.admit("model.complete").map_err(Refused::from)?;
        let Some(models) = self.models.clone() else {
            return Err(Refused::new(
                Status::unavailable,
                "this supervisor has no model routes (it was started without --routes)".into(),
            ));
        };
        let messages = well_formed(request)?;
        let shared = &models.shared;
        // The stop sequences leave with the messages: they are judged (and redacted) too,
        // after the messages.
        let texts: Vec<&str> = messages
            .iter()
            .map(|m| m.content.as_str())
            .chain(request.stop.iter().map(String::as_str))
            .collect();
        let force_local = shared.routes.policy.force_local || request.local_only;
        let choice = decide(
            &self.gate.receipt,
            &shared.routes,
            &shared.classifier,
            &Requested::resolve(&request.route, &shared.routes, &self.gate.receipt),
            force_local,
            &texts,
        )
        .map_err(|no_route| no_route_refusal(&no_route, force_local))?;
        // A route that asks: an operator sees the classifier's judgement of what would leave
        // (never the text) and decides before anything is sent.
        let asks = self
            .gate
            .receipt
            .routes
            .iter()
            .any(|grant| grant.name == choice.route.name && grant.ask);
        let mut approved_by = None;
        if asks {
            let asked = Asked {
                bytes: texts.iter().map(|t| t.len() as u64).sum(),
                sensitivity: choice.sent_sensitivity().name().to_owned(),
                reasons: choice
                    .assessment
                    .findings
                    .iter()
                    .map(|f| f.compact())
                    .collect(),
                ..Asked::new("model.complete", choice.route.name.clone())
            };
            approved_by = Some(
                self.approvals
                    .approved_by(asked, call_id)
                    .await
                    .map_err(Refused::from)?,
            );
        }
        self.gate.charge(made).map_err(Refused::from)?;
        let in_flight = models.in_flight.fetch_add(1, Ordering::SeqCst);
        let slot = Slot(models.clone());
        if in_flight >= MAX_IN_FLIGHT {
            return Err(Refused::new(
                Status::resource_exhausted,
                format!("{MAX_IN_FLIGHT} model calls are already in flight for this run"),
            ));
        }
        let mut sent: Vec<String> = match &choice.redacted {
            Some(redacted) => redacted.messages.clone(),
            None => texts.iter().map(|t| (*t).to_owned()).collect(),
        };
        let sent_stops = sent.split_off(messages.len());
        let sent_messages: Vec<pb::ChatMessage> = messages
            .iter()
            .zip(sent)
            .map(|(m, content)| pb::ChatMessage {
                role: m.role.clone(),
                content,
                parts: Vec::new(),
            })
            .collect();
        let route = choice.route;
        let mut chat = ChatRequest {
            model: route.model.clone(),
            call: pb::CompleteRequest {
                messages: sent_messages,
                stream: request.stream,
                temperature: request.temperature,
                stop: sent_stops,
                ..Default::default()
            },
        };
        let prompt = self.prompt_tokens(shared, route, &chat).await;
        let policy = &shared.routes.policy;
        let asked = if request.max_tokens == 0 {
            policy.max_tokens_default
        } else {
            request.max_tokens.min(policy.max_tokens_limit)
        };
        let reservation = models
            .ledger
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .reserve(prompt.tokens, asked)
            .map_err(|spent| {
                Refused::new(
                    Status::resource_exhausted,
                    format!("receipt {}: {spent}", self.gate.run_id),
                )
            })?;
        let mut meta = decision_meta(&choice, force_local, reservation.max_tokens);
        if let Some(by) = approved_by {
            meta.push(("approved_by", by.into()));
        }
        chat.call.max_tokens = reservation.max_tokens;
        let started = pb::CompleteStarted {
            call_id: String::new(),
            route: route.name.clone(),
            model: route.model.clone(),
            sensitivity: proto_sensitivity(choice.assessment.sensitivity),
            sent_sensitivity: proto_sensitivity(choice.sent_sensitivity()),
            redacted_spans: choice.redacted.as_ref().map_or(0, |r| r.spans as u32),
            max_tokens: reservation.max_tokens,
        };
        let route_name = route.name.clone();
        Ok((
            CallPlan {
                route: route_name,
                chat,
                prompt,
                reservation,
                started,
                meta,
            },
            slot,
        ))
    }

    /// Sends the call, streams what comes back, settles the budget, records the outcome.
    async fn run_call(
        self,
        call_id: String,
        plan: CallPlan,
        slot: Slot,
        out: mpsc::Sender<Result<pb::CompleteEvent, Status>>,
        started: Instant,
    ) {
        let models = slot.0.clone();
        let shared = models.shared.clone();
        let event = |e: pb::complete_event::Event| pb::CompleteEvent { event: Some(e) };
        let mut announce = plan.started.clone();
        announce.call_id.clone_from(&call_id);
        let _ = out
            .send(Ok(event(pb::complete_event::Event::Started(announce))))
            .await;
        let Some(route) = shared.routes.get(&plan.route) else {
            return;
        };
        let streamed = relay_reply(&shared.backends, route, &plan.chat, &out).await;
        let (prompt, completion) = self.counts(&shared, route, &plan, &streamed).await;
        let Streamed { result, finish, .. } = streamed;
        let (used, left) = {
            let mut ledger = models.ledger.lock().unwrap_or_else(|p| p.into_inner());
            let used = ledger.settle(plan.reservation, prompt.tokens, completion.tokens);
            (used, ledger.remaining())
        };
        models.record_use(&plan.route, prompt.tokens, completion.tokens);
        let estimated =
            prompt.source == TokenSource::Estimate || completion.source == TokenSource::Estimate;
        let mut entry = EntryDraft::new(COMPONENT, EntryKind::RouteDecision)
            .receipt(self.gate.run_id.as_str())
            .run(self.gate.run_id.as_str())
            .call(call_id.as_str())
            .meta("phase", "done")
            .meta("route", plan.route.as_str())
            .meta("prompt_tokens", prompt.tokens as i64)
            .meta("prompt_source", source_name(prompt))
            .meta("completion_tokens", completion.tokens as i64)
            .meta("completion_source", source_name(completion))
            .meta("estimated", estimated)
            .meta("finish_reason", finish.as_str())
            .meta("tokens_used", used as i64)
            .meta(
                "duration_ms",
                i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX),
            );
        match &result {
            Ok(()) => {
                entry = entry.decision(Decision::Allow);
                let done = pb::CompleteDone {
                    finish_reason: finish,
                    prompt: Some(proto_count(prompt)),
                    completion: Some(proto_count(completion)),
                    estimated,
                    tokens_left: left,
                };
                let _ = out
                    .send(Ok(event(pb::complete_event::Event::Done(done))))
                    .await;
            }
            Err(e) => {
                // The call went out and failed there: allowed, with why it has no result.
                let reason = self.scrubbed(&plan.route, &shared.backends, &e.to_string());
                entry = entry
                    .decision(Decision::Allow)
                    .reason(reason.as_str())
                    .meta(
                        "backend_status",
                        e.status().map_or(MetaValue::Null, |s| i64::from(s).into()),
                    );
                let status = match e {
                    BackendError::Status { status: 429, .. } => Status::resource_exhausted(reason),
                    BackendError::Status { status, .. } if (400..500).contains(status) => {
                        Status::failed_precondition(reason)
                    }
                    _ => Status::unavailable(reason),
                };
                let _ = out.send(Err(status)).await;
            }
        }
        if let Err(e) = self.gate.audited(entry, false) {
            tracing::error!(run_id = %self.gate.run_id, error = %e.message(), "could not audit a model call's end");
        }
        drop(slot);
    }

    /// The prompt's tokens: the route's tokenizer when its server has one (the text is sent
    /// to it as it would be to the route: it is the same local server); an estimate
    /// otherwise, or when the tokenizer fails. A tokenizer never fails the call.
    async fn prompt_tokens(
        &self,
        shared: &ModelRoutes,
        route: &Route,
        chat: &ChatRequest,
    ) -> TokenCount {
        if !has_tokenizer(route) {
            return estimate_call(&chat.call);
        }
        match shared.backends.count_prompt(route, chat).await {
            Ok(tokens) => TokenCount {
                tokens,
                source: TokenSource::Tokenizer,
            },
            Err(e) => {
                tracing::warn!(run_id = %self.gate.run_id, error = %e, "estimating the prompt's tokens instead");
                estimate_call(&chat.call)
            }
        }
    }

    /// What the call is charged: the server's counts, else the tokenizer's, else estimates
    /// (see [`Self::completion_tokens`]).
    async fn counts(
        &self,
        shared: &ModelRoutes,
        route: &Route,
        plan: &CallPlan,
        streamed: &Streamed,
    ) -> (TokenCount, TokenCount) {
        let Streamed {
            result,
            text_len,
            text,
            prompt: server_prompt,
            completion: server_completion,
            ..
        } = streamed;
        let text_len = *text_len;
        let prompt = server_prompt.map_or(plan.prompt, |tokens| TokenCount {
            tokens,
            source: TokenSource::Server,
        });
        let completion = match *server_completion {
            Some(tokens) => TokenCount {
                tokens,
                source: TokenSource::Server,
            },
            None => {
                // The tokenizer counts only a whole text from a call that went through.
                let whole = result.is_ok() && text.len() == text_len;
                self.completion_tokens(shared, route, whole.then_some(text.as_str()))
                    .await
                    .unwrap_or_else(|| {
                        // Uncounted: charged the cap the backend was held to (never less
                        // than the text's length suggests), so estimates cannot add up
                        // past the budget.
                        let mut estimate = estimate_completion(text);
                        estimate.tokens = estimate
                            .tokens
                            .max((text_len as u64).div_ceil(4))
                            .max(u64::from(plan.chat.call.max_tokens));
                        estimate
                    })
            }
        };
        // A failed call that returned nothing is not charged (an agent's retry of an
        // unreachable backend must not drain its budget).
        if result.is_err() && text_len == 0 {
            (
                TokenCount {
                    tokens: 0,
                    ..prompt
                },
                TokenCount {
                    tokens: 0,
                    ..completion
                },
            )
        } else {
            (prompt, completion)
        }
    }

    /// The completion's tokens by the route's tokenizer, when it has one and the whole text
    /// came back; `None`: estimate instead.
    async fn completion_tokens(
        &self,
        shared: &ModelRoutes,
        route: &Route,
        text: Option<&str>,
    ) -> Option<TokenCount> {
        let text = text.filter(|_| has_tokenizer(route))?;
        match shared.backends.count_completion(route, text).await {
            Ok(tokens) => Some(TokenCount {
                tokens,
                source: TokenSource::Tokenizer,
            }),
            Err(e) => {
                tracing::warn!(run_id = %self.gate.run_id, error = %e, "estimating the completion's tokens instead");
                None
            }
        }
    }

    /// A backend's error, with the route's key removed should it appear.
    fn scrubbed(&self, route: &str, backends: &Backends, text: &str) -> String {
        match backends.key_of(route) {
            Some(key) if !key.is_empty() => text.replace(key, "[secret]"),
            _ => text.to_owned(),
        }
    }
}

/// The call's messages, checked: known roles, 1 or more, at most [`MAX_TEXT`] bytes of text,
/// and few short stop sequences.
fn well_formed(request: &pb::CompleteRequest) -> Result<Vec<pb::ChatMessage>, Refused> {
    let mut messages = Vec::with_capacity(request.messages.len());
    let mut size = 0;
    for (i, m) in request.messages.iter().enumerate() {
        Role::parse(&m.role)
            .filter(|r| *r != Role::Tool)
            .ok_or_else(|| {
                Refused::new(
                    Status::invalid_argument,
                    format!(
                        "message {i}: the role is not system, user or assistant ({} bytes given)",
                        m.role.len()
                    ),
                )
            })?;
        size += m.content.len();
        messages.push(pb::ChatMessage {
            role: m.role.clone(),
            content: m.content.clone(),
            parts: Vec::new(),
        });
    }
    if messages.is_empty() || size > MAX_TEXT {
        return Err(Refused::new(
            Status::invalid_argument,
            format!("a call needs 1 or more messages and at most {MAX_TEXT} bytes of text"),
        ));
    }
    if request.stop.len() > MAX_STOPS || request.stop.iter().any(|s| s.len() > MAX_STOP_LEN) {
        return Err(Refused::new(
            Status::invalid_argument,
            format!("at most {MAX_STOPS} stop sequences of at most {MAX_STOP_LEN} bytes"),
        ));
    }
    Ok(messages)
}

/// The refusal of a call no granted route may carry, with what the classifier found.
fn no_route_refusal(no_route: &NoRoute, force_local: bool) -> Refused {
    let reasons: Vec<String> = no_route
        .assessment
        .findings
        .iter()
        .map(|f| f.compact())
        .collect();
    Refused {
        status: Status::permission_denied(no_route.to_string()),
        reason: no_route.to_string(),
        meta: vec![
            ("sensitivity", no_route.assessment.sensitivity.name().into()),
            ("reasons", reasons.into()),
            ("force_local", force_local.into()),
        ],
    }
}

/// The `route_decision` entry's metadata for an allowed call: route, sensitivities,
/// findings (never the text), redactions and the completion cap.
fn decision_meta(
    choice: &Choice<'_>,
    force_local: bool,
    max_tokens: u32,
) -> Vec<(&'static str, MetaValue)> {
    let route = choice.route;
    let findings: Vec<String> = choice
        .assessment
        .findings
        .iter()
        .map(|f| f.compact())
        .collect();
    vec![
        ("route", route.name.as_str().into()),
        (
            "kind",
            match route.kind {
                RouteKind::Local => "local",
                RouteKind::Cloud => "cloud",
            }
            .into(),
        ),
        ("model", route.model.as_str().into()),
        ("sensitivity", choice.assessment.sensitivity.name().into()),
        ("sent_sensitivity", choice.sent_sensitivity().name().into()),
        ("reasons", findings.into()),
        (
            "redacted_spans",
            choice
                .redacted
                .as_ref()
                .map_or(0, |r| r.spans as i64)
                .into(),
        ),
        ("force_local", force_local.into()),
        ("max_tokens", i64::from(max_tokens).into()),
    ]
}

/// What came back from a backend, as it was relayed to the agent.
struct Streamed {
    /// How the call ended.
    result: Result<(), BackendError>,
    /// Bytes of completion text relayed.
    text_len: usize,
    /// The text (up to 1 MiB), kept only to estimate a completion the server did not count.
    text: String,
    finish: String,
    /// The server's own counts, when it gave them.
    prompt: Option<u64>,
    completion: Option<u64>,
}

/// Sends `chat` to `route` and relays its reply to `out` as it arrives. A client that stops
/// reading does not hold the call: after [`CLIENT_IDLE`] the backend's reply is dropped.
async fn relay_reply(
    backends: &Backends,
    route: &Route,
    chat: &ChatRequest,
    out: &mpsc::Sender<Result<pb::CompleteEvent, Status>>,
) -> Streamed {
    let event = |e: pb::complete_event::Event| pb::CompleteEvent { event: Some(e) };
    let (items_tx, mut items_rx) = mpsc::channel::<StreamItem>(64);
    let backend = async {
        let result = tokio::time::timeout(CALL_TIMEOUT, backends.call(route, chat, &items_tx))
            .await
            .unwrap_or_else(|_| {
                Err(BackendError::Reply {
                    route: route.name.clone(),
                    detail: format!(
                        "the call took longer than {} s and was given up",
                        CALL_TIMEOUT.as_secs()
                    ),
                })
            });
        drop(items_tx);
        result
    };
    let forward = async {
        let mut streamed = Streamed {
            result: Ok(()),
            text_len: 0,
            text: String::new(),
            finish: String::new(),
            prompt: None,
            completion: None,
        };
        while let Some(item) = items_rx.recv().await {
            match item {
                StreamItem::Delta(delta) => {
                    streamed.text_len += delta.text.len();
                    if streamed.text.len() < 1 << 20 {
                        streamed.text.push_str(&delta.text);
                    }
                    let sent = tokio::time::timeout(
                        CLIENT_IDLE,
                        out.send(Ok(event(pb::complete_event::Event::Delta(delta)))),
                    )
                    .await;
                    if !matches!(sent, Ok(Ok(()))) {
                        break;
                    }
                }
                StreamItem::Finish(reason) => streamed.finish = reason,
                StreamItem::Usage { prompt, completion } => {
                    streamed.prompt = prompt.or(streamed.prompt);
                    streamed.completion = completion.or(streamed.completion);
                }
                StreamItem::Done => {}
            }
        }
        streamed
    };
    let (result, mut streamed) = tokio::join!(backend, forward);
    streamed.result = result;
    streamed
}

/// A checked call, ready to send.
struct CallPlan {
    route: String,
    chat: ChatRequest,
    prompt: TokenCount,
    reservation: tollgate_router::tokens::Reservation,
    started: pb::CompleteStarted,
    meta: Vec<(&'static str, MetaValue)>,
}

fn meta_str(meta: &[(&'static str, MetaValue)], key: &str) -> Option<String> {
    meta.iter()
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| match v {
            MetaValue::Str(s) => Some(s.clone()),
            _ => None,
        })
}

fn meta_list(meta: &[(&'static str, MetaValue)], key: &str) -> Option<String> {
    meta.iter()
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| match v {
            MetaValue::List(items) => Some(
                items
                    .iter()
                    .filter_map(|i| match i {
                        tollgate_audit::MetaScalar::Str(s) => Some(s.as_str()),
                        _ => None,
                    })
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            _ => None,
        })
}
