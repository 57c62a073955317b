//! Where one model call may go: the route it names, or for `auto` the most capable route
//! that may carry its text.
//!
//! A route may carry a call when (1) the receipt grants it and this supervisor configures
//! it, (2) it is not a cloud route while only local routes may be used (`force_local`: the
//! supervisor's policy or the caller's own request), and (3) the text's sensitivity is at
//! most the route's ceiling: the receipt grant's `max_sensitivity`, lowered by the route's own
//! `max_sensitivity` in the supervisor's configuration. An unspecified grant carries nothing.
//! A route that redacts is judged on the text as it would be sent: detected spans replaced,
//! then classified again.
//!
//! A call that names a model a granted route claims prefers that route: it takes it when the
//! route may carry the text, else whatever `auto` would choose.
//!
//! `auto` tries cloud routes before local ones (the most capable first: a cloud model for
//! what may leave the host, a local one otherwise) and, within a kind, the configuration's
//! order. Pure: no I/O.

use std::fmt::Write as _;
use std::ops::Range;

use tollgate_proto::v1 as pb;

use crate::config::{Route, RouteKind, Routes};
use crate::{Classification, Classifier, Sensitivity};

/// A grant's `max_sensitivity` from the protocol enum; `None` for UNSPECIFIED or unknown
/// values. Here rather than on [`Sensitivity`], which knows nothing of the wire protocol.
fn sensitivity_from_proto(value: i32) -> Option<Sensitivity> {
    match pb::Sensitivity::try_from(value) {
        Ok(pb::Sensitivity::Low) => Some(Sensitivity::Low),
        Ok(pb::Sensitivity::Medium) => Some(Sensitivity::Medium),
        Ok(pb::Sensitivity::High) => Some(Sensitivity::High),
        _ => None,
    }
}

/// The route a call asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requested {
    /// Let the router choose (`auto`, no name, or a name no granted route claims).
    Auto,
    /// This route, strictly: the call is refused when it may not carry the text.
    Named(String),
    /// This route when it may carry the text, else what [`Requested::Auto`] would choose: the
    /// call asked for a model name the route claims.
    Prefer(String),
}

impl Requested {
    /// What a call asking for `name` (a route's name, a model name, or `auto`) under
    /// `receipt` asks for: `""` and `"auto"` are [`Requested::Auto`]; a route's exact name
    /// (one this supervisor has, or one the receipt grants) is [`Requested::Named`]; a name
    /// that a granted route claims (its `model`, or one of its `models` patterns; the first
    /// such route in the routes file) is [`Requested::Prefer`] that route; any other name is
    /// [`Requested::Auto`]. A name is never refused for itself.
    pub fn resolve(name: &str, routes: &Routes, receipt: &pb::Receipt) -> Self {
        if name.is_empty() || name == "auto" {
            return Self::Auto;
        }
        let granted = |route: &str| receipt.routes.iter().any(|g| g.name == route);
        if routes.get(name).is_some() || granted(name) {
            return Self::Named(name.to_owned());
        }
        routes
            .routes
            .iter()
            .find(|route| granted(&route.name) && route.claims(name))
            .map_or(Self::Auto, |route| Self::Prefer(route.name.clone()))
    }
}

/// One finding in one message: detector, sensitivity and byte span, never the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Which message (0-based).
    pub message: usize,
    /// The detector that fired.
    pub detector: String,
    /// Its sensitivity.
    pub sensitivity: Sensitivity,
    /// Byte span in that message.
    pub span: Range<usize>,
}

impl Finding {
    /// `github_token@1:120..160`: compact, for audit metadata and gRPC metadata.
    pub fn compact(&self) -> String {
        format!(
            "{}@{}:{}..{}",
            self.detector, self.message, self.span.start, self.span.end
        )
    }
}

/// What a call's text is, as classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assessment {
    /// The highest sensitivity over all messages.
    pub sensitivity: Sensitivity,
    /// Every finding, message by message.
    pub findings: Vec<Finding>,
    classifications: Vec<Classification>,
}

impl Assessment {
    /// Classifies each message on its own (so no finding straddles two).
    pub fn of(classifier: &Classifier, messages: &[&str]) -> Self {
        let classifications: Vec<Classification> =
            messages.iter().map(|m| classifier.classify(m)).collect();
        let findings = classifications
            .iter()
            .enumerate()
            .flat_map(|(message, c)| {
                c.reasons.iter().map(move |r| Finding {
                    message,
                    detector: r.detector.as_str().to_owned(),
                    sensitivity: r.sensitivity,
                    span: r.span.clone(),
                })
            })
            .collect();
        let sensitivity = classifications
            .iter()
            .map(|c| c.sensitivity)
            .max()
            .unwrap_or(Sensitivity::Low);
        Self {
            sensitivity,
            findings,
            classifications,
        }
    }

    /// The findings in words: `github_token in message 1 at bytes 120..160; ...`.
    pub fn findings_text(&self) -> String {
        let mut text = String::new();
        for (i, f) in self.findings.iter().enumerate() {
            if i > 0 {
                text.push_str("; ");
            }
            let _ = write!(
                text,
                "{} in message {} at bytes {}..{}",
                f.detector, f.message, f.span.start, f.span.end
            );
        }
        text
    }
}

/// The messages as a redacting route would send them, and how sensitive they still are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redacted {
    /// Each message with its findings replaced by `[REDACTED:<detector>]`.
    pub messages: Vec<String>,
    /// The redacted text's sensitivity (classified again).
    pub sensitivity: Sensitivity,
    /// How many spans were replaced.
    pub spans: usize,
}

fn redact(classifier: &Classifier, messages: &[&str], assessment: &Assessment) -> Redacted {
    let redacted: Vec<String> = messages
        .iter()
        .zip(&assessment.classifications)
        .map(|(text, c)| c.redact(text))
        .collect();
    let again: Vec<&str> = redacted.iter().map(String::as_str).collect();
    Redacted {
        sensitivity: Assessment::of(classifier, &again).sensitivity,
        spans: assessment.findings.len(),
        messages: redacted,
    }
}

/// The route chosen for a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice<'a> {
    /// The route.
    pub route: &'a Route,
    /// The text as classified.
    pub assessment: Assessment,
    /// When the route redacts: what is sent instead.
    pub redacted: Option<Redacted>,
}

impl Choice<'_> {
    /// The sensitivity of what is sent.
    pub fn sent_sensitivity(&self) -> Sensitivity {
        self.redacted
            .as_ref()
            .map_or(self.assessment.sensitivity, |r| r.sensitivity)
    }
}

/// Why no route may carry a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoRoute {
    /// The receipt.
    pub receipt_id: String,
    /// The text as classified.
    pub assessment: Assessment,
    /// Each route considered and why it may not carry the text.
    pub refused: Vec<(String, String)>,
}

impl std::fmt::Display for NoRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "receipt {}: no granted route may carry this text (sensitivity {}",
            self.receipt_id,
            self.assessment.sensitivity.name()
        )?;
        if !self.assessment.findings.is_empty() {
            write!(f, ": {}", self.assessment.findings_text())?;
        }
        f.write_str(")")?;
        if self.refused.is_empty() {
            f.write_str("; the receipt grants no route this supervisor has")?;
        }
        for (route, why) in &self.refused {
            write!(f, "; {route}: {why}")?;
        }
        Ok(())
    }
}

/// Picks the route for a call of `messages` under `receipt`.
pub fn decide<'a>(
    receipt: &pb::Receipt,
    routes: &'a Routes,
    classifier: &Classifier,
    requested: &Requested,
    force_local: bool,
    messages: &[&str],
) -> Result<Choice<'a>, NoRoute> {
    let assessment = Assessment::of(classifier, messages);
    let mut redacted: Option<Redacted> = None;
    let mut refused = Vec::new();
    let auto = || {
        let granted = |route: &&Route| receipt.routes.iter().any(|g| g.name == route.name);
        let cloud = routes
            .routes
            .iter()
            .filter(|r| r.kind == RouteKind::Cloud)
            .filter(granted);
        let local = routes
            .routes
            .iter()
            .filter(|r| r.kind == RouteKind::Local)
            .filter(granted);
        cloud.chain(local).map(|r| r.name.as_str())
    };
    let candidates: Vec<&str> = match requested {
        Requested::Named(name) => vec![name.as_str()],
        Requested::Auto => auto().collect(),
        // The preferred route first, then the others in `auto`'s order.
        Requested::Prefer(name) => std::iter::once(name.as_str())
            .chain(auto().filter(|r| *r != name.as_str()))
            .collect(),
    };
    for name in candidates {
        let grant = receipt.routes.iter().find(|g| g.name == name);
        let Some(grant) = grant else {
            refused.push((name.to_owned(), "not granted by the receipt".to_owned()));
            continue;
        };
        let Some(route) = routes.get(name) else {
            refused.push((
                name.to_owned(),
                "granted, but this supervisor has no such route".to_owned(),
            ));
            continue;
        };
        if force_local && route.kind == RouteKind::Cloud {
            refused.push((
                name.to_owned(),
                "a cloud route, and only local routes may be used".to_owned(),
            ));
            continue;
        }
        let Some(granted) = sensitivity_from_proto(grant.max_sensitivity) else {
            refused.push((
                name.to_owned(),
                "the grant names no sensitivity, so it carries nothing".to_owned(),
            ));
            continue;
        };
        let ceiling = route
            .max_sensitivity
            .map_or(granted, |cap| cap.min(granted));
        let sent = if route.redact {
            redacted
                .get_or_insert_with(|| redact(classifier, messages, &assessment))
                .sensitivity
        } else {
            assessment.sensitivity
        };
        if sent <= ceiling {
            return Ok(Choice {
                route,
                redacted: route.redact.then(|| redacted.clone()).flatten(),
                assessment,
            });
        }
        let why = if route.redact {
            format!(
                "carries up to {} text, and this text is {} even redacted",
                ceiling.name(),
                sent.name()
            )
        } else {
            format!(
                "carries up to {} text, and this text is {}",
                ceiling.name(),
                sent.name()
            )
        };
        refused.push((name.to_owned(), why));
    }
    Err(NoRoute {
        receipt_id: receipt.receipt_id.clone(),
        assessment,
        refused,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ClassifierConfig;

    const ROUTES: &str = r#"
        [[route]]
        name = "local"
        kind = "local"
        preset = "vllm"
        endpoint = "http://127.0.0.1:8000"
        model = "qwen"

        [[route]]
        name = "claude"
        kind = "cloud"
        api = "anthropic"
        endpoint = "https://api.anthropic.com"
        model = "claude"
        key_secret = "env:K"
        models = ["claude-*"]

        [[route]]
        name = "gpt"
        kind = "cloud"
        api = "openai"
        endpoint = "https://api.openai.com"
        model = "gpt"
        key_secret = "env:K"
        max_sensitivity = "low"
        models = ["gpt-*", "o*-mini"]

        [[route]]
        name = "scrubbed"
        kind = "cloud"
        api = "openai"
        endpoint = "https://api.openai.com"
        model = "gpt"
        key_secret = "env:K"
        redact = true
    "#;

    // Made at run time so no scanner mistakes the source for a leak.
    fn secret_text() -> String {
        format!(
            "deploy with token {}{}",
            "ghp_", "q7Lm2Xv9Rt4Kp8Ws3Yb6Nc1Zd5Hf0Ja2Ue7Io9"
        )
    }

    fn receipt(grants: &[(&str, pb::Sensitivity)]) -> pb::Receipt {
        pb::Receipt {
            receipt_id: "r1".into(),
            routes: grants
                .iter()
                .map(|(name, s)| pb::RouteGrant {
                    name: (*name).into(),
                    max_sensitivity: *s as i32,
                    ask: false,
                })
                .collect(),
            ..Default::default()
        }
    }

    fn setup() -> (Routes, Classifier) {
        (
            Routes::parse(ROUTES, "routes.toml").unwrap(),
            Classifier::new(&ClassifierConfig::default()).unwrap(),
        )
    }

    fn pick(
        receipt: &pb::Receipt,
        requested: Requested,
        force_local: bool,
        text: &str,
    ) -> Result<String, String> {
        let (routes, classifier) = setup();
        decide(
            receipt,
            &routes,
            &classifier,
            &requested,
            force_local,
            &["be brief", text],
        )
        .map(|c| c.route.name.clone())
        .map_err(|e| e.to_string())
    }

    #[test]
    fn auto_sends_low_text_to_a_granted_cloud_route_and_secrets_to_local() {
        use pb::Sensitivity::{High, Low};
        let r = receipt(&[("local", High), ("claude", Low)]);
        assert_eq!(
            pick(&r, Requested::Auto, false, "summarise this").unwrap(),
            "claude"
        );
        assert_eq!(
            pick(&r, Requested::Auto, false, &secret_text()).unwrap(),
            "local"
        );
        // Only local granted: local even for low text.
        let r = receipt(&[("local", High)]);
        assert_eq!(pick(&r, Requested::Auto, false, "hi").unwrap(), "local");
    }

    #[test]
    fn named_routes_must_be_granted_and_able_to_carry_the_text() {
        use pb::Sensitivity::{High, Low};
        let r = receipt(&[("local", High), ("claude", Low)]);
        assert_eq!(
            pick(&r, Requested::Named("local".into()), false, "hi").unwrap(),
            "local"
        );
        let not_granted = pick(&r, Requested::Named("gpt".into()), false, "hi").unwrap_err();
        assert!(
            not_granted.contains("gpt: not granted by the receipt"),
            "{not_granted}"
        );
        let too_sensitive =
            pick(&r, Requested::Named("claude".into()), false, &secret_text()).unwrap_err();
        assert!(
            too_sensitive.contains("sensitivity high: github_token in message 1 at bytes 18..60")
                && too_sensitive.contains("claude: carries up to low text, and this text is high"),
            "{too_sensitive}"
        );
        assert!(!too_sensitive.contains("ghp_"), "never the text");
        let unknown = receipt(&[("nowhere", High)]);
        let unknown = pick(&unknown, Requested::Named("nowhere".into()), false, "hi").unwrap_err();
        assert!(unknown.contains("no such route"), "{unknown}");
    }

    #[test]
    fn force_local_never_picks_cloud() {
        use pb::Sensitivity::{High, Low};
        let r = receipt(&[("local", High), ("claude", Low)]);
        assert_eq!(pick(&r, Requested::Auto, true, "hi").unwrap(), "local");
        let refused = pick(&r, Requested::Named("claude".into()), true, "hi").unwrap_err();
        assert!(
            refused.contains("only local routes may be used"),
            "{refused}"
        );
        let cloud_only = receipt(&[("claude", Low)]);
        assert!(pick(&cloud_only, Requested::Auto, true, "hi").is_err());
    }

    #[test]
    fn the_host_cap_and_unspecified_grants_narrow_what_a_route_carries() {
        use pb::Sensitivity::{Medium, Unspecified};
        // gpt is capped at low by the host, whatever the receipt grants.
        let r = receipt(&[("gpt", Medium)]);
        let refused = pick(&r, Requested::Auto, false, "ask db01.corp").unwrap_err();
        assert!(
            refused.contains("gpt: carries up to low text, and this text is medium"),
            "{refused}"
        );
        let r = receipt(&[("local", Unspecified)]);
        let refused = pick(&r, Requested::Auto, false, "hi").unwrap_err();
        assert!(refused.contains("carries nothing"), "{refused}");
        let none = pick(&receipt(&[]), Requested::Auto, false, "hi").unwrap_err();
        assert!(none.contains("the receipt grants no route"), "{none}");
    }

    #[test]
    fn a_redacting_route_is_judged_on_what_it_sends() {
        let (routes, classifier) = setup();
        let r = receipt(&[("scrubbed", pb::Sensitivity::Low)]);
        let text = secret_text();
        let choice = decide(
            &r,
            &routes,
            &classifier,
            &Requested::Auto,
            false,
            &["x", &text],
        )
        .unwrap();
        assert_eq!(choice.route.name, "scrubbed");
        assert_eq!(choice.assessment.sensitivity, Sensitivity::High);
        let redacted = choice.redacted.as_ref().unwrap();
        assert_eq!(
            redacted.messages[1],
            "deploy with token [REDACTED:github_token]"
        );
        assert_eq!(choice.sent_sensitivity(), Sensitivity::Low);
        assert_eq!(
            choice.assessment.findings[0].compact(),
            "github_token@1:18..60"
        );
    }

    fn resolve(name: &str, r: &pb::Receipt) -> Requested {
        let (routes, _) = setup();
        Requested::resolve(name, &routes, r)
    }

    #[test]
    fn model_names_resolve_to_the_route_that_claims_them() {
        use pb::Sensitivity::{High, Low};
        let r = receipt(&[("local", High), ("claude", Low), ("gpt", Low)]);
        assert_eq!(resolve("", &r), Requested::Auto);
        assert_eq!(resolve("auto", &r), Requested::Auto);
        // A route's own name stays strict, granted or not.
        assert_eq!(resolve("local", &r), Requested::Named("local".into()));
        assert_eq!(resolve("scrubbed", &r), Requested::Named("scrubbed".into()));
        // Its model, or a name its patterns match: preferred.
        assert_eq!(resolve("qwen", &r), Requested::Prefer("local".into()));
        assert_eq!(
            resolve("claude-sonnet-4-5-20250929", &r),
            Requested::Prefer("claude".into())
        );
        assert_eq!(resolve("gpt-4.1", &r), Requested::Prefer("gpt".into()));
        assert_eq!(resolve("o4-mini", &r), Requested::Prefer("gpt".into()));
        // Names nothing granted claims go where auto would: never refused for themselves.
        assert_eq!(resolve("llama-3", &r), Requested::Auto);
        let only_local = receipt(&[("local", High)]);
        assert_eq!(resolve("gpt-4.1", &only_local), Requested::Auto);
    }

    #[test]
    fn a_preferred_route_carries_what_it_may_and_auto_picks_the_rest() {
        use pb::Sensitivity::{High, Low};
        let r = receipt(&[("local", High), ("claude", Low), ("gpt", Low)]);
        let prefer = |name: &str| Requested::Prefer(name.into());
        // Auto alone would take claude (first cloud route); the name asks for gpt.
        assert_eq!(pick(&r, Requested::Auto, false, "hi").unwrap(), "claude");
        assert_eq!(pick(&r, prefer("gpt"), false, "hi").unwrap(), "gpt");
        // A local model asked for by name: local, even for text cloud routes may carry.
        assert_eq!(pick(&r, prefer("local"), false, "hi").unwrap(), "local");
        // Text the preferred route may not carry: what auto would choose.
        assert_eq!(
            pick(&r, prefer("gpt"), false, &secret_text()).unwrap(),
            "local"
        );
        assert_eq!(pick(&r, prefer("gpt"), true, "hi").unwrap(), "local");
        // Nothing may carry it: each route's reason, the preferred one once.
        let r = receipt(&[("claude", Low), ("gpt", Low)]);
        let refused = pick(&r, prefer("gpt"), false, &secret_text()).unwrap_err();
        assert_eq!(
            refused.matches("gpt: carries up to low").count(),
            1,
            "{refused}"
        );
        assert!(refused.contains("claude: carries up to low"), "{refused}");
    }
}
