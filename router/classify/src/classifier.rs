//! The classifier: configuration, the single-pass scan, and redaction.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use regex_automata::meta;
use regex_automata::{Anchored, Input, MatchKind, PatternID};

use crate::detectors::{self, Builtin, Check, Source, BUILTINS, HIGH_ENTROPY};
use crate::patterns::{ascii_word_boundaries, first_bytes, value_group_index, ByteSet, Firsts};
use crate::{checks, entropy, escapes, Sensitivity};

/// Default internal-hostname suffixes.
pub const DEFAULT_INTERNAL_SUFFIXES: &[&str] = &[
    "internal",
    "corp",
    "local",
    "lan",
    "intranet",
    "home.arpa",
    "consul",
];

/// Default entropy threshold for the high-entropy fallback, in bits per byte.
pub const DEFAULT_ENTROPY_THRESHOLD: f64 = 4.0;

/// Default minimum length of a token the high-entropy fallback looks at.
pub const DEFAULT_ENTROPY_MIN_LEN: usize = 24;

/// A failed candidate shorter than this is rescanned from its next byte, so a pattern that
/// starts inside it is still found; a longer one is skipped whole, which bounds the rescanning
/// an adversarial input can cause.
const RESCAN_LIMIT: usize = 256;

/// The detector of the APIs' own ids (tool calls, completions, messages): harmless, but what
/// an id's body holds is judged (see `Classifier::inside_id`).
const API_ID: &str = "api_id";

/// How near `"private_key"` must be to `"type": "service_account"`, in bytes either side.
const GCP_WINDOW: usize = 8 * 1024;

/// How a [`Classifier`] is built.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassifierConfig {
    /// Host-name suffixes that mark internal hosts, without the leading dot (`corp`,
    /// `svc.cluster.local`). Empty turns the internal-hostname detector off.
    pub internal_suffixes: Vec<String>,
    /// Operator-defined patterns, tried after the built-ins and before the entropy fallback.
    pub custom: Vec<CustomPattern>,
    /// Shannon entropy, in bits per byte, a token must reach for the entropy fallback.
    pub entropy_threshold: f64,
    /// Shortest token the entropy fallback looks at, 16-64. The automaton grows with the
    /// square of this length.
    pub entropy_min_len: usize,
    /// Sensitivity the entropy fallback reports.
    pub entropy_sensitivity: Sensitivity,
    /// Built-in detector ids to leave out (see [`Classifier::builtin_detectors`]).
    pub disabled: Vec<String>,
    /// The sensitivity a detector reports, by id (built-in, `high_entropy` or a custom
    /// pattern's), where it differs from the default: an organisation that rates email
    /// addresses medium says `email = Medium` here.
    pub levels: std::collections::BTreeMap<String, Sensitivity>,
}

impl Default for ClassifierConfig {
    fn default() -> Self {
        Self {
            internal_suffixes: DEFAULT_INTERNAL_SUFFIXES
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
            custom: Vec::new(),
            entropy_threshold: DEFAULT_ENTROPY_THRESHOLD,
            entropy_min_len: DEFAULT_ENTROPY_MIN_LEN,
            entropy_sensitivity: Sensitivity::High,
            disabled: Vec::new(),
            levels: std::collections::BTreeMap::new(),
        }
    }
}

/// An operator-defined detector.
///
/// The regex uses the syntax of the `regex` crate. `\b` and `\B` are ASCII word boundaries
/// here, so the scan stays on the fast path for non-ASCII text. If the pattern has a capture
/// group named `value`, only that group is reported and redacted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CustomPattern {
    /// Detector id used in reasons and redaction markers: 1-64 bytes of `[A-Za-z0-9_.-]`,
    /// distinct from the built-in ids.
    pub id: String,
    /// The pattern.
    pub regex: String,
    /// Sensitivity of a match.
    pub sensitivity: Sensitivity,
}

/// Why a [`ClassifierConfig`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A custom pattern does not parse.
    #[error("custom pattern {id:?} is not a valid regex: {source}")]
    BadPattern {
        /// The pattern's id.
        id: String,
        /// The parser's error, which points at the offending part of the pattern.
        #[source]
        source: Box<regex_syntax::Error>,
    },
    /// A custom pattern can match the empty string, which would match everywhere.
    #[error("custom pattern {id:?} can match the empty string")]
    MatchesEmpty {
        /// The pattern's id.
        id: String,
    },
    /// A custom id is empty, too long, or has characters outside `[A-Za-z0-9_.-]`.
    #[error("custom pattern id {id:?} must be 1-64 characters of [A-Za-z0-9_.-]")]
    BadId {
        /// The id.
        id: String,
    },
    /// Two detectors share an id (custom ids must also differ from the built-ins).
    #[error("detector id {id:?} is used twice")]
    DuplicateId {
        /// The id.
        id: String,
    },
    /// An internal suffix is not a host-name suffix.
    #[error("internal suffix {suffix:?} must be dot-separated labels of [a-z0-9-]")]
    BadSuffix {
        /// The suffix.
        suffix: String,
    },
    /// `disabled` names a detector that does not exist.
    #[error("no built-in detector is called {id:?}")]
    UnknownDetector {
        /// The id.
        id: String,
    },
    /// The entropy settings are out of range.
    #[error("entropy_threshold must be within 0..=8 and entropy_min_len within 16..=64")]
    BadEntropy,
    /// The combined automaton could not be built (size limits).
    #[error("the detectors could not be compiled together: {0}")]
    Build(#[source] Box<meta::BuildError>),
}

/// A detector's id: a built-in name such as `credit_card`, or a custom pattern's id.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DetectorId(Arc<str>);

impl DetectorId {
    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for DetectorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for DetectorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<str> for DetectorId {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for DetectorId {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

/// One finding: which detector, how sensitive, and where. It never carries the text itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reason {
    /// The detector that fired.
    pub detector: DetectorId,
    /// What it found, in a few words ("email address", "internal host").
    pub description: &'static str,
    /// The detector's sensitivity.
    pub sensitivity: Sensitivity,
    /// Byte range in the classified text; always on `char` boundaries.
    pub span: Range<usize>,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}, {}) at bytes {}..{}",
            self.description,
            self.detector,
            self.sensitivity.name(),
            self.span.start,
            self.span.end
        )
    }
}

/// The result of classifying a text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classification {
    /// The highest sensitivity among the reasons; `Low` when there are none.
    pub sensitivity: Sensitivity,
    /// Findings in text order; their spans do not overlap.
    pub reasons: Vec<Reason>,
}

impl Classification {
    /// `text` with every reason's span replaced by `[REDACTED:<detector>]`.
    ///
    /// `text` must be the text this classification came from. If a span does not fit it (out
    /// of range or off a `char` boundary) the whole text is replaced, failing closed.
    pub fn redact(&self, text: &str) -> String {
        let mut spans: Vec<&Reason> = self.reasons.iter().collect();
        spans.sort_by_key(|r| (r.span.start, r.span.end));
        let mut out = String::with_capacity(text.len());
        let mut at = 0;
        for r in spans {
            let Range { start, end } = r.span;
            if end > text.len() || !text.is_char_boundary(start) || !text.is_char_boundary(end) {
                return "[REDACTED:mismatch]".to_owned();
            }
            if end <= at {
                continue;
            }
            // Overlaps never come out of the classifier, but merge them rather than leak.
            let start = start.max(at);
            out.push_str(&text[at..start]);
            out.push_str("[REDACTED:");
            out.push_str(r.detector.as_str());
            out.push(']');
            at = end;
        }
        out.push_str(&text[at..]);
        out
    }
}

/// A compiled detector.
#[derive(Debug)]
struct Detector {
    id: DetectorId,
    description: &'static str,
    sensitivity: Sensitivity,
    check: Check,
    /// Index of the `value` capture group within the pattern, if it has one.
    value_group: Option<usize>,
    /// Bytes a match can start with (conservative), so retries skip hopeless patterns.
    first_bytes: ByteSet,
}

/// Classifies text for sensitive content. Build once, share freely (`Send + Sync`).
///
/// See the crate documentation for the detectors and how the scan works.
#[derive(Debug)]
pub struct Classifier {
    regex: meta::Regex,
    detectors: Vec<Detector>,
    /// Whether no pattern can start inside a run of ASCII word bytes unless the run starts
    /// there: every pattern begins with `\b` or with a non-word byte. Then a rejected
    /// candidate lets the scan skip the rest of its word.
    skip_words: bool,
    entropy_min_len: usize,
    entropy_threshold: f64,
    /// The internal labels and suffixes, lower case.
    internal_suffixes: Vec<String>,
}

impl Classifier {
    /// Compiles the built-in detectors and `config`'s custom patterns into one automaton.
    pub fn new(config: &ClassifierConfig) -> Result<Self, ConfigError> {
        if !(0.0..=8.0).contains(&config.entropy_threshold)
            || !(16..=64).contains(&config.entropy_min_len)
        {
            return Err(ConfigError::BadEntropy);
        }
        for id in &config.disabled {
            if Self::builtin_detectors().all(|(b, _)| b != id) {
                return Err(ConfigError::UnknownDetector { id: id.clone() });
            }
        }
        for id in config.levels.keys() {
            let known = Self::builtin_detectors().any(|(b, _)| b == id)
                || config.custom.iter().any(|c| &c.id == id);
            if !known {
                return Err(ConfigError::UnknownDetector { id: id.clone() });
            }
        }
        let level =
            |id: &str, default: Sensitivity| config.levels.get(id).copied().unwrap_or(default);
        let suffixes = normalise_suffixes(&config.internal_suffixes)?;
        let enabled = |b: &Builtin| !config.disabled.iter().any(|d| d == b.id);

        let mut hirs = Vec::new();
        let mut detectors = Vec::new();
        let mut mid_word_starts = false;
        let mut add = |id: &str, sensitivity, check, pattern: &str| -> Result<(), ConfigError> {
            if detectors.iter().any(|d: &Detector| d.id == id) {
                return Err(ConfigError::DuplicateId { id: id.to_owned() });
            }
            let hir = regex_syntax::ParserBuilder::new()
                .build()
                .parse(pattern)
                .map_err(|source| ConfigError::BadPattern {
                    id: id.to_owned(),
                    source: Box::new(source),
                })?;
            if hir.properties().minimum_len().unwrap_or(0) == 0 {
                return Err(ConfigError::MatchesEmpty { id: id.to_owned() });
            }
            let value_group = value_group_index(&hir);
            let hir = ascii_word_boundaries(&hir);
            let mut firsts = Firsts::default();
            first_bytes(&hir, false, &mut firsts);
            hirs.push(hir);
            detectors.push(Detector {
                id: DetectorId(Arc::from(id)),
                description: detectors::description(id),
                sensitivity,
                check,
                value_group,
                first_bytes: firsts.any,
            });
            mid_word_starts |= firsts.unguarded.0.iter().enumerate().any(|(b, &x)| {
                x && u8::try_from(b).is_ok_and(|b| b.is_ascii_alphanumeric() || b == b'_')
            });
            Ok(())
        };

        for b in BUILTINS.iter().filter(|b| enabled(b)) {
            let pattern = match b.source {
                Source::Fixed(p) => p.to_owned(),
                Source::InternalHostname if suffixes.is_empty() => continue,
                Source::InternalHostname => detectors::internal_hostname_pattern(&suffixes),
                Source::HighEntropy => continue,
            };
            add(b.id, level(b.id, b.sensitivity), b.check, &pattern)?;
        }
        for c in &config.custom {
            let valid_id = (1..=64).contains(&c.id.len())
                && c.id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
            if !valid_id {
                return Err(ConfigError::BadId { id: c.id.clone() });
            }
            if Self::builtin_detectors().any(|(b, _)| b == c.id) {
                return Err(ConfigError::DuplicateId { id: c.id.clone() });
            }
            add(&c.id, level(&c.id, c.sensitivity), Check::None, &c.regex)?;
        }
        if enabled(&HIGH_ENTROPY) {
            add(
                HIGH_ENTROPY.id,
                level(HIGH_ENTROPY.id, config.entropy_sensitivity),
                HIGH_ENTROPY.check,
                &detectors::high_entropy_pattern(config.entropy_min_len),
            )?;
        }

        let regex = meta::Builder::new()
            .configure(
                meta::Config::new()
                    .match_kind(MatchKind::LeftmostFirst)
                    // Room for the many states a union of ~30 patterns visits, so the lazy
                    // DFA does not give up and fall back to a slower engine.
                    .hybrid_cache_capacity(16 * 1024 * 1024)
                    .nfa_size_limit(Some(64 * 1024 * 1024)),
            )
            .build_many_from_hir(&hirs)
            .map_err(|e| ConfigError::Build(Box::new(e)))?;
        Ok(Self {
            regex,
            detectors,
            skip_words: !mid_word_starts,
            entropy_min_len: config.entropy_min_len,
            entropy_threshold: config.entropy_threshold,
            internal_suffixes: suffixes.iter().map(|s| s.to_ascii_lowercase()).collect(),
        })
    }

    /// The built-in detectors, in priority order, with their default sensitivities.
    pub fn builtin_detectors() -> impl Iterator<Item = (&'static str, Sensitivity)> {
        BUILTINS
            .iter()
            .chain(std::iter::once(&HIGH_ENTROPY))
            .filter(|b| b.check != Check::Benign)
            .map(|b| (b.id, b.sensitivity))
    }

    /// What the detector `id` looks for, in a few words (for a custom pattern: "operator
    /// pattern").
    pub fn describe(id: &str) -> &'static str {
        detectors::description(id)
    }

    /// The detectors this classifier runs, in priority order.
    pub fn detectors(&self) -> impl Iterator<Item = (&DetectorId, Sensitivity)> {
        self.detectors
            .iter()
            .filter(|d| d.check != Check::Benign)
            .map(|d| (&d.id, d.sensitivity))
    }

    /// Classifies `text` in one pass.
    ///
    /// String escapes (`\n`, `\"`, `\\\"`, `\u0026`, `\/`) are read as what they stand for,
    /// so text carried in JSON, JSON inside JSON included, is classified as it reads; spans are
    /// still spans of `text`.
    pub fn classify(&self, text: &str) -> Classification {
        self.scan(&escapes::normalise(text))
    }

    /// The single pass over text whose escapes are already neutralised.
    fn scan(&self, text: &str) -> Classification {
        let mut reasons = Vec::new();
        let mut at = 0;
        while at < text.len() {
            let Some(m) = self.regex.search(&Input::new(text).range(at..)) else {
                break;
            };
            let start = m.start();
            let (mut pid, mut range) = (m.pattern().as_usize(), m.range());
            at = loop {
                if let Some((found, span)) = self.accept(pid, text, range.clone()) {
                    let d = &self.detectors[found];
                    let end = span.end.max(start + 1);
                    // A random-looking run that its context names an id, a digest or an
                    // encoded file is consumed whole, so no part of it is judged again.
                    let harmless = d.check == Check::Benign
                        || (d.check == Check::HighEntropy
                            && (entropy::labelled_not_secret(
                                text,
                                span.start,
                                &text[span.clone()],
                            ) || entropy::encoded_file(text, span.start, span.end)));
                    if !harmless {
                        reasons.push(Reason {
                            detector: d.id.clone(),
                            description: d.description,
                            sensitivity: d.sensitivity,
                            span,
                        });
                    } else if d.id.as_str() == API_ID {
                        reasons.extend(self.inside_id(text, span));
                    }
                    break end;
                }
                // The winner was a false candidate: give the lower-priority patterns their turn
                // at the same position.
                match self.next_anchored(text, start, pid + 1) {
                    Some((next, r)) => (pid, range) = (next, r),
                    None if m.len() > RESCAN_LIMIT => break m.end(),
                    None if self.skip_words => break end_of_word(text, start),
                    None => break next_char_boundary(text, start),
                }
            };
        }
        let sensitivity = reasons
            .iter()
            .map(|r| r.sensitivity)
            .max()
            .unwrap_or(Sensitivity::Low);
        Classification {
            sensitivity,
            reasons,
        }
    }

    /// What the body of an API's id (`chatcmpl-<body>`, `call_<body>`, `toolu_01<body>`)
    /// holds for the specific high-sensitivity detectors (keys and tokens of a known format).
    /// The id is consumed whole by the scan, so without this a key shaped to fit an id's
    /// pattern (`chatcmpl-AKIA…`) would pass unseen; the body is judged on its own (its
    /// prefix's `_` or `-` is where a key may start), the generic and entropy detectors left
    /// out: an id's body is random by nature.
    fn inside_id(&self, text: &str, id: Range<usize>) -> Vec<Reason> {
        let shown = &text[id.clone()];
        let body = shown.rfind(['_', '-']).map_or(0, |i| i + 1);
        let offset = id.start + body;
        self.scan(&shown[body..])
            .reasons
            .into_iter()
            .filter(|reason| {
                reason.sensitivity == Sensitivity::High
                    && self.detectors.iter().any(|d| {
                        d.id == reason.detector
                            && !matches!(
                                d.check,
                                Check::Assignment
                                    | Check::SecretValue
                                    | Check::Benign
                                    | Check::HighEntropy
                            )
                    })
            })
            .map(|reason| Reason {
                span: reason.span.start + offset..reason.span.end + offset,
                ..reason
            })
            .collect()
    }

    /// `text` with every detected span replaced by `[REDACTED:<detector>]`, or `None` when
    /// nothing was detected.
    pub fn redact(&self, text: &str) -> Option<String> {
        let classification = self.classify(text);
        (!classification.reasons.is_empty()).then(|| classification.redact(text))
    }

    /// The first pattern at or after `from` that matches anchored at `start`.
    fn next_anchored(
        &self,
        text: &str,
        start: usize,
        from: usize,
    ) -> Option<(usize, Range<usize>)> {
        let first = text.as_bytes()[start];
        (from..self.detectors.len()).find_map(|pid| {
            if !self.detectors[pid].first_bytes.contains(first) {
                return None;
            }
            let input = Input::new(text)
                .range(start..)
                .anchored(Anchored::Pattern(PatternID::new(pid).ok()?));
            self.regex.search(&input).map(|m| (pid, m.range()))
        })
    }

    /// Validates a candidate; returns the detector and span to report.
    fn accept(&self, pid: usize, text: &str, whole: Range<usize>) -> Option<(usize, Range<usize>)> {
        let span = self.validate(pid, text, whole)?;
        // A credential value that is itself a known format (`GITHUB_TOKEN=ghp_...`, a PEM key
        // in JSON, a JWT bearer token) is reported as that format, over the whole value.
        let generic = |check| {
            matches!(
                check,
                Check::Assignment | Check::SecretValue | Check::Benign | Check::HighEntropy
            )
        };
        let this = &self.detectors[pid];
        if matches!(this.check, Check::Assignment | Check::SecretValue) {
            let first = text.as_bytes()[span.start];
            let specific = (0..self.detectors.len()).find_map(|q| {
                let d = &self.detectors[q];
                // Never trade a finding for a less sensitive one.
                if generic(d.check)
                    || d.sensitivity < this.sensitivity
                    || !d.first_bytes.contains(first)
                {
                    return None;
                }
                let input = Input::new(text)
                    .span(span.clone())
                    .anchored(Anchored::Pattern(PatternID::new(q).ok()?));
                let m = self.regex.search(&input)?;
                self.validate(q, text, m.range()).map(|_| q)
            });
            if let Some(q) = specific {
                return Some((q, span));
            }
        }
        Some((pid, span))
    }

    /// Runs a candidate's validator; returns the span to report.
    fn validate(&self, pid: usize, text: &str, whole: Range<usize>) -> Option<Range<usize>> {
        let d = &self.detectors[pid];
        let span = match d.value_group {
            // A pattern whose alternatives do not all name a value reports the whole match.
            Some(group) => self
                .group_span(pid, group, text, whole.clone())
                .unwrap_or_else(|| whole.clone()),
            None => whole.clone(),
        };
        let candidate = &text[span.clone()];
        let bytes = text.as_bytes();
        let ok = match d.check {
            Check::None | Check::Benign => true,
            Check::GcpServiceAccount => {
                let lo = floor_char_boundary(text, whole.start.saturating_sub(GCP_WINDOW));
                let hi = floor_char_boundary(text, whole.end.saturating_add(GCP_WINDOW));
                text[lo..hi].contains("\"private_key\"")
            }
            Check::AwsSecret => {
                let more = bytes
                    .get(span.end)
                    .is_some_and(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='));
                !more && checks::token_body(candidate)
            }
            Check::Assignment => {
                let (inner, quoted) = strip_quotes(span.clone(), text);
                // A pagination cursor (`"nextPageToken": "…"`) is not a credential.
                if checks::pagination_key(&text[whole.start..span.start]) {
                    return None;
                }
                let before = text[..span.start].trim_end();
                // A comparison (`==`, `===`) names a credential only against a literal.
                let comparison = before.ends_with("==");
                // A key, a comma and a value is a constant only in PHP's `define(`; elsewhere
                // it is a list (`"password", "email"` in a CSV header or a query).
                let listed = before.ends_with(',')
                    && !text[..whole.start]
                        .trim_end_matches(['\'', '"', ' ', '\t'])
                        .ends_with("define(");
                if (comparison || before.ends_with(',')) && !quoted || listed {
                    return None;
                }
                let tight = span.start >= 2
                    && bytes[span.start - 1] == b'='
                    && !bytes[span.start - 2].is_ascii_whitespace()
                    && bytes[span.start - 2] != b':';
                return checks::real_secret_value(&text[inner.clone()], quoted, tight)
                    .then_some(inner);
            }
            // URLs and Authorization headers leave no doubt that the value is a credential.
            Check::SecretValue => checks::real_secret_value(candidate, true, true),
            Check::TokenBody => {
                let body = candidate
                    .find(['_', '-'])
                    .map_or(candidate, |i| &candidate[i + 1..]);
                checks::token_body(body)
            }
            Check::OpenAi => checks::openai_key(candidate),
            Check::Jwt => checks::jwt(candidate),
            Check::CreditCard => checks::credit_card(candidate),
            Check::Iban => {
                let len = checks::iban(candidate)?;
                return Some(span.start..span.start + len);
            }
            Check::UsSsn => checks::us_ssn(candidate),
            Check::Email => checks::email(candidate) && !checks::url_userinfo(text, span.start),
            Check::UncPath => checks::unc_path(text, span.start, span.end),
            Check::Phone => checks::phone(text, span.start, span.end),
            Check::PrivateIpv4 => checks::standalone_dotted(text, span.start, span.end),
            Check::PrivateIpv6 => {
                let len = checks::private_ipv6(candidate)?;
                return Some(span.start..span.start + len);
            }
            Check::InternalHostname => {
                checks::internal_hostname(text, span.start, span.end, &self.internal_suffixes)
            }
            Check::TwilioToken => checks::twilio_token(text, span.start, span.end),
            Check::DocumentNumber => checks::document_number(candidate),
            Check::IntranetHost => !matches!(
                candidate.to_ascii_lowercase().as_str(),
                "localhost"
                    | "example"
                    | "test"
                    | "invalid"
                    | "host"
                    | "hostname"
                    | "server"
                    | "your-host"
                    | "yourhost"
                    | "myhost"
            ),
            Check::HighEntropy => {
                entropy::high_entropy(candidate, self.entropy_min_len, self.entropy_threshold)
            }
        };
        ok.then_some(span)
    }

    /// The span of capture group `group` for the match of pattern `pid` at `whole`.
    fn group_span(
        &self,
        pid: usize,
        group: usize,
        text: &str,
        whole: Range<usize>,
    ) -> Option<Range<usize>> {
        let input = Input::new(text)
            .range(whole)
            .anchored(Anchored::Pattern(PatternID::new(pid).ok()?));
        let mut caps = self.regex.create_captures();
        self.regex.search_captures(&input, &mut caps);
        caps.get_group(group)
            .map(|s| s.range())
            .filter(|r| !r.is_empty())
    }
}

/// Lower-cases and checks the configured suffixes, dropping a leading dot.
fn normalise_suffixes(suffixes: &[String]) -> Result<Vec<String>, ConfigError> {
    suffixes
        .iter()
        .map(|s| {
            let t = s.strip_prefix('.').unwrap_or(s).to_ascii_lowercase();
            let ok = !t.is_empty()
                && t.split('.').all(|label| {
                    !label.is_empty()
                        && label.len() <= 63
                        && label
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                });
            if ok {
                Ok(t)
            } else {
                Err(ConfigError::BadSuffix { suffix: s.clone() })
            }
        })
        .collect()
}

/// The span inside matching quotes, and whether there were quotes.
fn strip_quotes(span: Range<usize>, text: &str) -> (Range<usize>, bool) {
    let b = &text.as_bytes()[span.clone()];
    match (b.first(), b.last()) {
        (Some(&q @ (b'"' | b'\'')), Some(&l)) if b.len() >= 2 && q == l => {
            (span.start + 1..span.end - 1, true)
        }
        _ => (span, false),
    }
}

/// The end of the run of ASCII word bytes starting at `i`; the next char boundary when `i`
/// is not a word byte (a word starting right after it starts at a boundary).
fn end_of_word(text: &str, i: usize) -> usize {
    let b = text.as_bytes();
    if !(b[i].is_ascii_alphanumeric() || b[i] == b'_') {
        return next_char_boundary(text, i);
    }
    let mut j = i + 1;
    while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
        j += 1;
    }
    j
}

/// The first `char` boundary after byte `i`.
fn next_char_boundary(text: &str, i: usize) -> usize {
    let mut j = i + 1;
    while j < text.len() && !text.is_char_boundary(j) {
        j += 1;
    }
    j
}

/// The last `char` boundary at or before byte `i` (clamped to the text).
fn floor_char_boundary(text: &str, i: usize) -> usize {
    let mut j = i.min(text.len());
    while !text.is_char_boundary(j) {
        j -= 1;
    }
    j
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_never_start_inside_a_word() {
        let c = Classifier::new(&ClassifierConfig::default()).unwrap();
        assert!(c.skip_words);
        let unguarded = ClassifierConfig {
            custom: vec![CustomPattern {
                id: "codename".into(),
                regex: "ORCA[0-9]+".into(),
                sensitivity: Sensitivity::Medium,
            }],
            ..ClassifierConfig::default()
        };
        let c = Classifier::new(&unguarded).unwrap();
        assert!(!c.skip_words);
        // Found inside a word, after a rejected candidate that starts the same word.
        let text = "abcdefabcdefabcdefabcdefORCA7";
        let ids: Vec<_> = c
            .classify(text)
            .reasons
            .into_iter()
            .map(|r| r.detector)
            .collect();
        assert_eq!(ids, vec!["codename"]);
    }
}
