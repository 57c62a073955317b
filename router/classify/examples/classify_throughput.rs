//! Classifier throughput: `cargo run --release -p tollgate-classify --example classify_throughput`.
//!
//! Times `Classifier::classify` over 1 MiB of `bench::mixed_text` (and a few harder inputs,
//! among them the same text carried as tool results in OpenAI and Anthropic JSON messages,
//! which is full of escapes) and prints the median of several runs in MB/s (10^6 bytes per
//! second). An argument keeps only the inputs whose name contains it (`... -- mixed`).

use std::time::Instant;

use tollgate_classify::{bench, Classifier, ClassifierConfig};

fn median_mb_s(classifier: &Classifier, text: &str, runs: usize) -> (f64, usize) {
    let mut rates = Vec::with_capacity(runs);
    let mut found = 0;
    // One untimed run fills the lazy DFA's cache, as a long-running classifier would have.
    let _ = classifier.classify(text);
    for _ in 0..runs {
        let start = Instant::now();
        let classification = classifier.classify(text);
        let secs = start.elapsed().as_secs_f64();
        found = classification.reasons.len();
        rates.push(text.len() as f64 / secs / 1e6);
    }
    rates.sort_by(f64::total_cmp);
    (rates[rates.len() / 2], found)
}

/// `bench::mixed_text` as the gateway sees tool traffic: every eight lines one tool result,
/// alternately an OpenAI `tool` message and an Anthropic `tool_result` block, JSON-encoded
/// (so every line break is `\n` and every quote `\"`), with ids of each API's shape.
fn tool_call_json(len: usize) -> String {
    let text = bench::mixed_text(len, 3);
    let lines: Vec<&str> = text.lines().collect();
    let mut out = String::with_capacity(len + len / 4);
    for (i, chunk) in lines.chunks(8).enumerate() {
        let content = serde_json::to_string(&chunk.join("\n")).expect("a string serialises");
        if i % 2 == 0 {
            out.push_str(&format!(
                r#"{{"role":"tool","tool_call_id":"call_Zp4Wm7Qx2Nr9Tk5Lb8Vc{i:04}","content":{content}}}"#
            ));
        } else {
            out.push_str(&format!(
                r#"{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"toolu_01D7FLrfh4GYq7yT1ULF{i:04}","content":{content}}}]}}"#
            ));
        }
        out.push('\n');
    }
    out
}

fn main() {
    let started = Instant::now();
    let classifier = Classifier::new(&ClassifierConfig::default()).expect("default config");
    println!("build: {:.1} ms", started.elapsed().as_secs_f64() * 1000.0);
    let mib = 1 << 20;
    let inputs = [
        ("mixed (bench::mixed_text)", bench::mixed_text(mib, 1)),
        ("mixed as tool-call JSON", tool_call_json(mib)),
        (
            "prose only (ASCII)",
            "The quarterly report shows revenue grew in every region except the north. "
                .repeat(mib / 74 + 1),
        ),
        (
            "non-ASCII prose",
            "Grüße aus München, 東京の天気は晴れ。".repeat(mib / 50 + 1),
        ),
        (
            "dense identifiers",
            "getUserAccountSettingsHandlerFactory2 ".repeat(mib / 38 + 1),
        ),
        ("digit groups", "4111 1111 1111 1112 ".repeat(mib / 20 + 1)),
        (
            "hexdump",
            "00000010: 2020 3431 3131 2031 3131 3120 3131 3131    4111 1111 1111\n"
                .repeat(mib / 70 + 1),
        ),
        (
            "dense secrets",
            "password=Tr0ub4dor&3 mail jane.doe@acme-corp.io ip 10.1.2.3 tok f7EbsDe0G9Cryn687neLfjVHq8xiM0OGr4hTxoF5\n"
                .repeat(mib / 107 + 1),
        ),
    ];
    // An optional argument picks inputs by name, for profiling one at a time.
    let only = std::env::args().nth(1).unwrap_or_default();
    for (name, text) in inputs.iter().filter(|(name, _)| name.contains(&only)) {
        let (rate, found) = median_mb_s(&classifier, text, 21);
        println!(
            "{name:<28} {:>8} bytes  {rate:>8.1} MB/s  {found} reasons",
            text.len()
        );
    }
}
