//! Server-sent events (the `text/event-stream` format both model APIs stream in), read
//! incrementally from the chunks a response body arrives in.
//!
//! Lines end with `\n`, `\r\n` or `\r` (also when a chunk ends between `\r` and `\n`); a
//! field is `name: value` (one space after the colon is dropped); `data` lines of one event
//! are joined with `\n`; lines starting with `:` are comments; a blank line ends the event.
//! An event without data is not dispatched. `id` and `retry` are ignored (nothing here
//! reconnects). A line longer than [`MAX_LINE`] is an error, so a hostile server cannot make
//! the supervisor buffer without bound.

/// Longest line accepted.
pub const MAX_LINE: usize = 1 << 20;

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// Its `event:` name, if it had one.
    pub event: Option<String>,
    /// Its data lines, joined with `\n`.
    pub data: String,
}

/// Why a stream cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    /// A line, or one event's data, exceeded [`MAX_LINE`].
    #[error("an event-stream line or event is longer than {MAX_LINE} bytes")]
    LineTooLong,
    /// A line is not UTF-8.
    #[error("an event-stream line is not UTF-8")]
    NotUtf8,
}

/// Reads events from a stream's chunks.
#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    /// The previous chunk ended with `\r`: a `\n` starting the next one belongs to it.
    after_cr: bool,
    event: Option<String>,
    data: Option<Vec<String>>,
}

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the next chunk; returns the events it completed.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<SseEvent>, SseError> {
        let mut events = Vec::new();
        let mut bytes = chunk;
        if self.after_cr {
            self.after_cr = false;
            if let Some(rest) = bytes.strip_prefix(b"\n") {
                bytes = rest;
            }
        }
        while let Some(end) = bytes.iter().position(|&b| b == b'\n' || b == b'\r') {
            self.append(&bytes[..end])?;
            bytes = if bytes[end] == b'\r' {
                match bytes.get(end + 1) {
                    Some(b'\n') => &bytes[end + 2..],
                    Some(_) => &bytes[end + 1..],
                    None => {
                        self.after_cr = true;
                        &[]
                    }
                }
            } else {
                &bytes[end + 1..]
            };
            let line = std::mem::take(&mut self.line);
            if let Some(event) = self.line_done(&line)? {
                events.push(event);
            }
        }
        self.append(bytes)?;
        Ok(events)
    }

    fn append(&mut self, bytes: &[u8]) -> Result<(), SseError> {
        if self.line.len() + bytes.len() > MAX_LINE {
            return Err(SseError::LineTooLong);
        }
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    fn line_done(&mut self, line: &[u8]) -> Result<Option<SseEvent>, SseError> {
        if line.is_empty() {
            let event = self.event.take();
            return Ok(self.data.take().map(|lines| SseEvent {
                event,
                data: lines.join("\n"),
            }));
        }
        let line = std::str::from_utf8(line).map_err(|_| SseError::NotUtf8)?;
        if line.starts_with(':') {
            return Ok(None);
        }
        let (name, value) = match line.split_once(':') {
            Some((name, value)) => (name, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match name {
            "data" => {
                let data = self.data.get_or_insert_with(Vec::new);
                // One event's data is bounded too, not only each line.
                if data.iter().map(String::len).sum::<usize>() + value.len() > MAX_LINE {
                    return Err(SseError::LineTooLong);
                }
                data.push(value.to_owned());
            }
            "event" => self.event = Some(value.to_owned()),
            _ => {}
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &str = "event: message_start\r\ndata: {\"a\":1}\r\n\r\n: a comment\n\
                          data: first\ndata:second\n\nevent: ping\n\ndata: [DONE]\r\r";

    fn expected() -> Vec<SseEvent> {
        vec![
            SseEvent {
                event: Some("message_start".into()),
                data: "{\"a\":1}".into(),
            },
            SseEvent {
                event: None,
                data: "first\nsecond".into(),
            },
            SseEvent {
                event: None,
                data: "[DONE]".into(),
            },
        ]
    }

    #[test]
    fn events_come_out_the_same_however_the_stream_is_split() {
        let bytes = STREAM.as_bytes();
        let mut whole = SseParser::new();
        assert_eq!(whole.push(bytes).unwrap(), expected());
        for split in 0..=bytes.len() {
            let mut parser = SseParser::new();
            let mut events = parser.push(&bytes[..split]).unwrap();
            events.extend(parser.push(&bytes[split..]).unwrap());
            assert_eq!(events, expected(), "split at {split}");
        }
        let mut parser = SseParser::new();
        let events: Vec<SseEvent> = bytes
            .iter()
            .flat_map(|b| parser.push(std::slice::from_ref(b)).unwrap())
            .collect();
        assert_eq!(events, expected(), "byte by byte");
    }

    #[test]
    fn endless_lines_and_broken_text_are_refused() {
        let mut parser = SseParser::new();
        let chunk = vec![b'a'; 64 << 10];
        let mut result = Ok(Vec::new());
        for _ in 0..=(MAX_LINE / chunk.len()) {
            result = parser.push(&chunk);
            if result.is_err() {
                break;
            }
        }
        assert_eq!(result, Err(SseError::LineTooLong));
        assert_eq!(
            SseParser::new().push(b"data: \xff\n\n"),
            Err(SseError::NotUtf8)
        );
    }
}
