//! The tool-call corpus in `corpus/tool_calls.txt`: what coding agents send through the
//! gateway (tool definitions, tool-call arguments, tool results, whole messages), harmless and
//! not, each classified case by case at the level the policy gives it.
//!
//! Every case but a whole message is classified four times: as the extracted text the gateway
//! classifies, and carried in an OpenAI Chat message, an OpenAI Responses item and an
//! Anthropic message, with fresh ids of each API's own shape. Failures name the corpus line
//! and the carrier, never the text, so even fake secrets stay out of test output.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};
use tollgate_classify::{Classifier, ClassifierConfig, Sensitivity};

const CORPUS: &str = include_str!("../corpus/tool_calls.txt");

/// What a corpus text is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Form {
    /// The arguments of a call to the named tool.
    Call(String),
    /// A tool's result.
    Result,
    /// A tool definition.
    Tool,
    /// A whole message or request.
    Message,
}

impl Form {
    fn name(&self) -> &'static str {
        match self {
            Self::Call(_) => "call",
            Self::Result => "result",
            Self::Tool => "tool",
            Self::Message => "message",
        }
    }
}

struct Case {
    line: usize,
    known_gap: bool,
    level: Sensitivity,
    detectors: BTreeSet<String>,
    form: Form,
    text: String,
}

/// One case as one carrier holds it.
struct Rendering {
    carrier: &'static str,
    text: String,
}

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('t') => out.push('\t'),
            Some('\\') => out.push('\\'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

fn parse_level(s: &str, line: usize) -> Sensitivity {
    match s {
        "low" => Sensitivity::Low,
        "medium" => Sensitivity::Medium,
        "high" => Sensitivity::High,
        other => panic!("line {line}: unknown level {other:?}"),
    }
}

fn cases() -> Vec<Case> {
    CORPUS
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|(i, l)| {
            let line = i + 1;
            let mut parts = l.splitn(4, ' ');
            let mut level = parts.next().unwrap();
            let known_gap = level.starts_with('~');
            if known_gap {
                level = &level[1..];
            }
            let level = parse_level(level, line);
            let detectors = match parts.next().unwrap() {
                "-" => BTreeSet::new(),
                list => list.split(',').map(str::to_owned).collect(),
            };
            let form = match parts.next().unwrap_or_default() {
                "result" => Form::Result,
                "tool" => Form::Tool,
                "message" => Form::Message,
                other => match other.strip_prefix("call:") {
                    Some(name) if !name.is_empty() => Form::Call(name.to_owned()),
                    _ => panic!("line {line}: unknown form {other:?}"),
                },
            };
            let text = unescape(
                parts
                    .next()
                    .unwrap_or_else(|| panic!("line {line}: no text")),
            );
            Case {
                line,
                known_gap,
                level,
                detectors,
                form,
                text,
            }
        })
        .collect()
}

/// A deterministic generator for the APIs' random ids, so every case carries different ones.
struct Ids(u64);

impl Ids {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn string(&mut self, alphabet: &[u8], len: usize) -> String {
        (0..len)
            .map(|_| char::from(alphabet[(self.next() % alphabet.len() as u64) as usize]))
            .collect()
    }

    const BASE62: &'static [u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    const HEX: &'static [u8] = b"0123456789abcdef";

    /// OpenAI Chat and Responses call ids: `call_` and 24 base62 characters.
    fn openai_call(&mut self) -> String {
        format!("call_{}", self.string(Self::BASE62, 24))
    }

    /// Responses item ids: a type prefix and 48 hex digits.
    fn responses_item(&mut self, prefix: &str) -> String {
        format!("{prefix}_{}", self.string(Self::HEX, 48))
    }

    /// Anthropic ids: a type prefix, `01` and 22 base62 characters.
    fn anthropic(&mut self, prefix: &str) -> String {
        format!("{prefix}_01{}", self.string(Self::BASE62, 22))
    }
}

fn to_json(value: &Value) -> String {
    serde_json::to_string(value).expect("a JSON value serialises")
}

/// The case as extracted text and in each API's message shape.
fn renderings(case: &Case) -> Vec<Rendering> {
    let mut ids = Ids(0x9e37_79b9_7f4a_7c15 ^ case.line as u64);
    let text = &case.text;
    let mut out = vec![Rendering {
        carrier: if case.form == Form::Message {
            "message"
        } else {
            "extracted text"
        },
        text: text.clone(),
    }];
    let parse = || -> Value {
        serde_json::from_str(text)
            .unwrap_or_else(|e| panic!("line {}: not a JSON object: {e}", case.line))
    };
    let carried: [(&'static str, Value); 3] = match &case.form {
        Form::Message => return out,
        Form::Call(name) => {
            let args = parse();
            assert!(
                args.is_object(),
                "line {}: arguments are an object",
                case.line
            );
            let call_id = ids.openai_call();
            [
                (
                    "openai chat tool_calls",
                    json!({"role": "assistant", "content": null, "tool_calls": [
                        {"id": call_id, "type": "function",
                         "function": {"name": name, "arguments": text}}]}),
                ),
                (
                    "openai responses function_call",
                    json!({"type": "function_call", "id": ids.responses_item("fc"),
                           "call_id": ids.openai_call(), "name": name, "arguments": text,
                           "status": "completed"}),
                ),
                (
                    "anthropic tool_use",
                    json!({"role": "assistant", "content": [
                        {"type": "text", "text": "Let me check."},
                        {"type": "tool_use", "id": ids.anthropic("toolu"), "name": name,
                         "input": args}]}),
                ),
            ]
        }
        Form::Result => {
            // Anthropic results come as a string or as text blocks; use both across the corpus.
            let content = if case.line.is_multiple_of(2) {
                json!(text)
            } else {
                json!([{"type": "text", "text": text}])
            };
            [
                (
                    "openai chat tool message",
                    json!({"role": "tool", "tool_call_id": ids.openai_call(), "content": text}),
                ),
                (
                    "openai responses function_call_output",
                    json!({"type": "function_call_output", "call_id": ids.openai_call(),
                           "output": text}),
                ),
                (
                    "anthropic tool_result",
                    json!({"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": ids.anthropic("toolu"),
                         "content": content}]}),
                ),
            ]
        }
        Form::Tool => {
            let tool = parse();
            let (name, description, parameters) =
                (&tool["name"], &tool["description"], &tool["parameters"]);
            assert!(
                name.is_string() && parameters.is_object(),
                "line {}: a tool has a name and parameters",
                case.line
            );
            [
                (
                    "openai chat tools",
                    json!({"type": "function", "function": {
                        "name": name, "description": description, "parameters": parameters}}),
                ),
                (
                    "openai responses tools",
                    json!({"type": "function", "name": name, "description": description,
                           "parameters": parameters, "strict": false}),
                ),
                (
                    "anthropic tools",
                    json!({"name": name, "description": description,
                           "input_schema": parameters}),
                ),
            ]
        }
    };
    out.extend(carried.into_iter().map(|(carrier, value)| Rendering {
        carrier,
        text: to_json(&value),
    }));
    out
}

fn classifier() -> Classifier {
    Classifier::new(&ClassifierConfig::default()).expect("default config builds")
}

fn default_level(id: &str) -> Sensitivity {
    Classifier::builtin_detectors()
        .find(|(b, _)| *b == id)
        .map(|(_, level)| level)
        .unwrap_or_else(|| panic!("no built-in detector {id:?}"))
}

fn found(classifier: &Classifier, text: &str) -> (Sensitivity, BTreeSet<String>) {
    let c = classifier.classify(text);
    let ids = c.reasons.iter().map(|r| r.detector.to_string()).collect();
    (c.sensitivity, ids)
}

#[test]
fn tool_call_corpus_is_well_formed() {
    let cases = cases();
    let mut renderings_total = 0;
    let mut by_form: BTreeMap<&str, [usize; 2]> = BTreeMap::new();
    for case in &cases {
        // The declared level is the one the policy gives the declared detectors.
        let implied = case
            .detectors
            .iter()
            .map(|d| default_level(d))
            .max()
            .unwrap_or(Sensitivity::Low);
        assert_eq!(
            implied, case.level,
            "line {}: level and detectors disagree",
            case.line
        );
        renderings_total += renderings(case).len();
        by_form.entry(case.form.name()).or_default()
            [usize::from(case.level != Sensitivity::Low)] += 1;
    }
    assert!(renderings_total >= 300, "only {renderings_total} cases");
    for form in ["call", "result", "tool", "message"] {
        let [harmless, sensitive] = by_form.get(form).copied().unwrap_or_default();
        assert!(harmless >= 5, "{form}: only {harmless} harmless cases");
        assert!(sensitive >= 1, "{form}: no sensitive case");
    }
}

#[test]
fn every_tool_call_case_is_classified_as_expected() {
    let classifier = classifier();
    let mut failures = Vec::new();
    for case in cases().iter().filter(|c| !c.known_gap) {
        for r in renderings(case) {
            let (level, ids) = found(&classifier, &r.text);
            if level != case.level || ids != case.detectors {
                failures.push(format!(
                    "line {} ({}): expected {} {:?}, got {} {:?}",
                    case.line,
                    r.carrier,
                    case.level.name(),
                    case.detectors,
                    level.name(),
                    ids
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of the tool-call cases are misclassified:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn ratio(num: usize, den: usize) -> f64 {
    if den == 0 {
        1.0
    } else {
        num as f64 / den as f64
    }
}

/// The targets on tool-call traffic, known gaps included: false positives (a harmless
/// case rated above low) at most 3 %, and at least 95 % of sensitive cases at exactly their
/// level. Run with `--nocapture` for the table.
#[test]
fn tool_call_traffic_meets_the_targets() {
    let classifier = classifier();
    let cases = cases();
    // carrier -> [harmless, false positives, sensitive, at the exact level]
    let mut per: BTreeMap<&str, [usize; 4]> = BTreeMap::new();
    for case in &cases {
        for r in renderings(case) {
            let level = classifier.classify(&r.text).sensitivity;
            let counts = per.entry(r.carrier).or_default();
            if case.level == Sensitivity::Low {
                counts[0] += 1;
                counts[1] += usize::from(level != Sensitivity::Low);
            } else {
                counts[2] += 1;
                counts[3] += usize::from(level == case.level);
            }
        }
    }
    println!(
        "{:<40} {:>8} {:>8} {:>9} {:>12}",
        "carrier", "harmless", "fp rate", "sensitive", "exact level"
    );
    let mut total = [0usize; 4];
    for (carrier, c) in &per {
        println!(
            "{:<40} {:>8} {:>8.3} {:>9} {:>12.3}",
            carrier,
            c[0],
            ratio(c[1], c[0]),
            c[2],
            ratio(c[3], c[2])
        );
        for i in 0..4 {
            total[i] += c[i];
        }
    }
    let fp_rate = ratio(total[1], total[0]);
    let exact = ratio(total[3], total[2]);
    println!(
        "{:<40} {:>8} {:>8.3} {:>9} {:>12.3}",
        "overall", total[0], fp_rate, total[2], exact
    );
    assert!(fp_rate <= 0.03, "false positive rate {fp_rate:.3} > 0.03");
    assert!(exact >= 0.95, "exact level {exact:.3} < 0.95");
}

#[test]
fn redacted_tool_calls_hold_nothing_sensitive() {
    let classifier = classifier();
    for case in cases() {
        for r in renderings(&case) {
            let Some(redacted) = classifier.redact(&r.text) else {
                continue;
            };
            let (level, ids) = found(&classifier, &redacted);
            assert!(
                level == Sensitivity::Low,
                "line {} ({}): redacted text still reports {ids:?}",
                case.line,
                r.carrier
            );
        }
    }
}
