//! Changing a live run's powers without restarting it (`AmendRun`). Narrowing needs no
//! signature: drop fs grants (a mounted one is unmounted from the live sandbox first, by
//! `tollgate-shim enter` in its mount namespace), lower a budget (tool calls, model tokens,
//! relayed output, outbound bytes), bring the expiry forward.
//! Widening needs an authority's signed amendment, checked with the receipts' key set: add
//! gateway-only fs grants (pinned now, without following links), raise the budget, extend the
//! expiry. Only what the gateway checks on each call moves; the kernel envelope (mounts,
//! Landlock, the exec list, the cgroup) is never widened on a live run. Audited
//! (`run_amended`, durable) before the change takes effect.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use prost::Message as _;
use serde::{Deserialize, Serialize};
use tollgate_audit::{Decision, EntryDraft, EntryKind};
use tollgate_proto::v1 as pb;
use tollgate_receipt::amendment::{check_widening, verify_amendment, MAX_CHILD_AMENDMENTS};
use tollgate_receipt::paths::path_within;
use tollgate_receipt::{timestamp_from_unix, unix_now};

use super::{LiveRun, RunManager};
use crate::error::AmendError;
use crate::gateway::fs::{FsGrant, GrantOrigin};
use crate::gateway::RunGateway;
use crate::COMPONENT;

/// Most fs grants a live run holds, its receipt's and its amendments' together (each pinned
/// grant holds descriptors).
pub const MAX_LIVE_GRANTS: usize = 64;

/// One change to a live run.
#[derive(Debug, Clone)]
pub enum RunChange {
    /// Take powers away.
    Narrow(pb::Narrowing),
    /// Add what an authority signed for.
    Widen(pb::SignedAmendment),
}

impl RunManager {
    /// Applies `change` to live run `run_id` on behalf of `by`; the gateway envelope after it.
    pub fn amend(
        &self,
        run_id: &str,
        change: RunChange,
        by: &str,
    ) -> Result<pb::AmendRunResponse, AmendError> {
        if self.closing.load(Ordering::SeqCst) {
            // A change acknowledged now could miss the record a live restore keeps.
            return Err(AmendError::NotLive(format!(
                "{run_id} (the supervisor is shutting down)"
            )));
        }
        let live = self
            .live_run(run_id)
            .ok_or_else(|| AmendError::NotLive(run_id.to_owned()))?;
        let gateway = live
            .gateway
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|(gateway, _)| gateway.clone())
            .ok_or_else(|| AmendError::NotLive(run_id.to_owned()))?;
        // What a run loses its live children lose too (theirs at or beneath it), first —
        // once the run's own narrowing is known to stand: should one of theirs not leave (a
        // mount still in use), the run keeps its own and the operator is told. After the
        // run's change, once more, for a child that started in between.
        let dropped = match &change {
            RunChange::Narrow(narrow)
                if !narrow.drop_fs.is_empty() || !narrow.drop_gateway_exec.is_empty() =>
            {
                let grants = gateway.fs.grants.current();
                if let Some(path) = narrow
                    .drop_fs
                    .iter()
                    .find(|path| !grants.iter().any(|g| g.path == **path))
                {
                    return Err(AmendError::NotANarrowing(format!(
                        "drop_fs {path:?}: the run has no grant of that path"
                    )));
                }
                let programs = gateway.exec.programs();
                if let Some(program) = narrow
                    .drop_gateway_exec
                    .iter()
                    .find(|p| !programs.iter().any(|g| g.program == **p))
                {
                    return Err(no_program_to_drop(&gateway.gate.receipt, program));
                }
                self.narrow_children(run_id, &narrow.drop_fs, &narrow.drop_gateway_exec, by)?;
                Some((narrow.drop_fs.clone(), narrow.drop_gateway_exec.clone()))
            }
            _ => None,
        };
        let after = self.amend_run(run_id, &live, &gateway, change, by)?;
        if let Some((fs, programs)) = dropped {
            if let Err(e) = self.narrow_children(run_id, &fs, &programs, by) {
                tracing::warn!(run_id, error = %e, "a child that started during a narrowing keeps a dropped grant");
            }
        }
        Ok(after)
    }

    /// [`RunManager::amend`]'s change to the run itself.
    fn amend_run(
        &self,
        run_id: &str,
        live: &Arc<LiveRun>,
        gateway: &Arc<RunGateway>,
        change: RunChange,
        by: &str,
    ) -> Result<pb::AmendRunResponse, AmendError> {
        // One change at a time: each is checked against, and applied to, what the last left.
        let mut applied = gateway.amendments.lock().unwrap_or_else(|p| p.into_inner());
        // Checked again under the lock a live restore's record is taken under: a change
        // either lands before that record or is refused.
        if self.closing.load(Ordering::SeqCst) {
            return Err(AmendError::NotLive(format!(
                "{run_id} (the supervisor is shutting down)"
            )));
        }
        let gate = &gateway.gate;
        let now = unix_now();
        let mut applied_id = None;
        let entry = EntryDraft::new(COMPONENT, EntryKind::RunAmended)
            .receipt(run_id)
            .run(run_id)
            .decision(Decision::Allow)
            .meta("by", by);
        let (entry, apply): (EntryDraft, Box<dyn FnOnce()>) = match change {
            RunChange::Narrow(narrow) => {
                let current = gate.max_calls();
                if narrow.tool_calls > current {
                    return Err(AmendError::NotANarrowing(format!(
                        "tool_calls {} is above the run's {current}: raising it needs a signed amendment",
                        narrow.tool_calls
                    )));
                }
                let expiry = gate.expires_at();
                let new_expiry = narrow.expires_at.as_ref().map(|t| t.seconds);
                if let Some(new) = new_expiry.filter(|new| *new > expiry) {
                    return Err(AmendError::NotANarrowing(format!(
                        "expires_at unix {new} is after the run's (unix {expiry}): extending it needs a signed amendment"
                    )));
                }
                if new_expiry.is_some_and(|new| new <= 0) {
                    return Err(AmendError::NotANarrowing(
                        "expires_at must be a time (Unix seconds above 0); to end the run now, give the current time or stop it".into(),
                    ));
                }
                let budgets = Budgets::now(gateway, live);
                for (field, new, current) in [
                    ("tokens", narrow.tokens, budgets.tokens),
                    ("output_bytes", narrow.output_bytes, budgets.output_bytes),
                    ("egress_bytes", narrow.egress_bytes, budgets.egress_bytes),
                ] {
                    if new > current {
                        return Err(AmendError::NotANarrowing(format!(
                            "{field} {new} is above the run's {current}: a narrowing only lowers a budget"
                        )));
                    }
                }
                if narrow.tokens != 0 && gateway.models.models.is_none() {
                    return Err(AmendError::NotANarrowing(
                        "tokens: this run makes no model calls (the supervisor has no model routes)".into(),
                    ));
                }
                let programs = gateway.exec.programs();
                if let Some(program) = narrow
                    .drop_gateway_exec
                    .iter()
                    .find(|p| !programs.iter().any(|g| g.program == **p))
                {
                    return Err(no_program_to_drop(&gate.receipt, program));
                }
                let grants = gateway.fs.grants.current();
                let mut unmount = Vec::new();
                for path in &narrow.drop_fs {
                    let Some(live) = grants.iter().find(|g| g.path == *path) else {
                        return Err(AmendError::NotANarrowing(format!(
                            "drop_fs {path:?}: the run has no grant of that path"
                        )));
                    };
                    // Only the receipt's own grant of the path is mounted (an amendment's never
                    // is), and only while it is still in force.
                    if let Some(target) = mount_of(&gate.receipt, path)
                        .filter(|_| live.origin == GrantOrigin::Receipt)
                    {
                        unmount.push(target);
                    }
                }
                // A mounted grant leaves the sandbox itself, before the entry says it is gone.
                if !unmount.is_empty() {
                    let Some(sandbox) = gateway.exec.sandbox.clone() else {
                        return Err(AmendError::NotANarrowing(
                            "this run's sandbox cannot be entered to unmount a grant".into(),
                        ));
                    };
                    let runtime = tokio::runtime::Handle::current();
                    for target in &unmount {
                        runtime
                            .block_on(crate::exec::unmount(&sandbox, target))
                            .map_err(|e| AmendError::Unmount {
                                target: target.clone(),
                                reason: e.to_string(),
                            })?;
                    }
                }
                let entry = entry
                    .meta("change", "narrow")
                    .meta("drop_fs", narrow.drop_fs.clone())
                    .meta("unmounted", unmount.clone())
                    .meta(
                        "tool_calls",
                        i64::try_from(narrow.tool_calls).unwrap_or(i64::MAX),
                    )
                    .meta("expires_at", new_expiry.unwrap_or(0))
                    .meta("drop_gateway_exec", narrow.drop_gateway_exec.clone())
                    .meta("tokens", i64::try_from(narrow.tokens).unwrap_or(i64::MAX))
                    .meta(
                        "output_bytes",
                        i64::try_from(narrow.output_bytes).unwrap_or(i64::MAX),
                    )
                    .meta(
                        "egress_bytes",
                        i64::try_from(narrow.egress_bytes).unwrap_or(i64::MAX),
                    );
                let (run, live) = (gateway.clone(), live.clone());
                let apply = move || {
                    if !narrow.drop_gateway_exec.is_empty() {
                        run.exec
                            .gateway_only
                            .write()
                            .unwrap_or_else(|p| p.into_inner())
                            .retain(|g| !narrow.drop_gateway_exec.contains(&g.program));
                    }
                    if narrow.tokens != 0 {
                        if let Some(models) = &run.models.models {
                            models.lower_tokens(narrow.tokens);
                        }
                    }
                    if narrow.output_bytes != 0 {
                        live.lower_output(narrow.output_bytes);
                    }
                    if narrow.egress_bytes != 0 {
                        run.egress.lower_bytes(narrow.egress_bytes);
                    }
                    if !narrow.drop_fs.is_empty() {
                        run.fs.grants.change(|grants| {
                            grants
                                .iter()
                                .filter(|g| !narrow.drop_fs.contains(&g.path))
                                .cloned()
                                .collect()
                        });
                    }
                    if narrow.tool_calls != 0 {
                        run.gate
                            .max_calls
                            .store(narrow.tool_calls, Ordering::SeqCst);
                    }
                    if let Some(new) = new_expiry {
                        run.gate.expires_at.fetch_min(new, Ordering::SeqCst);
                        live.set_expiry(run.gate.expires_at());
                    }
                };
                (entry, Box::new(apply))
            }
            RunChange::Widen(signed) => {
                let amendment = {
                    let admission = self.admission.read().unwrap_or_else(|p| p.into_inner());
                    let amendment = verify_amendment(admission.keys(), &signed)?;
                    if admission.is_revoked(run_id) {
                        return Err(AmendError::Revoked(run_id.to_owned()));
                    }
                    amendment
                };
                check_widening(&gate.receipt, &amendment, now)?;
                if applied.contains(&amendment.amendment_id) {
                    // Applied once already: a replay changes nothing (and undoes no narrowing).
                    return Ok(envelope(gateway, live));
                }
                // Each is handed to the authority with every delegation: bounded like its list.
                if amendment.for_children
                    && gateway.children.state.for_children_count() >= MAX_CHILD_AMENDMENTS
                {
                    return Err(AmendError::NotANarrowing(format!(
                        "the run already holds {MAX_CHILD_AMENDMENTS} amendments for its children; start a new run instead"
                    )));
                }
                if amendment.tokens != 0 && gateway.models.models.is_none() {
                    return Err(AmendError::NotANarrowing(
                        "tokens: this run makes no model calls (the supervisor has no model routes)".into(),
                    ));
                }
                let programs = gateway.exec.programs();
                let added_programs: Vec<pb::GatewayExecGrant> = amendment
                    .add_gateway_exec
                    .iter()
                    .filter(|g| !programs.iter().any(|have| have.program == g.program))
                    .cloned()
                    .collect();
                if programs.len() + added_programs.len() > MAX_LIVE_GRANTS {
                    return Err(AmendError::NotANarrowing(format!(
                        "the run would hold more than {MAX_LIVE_GRANTS} gateway-only programs; start a new run instead"
                    )));
                }
                // A program the agent must not reach leaves its sight before the exec tool
                // may run it.
                if !added_programs.is_empty() {
                    let Some(sandbox) = gateway.exec.sandbox.clone() else {
                        return Err(AmendError::NotANarrowing(
                            "this run's sandbox cannot be entered to hide a program from its agent"
                                .into(),
                        ));
                    };
                    let runtime = tokio::runtime::Handle::current();
                    for grant in &added_programs {
                        runtime
                            .block_on(crate::exec::hide(&sandbox, &grant.program))
                            .map_err(|e| AmendError::Hide {
                                program: grant.program.clone(),
                                reason: e.to_string(),
                            })?;
                    }
                }
                let current = gateway.fs.grants.current();
                if current.len() + amendment.add_fs.len() > MAX_LIVE_GRANTS {
                    return Err(AmendError::NotANarrowing(format!(
                        "the run would hold more than {MAX_LIVE_GRANTS} fs grants; start a new run instead"
                    )));
                }
                // Pinned now, as a run's grants are at its start: no link followed. A grant the
                // run already has as asked is not pinned twice.
                let added: Vec<Arc<FsGrant>> = amendment
                    .add_fs
                    .iter()
                    .filter(|g| {
                        !current.iter().any(|have| {
                            have.path == g.path
                                && have.writable == (g.access == pb::FsAccess::Write as i32)
                                && have.ask == g.ask
                                && have.ask_reads == g.ask_reads
                        })
                    })
                    .map(|g| {
                        let mut grant = FsGrant::pin(g);
                        grant.origin = if amendment.for_children {
                            GrantOrigin::AmendmentForChildren
                        } else {
                            GrantOrigin::Amendment
                        };
                        Arc::new(grant)
                    })
                    .collect();
                let new_expiry = amendment.expires_at.as_ref().map(|t| t.seconds);
                let entry = entry
                    .meta("change", "widen")
                    .meta("amendment_id", amendment.amendment_id.as_str())
                    .meta("amended_by", amendment.amended_by.as_str())
                    .meta(
                        "add_fs",
                        amendment
                            .add_fs
                            .iter()
                            .map(|g| g.path.clone())
                            .collect::<Vec<_>>(),
                    )
                    .meta(
                        "tool_calls",
                        i64::try_from(amendment.tool_calls).unwrap_or(i64::MAX),
                    )
                    .meta("expires_at", new_expiry.unwrap_or(0))
                    .meta("for_children", amendment.for_children)
                    .meta(
                        "add_gateway_exec",
                        amendment
                            .add_gateway_exec
                            .iter()
                            .map(|g| g.program.clone())
                            .collect::<Vec<_>>(),
                    )
                    .meta(
                        "tokens",
                        i64::try_from(amendment.tokens).unwrap_or(i64::MAX),
                    )
                    .meta(
                        "output_bytes",
                        i64::try_from(amendment.output_bytes).unwrap_or(i64::MAX),
                    )
                    .meta(
                        "egress_bytes",
                        i64::try_from(amendment.egress_bytes).unwrap_or(i64::MAX),
                    );
                applied_id = Some(amendment.amendment_id.clone());
                let (run, live) = (gateway.clone(), live.clone());
                let apply = move || {
                    if amendment.for_children {
                        run.children.state.for_children(signed, amendment.clone());
                    }
                    if !added.is_empty() {
                        run.fs
                            .grants
                            .change(|grants| grants.iter().cloned().chain(added).collect());
                    }
                    if !added_programs.is_empty() {
                        run.exec
                            .gateway_only
                            .write()
                            .unwrap_or_else(|p| p.into_inner())
                            .extend(added_programs);
                    }
                    // Only ever up: an older amendment applied late never lowers a newer one.
                    if amendment.tokens != 0 {
                        if let Some(models) = &run.models.models {
                            models.raise_tokens(amendment.tokens);
                        }
                    }
                    if amendment.output_bytes != 0 {
                        live.raise_output(amendment.output_bytes);
                    }
                    if amendment.egress_bytes != 0 {
                        run.egress.raise_bytes(amendment.egress_bytes);
                    }
                    if amendment.tool_calls != 0 {
                        run.gate
                            .max_calls
                            .fetch_max(amendment.tool_calls, Ordering::SeqCst);
                    }
                    if let Some(new) = new_expiry {
                        run.gate.expires_at.fetch_max(new, Ordering::SeqCst);
                        live.set_expiry(run.gate.expires_at());
                    }
                };
                (entry, Box::new(apply))
            }
        };
        // On disk before the run's powers change.
        self.audit.append(entry)?;
        let expiry = gate.expires_at();
        apply();
        if gate.expires_at() != expiry {
            // Shown by listings; the run's own expiry is the gateway's and its expiry task's.
            if let Err(e) = self.records.set_expiry(run_id, gate.expires_at()) {
                tracing::warn!(run_id, error = %e, "could not record the amended expiry");
            }
        }
        if let Some(id) = applied_id {
            // Bounded: amendments are signed by the authority, and past this many a run's
            // replays are refused as stale anyway (5 minutes).
            if applied.len() >= 1024 {
                applied.clear();
            }
            applied.insert(id);
        }
        Ok(envelope(gateway, live))
    }
}

/// A live run's budgets in all, now.
struct Budgets {
    tokens: u64,
    output_bytes: u64,
    egress_bytes: u64,
}

impl Budgets {
    fn now(gateway: &RunGateway, live: &LiveRun) -> Self {
        Self {
            tokens: gateway
                .models
                .models
                .as_ref()
                .map_or(0, |models| models.token_limit()),
            output_bytes: live.output_limit.load(Ordering::SeqCst),
            egress_bytes: gateway.egress.max_bytes(),
        }
    }
}

impl RunManager {
    /// Drops from each live child of `run_id` (and theirs, in turn) its grants at or beneath
    /// one of `dropped`, and its gateway-only programs among `programs`.
    fn narrow_children(
        &self,
        run_id: &str,
        dropped: &[String],
        programs: &[String],
        by: &str,
    ) -> Result<(), AmendError> {
        // Found through the family index, not by walking every live run (lock order: live,
        // then family).
        let children: Vec<(String, Arc<LiveRun>)> = {
            let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
            let family = self.family.lock().unwrap_or_else(|p| p.into_inner());
            family
                .children_of(run_id)
                .filter_map(|id| live.get(id).map(|child| (id.clone(), child.clone())))
                .collect()
        };
        for (child_id, child) in children {
            let Some(gateway) = child
                .gateway
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .map(|(gateway, _)| gateway.clone())
            else {
                continue;
            };
            let drop_fs: Vec<String> = gateway
                .fs
                .grants
                .current()
                .iter()
                .filter(|g| dropped.iter().any(|d| path_within(&g.path, d)))
                .map(|g| g.path.clone())
                .collect();
            if drop_fs.is_empty() {
                continue;
            }
            let drop_gateway_exec: Vec<String> = gateway
                .exec
                .programs()
                .into_iter()
                .filter(|g| programs.contains(&g.program))
                .map(|g| g.program)
                .collect();
            if drop_fs.is_empty() && drop_gateway_exec.is_empty() {
                continue;
            }
            let narrowing = pb::Narrowing {
                drop_fs,
                drop_gateway_exec,
                ..Default::default()
            };
            match self.amend(&child_id, RunChange::Narrow(narrowing), by) {
                Ok(_) | Err(AmendError::NotLive(_)) => {}
                Err(e) => {
                    return Err(AmendError::NotANarrowing(format!(
                        "child run {child_id} keeps a grant beneath a dropped one ({e}); nothing of this run was changed"
                    )))
                }
            }
        }
        Ok(())
    }
}

/// Why a narrowing cannot drop `program` from a run of `receipt`: it is the kernel's (the
/// receipt's exec list), or the run has no gateway-only program of that path.
fn no_program_to_drop(receipt: &pb::Receipt, program: &str) -> AmendError {
    let why = if receipt.exec.iter().any(|p| p == program) {
        "it is in the receipt's exec list, which the kernel holds for the live sandbox (Landlock cannot take a right back): start a new run without it"
    } else {
        "the run has no gateway-only program of that path"
    };
    AmendError::NotANarrowing(format!("drop_gateway_exec {program:?}: {why}"))
}

/// Where in the sandbox the receipt mounts its grant of `path`, if it does.
fn mount_of(receipt: &pb::Receipt, path: &str) -> Option<String> {
    receipt
        .fs
        .iter()
        .find(|g| g.path == path && !g.mount.is_empty())
        .map(|g| g.mount.clone())
}

/// What the run's gateway allows now.
fn envelope(gateway: &RunGateway, live: &LiveRun) -> pb::AmendRunResponse {
    let receipt = &gateway.gate.receipt;
    let budgets = Budgets::now(gateway, live);
    pb::AmendRunResponse {
        fs: gateway
            .fs
            .grants
            .current()
            .iter()
            .map(|g| pb::FsGrant {
                path: g.path.clone(),
                access: if g.writable {
                    pb::FsAccess::Write as i32
                } else {
                    pb::FsAccess::Read as i32
                },
                mount: receipt
                    .fs
                    .iter()
                    .find(|r| r.path == g.path && g.origin == GrantOrigin::Receipt)
                    .map(|r| r.mount.clone())
                    .unwrap_or_default(),
                exec: false,
                ask: g.ask,
                ask_reads: g.ask_reads,
            })
            .collect(),
        tool_calls: gateway.gate.max_calls(),
        expires_at: Some(timestamp_from_unix(gateway.gate.expires_at())),
        tokens: budgets.tokens,
        output_bytes: budgets.output_bytes,
        egress_bytes: budgets.egress_bytes,
        gateway_exec: gateway.exec.programs(),
    }
}

/// What amendments and narrowings made of a live run: kept in its record when it is left
/// running for a live restore, and put back when the next supervisor re-adopts it (so a
/// narrowing is never undone, nor an extension lost, by a restart).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct AmendedRun {
    /// The fs grants in force, in order: the receipt's still kept, then those amendments
    /// added.
    grants: Vec<KeptGrant>,
    /// The tool-call budget.
    tool_calls: u64,
    /// The expiry (Unix seconds).
    expires_at: i64,
    /// The model-token budget (0: no model calls).
    tokens: u64,
    /// The output budget in all.
    output_bytes: u64,
    /// The outbound-bytes budget.
    egress_bytes: u64,
    /// The gateway-only programs in force: (program, ask); absent: the receipt's.
    #[serde(default)]
    gateway_exec: Option<Vec<(String, bool)>>,
    /// The applied amendments for children, each a `SignedAmendment`'s protobuf encoding.
    for_children: Vec<Vec<u8>>,
    /// The ids of the amendments applied (each applies once).
    applied: Vec<String>,
}

/// One live fs grant as [`AmendedRun`] keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct KeptGrant {
    path: String,
    writable: bool,
    ask: bool,
    ask_reads: bool,
    origin: GrantOrigin,
}

impl AmendedRun {
    /// What `gateway` and `live` hold now.
    pub(super) fn of(gateway: &RunGateway, live: &LiveRun) -> Self {
        // Under the lock changes are made under: never half of one.
        let applied_ids = gateway.amendments.lock().unwrap_or_else(|p| p.into_inner());
        let budgets = Budgets::now(gateway, live);
        let applied = applied_ids.iter().cloned().collect();
        Self {
            grants: gateway
                .fs
                .grants
                .current()
                .iter()
                .map(|g| KeptGrant {
                    path: g.path.clone(),
                    writable: g.writable,
                    ask: g.ask,
                    ask_reads: g.ask_reads,
                    origin: g.origin,
                })
                .collect(),
            tool_calls: gateway.gate.max_calls(),
            expires_at: gateway.gate.expires_at(),
            tokens: budgets.tokens,
            output_bytes: budgets.output_bytes,
            egress_bytes: budgets.egress_bytes,
            gateway_exec: Some(
                gateway
                    .exec
                    .programs()
                    .into_iter()
                    .map(|g| (g.program, g.ask))
                    .collect(),
            ),
            for_children: gateway
                .children
                .state
                .signed_for_children()
                .iter()
                .map(prost::Message::encode_to_vec)
                .collect(),
            applied,
        }
    }

    /// Puts what was kept back on the re-adopted run's fresh gateway (built from its
    /// receipt): the receipt's grants dropped since are dropped again (a mounted one was
    /// already unmounted from the sandbox, which lived on), amendments' grants pinned again
    /// (no link followed), budgets and expiry as they were.
    pub(super) fn restore(self, gateway: &RunGateway, live: &LiveRun) {
        let signed = gateway.fs.grants.current();
        let grants: Vec<Arc<FsGrant>> = self
            .grants
            .iter()
            .filter_map(|kept| match kept.origin {
                GrantOrigin::Receipt => signed
                    .iter()
                    .find(|g| g.path == kept.path && g.writable == kept.writable)
                    .cloned(),
                origin => {
                    let mut grant = FsGrant::open(&kept.path, kept.writable, kept.ask);
                    grant.ask_reads = kept.ask_reads;
                    grant.origin = origin;
                    Some(Arc::new(grant))
                }
            })
            .collect();
        gateway.fs.grants.change(|_| grants);
        if let Some(programs) = self.gateway_exec {
            *gateway
                .exec
                .gateway_only
                .write()
                .unwrap_or_else(|p| p.into_inner()) = programs
                .into_iter()
                .map(|(program, ask)| pb::GatewayExecGrant { program, ask })
                .collect();
        }
        gateway
            .gate
            .max_calls
            .store(self.tool_calls, Ordering::SeqCst);
        gateway
            .gate
            .expires_at
            .store(self.expires_at, Ordering::SeqCst);
        live.set_expiry(self.expires_at);
        if let Some(models) = &gateway.models.models {
            models.set_tokens(self.tokens);
        }
        // What was left of it came back with the run's record.
        live.output_limit.store(self.output_bytes, Ordering::SeqCst);
        gateway.egress.set_bytes(self.egress_bytes);
        for bytes in &self.for_children {
            let Ok(signed) = pb::SignedAmendment::decode(bytes.as_slice()) else {
                continue;
            };
            if let Ok(amendment) = pb::Amendment::decode(signed.amendment.as_slice()) {
                gateway.children.state.for_children(signed, amendment);
            }
        }
        gateway
            .amendments
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(self.applied);
    }
}
