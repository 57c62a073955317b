//! `Gateway.Delegate`: a child receipt narrower than the run's own, its budgets carved from
//! what the run has left, minted by the authority and verified here.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tollgate_audit::Decision;
use tollgate_proto::v1 as pb;
use tollgate_receipt::SignedReceipt;
use tonic::Status;

use crate::gateway::gate::{new_call_id, CallMeta, Refusal};

use super::authority::authority_refusal;
use super::{clip, unavailable, Children, MAX_PENDING};

/// What a delegation carved from its parent, given back if the child is never usable.
struct Carved {
    calls: u64,
    tokens: Option<u64>,
    output: Option<u64>,
}

/// Takes `asked` (0: half of what is left) from a budget counting down; how much, or what
/// was asked and what is left.
pub(crate) fn carve_left(left: &AtomicU64, asked: u64) -> Result<u64, (u64, u64)> {
    let now = left.load(Ordering::SeqCst);
    let wanted = if asked == 0 { now / 2 } else { asked };
    if wanted == 0 {
        return Err((wanted, now));
    }
    left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| {
        l.checked_sub(wanted)
    })
    .map(|_| wanted)
    .map_err(|l| (wanted, l))
}

/// A child minted by the authority and verified here, not yet handed to the agent.
struct Minted {
    response: pb::DelegateResponse,
    signed: SignedReceipt,
    carved: Carved,
}

impl Children {
    /// Hands `asked` tool calls on to a child (0: half of what this run has left); how many,
    /// or why not. They go into the same counter as the run's own calls, so the two together
    /// never exceed the budget, and one call always stays for starting the child.
    pub(crate) fn carve_calls(&self, asked: u64) -> Result<u64, Refusal> {
        let left = self.gate.calls_left();
        let calls = if asked == 0 {
            left.saturating_sub(1) / 2
        } else {
            asked
        };
        let carved = calls > 0
            && self
                .gate
                .calls
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |made| {
                    (made.saturating_add(calls).saturating_add(1) <= self.gate.max_calls())
                        .then_some(made + calls)
                })
                .is_ok();
        if carved {
            Ok(calls)
        } else {
            Err(Refusal::with(
                Status::resource_exhausted,
                format!(
                    "limits.tool_calls = {calls}: this run has {left} tool calls left to hand on (one stays for starting the child)"
                ),
            ))
        }
    }

    /// Gives back calls carved for a child that was never usable.
    pub(crate) fn refund_calls(&self, calls: u64) {
        let _ = self
            .gate
            .calls
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |made| {
                Some(made.saturating_sub(calls))
            });
    }

    fn refund(&self, carved: &Carved) {
        self.refund_calls(carved.calls);
        if let (Some(left), Some(output)) = (&self.state.output_left, carved.output) {
            left.fetch_add(output, Ordering::SeqCst);
        }
        if let (Some(models), Some(tokens)) = (&self.models, carved.tokens) {
            models
                .ledger
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .refund(tokens);
        }
    }

    /// `Gateway.Delegate`. Runs on its own task: a client that hangs up does not skip the
    /// audit entry or leave budget carved for nothing.
    pub(crate) async fn delegate(
        self: &Arc<Self>,
        request: pb::DelegateRequest,
    ) -> Result<pb::DelegateResponse, Status> {
        let started = Instant::now();
        let call_id = new_call_id();
        let spec = request.child.unwrap_or_default();
        let mut meta: CallMeta = vec![("subject", clip(&spec.subject).into())];
        let outcome = self.delegate_checked(spec, &mut meta, &call_id).await;
        if let Ok(minted) = &outcome {
            if let Some(receipt) = &minted.response.receipt {
                meta.push(("child_receipt_id", receipt.receipt_id.clone().into()));
            }
        }
        let (decision, reason) = match &outcome {
            Ok(_) => (Decision::Allow, None),
            Err(refusal) => (refusal.decision(), Some(refusal.reason.as_str())),
        };
        // On disk before the child exists for the agent (it enters `pending` only after).
        let recorded = tokio::task::block_in_place(|| {
            self.gate.record_call(
                "delegate",
                &call_id,
                started,
                &meta,
                (decision, reason),
                true,
            )
        });
        match (outcome, recorded) {
            (Ok(minted), Ok(())) => {
                if let Some(receipt) = &minted.response.receipt {
                    self.state
                        .pending
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(receipt.receipt_id.clone(), (minted.signed, receipt.clone()));
                }
                Ok(pb::DelegateResponse {
                    call_id,
                    ..minted.response
                })
            }
            // Minted but unaudited: never usable, so its budget comes back.
            (Ok(minted), Err(status)) => {
                self.refund(&minted.carved);
                Err(status)
            }
            (Err(refusal), Ok(())) => Err(refusal.into_status(&call_id)),
            (Err(_), Err(status)) => Err(status),
        }
    }

    /// Carves a child's budgets from what this run has left (a zero asks for half):
    /// tool calls, output (a tree never relays, or keeps for watchers, more than its root
    /// may) and tokens; `limits` is set to what was carved. All or nothing: a carve that
    /// fails gives back what was taken.
    fn carve(&self, limits: &mut pb::Limits) -> Result<Carved, Refusal> {
        let calls = self.carve_calls(limits.tool_calls)?;
        let mut carved = Carved {
            calls,
            tokens: None,
            output: None,
        };
        // Output too: a tree never relays (or keeps for watchers) more than its root may.
        if let Some(left) = &self.state.output_left {
            match carve_left(left, limits.output_bytes) {
                Ok(output) => carved.output = Some(output),
                Err((wanted, left)) => {
                    self.refund(&carved);
                    return Err(Refusal::with(
                        Status::resource_exhausted,
                        format!("limits.output_bytes = {wanted}: this run has {left} bytes of output left to hand on"),
                    ));
                }
            }
        }
        let parent_tokens = self.gate.receipt.limits.unwrap_or_default().tokens;
        if let Some(models) = &self.models {
            let mut ledger = models.ledger.lock().unwrap_or_else(|p| p.into_inner());
            let tokens = if limits.tokens == 0 {
                ledger.remaining() / 2
            } else {
                limits.tokens
            };
            match ledger.transfer(tokens) {
                Ok(()) if tokens > 0 => carved.tokens = Some(tokens),
                _ => {
                    let left = ledger.remaining();
                    drop(ledger);
                    self.refund(&carved);
                    return Err(Refusal::with(
                        Status::resource_exhausted,
                        format!(
                            "limits.tokens = {tokens}: this run has {left} tokens left to hand on"
                        ),
                    ));
                }
            }
        }
        limits.tool_calls = calls;
        if let Some(output) = carved.output {
            limits.output_bytes = output;
        }
        limits.tokens = match (carved.tokens, limits.tokens) {
            (Some(tokens), _) => tokens,
            // No routes on this supervisor: no run here can spend tokens, so none move.
            (None, 0) => (parent_tokens / 2).max(1),
            (None, asked) => asked,
        };
        Ok(carved)
    }

    async fn delegate_checked(
        &self,
        mut spec: pb::ChildSpec,
        meta: &mut CallMeta,
        call_id: &str,
    ) -> Result<Minted, Refusal> {
        let made = self.gate.admit("delegate")?;
        let max_depth = self.gate.receipt.delegate.map_or(0, |d| d.max_depth);
        if max_depth == 0 {
            return Err(Refusal::denied(
                &self.gate.run_id,
                "delegate needs a delegate grant (missing grant: delegate max_depth >= 1)".into(),
            ));
        }
        // Checked before anyone is asked; the start checks again.
        self.programs_in_force(&spec.gateway_exec)?;
        if self.gate.receipt.delegate.is_some_and(|d| d.ask) {
            let asked = crate::gateway::approval::Asked::new("delegate", clip(&spec.subject));
            let by = self.approvals.approved_by(asked, call_id).await?;
            meta.push(("approved_by", by.into()));
        }
        self.gate.charge(made)?;
        let delegator = self
            .state
            .control
            .as_ref()
            .and_then(|control| control.delegator.clone())
            .ok_or_else(|| {
                unavailable(
                    "this supervisor cannot delegate: it has no delegation token (--delegation-token-file)",
                )
            })?;
        let manager = self.manager()?;
        let _slot = self.state.hold_slot().ok_or_else(|| {
            Refusal::with(
                Status::resource_exhausted,
                format!("this run already holds {MAX_PENDING} child receipts not started; start some, or wait for them to expire"),
            )
        })?;
        let mut limits = spec.limits.unwrap_or_default();
        let carved = self.carve(&mut limits)?;
        let calls = carved.calls;
        spec.limits = Some(limits);
        meta.push((
            "tool_calls",
            i64::try_from(calls).unwrap_or(i64::MAX).into(),
        ));
        meta.push((
            "tokens",
            i64::try_from(limits.tokens).unwrap_or(i64::MAX).into(),
        ));
        let (amendments, _) = self.state.amendments();
        let minted = match delegator
            .delegate(&self.state.signed, amendments, spec)
            .await
        {
            Ok(minted) => minted,
            Err(status) => {
                self.refund(&carved);
                return Err(authority_refusal(&self.gate.run_id, status));
            }
        };
        let receipt = match manager.verify_child(&minted, &self.gate.run_id) {
            Ok(receipt) => receipt,
            Err(reason) => {
                self.refund(&carved);
                return Err(Refusal::with(Status::internal, reason));
            }
        };
        // What was carved is what the child may spend, no more.
        let got = receipt.limits.unwrap_or_default();
        if got.tool_calls != calls
            || got.tokens != limits.tokens
            || carved
                .output
                .is_some_and(|output| got.output_bytes != output)
        {
            self.refund(&carved);
            return Err(Refusal::with(
                Status::internal,
                format!(
                    "the authority's child receipt {} has other budgets than were carved",
                    receipt.receipt_id
                ),
            ));
        }
        let tokens_left = self.models.as_ref().map_or(0, |models| {
            models
                .ledger
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remaining()
        });
        Ok(Minted {
            response: pb::DelegateResponse {
                call_id: String::new(),
                receipt: Some(receipt),
                tool_calls_left: self.gate.calls_left(),
                tokens_left,
            },
            signed: minted,
            carved,
        })
    }
}
