//! What a request can make the supervisor hold, bounded before it is decoded.
//!
//! prost turns every item of a repeated field into a value in memory: an empty content part
//! is two bytes on the wire and a hundred in a `Vec`, so an 8 MiB request of empty parts
//! decodes to hundreds of MiB before any check on the decoded request could refuse it. So a
//! gateway request whose message has repeated fields is walked on its raw protobuf bytes
//! first (tags, varints, lengths; nothing is allocated), counting the items of each repeated
//! field over the whole request and the nesting depth, and refused past fixed limits.
//!
//! The walk reads the message shapes from the protocol's own descriptors, so a field added to
//! a request is counted without anyone remembering to: every repeated field has a limit, the
//! default [`MAX_ITEMS`] unless [`LIMITS`] names it.

use std::collections::HashMap;

use prost::Message as _;
use prost_types::field_descriptor_proto::{Label, Type};

use super::input::{MAX_ITEMS, MAX_MESSAGES, MAX_PARTS, MAX_TOOLS};
use super::models::MAX_STOPS;

/// Deepest nesting of messages a gateway request may have (the deepest real one, a tool
/// result's image in a message of a model call, is 4 below the request).
pub const MAX_DEPTH: usize = 16;

/// The repeated fields whose limit is not [`MAX_ITEMS`]: field (`Message.field`), the name a
/// refusal gives the count, and the limit. Fields with the same name share one count: a
/// call's parts are its messages' parts and its tool results' contents together.
pub const LIMITS: &[(&str, &str, usize)] = &[
    ("CompleteRequest.messages", "messages", MAX_MESSAGES),
    ("ChatMessage.parts", "parts", MAX_PARTS),
    ("ToolResult.content", "parts", MAX_PARTS),
    ("CompleteRequest.tools", "tools", MAX_TOOLS),
    ("CompleteRequest.stop", "stop", MAX_STOPS),
];

/// The protobuf package whose messages the gateway takes.
const PACKAGE: &str = "tollgate.v1";

/// Why a request was refused before it was decoded; each a one-line reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    /// A repeated field (or a group of them) has more items than its limit.
    #[error("{name} has more than {max} items; at most {max} are accepted")]
    TooMany {
        /// The count's name.
        name: String,
        /// Its limit.
        max: usize,
    },
    /// Messages nest deeper than [`MAX_DEPTH`].
    #[error("the request nests messages more than {MAX_DEPTH} deep; at most {MAX_DEPTH} levels are accepted")]
    TooDeep,
    /// The gRPC frame says its message is compressed; the gateway accepts none.
    #[error("the request is compressed; send it uncompressed")]
    Compressed,
    /// The body is not exactly one gRPC frame of a protobuf message.
    #[error("the request is not one valid protobuf message: {0}")]
    Malformed(&'static str),
}

/// How a field's values travel.
#[derive(Debug, Clone)]
enum Kind {
    /// A message of this full name (no leading dot).
    Message(String),
    /// Numbers as varints (packed when repeated).
    Varint,
    /// Numbers of 4 bytes.
    Fixed32,
    /// Numbers of 8 bytes.
    Fixed64,
    /// Strings and bytes.
    Bytes,
}

#[derive(Debug, Clone)]
struct Field {
    number: u32,
    kind: Kind,
    /// The count a repeated field's items go to.
    count: Option<usize>,
}

#[derive(Debug, Clone)]
struct Count {
    name: String,
    max: usize,
}

/// The shapes of the protocol's messages and the limits on their repeated fields.
#[derive(Debug)]
pub struct Shapes {
    messages: HashMap<String, Vec<Field>>,
    counts: Vec<Count>,
    /// Method path (`/tollgate.v1.Gateway/Complete`) → its request message, for the unary
    /// methods whose request can hold a repeated field.
    methods: HashMap<String, String>,
}

impl Shapes {
    /// The shapes of the gateway's requests, from the protocol's descriptors.
    pub fn gateway() -> &'static Shapes {
        static SHAPES: std::sync::LazyLock<Shapes> = std::sync::LazyLock::new(|| {
            Shapes::new(tollgate_proto::FILE_DESCRIPTOR_SET, "Gateway", LIMITS)
        });
        &SHAPES
    }

    /// The shapes of every message in `descriptors` (an encoded `FileDescriptorSet`), and
    /// the methods of `service` to walk. The descriptors are the ones this binary was built
    /// with: not decoding them is a build error, hence the panic.
    fn new(descriptors: &[u8], service: &str, limits: &[(&str, &str, usize)]) -> Shapes {
        let set = prost_types::FileDescriptorSet::decode(descriptors)
            .expect("the protocol's own descriptors decode");
        let mut shapes = Shapes {
            messages: HashMap::new(),
            counts: Vec::new(),
            methods: HashMap::new(),
        };
        let mut services = Vec::new();
        for file in &set.file {
            let package = file.package().to_owned();
            for message in &file.message_type {
                shapes.add(&package, message, limits);
            }
            if package == PACKAGE {
                services.extend(file.service.iter().filter(|s| s.name() == service));
            }
        }
        for method in services.iter().flat_map(|s| &s.method) {
            let input = method.input_type().trim_start_matches('.').to_owned();
            if !method.client_streaming() && shapes.has_repeated(&input, &mut Vec::new()) {
                shapes
                    .methods
                    .insert(format!("/{PACKAGE}.{service}/{}", method.name()), input);
            }
        }
        shapes
    }

    fn add(
        &mut self,
        scope: &str,
        message: &prost_types::DescriptorProto,
        limits: &[(&str, &str, usize)],
    ) {
        let full = format!("{scope}.{}", message.name());
        // `Message.field` within the package, as LIMITS names it.
        let short = full
            .strip_prefix(&format!("{PACKAGE}."))
            .unwrap_or(&full)
            .to_owned();
        let mut fields = Vec::new();
        for field in &message.field {
            let kind = match field.r#type() {
                Type::Message | Type::Group => {
                    Kind::Message(field.type_name().trim_start_matches('.').to_owned())
                }
                Type::String | Type::Bytes => Kind::Bytes,
                Type::Fixed32 | Type::Sfixed32 | Type::Float => Kind::Fixed32,
                Type::Fixed64 | Type::Sfixed64 | Type::Double => Kind::Fixed64,
                _ => Kind::Varint,
            };
            let count = (field.label() == Label::Repeated).then(|| {
                let field_name = format!("{short}.{}", field.name());
                let (name, max) = limits
                    .iter()
                    .find(|(named, _, _)| *named == field_name)
                    .map_or((field_name.clone(), MAX_ITEMS), |(_, name, max)| {
                        ((*name).to_owned(), *max)
                    });
                self.count(name, max)
            });
            fields.push(Field {
                number: field.number() as u32,
                kind,
                count,
            });
        }
        self.messages.insert(full.clone(), fields);
        for nested in &message.nested_type {
            self.add(&full, nested, limits);
        }
    }

    /// The index of the count named `name` (made on first use).
    fn count(&mut self, name: String, max: usize) -> usize {
        if let Some(i) = self.counts.iter().position(|c| c.name == name) {
            return i;
        }
        self.counts.push(Count { name, max });
        self.counts.len() - 1
    }

    /// Whether `message` (or a message within it) has a repeated field.
    fn has_repeated(&self, message: &str, seen: &mut Vec<String>) -> bool {
        if seen.iter().any(|s| s == message) {
            return false;
        }
        seen.push(message.to_owned());
        self.messages.get(message).is_some_and(|fields| {
            fields.iter().any(|f| {
                f.count.is_some()
                    || matches!(&f.kind, Kind::Message(inner) if self.has_repeated(inner, seen))
            })
        })
    }

    /// The request message of `path` when its requests are walked before decoding.
    pub fn walked(&self, path: &str) -> Option<&str> {
        self.methods.get(path).map(String::as_str)
    }

    /// Checks a unary call's body (one gRPC frame) carrying a `message`.
    pub fn check_frame(&self, message: &str, body: &[u8]) -> Result<(), ShapeError> {
        let Some((header, rest)) = body.split_first_chunk::<5>() else {
            return Err(ShapeError::Malformed("its gRPC frame is cut short"));
        };
        if header[0] != 0 {
            return Err(ShapeError::Compressed);
        }
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        match rest.len().cmp(&len) {
            std::cmp::Ordering::Less => Err(ShapeError::Malformed("its gRPC frame is cut short")),
            std::cmp::Ordering::Greater => Err(ShapeError::Malformed(
                "a call of this method carries exactly one message",
            )),
            std::cmp::Ordering::Equal => self.check(message, rest),
        }
    }

    /// Checks the protobuf bytes of one `message`.
    pub fn check(&self, message: &str, bytes: &[u8]) -> Result<(), ShapeError> {
        let mut counts = vec![0usize; self.counts.len()];
        self.walk(message, bytes, 0, &mut counts)
    }

    fn walk(
        &self,
        message: &str,
        mut bytes: &[u8],
        depth: usize,
        counts: &mut [usize],
    ) -> Result<(), ShapeError> {
        let fields = self.messages.get(message).map(Vec::as_slice).unwrap_or(&[]);
        while !bytes.is_empty() {
            let key = varint(&mut bytes)?;
            let number = key >> 3;
            if number == 0 || number > u64::from(u32::MAX >> 3) {
                return Err(ShapeError::Malformed("a field number is out of range"));
            }
            let field = fields.iter().find(|f| u64::from(f.number) == number);
            let mut items = 1;
            match key & 7 {
                0 => {
                    varint(&mut bytes)?;
                }
                1 => take(&mut bytes, 8).map(drop)?,
                5 => take(&mut bytes, 4).map(drop)?,
                2 => {
                    let len = usize::try_from(varint(&mut bytes)?)
                        .map_err(|_| ShapeError::Malformed("a length is out of range"))?;
                    let value = take(&mut bytes, len)?;
                    match field.map(|f| &f.kind) {
                        Some(Kind::Message(inner)) => {
                            if depth + 1 > MAX_DEPTH {
                                return Err(ShapeError::TooDeep);
                            }
                            self.walk(inner, value, depth + 1, counts)?;
                        }
                        // Packed numbers: one item per varint, or per 4 or 8 bytes.
                        Some(Kind::Varint) => {
                            items = value.iter().filter(|b| *b & 0x80 == 0).count()
                        }
                        Some(Kind::Fixed32) => items = value.len() / 4,
                        Some(Kind::Fixed64) => items = value.len() / 8,
                        Some(Kind::Bytes) | None => {}
                    }
                }
                3 | 4 => return Err(ShapeError::Malformed("it holds a group")),
                _ => return Err(ShapeError::Malformed("a wire type is unknown")),
            }
            if let Some(i) = field.and_then(|f| f.count) {
                counts[i] = counts[i].saturating_add(items);
                let count = &self.counts[i];
                if counts[i] > count.max {
                    return Err(ShapeError::TooMany {
                        name: count.name.clone(),
                        max: count.max,
                    });
                }
            }
        }
        Ok(())
    }
}

/// Reads one varint (at most 10 bytes).
fn varint(bytes: &mut &[u8]) -> Result<u64, ShapeError> {
    let mut value = 0u64;
    for i in 0..10 {
        let Some((&byte, rest)) = bytes.split_first() else {
            return Err(ShapeError::Malformed("a varint is cut short"));
        };
        *bytes = rest;
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(ShapeError::Malformed("a varint is longer than 10 bytes"))
}

/// Takes `len` bytes off the front of `bytes`.
fn take<'a>(bytes: &mut &'a [u8], len: usize) -> Result<&'a [u8], ShapeError> {
    if bytes.len() < len {
        return Err(ShapeError::Malformed("a field is cut short"));
    }
    let (value, rest) = bytes.split_at(len);
    *bytes = rest;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_proto::v1 as pb;

    fn complete(request: &pb::CompleteRequest) -> Result<(), ShapeError> {
        Shapes::gateway().check("tollgate.v1.CompleteRequest", &request.encode_to_vec())
    }

    fn empty_parts(n: usize) -> pb::CompleteRequest {
        pb::CompleteRequest {
            messages: vec![pb::ChatMessage {
                role: "user".into(),
                parts: vec![pb::ContentPart::default(); n],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn every_gateway_method_whose_request_repeats_a_field_is_walked() {
        let shapes = Shapes::gateway();
        let mut walked: Vec<&str> = shapes.methods.keys().map(String::as_str).collect();
        walked.sort_unstable();
        assert_eq!(
            walked,
            [
                "/tollgate.v1.Gateway/CallTool",
                "/tollgate.v1.Gateway/Complete",
                "/tollgate.v1.Gateway/CountTokens",
                "/tollgate.v1.Gateway/Delegate",
                "/tollgate.v1.Gateway/StartChild",
            ]
        );
        // A request without repeated fields, and a client stream, are not held for a walk.
        assert_eq!(shapes.walked("/tollgate.v1.Gateway/StopChild"), None);
        assert_eq!(shapes.walked("/tollgate.v1.Gateway/Egress"), None);
    }

    /// How deep `message` nests along paths that do not repeat a message (recursion, such as
    /// a tool result's contents, is bounded by the decoded checks instead).
    fn depth(shapes: &Shapes, message: &str, path: &mut Vec<String>) -> usize {
        path.push(message.to_owned());
        let inner: Vec<String> = shapes.messages[message]
            .iter()
            .filter_map(|f| match &f.kind {
                Kind::Message(inner) if !path.contains(inner) => Some(inner.clone()),
                _ => None,
            })
            .collect();
        let deepest = inner
            .iter()
            .map(|inner| 1 + depth(shapes, inner, path))
            .max()
            .unwrap_or(0);
        path.pop();
        deepest
    }

    #[test]
    fn every_request_without_recursion_fits_the_depth_limit() {
        let shapes = Shapes::gateway();
        for (method, message) in &shapes.methods {
            let deepest = depth(shapes, message, &mut Vec::new());
            assert!(deepest <= MAX_DEPTH, "{method}: {deepest} levels");
        }
    }

    #[test]
    fn a_call_within_its_limits_passes_and_one_past_them_is_refused_undecoded() {
        assert_eq!(complete(&empty_parts(MAX_PARTS)), Ok(()));
        assert_eq!(
            complete(&empty_parts(MAX_PARTS + 1)),
            Err(ShapeError::TooMany {
                name: "parts".into(),
                max: MAX_PARTS
            })
        );
        // A tool result's contents count with the parts around it.
        let mut nested = empty_parts(MAX_PARTS - 1);
        nested.messages[0].parts.push(pb::ContentPart {
            part: Some(pb::content_part::Part::ToolResult(pb::ToolResult {
                content: vec![pb::ContentPart::default(); 2],
                ..Default::default()
            })),
            cache: false,
        });
        assert!(
            matches!(complete(&nested), Err(ShapeError::TooMany { name, .. }) if name == "parts")
        );
        let many = pb::CompleteRequest {
            messages: vec![pb::ChatMessage::default(); MAX_MESSAGES + 1],
            ..Default::default()
        };
        assert_eq!(
            complete(&many).unwrap_err().to_string(),
            format!(
                "messages has more than {MAX_MESSAGES} items; at most {MAX_MESSAGES} are accepted"
            )
        );
        let stops = pb::CompleteRequest {
            stop: vec![String::new(); MAX_STOPS + 1],
            ..Default::default()
        };
        assert!(
            matches!(complete(&stops), Err(ShapeError::TooMany { name, .. }) if name == "stop")
        );
    }

    #[test]
    fn any_other_repeated_field_has_the_default_limit() {
        let exec = pb::CallToolRequest {
            tool: Some(pb::call_tool_request::Tool::Exec(pb::ExecRequest {
                argv: vec![String::new(); MAX_ITEMS + 1],
                ..Default::default()
            })),
        };
        let refused = Shapes::gateway()
            .check("tollgate.v1.CallToolRequest", &exec.encode_to_vec())
            .unwrap_err();
        assert_eq!(
            refused,
            ShapeError::TooMany {
                name: "ExecRequest.argv".into(),
                max: MAX_ITEMS
            }
        );
    }

    #[test]
    fn frames_that_are_compressed_cut_short_or_deep_are_refused() {
        let shapes = Shapes::gateway();
        let message = empty_parts(1).encode_to_vec();
        let frame = |flag: u8, len: usize, body: &[u8]| {
            let mut frame = vec![flag];
            frame.extend_from_slice(&(len as u32).to_be_bytes());
            frame.extend_from_slice(body);
            frame
        };
        let kind = "tollgate.v1.CompleteRequest";
        assert_eq!(
            shapes.check_frame(kind, &frame(0, message.len(), &message)),
            Ok(())
        );
        assert_eq!(
            shapes.check_frame(kind, &frame(1, message.len(), &message)),
            Err(ShapeError::Compressed)
        );
        assert!(shapes
            .check_frame(kind, &frame(0, message.len() + 1, &message))
            .is_err());
        assert!(shapes.check_frame(kind, &message[..3]).is_err());
        // A length past the end, an endless varint, a group.
        assert!(shapes.check(kind, &[0x12, 0x05, 0x00]).is_err());
        assert!(shapes.check(kind, &[0x12; 11]).is_err());
        assert!(shapes.check(kind, &[0x13]).is_err());
        // Tool results in tool results, nested past the limit (the decoded check refuses
        // any nesting; this bounds the walk itself).
        let mut part = pb::ContentPart::default();
        for _ in 0..MAX_DEPTH {
            part = pb::ContentPart {
                part: Some(pb::content_part::Part::ToolResult(pb::ToolResult {
                    content: vec![part],
                    ..Default::default()
                })),
                cache: false,
            };
        }
        let deep = pb::CompleteRequest {
            messages: vec![pb::ChatMessage {
                parts: vec![part],
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(complete(&deep), Err(ShapeError::TooDeep));
    }
}
