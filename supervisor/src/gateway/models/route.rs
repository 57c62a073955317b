//! Where a call goes, judged on everything that leaves: the texts of [`super::outbound`]
//! classified together, the call's images rated high (their pixels cannot be read), the
//! route picked by `tollgate_router::decide` and, on a route that redacts, the texts put
//! back as that route sends them (JSON fields kept valid JSON).

use tollgate_audit::MetaValue;
use tollgate_proto::v1 as pb;
use tollgate_router::config::{RouteKind, Routes};
use tollgate_router::decide::{decide, Choice, Finding, NoRoute, Requested};
use tollgate_router::{Classifier, Sensitivity};

use super::outbound::{self, Kind};

/// The detector name of the finding an image makes.
pub(super) const IMAGE_FINDING: &str = "image";

/// A call routed: the route chosen, and the call as it will be sent.
pub(super) struct Routed<'a> {
    /// The choice (route, classification, redaction).
    pub(super) choice: Choice<'a>,
    /// The call as it leaves: redacted where the route redacts.
    pub(super) sent: pb::CompleteRequest,
    /// Bytes of text the call carries (what an operator asked to approve is told).
    pub(super) bytes: u64,
}

/// Routes `call` (already checked by [`outbound::normalise`]) under `receipt`.
pub(super) fn route<'a>(
    receipt: &pb::Receipt,
    routes: &'a Routes,
    classifier: &Classifier,
    requested: &Requested,
    force_local: bool,
    call: pb::CompleteRequest,
) -> Result<Routed<'a>, RouteRefusal> {
    let texts = outbound::texts(&call);
    let strs: Vec<&str> = texts.iter().map(|(_, t)| t.as_str()).collect();
    let bytes = strs.iter().map(|t| t.len() as u64).sum();
    let choice = match outbound::first_image(&call) {
        None => decide(receipt, routes, classifier, requested, force_local, &strs),
        Some(message) => decide_with_image(
            receipt,
            routes,
            classifier,
            requested,
            force_local,
            &strs,
            message,
        ),
    }
    .map_err(RouteRefusal::NoRoute)?;
    let mut sent = call;
    if let Some(redacted) = &choice.redacted {
        let mut out = Vec::with_capacity(texts.len());
        for ((kind, original), redacted) in texts.iter().zip(&redacted.messages) {
            if *kind != Kind::Json || original == redacted {
                out.push(redacted.clone());
                continue;
            }
            let kept = outbound::redacted_json(classifier, original, redacted.clone());
            // Redacted string by string, the field must be no more sensitive than what
            // the route was judged on.
            if classifier.classify(&kept).sensitivity > choice.sent_sensitivity() {
                return Err(RouteRefusal::Unredactable);
            }
            out.push(kept);
        }
        outbound::apply(&mut sent, out);
    }
    Ok(Routed {
        choice,
        sent,
        bytes,
    })
}

/// Why a call could not be routed.
pub(super) enum RouteRefusal {
    /// No granted route may carry it.
    NoRoute(NoRoute),
    /// A redacted JSON field could not be kept valid JSON without what the route may not
    /// carry.
    Unredactable,
}

/// A call with an image is rated high (finding `image` in the message that carries it):
/// only a route whose ceiling is high may carry it. The other grants are withheld from the
/// decision and their reasons say why.
fn decide_with_image<'a>(
    receipt: &pb::Receipt,
    routes: &'a Routes,
    classifier: &Classifier,
    requested: &Requested,
    force_local: bool,
    texts: &[&str],
    message: usize,
) -> Result<Choice<'a>, NoRoute> {
    let mut narrowed = receipt.clone();
    let mut withheld = Vec::new();
    for grant in &mut narrowed.routes {
        let granted = pb::Sensitivity::try_from(grant.max_sensitivity)
            .unwrap_or(pb::Sensitivity::Unspecified);
        let capped = routes
            .get(&grant.name)
            .and_then(|route| route.max_sensitivity)
            .is_some_and(|cap| cap < Sensitivity::High);
        if granted == pb::Sensitivity::High && !capped {
            continue;
        }
        let ceiling = match granted {
            pb::Sensitivity::Low => "low",
            pb::Sensitivity::Medium => "medium",
            pb::Sensitivity::High => "less than high",
            _ => "no",
        };
        withheld.push((grant.name.clone(), ceiling));
        grant.max_sensitivity = pb::Sensitivity::Unspecified as i32;
    }
    let image = Finding {
        message,
        detector: IMAGE_FINDING.into(),
        sensitivity: Sensitivity::High,
        span: 0..0,
    };
    match decide(&narrowed, routes, classifier, requested, force_local, texts) {
        Ok(mut choice) => {
            choice.assessment.sensitivity = Sensitivity::High;
            choice.assessment.findings.insert(0, image);
            if let Some(redacted) = &mut choice.redacted {
                redacted.sensitivity = Sensitivity::High;
            }
            Ok(choice)
        }
        Err(mut no_route) => {
            no_route.assessment.sensitivity = Sensitivity::High;
            no_route.assessment.findings.insert(0, image);
            for (name, why) in &mut no_route.refused {
                if let Some((_, ceiling)) = withheld.iter().find(|(n, _)| n == name) {
                    *why = format!(
                        "carries up to {ceiling} text, and this call carries an image (rated high: its pixels cannot be classified)"
                    );
                }
            }
            Err(no_route)
        }
    }
}

/// The `route_decision` entry's metadata for an allowed call: route, sensitivities,
/// findings (never the text), redactions, the completion cap and the tools offered.
pub(super) fn decision_meta(
    choice: &Choice<'_>,
    force_local: bool,
    max_tokens: u32,
    call: &pb::CompleteRequest,
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
        ("tools", (call.tools.len() as i64).into()),
        (
            "tool_calls_sent",
            (outbound::tool_calls_in(call) as i64).into(),
        ),
    ]
}
