//! The gateway's model calls: `Complete` (one model call, checked, routed, charged and
//! audited), `CountTokens`, `ListModels` and `RecordRefusedCall`.
//!
//! `Complete`, in order: the run is alive and its receipt neither expired nor revoked (as
//! for tools), the call is well formed (roles, tool names, JSON fields; see
//! [`outbound::normalise`]), this supervisor has routes, reasoning whose signature this run's
//! backend did not issue is dropped ([`signatures`]), the router picks the route on
//! everything that leaves (every text of the call classified together, an image rated high;
//! the named route, a route that claims the model name asked for, or for `auto` the most
//! capable granted route that may carry it; see `tollgate_router::decide`), the tool-call
//! budget counts the call, the token budget holds the prompt (estimated or counted over the
//! whole call) and the completion cap (lowered to what is left). The `route_decision` entry
//! is on disk **before** any byte leaves the host; text sent to a backend cannot be
//! recalled. The backend call then runs on its own task, so a client that goes away never
//! skips the settling of the budget or the second entry (counts, tool calls, finish, served
//! model, status). Entries carry the route, sensitivities, findings (detector, text number,
//! byte span) and counts, never the text, the tools' names or their arguments.

mod counts;
mod names;
mod outbound;
mod refused;
mod relay;
mod route;
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
use tollgate_router::decide::{NoRoute, Requested};
use tollgate_router::tokens::{estimate_call, Ledger, TokenCount, TokenSource};
use tollgate_router::wire::ChatRequest;
use tollgate_router::Sensitivity;
use tollgate_router_backends::{BackendError, Backends, ModelRoutes};
use tonic::Status;

use super::approval::Asked;
use super::gate::{new_call_id, CallGate, Refusal};
use crate::records::RouteUsage;
use crate::COMPONENT;

use route::{RouteRefusal, Routed};

/// Most model calls of one run in flight at once.
pub const MAX_IN_FLIGHT: usize = 4;
/// Most bytes of text in one call: messages, parts, tools, arguments, results together.
pub const MAX_TEXT: usize = 4 << 20;
/// Most stop sequences a call may carry.
pub const MAX_STOPS: usize = 4;
/// Longest stop sequence.
pub const MAX_STOP_LEN: usize = 64;

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

/// The name a call asked for, as recorded: a route or model name of the usual shape (at
/// most 128 bytes of letters, digits and `._:/@+-`), else `<invalid>`: the field is the
/// agent's and could hold anything.
fn requested_name(name: &str) -> &str {
    let shaped = name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:/@+-".contains(&b));
    if shaped {
        name
    } else {
        "<invalid>"
    }
}

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

impl From<RouteRefusal> for Refused {
    fn from(refusal: RouteRefusal) -> Self {
        match refusal {
            RouteRefusal::NoRoute(no_route) => no_route_refusal(&no_route),
            RouteRefusal::Unredactable => Refused::new(
                Status::permission_denied,
                "a tool argument or schema the route must redact could not be redacted and kept valid JSON; send it on a route that may carry it".into(),
            ),
        }
    }
}

/// The model calls of one run (`Gateway.Complete`, `CountTokens`, `ListModels`,
/// `RecordRefusedCall`).
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

/// A call checked and routed, not yet charged.
struct Checked<'a> {
    models: Arc<RunModels>,
    routed: Routed<'a>,
    force_local: bool,
    /// Thinking parts dropped for a signature this run's backend did not issue.
    dropped_thinking: usize,
}

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

    /// Serves `ListModels`: "auto", each granted route this supervisor serves, its model and
    /// the names it claims (none when it has no routes).
    pub(crate) fn list_models(&self) -> pb::ListModelsResponse {
        match &self.models {
            Some(models) => names::list(&self.gate.receipt, &models.shared.routes),
            None => pb::ListModelsResponse::default(),
        }
    }

    /// An entry of this call's `route_decision`.
    fn entry(
        &self,
        call_id: &str,
        request: &pb::CompleteRequest,
        decision: Decision,
        reason: Option<&str>,
        meta: &[(&'static str, MetaValue)],
    ) -> EntryDraft {
        let mut entry = EntryDraft::new(COMPONENT, EntryKind::RouteDecision)
            .receipt(self.gate.run_id.as_str())
            .run(self.gate.run_id.as_str())
            .call(call_id)
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
    }

    /// Records a refused call (summarised once the run is spent) and the status for the
    /// agent, with the call id, the sensitivity and the findings in its metadata.
    fn refuse(
        &self,
        tool: &str,
        call_id: &str,
        request: &pb::CompleteRequest,
        mut refused: Refused,
    ) -> Status {
        let summarised = self
            .gate
            .summarised(tool, call_id, &refused.reason)
            .unwrap_or(false);
        if !summarised {
            if tool == "model.count_tokens" {
                refused.meta.push(("count_only", true.into()));
            }
            let entry = self.entry(
                call_id,
                request,
                Decision::Deny,
                Some(&refused.reason),
                &refused.meta,
            );
            if let Err(e) = self.gate.audited(entry, false) {
                tracing::error!(run_id = %self.gate.run_id, error = %e.message(), "could not audit a model call");
            }
        }
        crate::metrics::get().call(tool, "deny");
        let mut status = refused.status;
        for (key, value) in [
            ("tollgate-call-id", Some(call_id.to_owned())),
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
        status
    }

    /// Serves one `Complete` call.
    pub(crate) async fn complete(
        &self,
        request: pb::CompleteRequest,
    ) -> Result<CompleteStream, Status> {
        let started = Instant::now();
        let call_id = new_call_id();
        let (plan, slot) = match self.prepare(&request, &call_id).await {
            Ok(prepared) => prepared,
            Err(refused) => return Err(self.refuse("model.complete", &call_id, &request, refused)),
        };
        // On disk before any byte leaves the host.
        let entry = self.entry(&call_id, &request, Decision::Allow, None, &plan.meta);
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

    /// Serves one `CountTokens`: checked, classified and routed as `Complete` would be
    /// (refused alike), audited as a model call with `count_only`, charged nothing (neither
    /// tokens nor a tool call). The count is the chosen route's tokenizer's where it has one
    /// (a local server), else the estimate over the whole call; nothing goes to a route that
    /// asks an operator first.
    pub(crate) async fn count_tokens(
        &self,
        request: pb::CompleteRequest,
    ) -> Result<pb::CountTokensResponse, Status> {
        let call_id = new_call_id();
        let checked = self
            .gate
            .check_audit_quota()
            .and_then(|()| self.gate.check_alive())
            .map_err(Refused::from);
        let checked = match checked {
            Ok(()) => self.check(&request),
            Err(refused) => Err(refused),
        };
        let checked = match checked {
            Ok(checked) => checked,
            Err(refused) => {
                return Err(self.refuse("model.count_tokens", &call_id, &request, refused))
            }
        };
        let Routed { choice, sent, .. } = checked.routed;
        let route = choice.route;
        let asks = self
            .gate
            .receipt
            .routes
            .iter()
            .any(|grant| grant.name == route.name && grant.ask);
        let chat = ChatRequest {
            model: route.model.clone(),
            call: sent,
        };
        let prompt = if asks {
            estimate_call(&chat.call)
        } else {
            self.prompt_tokens(&checked.models.shared, route, &chat)
                .await
        };
        let mut meta = route::decision_meta(&choice, checked.force_local, 0, &chat.call);
        meta.push(("count_only", true.into()));
        meta.push((
            "prompt_tokens",
            i64::try_from(prompt.tokens).unwrap_or(i64::MAX).into(),
        ));
        meta.push(("prompt_source", source_name(prompt).into()));
        let entry = self.entry(&call_id, &request, Decision::Allow, None, &meta);
        self.gate.audited(entry, false)?;
        crate::metrics::get().call("model.count_tokens", "allow");
        Ok(pb::CountTokensResponse {
            prompt: Some(proto_count(prompt)),
            route: route.name.clone(),
            model: route.model.clone(),
        })
    }

    /// The checks every model call passes before anything is charged: routes exist, the
    /// call is well formed, unissued reasoning dropped, a route chosen for what leaves.
    fn check<'a>(&'a self, request: &pb::CompleteRequest) -> Result<Checked<'a>, Refused> {
        let Some(run_models) = self.models.as_ref() else {
            return Err(Refused::new(
                Status::unavailable,
                "this supervisor has no model routes (it was started without --routes)".into(),
            ));
        };
        let models = run_models.clone();
        let shared: &'a ModelRoutes = &run_models.shared;
        let mut call = request.clone();
        outbound::normalise(&mut call).map_err(|e| Refused::new(Status::invalid_argument, e))?;
        let force_local = shared.routes.policy.force_local || request.local_only;
        let requested = Requested::resolve(&request.route, &shared.routes, &self.gate.receipt);
        let mut routed = route::route(
            &self.gate.receipt,
            &shared.routes,
            &shared.classifier,
            &requested,
            force_local,
            call,
        )
        .map_err(|refusal| {
            let mut refused = Refused::from(refusal);
            refused.meta.push(("force_local", force_local.into()));
            refused
        })?;
        // Reasoning goes back only to the route whose backend issued it, so this is decided
        // once the route is chosen.
        let dropped_thinking = {
            let issued = models.signatures.lock().unwrap_or_else(|p| p.into_inner());
            outbound::drop_unissued_thinking(&mut routed.sent, &issued, &routed.choice.route.name)
        };
        if routed.sent.messages.is_empty() {
            return Err(Refused::new(
                Status::invalid_argument,
                "a call needs 1 or more messages besides reasoning the chosen route's backend did not issue".into(),
            ));
        }
        Ok(Checked {
            models,
            routed,
            force_local,
            dropped_thinking,
        })
    }

    /// Every check before a call is sent; the plan to send it.
    async fn prepare(
        &self,
        request: &pb::CompleteRequest,
        call_id: &str,
    ) -> Result<(CallPlan, Slot), Refused> {
        let made = self.gate.admit("model.complete").map_err(Refused::from)?;
        let Checked {
            models,
            routed,
            force_local,
            dropped_thinking,
        } = self.check(request)?;
        let Routed {
            choice,
            sent,
            bytes,
        } = routed;
        let choice = &choice;
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
                bytes,
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
        let route = choice.route;
        let shared = &models.shared;
        let mut chat = ChatRequest {
            model: route.model.clone(),
            call: sent,
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
        chat.call.max_tokens = reservation.max_tokens;
        let mut meta =
            route::decision_meta(choice, force_local, reservation.max_tokens, &chat.call);
        if dropped_thinking > 0 {
            meta.push(("dropped_thinking", (dropped_thinking as i64).into()));
        }
        if let Some(by) = approved_by {
            meta.push(("approved_by", by.into()));
        }
        let started = pb::CompleteStarted {
            call_id: String::new(),
            route: route.name.clone(),
            model: route.model.clone(),
            sensitivity: proto_sensitivity(choice.assessment.sensitivity),
            sent_sensitivity: proto_sensitivity(choice.sent_sensitivity()),
            redacted_spans: choice.redacted.as_ref().map_or(0, |r| r.spans as u32),
            max_tokens: reservation.max_tokens,
        };
        Ok((
            CallPlan {
                route: route.name.clone(),
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
        let streamed = relay::relay_reply(&shared.backends, route, &plan.chat, &out).await;
        streamed.remember_signatures(&plan.route, &models.signatures);
        let (prompt, completion) = self
            .counts(
                &shared,
                route,
                (plan.prompt, plan.chat.call.max_tokens),
                &streamed,
            )
            .await;
        let relay::Streamed {
            result,
            finish,
            tool_calls,
            ..
        } = streamed;
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
            .meta("model", plan.chat.model.as_str())
            .meta("prompt_tokens", prompt.tokens as i64)
            .meta("prompt_source", source_name(prompt))
            .meta("completion_tokens", completion.tokens as i64)
            .meta("completion_source", source_name(completion))
            .meta("estimated", estimated)
            .meta("finish_reason", finish.as_str())
            .meta("tool_calls", i64::from(tool_calls))
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
                    // Nothing was sent: the call holds what the route's format cannot carry.
                    BackendError::Unsendable { .. } => Status::invalid_argument(reason),
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

    /// A backend's error, with the route's key removed should it appear.
    fn scrubbed(&self, route: &str, backends: &Backends, text: &str) -> String {
        match backends.key_of(route) {
            Some(key) if !key.is_empty() => text.replace(key, "[secret]"),
            _ => text.to_owned(),
        }
    }
}

/// The refusal of a call no granted route may carry, with what the classifier found.
fn no_route_refusal(no_route: &NoRoute) -> Refused {
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
        ],
    }
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
