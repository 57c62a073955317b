//! Changing a live run's powers without restarting it (`AmendRun`). Narrowing needs no
//! signature: drop fs grants (a mounted one is unmounted from the live sandbox first, by
//! `tollgate-shim enter` in its mount namespace), lower the tool-call budget, bring the expiry
//! forward.
//! Widening needs an authority's signed amendment, checked with the receipts' key set: add
//! gateway-only fs grants (pinned now, without following links), raise the budget, extend the
//! expiry. Only what the gateway checks on each call moves; the kernel envelope (mounts,
//! Landlock, the exec list, the cgroup) is never widened on a live run. Audited
//! (`run_amended`, durable) before the change takes effect.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tollgate_audit::{Decision, EntryDraft, EntryKind};
use tollgate_proto::v1 as pb;
use tollgate_receipt::amendment::{check_widening, verify_amendment};
use tollgate_receipt::{timestamp_from_unix, unix_now};

use super::RunManager;
use crate::error::AmendError;
use crate::gateway::fs::FsGrant;
use crate::gateway::RunGateway;
use crate::COMPONENT;

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
        let gate = &gateway.gate;
        let now = unix_now();
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
                let grants = gateway.fs.grants.current();
                let mut unmount = Vec::new();
                for path in &narrow.drop_fs {
                    if !grants.iter().any(|g| g.path == *path) {
                        return Err(AmendError::NotANarrowing(format!(
                            "drop_fs {path:?}: the run has no grant of that path"
                        )));
                    }
                    if let Some(target) = mount_of(&gate.receipt, path) {
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
                    .meta("expires_at", new_expiry.unwrap_or(0));
                let (run, live) = (gateway.clone(), live.clone());
                let apply = move || {
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
                        run.gate.expires_at.store(new, Ordering::SeqCst);
                        live.set_expiry(new);
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
                // Pinned now, as a run's grants are at its start: no link followed.
                let added: Vec<Arc<FsGrant>> = amendment
                    .add_fs
                    .iter()
                    .map(|g| {
                        let mut grant =
                            FsGrant::open(&g.path, g.access == pb::FsAccess::Write as i32, g.ask);
                        grant.amended = true;
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
                    .meta("expires_at", new_expiry.unwrap_or(0));
                let (run, live) = (gateway.clone(), live.clone());
                let apply = move || {
                    if !added.is_empty() {
                        run.fs
                            .grants
                            .change(|grants| grants.iter().cloned().chain(added).collect());
                    }
                    // Only ever up: an older amendment applied late never lowers a newer one.
                    if amendment.tool_calls != 0 {
                        run.gate
                            .max_calls
                            .fetch_max(amendment.tool_calls, Ordering::SeqCst);
                    }
                    if let Some(new) = new_expiry {
                        if run.gate.expires_at.fetch_max(new, Ordering::SeqCst) < new {
                            live.set_expiry(new);
                        }
                    }
                };
                (entry, Box::new(apply))
            }
        };
        // On disk before the run's powers change.
        self.audit.append(entry)?;
        apply();
        Ok(envelope(&gateway))
    }
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
fn envelope(gateway: &RunGateway) -> pb::AmendRunResponse {
    let receipt = &gateway.gate.receipt;
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
                    .find(|r| r.path == g.path && !g.amended)
                    .map(|r| r.mount.clone())
                    .unwrap_or_default(),
                exec: false,
                ask: g.ask,
            })
            .collect(),
        tool_calls: gateway.gate.max_calls(),
        expires_at: Some(timestamp_from_unix(gateway.gate.expires_at())),
    }
}
