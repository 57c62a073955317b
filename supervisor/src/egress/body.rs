//! What of an outbound request is classified, decoded the way HTTP says it is encoded: the
//! request target without the granted destination (its authority and `Host` name the host
//! the receipt grants, so they are no leak), percent-decoded; every other header; the body
//! with its `Content-Encoding` (gzip, deflate) undone within the inspection limit, UTF-16
//! read as text, multipart parts with their `Content-Transfer-Encoding` (base64,
//! quoted-printable) undone, form bodies percent-decoded; and every base64-looking run
//! decoded besides. A body the classifier cannot read (an encoding it does not know, bytes
//! that are no text) is said so, for the caller to refuse below `high`.

use std::io::Read as _;

use base64::Engine as _;
use bytes::Bytes;
use http::header::{CONTENT_ENCODING, CONTENT_TYPE, HOST};
use tollgate_receipt::egress::Host;

use super::budget::{BudgetSpent, Reservation};

/// Shortest run of base64 alphabet decoded on its own (a 12-byte secret encodes to 16).
const MIN_BASE64_RUN: usize = 16;
/// Rounds of decoding base64 runs found in what the previous round decoded.
const BASE64_ROUNDS: usize = 2;
/// Multipart nesting read at most.
const MAX_DEPTH: usize = 4;

/// The text a request is classified by.
#[derive(Debug, Default)]
pub struct Inspected {
    /// Everything classified, decoded forms appended after the text as sent.
    pub text: String,
    /// Why (part of) the body could not be read as text, when it could not.
    pub unreadable: Option<String>,
}

/// The text of a request: its target and headers less the granted destination, and its
/// body, each decoded as HTTP says it is encoded. Decoded bytes are reserved in `held`
/// (`limit` bounds any one decompression).
pub fn request_text(
    method: &str,
    parts: &http::request::Parts,
    body: &Bytes,
    granted: &Host,
    limit: usize,
    held: &mut Reservation,
) -> Result<Inspected, BudgetSpent> {
    let mut reader = Reader {
        limit,
        held,
        unreadable: None,
        decoded: String::new(),
    };
    let mut text = String::new();
    // The authority names the destination only when it is the granted host; anything else
    // there (user information, another host) is classified.
    let target = match parts.uri.authority() {
        Some(authority)
            if names(authority.host(), granted) && !authority.as_str().contains('@') =>
        {
            parts
                .uri
                .path_and_query()
                .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned())
        }
        _ => parts.uri.to_string(),
    };
    text.push_str(method);
    text.push(' ');
    text.push_str(&target);
    text.push('\n');
    reader.percent_decoded(&target, false);
    for (name, value) in &parts.headers {
        if name == HOST && value.to_str().is_ok_and(|h| names(strip_port(h), granted)) {
            continue;
        }
        text.push_str(name.as_str());
        text.push_str(": ");
        text.push_str(&String::from_utf8_lossy(value.as_bytes()));
        text.push('\n');
    }
    text.push('\n');
    let body_text = reader.body(&parts.headers, body, 0)?;
    text.push_str(&body_text);
    text.push('\n');
    let decoded = std::mem::take(&mut reader.decoded);
    text.push_str(&decoded);
    // Base64 runs anywhere (target, headers, body, what was decoded), decoded in rounds.
    let mut scan = text.clone();
    for _ in 0..BASE64_ROUNDS {
        let found = base64_runs(&scan);
        if found.is_empty() {
            break;
        }
        reader.held.grow(found.len())?;
        text.push('\n');
        text.push_str(&found);
        scan = found;
    }
    reader.held.grow(text.len())?;
    Ok(Inspected {
        text,
        unreadable: reader.unreadable,
    })
}

/// Why a request body was not read whole.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// Longer than the inspection limit.
    #[error("the request body is larger than the {0} bytes the supervisor reads to inspect it")]
    TooLarge(usize),
    /// The supervisor-wide budget could not hold it.
    #[error(transparent)]
    Spent(#[from] BudgetSpent),
    /// It did not arrive in time.
    #[error("the request body did not arrive whole within {} s", .0.as_secs())]
    Deadline(std::time::Duration),
    /// The connection failed while it was read.
    #[error("the request body could not be read: {0}")]
    Failed(String),
}

/// Reads `body` whole within `deadline`: at most `limit` bytes, each reserved in `held`
/// before it is kept.
pub async fn read_body<B>(
    body: B,
    limit: usize,
    held: &mut Reservation,
    deadline: std::time::Duration,
) -> Result<Bytes, BodyError>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    use http_body_util::BodyExt as _;
    let read = async {
        let mut body = body;
        let mut collected = bytes::BytesMut::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| BodyError::Failed(e.to_string()))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            if collected.len() + data.len() > limit {
                return Err(BodyError::TooLarge(limit));
            }
            held.grow(data.len())?;
            collected.extend_from_slice(&data);
        }
        Ok(collected.freeze())
    };
    tokio::time::timeout(deadline, read)
        .await
        .map_err(|_| BodyError::Deadline(deadline))?
}

struct Reader<'a> {
    limit: usize,
    held: &'a mut Reservation,
    unreadable: Option<String>,
    /// Decoded forms of the target and form bodies, classified besides the text as sent.
    decoded: String,
}

impl Reader<'_> {
    fn unreadable(&mut self, why: String) {
        self.unreadable.get_or_insert(why);
    }

    /// `text` percent-decoded (`+` as a space in forms), added when it differs.
    fn percent_decoded(&mut self, text: &str, form: bool) {
        let text = if form {
            std::borrow::Cow::Owned(text.replace('+', " "))
        } else {
            std::borrow::Cow::Borrowed(text)
        };
        let decoded = percent_encoding::percent_decode_str(&text).decode_utf8_lossy();
        if decoded != text {
            self.decoded.push_str(&decoded);
            self.decoded.push('\n');
        }
    }

    /// A body (or a part's) as text, given its headers.
    fn body(
        &mut self,
        headers: &http::HeaderMap,
        body: &[u8],
        depth: usize,
    ) -> Result<String, BudgetSpent> {
        let mut bytes = std::borrow::Cow::Borrowed(body);
        let encodings: Vec<String> = headers
            .get_all(CONTENT_ENCODING)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|e| e.trim().to_ascii_lowercase())
            .filter(|e| !e.is_empty() && e != "identity")
            .collect();
        // Applied in the order listed: undone last first.
        for encoding in encodings.iter().rev() {
            match self.decompress(encoding, &bytes)? {
                Ok(decoded) => bytes = std::borrow::Cow::Owned(decoded),
                Err(why) => {
                    self.unreadable(why);
                    return Ok(String::from_utf8_lossy(&bytes).into_owned());
                }
            }
        }
        let content_type = headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        self.typed(&content_type, &bytes, depth)
    }

    /// Bytes of a `content_type` as text.
    fn typed(
        &mut self,
        content_type: &str,
        bytes: &[u8],
        depth: usize,
    ) -> Result<String, BudgetSpent> {
        let lower = content_type.to_ascii_lowercase();
        let mime = lower.split(';').next().unwrap_or("").trim().to_owned();
        if mime.starts_with("multipart/") && depth < MAX_DEPTH {
            if let Some(boundary) = parameter(content_type, "boundary") {
                return self.multipart(&boundary, bytes, depth + 1);
            }
        }
        let text = self.as_text(parameter(&lower, "charset").as_deref(), bytes);
        if mime == "application/x-www-form-urlencoded" {
            self.percent_decoded(&text, true);
        }
        Ok(text)
    }

    /// Bytes as text by their charset or byte order mark; UTF-16 without either is read
    /// besides when the bytes carry NULs. Bytes that are no text are said unreadable.
    fn as_text(&mut self, charset: Option<&str>, bytes: &[u8]) -> String {
        let utf16 = |little: bool, bytes: &[u8]| -> Option<String> {
            if !bytes.len().is_multiple_of(2) {
                return None;
            }
            let units = bytes.chunks_exact(2).map(|pair| {
                if little {
                    u16::from_le_bytes([pair[0], pair[1]])
                } else {
                    u16::from_be_bytes([pair[0], pair[1]])
                }
            });
            char::decode_utf16(units)
                .collect::<Result<String, _>>()
                .ok()
        };
        match (charset, bytes) {
            (_, [0xFF, 0xFE, rest @ ..]) | (Some("utf-16le"), rest) => {
                if let Some(text) = utf16(true, rest) {
                    return text;
                }
            }
            (_, [0xFE, 0xFF, rest @ ..]) | (Some("utf-16be" | "utf-16"), rest) => {
                if let Some(text) = utf16(false, rest) {
                    return text;
                }
            }
            _ => {}
        }
        if bytes.contains(&0) {
            // Undeclared UTF-16 reads as UTF-8 with NULs between the letters: both readings
            // are classified.
            let mut text = String::from_utf8_lossy(bytes).into_owned();
            let mut read = false;
            for little in [true, false] {
                if let Some(decoded) = utf16(little, bytes) {
                    text.push('\n');
                    text.push_str(&decoded);
                    read = true;
                }
            }
            if !read {
                self.unreadable("the request body is binary the classifier cannot read".into());
            }
            return text;
        }
        match std::str::from_utf8(bytes) {
            Ok(text) => text.to_owned(),
            Err(_) => {
                self.unreadable("the request body is binary the classifier cannot read".into());
                String::from_utf8_lossy(bytes).into_owned()
            }
        }
    }

    /// `bytes` with one `Content-Encoding` undone, at most `limit` bytes of it, reserved as
    /// they are read; or why it cannot be.
    fn decompress(
        &mut self,
        encoding: &str,
        bytes: &[u8],
    ) -> Result<Result<Vec<u8>, String>, BudgetSpent> {
        let mut reader: Box<dyn std::io::Read + '_> = match encoding {
            "gzip" | "x-gzip" => Box::new(flate2::read::MultiGzDecoder::new(bytes)),
            // `deflate` is zlib-wrapped; some clients send it raw.
            "deflate" if bytes.first().is_some_and(|b| b & 0x0F == 8) => {
                Box::new(flate2::read::ZlibDecoder::new(bytes))
            }
            "deflate" => Box::new(flate2::read::DeflateDecoder::new(bytes)),
            other => {
                return Ok(Err(format!(
                    "the request body's Content-Encoding {other:?} is one the classifier cannot read (gzip, deflate and identity are read)"
                )))
            }
        };
        let mut out = Vec::new();
        let mut chunk = vec![0u8; 64 << 10];
        loop {
            let n = match reader.read(&mut chunk) {
                Ok(0) => return Ok(Ok(out)),
                Ok(n) => n,
                Err(e) => {
                    return Ok(Err(format!(
                        "the request body is not valid {encoding} ({})",
                        e.kind()
                    )))
                }
            };
            if out.len() + n > self.limit {
                return Ok(Err(format!(
                    "the request body decompresses to more than the {} bytes the supervisor reads to inspect it",
                    self.limit
                )));
            }
            self.held.grow(n)?;
            out.extend_from_slice(&chunk[..n]);
        }
    }

    /// A multipart body's parts, each read by its own headers.
    fn multipart(
        &mut self,
        boundary: &str,
        bytes: &[u8],
        depth: usize,
    ) -> Result<String, BudgetSpent> {
        let delimiter = format!("--{boundary}");
        let mut text = String::new();
        for part in split(bytes, delimiter.as_bytes()).skip(1) {
            if part.starts_with(b"--") {
                break;
            }
            let part = part.strip_prefix(b"\r\n").unwrap_or(part);
            let part = part.strip_suffix(b"\r\n").unwrap_or(part);
            let (head, body) = match find(part, b"\r\n\r\n") {
                Some(at) => (&part[..at], &part[at + 4..]),
                None => (&part[..0], part),
            };
            let head = String::from_utf8_lossy(head).into_owned();
            text.push_str(&head);
            text.push('\n');
            let mut headers = http::HeaderMap::new();
            let mut transfer = String::new();
            for line in head.lines() {
                let Some((name, value)) = line.split_once(':') else {
                    continue;
                };
                let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
                if name == "content-transfer-encoding" {
                    transfer = value.to_ascii_lowercase();
                } else if let (Ok(name), Ok(value)) = (
                    http::HeaderName::from_bytes(name.as_bytes()),
                    http::HeaderValue::from_str(value),
                ) {
                    headers.append(name, value);
                }
            }
            let decoded = match transfer.as_str() {
                "base64" => {
                    let compact: Vec<u8> = body
                        .iter()
                        .copied()
                        .filter(|b| !b.is_ascii_whitespace())
                        .collect();
                    match STANDARD.decode(&compact) {
                        Ok(decoded) => decoded,
                        Err(_) => {
                            self.unreadable(
                                "a multipart part says base64 and is not valid base64".into(),
                            );
                            body.to_vec()
                        }
                    }
                }
                "quoted-printable" => quoted_printable(body),
                _ => body.to_vec(),
            };
            self.held.grow(decoded.len())?;
            text.push_str(&self.body(&headers, &decoded, depth)?);
            text.push('\n');
        }
        Ok(text)
    }
}

/// Whether `host` (as written in a request) is the granted host.
fn names(host: &str, granted: &Host) -> bool {
    Host::parse(host).is_ok_and(|host| &host == granted)
}

/// `host` without a `:port`.
fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host
            .split_once(']')
            .map_or(host, |(h, _)| &host[..=h.len()]);
    }
    host.rsplit_once(':')
        .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
        .map_or(host, |(h, _)| h)
}

/// A `name=value` parameter of a header value (quotes removed).
fn parameter(value: &str, name: &str) -> Option<String> {
    value.split(';').skip(1).find_map(|param| {
        let (key, value) = param.split_once('=')?;
        key.trim()
            .eq_ignore_ascii_case(name)
            .then(|| value.trim().trim_matches('"').to_owned())
    })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// `bytes` split at every `delimiter`.
fn split<'a>(bytes: &'a [u8], delimiter: &'a [u8]) -> impl Iterator<Item = &'a [u8]> + 'a {
    let mut rest = Some(bytes);
    std::iter::from_fn(move || {
        let current = rest?;
        match find(current, delimiter) {
            Some(at) => {
                rest = Some(&current[at + delimiter.len()..]);
                Some(&current[..at])
            }
            None => {
                rest = None;
                Some(current)
            }
        }
    })
}

fn quoted_printable(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        if body[i] == b'=' {
            if body[i + 1..].starts_with(b"\r\n") {
                i += 3;
                continue;
            }
            if let Some(hex) = body.get(i + 1..i + 3) {
                if let Ok(byte) = u8::from_str_radix(&String::from_utf8_lossy(hex), 16) {
                    out.push(byte);
                    i += 3;
                    continue;
                }
            }
        }
        out.push(body[i]);
        i += 1;
    }
    out
}

/// Base64 as senders write it: padded or not, trailing bits ignored.
const LENIENT: base64::engine::GeneralPurposeConfig = base64::engine::GeneralPurposeConfig::new()
    .with_decode_allow_trailing_bits(true)
    .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent);
const STANDARD: base64::engine::GeneralPurpose =
    base64::engine::GeneralPurpose::new(&base64::alphabet::STANDARD, LENIENT);
const URL_SAFE: base64::engine::GeneralPurpose =
    base64::engine::GeneralPurpose::new(&base64::alphabet::URL_SAFE, LENIENT);

/// Each run of at least [`MIN_BASE64_RUN`] base64 characters in `text` that decodes (standard
/// or URL-safe alphabet) to text, one per line.
fn base64_runs(text: &str) -> String {
    let mut found = String::new();
    let is_alphabet = |c: char| c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '-' | '_');
    for run in text.split(|c: char| !is_alphabet(c)) {
        if run.len() < MIN_BASE64_RUN {
            continue;
        }
        // The run whole, else cut where a quantum may begin or end (text around it).
        let candidates = (0..4.min(run.len())).flat_map(|start| {
            let run = &run[start..];
            [run, &run[..run.len() - run.len() % 4]]
        });
        for candidate in candidates {
            let Ok(decoded) = STANDARD
                .decode(candidate)
                .or_else(|_| URL_SAFE.decode(candidate))
            else {
                continue;
            };
            let text = String::from_utf8_lossy(&decoded);
            // Text, not noise: valid UTF-8, mostly printable.
            let printable = text
                .chars()
                .filter(|c| (!c.is_control() || c.is_whitespace()) && *c != '\u{FFFD}')
                .count();
            if printable * 10 >= text.chars().count() * 9 {
                found.push_str(&text);
                found.push('\n');
            } else if decoded.contains(&0) {
                // UTF-16 text, base64'd.
                found.push_str(&text.replace('\0', ""));
                found.push('\n');
            }
            break;
        }
    }
    found
}

#[cfg(test)]
mod tests;
