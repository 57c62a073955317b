//! Input for throughput benchmarks of the classifier.
//!
//! [`mixed_text`] builds a deterministic mix of what agents send to models: prose in several
//! languages, source code, log lines with UUIDs, git SHAs and public addresses, JSON, and
//! about one line in twenty with something sensitive in it (all values fake). The project's
//! benchmark binary and `examples/classify_throughput.rs` time [`crate::Classifier::classify`]
//! over it.

/// A small deterministic generator (SplitMix64), so runs are comparable.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn string(&mut self, alphabet: &[u8], len: usize) -> String {
        (0..len)
            .map(|_| char::from(alphabet[self.below(alphabet.len() as u64) as usize]))
            .collect()
    }
}

const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
const HEX: &[u8] = b"0123456789abcdef";

const PROSE: &[&str] = &[
    "The quarterly report shows revenue grew in every region except the north, where the new warehouse opened late.",
    "Please summarise the following meeting notes and list the action items with their owners and due dates.",
    "Die Grüße aus München kamen pünktlich an; das Büro bleibt über die Feiertage geschlossen.",
    "東京の天気は晴れ、明日は雨の予報です。会議は午後三時から始まります。",
    "Le café était fermé, alors nous avons travaillé à la bibliothèque jusqu'à dix-huit heures.",
    "Refactor the parser so that errors carry the byte offset and the expected token, then add tests.",
    "Version 2.4.1 fixes a crash on startup when the config file is missing; upgrade from 2.3.x is automatic.",
];

const CODE: &[&str] = &[
    "    let config = Config::load(&path).context(\"reading config\")?;",
    "fn handle_request(req: Request<Body>, state: Arc<AppState>) -> Result<Response<Body>, Error> {",
    "    for (index, item) in items.iter().enumerate().filter(|(_, i)| i.is_active()) {",
    "def fetch_user_profile(user_id: int, include_history: bool = False) -> dict:",
    "        return self.session.get(f\"{self.base_url}/users/{user_id}\", timeout=30).json()",
    "import { useState, useEffect } from 'react'; // hooks for the settings panel",
    "SELECT id, name, created_at FROM accounts WHERE status = 'active' ORDER BY created_at DESC LIMIT 50;",
];

fn push_line(rng: &mut Rng, out: &mut String) {
    let n = rng.below(1000);
    let line = match rng.below(20) {
        0..=5 => PROSE[rng.below(PROSE.len() as u64) as usize].to_owned(),
        6..=10 => CODE[rng.below(CODE.len() as u64) as usize].to_owned(),
        11 | 12 => format!(
            "2024-05-17T12:{:02}:{:02}.{n:03}Z INFO request_id={}-{}-4{}-a{}-{} path=/api/v1/users/{n} status=200 latency_ms={} client=203.0.113.{}",
            rng.below(60),
            rng.below(60),
            rng.string(HEX, 8),
            rng.string(HEX, 4),
            rng.string(HEX, 3),
            rng.string(HEX, 3),
            rng.string(HEX, 12),
            rng.below(900),
            rng.below(255)
        ),
        13 => format!(
            "commit {}\nAuthor: Release Bot\n\n    Bump dependencies to 1.{n}.0",
            rng.string(HEX, 40)
        ),
        14 => format!(
            "{{\"id\": {n}, \"name\": \"widget-{n}\", \"price\": 12.50, \"sha256\": \"{}\", \"tags\": [\"blue\", \"large\"]}}",
            rng.string(HEX, 64)
        ),
        15 => format!(
            "| {n} | getUserAccountSettings | src/handlers/account_settings.rs | {} ms |",
            rng.below(100)
        ),
        16 => format!("resolved 8.8.8.8 and 1.1.1.{} in {n} us", rng.below(255)),
        17 => format!(
            "dependency \"serde\" version 1.0.{n} checksum {}",
            rng.string(HEX, 64)
        ),
        18 => "----------------------------------------------------------------".to_owned(),
        _ => sensitive_line(rng, n),
    };
    out.push_str(&line);
    out.push('\n');
}

fn sensitive_line(rng: &mut Rng, n: u64) -> String {
    match rng.below(8) {
        0 => format!("Contact jane.doe{n}@acme-corp.io for access."),
        1 => format!(
            "ssh deploy@10.{}.{}.{}",
            rng.below(255),
            rng.below(255),
            rng.below(255)
        ),
        2 => format!("DB_PASSWORD=Tr0ub4dor{n}&3"),
        3 => format!("export GITHUB_TOKEN=ghp_{}", rng.string(ALNUM, 36)),
        4 => "Card on file: 4111 1111 1111 1111".to_owned(),
        5 => format!("Call me at +1 415 555 01{:02}", rng.below(100)),
        6 => format!("see https://jenkins.corp/job/build-{n}/console"),
        _ => format!("session {}", rng.string(ALNUM, 40)),
    }
}

/// About `len` bytes (never less, at most one line more) of deterministic mixed text.
pub fn mixed_text(len: usize, seed: u64) -> String {
    let mut rng = Rng(seed);
    let mut out = String::with_capacity(len + 512);
    while out.len() < len {
        push_line(&mut rng, &mut out);
    }
    out
}

/// About `len` bytes of findings-dense text: a sensitive line (a credential, personal data,
/// an internal name) after every two lines of the mixed text, so about one finding per 200
/// bytes — far denser than real traffic, where a scanner validates a candidate most often.
pub fn dense_text(len: usize, seed: u64) -> String {
    let mut rng = Rng(seed);
    let mut out = String::with_capacity(len + 512);
    while out.len() < len {
        push_line(&mut rng, &mut out);
        push_line(&mut rng, &mut out);
        let n = rng.below(1000);
        let line = match rng.below(12) {
            0..=7 => sensitive_line(&mut rng, n),
            8 => format!("Passport number: X{:08}", rng.below(100_000_000)),
            9 => format!("vault at https://vault.internal.acme-{n}.dev/v1/secret"),
            10 => format!("key AIza{}", rng.string(ALNUM, 35)),
            _ => format!(
                "ping db{n}.corp and 192.168.{}.{}",
                rng.below(255),
                rng.below(255)
            ),
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}
