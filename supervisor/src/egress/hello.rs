//! The first bytes a sandbox sends on an outbound connection, read far enough to know whether
//! it speaks TLS and, if it does, which server its ClientHello names (RFC 8446 §4.1.2, the
//! `server_name` extension of RFC 6066 §3) and whether it hides that name
//! (`encrypted_client_hello`). The supervisor compares the name with the host it granted, so
//! a tunnel to an allowed host cannot carry a handshake meant for another one behind the
//! same front (domain fronting).
//!
//! Only what the check needs is parsed, and every length is checked against what is left:
//! the input is the agent's.

/// Most bytes read before a ClientHello must be complete (one full TLS record and its header).
pub const MAX_HELLO: usize = 16 * 1024 + 5;

/// TLS record type of handshake messages.
const HANDSHAKE: u8 = 0x16;
/// Handshake message type of a ClientHello.
const CLIENT_HELLO: u8 = 0x01;
/// Extension carrying the server name.
const SERVER_NAME: u16 = 0x0000;
/// Extension carrying an encrypted ClientHello (RFC 9849).
const ENCRYPTED_CLIENT_HELLO: u16 = 0xfe0d;

/// What a ClientHello says about where it is going.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientHello {
    /// The `host_name` of its `server_name` extension, as sent; none when it has none.
    pub server_name: Option<String>,
    /// Whether it carries `encrypted_client_hello` (the real name is hidden inside).
    pub encrypted_client_hello: bool,
}

/// What the first bytes of a connection are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FirstFlight {
    /// Not a TLS handshake: nothing to compare.
    NotTls,
    /// A TLS handshake whose ClientHello is not complete yet: read more (up to [`MAX_HELLO`]).
    NeedMore,
    /// A complete ClientHello.
    Hello(ClientHello),
    /// A TLS handshake that is not a well-formed ClientHello.
    Malformed(&'static str),
}

/// A cursor over bytes that never reads past their end.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < n {
            return None;
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Some(head)
    }

    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }

    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    fn u24(&mut self) -> Option<usize> {
        self.take(3)
            .map(|b| (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]))
    }

    /// A length-prefixed block (`width` bytes of length).
    fn block(&mut self, width: usize) -> Option<Reader<'a>> {
        let len = match width {
            1 => self.u8()?,
            2 => self.u16()?,
            _ => self.u24()?,
        };
        self.take(len).map(|bytes| Reader { bytes })
    }
}

/// Reads `bytes`, the start of what a sandbox sent on a connection.
pub fn first_flight(bytes: &[u8]) -> FirstFlight {
    match bytes.first() {
        None => return FirstFlight::NeedMore,
        Some(&HANDSHAKE) => {}
        Some(_) => return FirstFlight::NotTls,
    }
    // The handshake message may span records: join their fragments.
    let mut handshake = Vec::new();
    let mut records = Reader { bytes };
    let needed = loop {
        let Some(header) = records.take(5) else {
            return FirstFlight::NeedMore;
        };
        if header[0] != HANDSHAKE {
            return FirstFlight::Malformed(
                "a record other than a handshake came before the ClientHello was complete",
            );
        }
        if header[1] != 3 {
            return FirstFlight::Malformed("not a TLS record version");
        }
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if len == 0 || len > 16 * 1024 {
            return FirstFlight::Malformed("a TLS record length out of range");
        }
        let Some(fragment) = records.take(len) else {
            return FirstFlight::NeedMore;
        };
        handshake.extend_from_slice(fragment);
        if handshake.len() >= 4 {
            let needed = 4
                + ((usize::from(handshake[1]) << 16)
                    | (usize::from(handshake[2]) << 8)
                    | usize::from(handshake[3]));
            if handshake.len() >= needed {
                break needed;
            }
            if needed > MAX_HELLO {
                return FirstFlight::Malformed("a ClientHello longer than 16 KiB");
            }
        }
    };
    if handshake[0] != CLIENT_HELLO {
        return FirstFlight::Malformed("the first handshake message is not a ClientHello");
    }
    match client_hello(&handshake[4..needed]) {
        Some(hello) => FirstFlight::Hello(hello),
        None => FirstFlight::Malformed("a ClientHello whose lengths do not add up"),
    }
}

/// The fields of a ClientHello body the check needs; none if a length does not fit.
fn client_hello(body: &[u8]) -> Option<ClientHello> {
    let mut hello = Reader { bytes: body };
    hello.take(2 + 32)?; // legacy_version, random
    hello.block(1)?; // legacy_session_id
    hello.block(2)?; // cipher_suites
    hello.block(1)?; // legacy_compression_methods
    let mut found = ClientHello {
        server_name: None,
        encrypted_client_hello: false,
    };
    if hello.bytes.is_empty() {
        return Some(found); // no extensions at all
    }
    let mut extensions = hello.block(2)?;
    while !extensions.bytes.is_empty() {
        let kind = extensions.u16()?;
        let mut data = extensions.block(2)?;
        match u16::try_from(kind).ok()? {
            SERVER_NAME => {
                let mut names = data.block(2)?;
                while !names.bytes.is_empty() {
                    let name_type = names.u8()?;
                    let name = names.block(2)?;
                    if name_type == 0 {
                        if found.server_name.is_some() {
                            return None; // two host names: ambiguous, refused
                        }
                        found.server_name = Some(String::from_utf8(name.bytes.to_vec()).ok()?);
                    }
                }
            }
            ENCRYPTED_CLIENT_HELLO => found.encrypted_client_hello = true,
            _ => {}
        }
    }
    Some(found)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A ClientHello record naming `name` (none: no server_name), with `extra` extensions.
    pub(crate) fn hello(name: Option<&str>, extra: &[(u16, &[u8])]) -> Vec<u8> {
        let mut extensions = Vec::new();
        if let Some(name) = name {
            let mut list = vec![0u8];
            list.extend_from_slice(&(name.len() as u16).to_be_bytes());
            list.extend_from_slice(name.as_bytes());
            let mut data = (list.len() as u16).to_be_bytes().to_vec();
            data.extend_from_slice(&list);
            extensions.extend_from_slice(&0u16.to_be_bytes());
            extensions.extend_from_slice(&(data.len() as u16).to_be_bytes());
            extensions.extend_from_slice(&data);
        }
        for (kind, data) in extra {
            extensions.extend_from_slice(&kind.to_be_bytes());
            extensions.extend_from_slice(&(data.len() as u16).to_be_bytes());
            extensions.extend_from_slice(data);
        }
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.push(0); // session id
        body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one cipher suite
        body.extend_from_slice(&[1, 0]); // null compression
        body.extend_from_slice(&(extensions.len() as u16).to_be_bytes());
        body.extend_from_slice(&extensions);
        let mut handshake = vec![CLIENT_HELLO];
        handshake.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        handshake.extend_from_slice(&body);
        let mut record = vec![HANDSHAKE, 3, 1];
        record.extend_from_slice(&(handshake.len() as u16).to_be_bytes());
        record.extend_from_slice(&handshake);
        record
    }

    #[test]
    fn reads_the_server_name() {
        let record = hello(Some("api.example.test"), &[(0x002b, &[2, 3, 4])]);
        assert_eq!(
            first_flight(&record),
            FirstFlight::Hello(ClientHello {
                server_name: Some("api.example.test".into()),
                encrypted_client_hello: false
            })
        );
        let no_name = hello(None, &[]);
        assert!(matches!(
            first_flight(&no_name),
            FirstFlight::Hello(ClientHello {
                server_name: None,
                ..
            })
        ));
        let ech = hello(Some("cover.example"), &[(ENCRYPTED_CLIENT_HELLO, &[0; 8])]);
        assert!(matches!(
            first_flight(&ech),
            FirstFlight::Hello(ClientHello {
                encrypted_client_hello: true,
                ..
            })
        ));
    }

    #[test]
    fn waits_for_the_whole_hello_and_joins_records() {
        let record = hello(Some("a.example"), &[]);
        for cut in 1..record.len() {
            assert_eq!(first_flight(&record[..cut]), FirstFlight::NeedMore, "{cut}");
        }
        // The same handshake split over two records.
        let handshake = &record[5..];
        let (a, b) = handshake.split_at(10);
        let mut split = Vec::new();
        for part in [a, b] {
            split.extend_from_slice(&[HANDSHAKE, 3, 3]);
            split.extend_from_slice(&(part.len() as u16).to_be_bytes());
            split.extend_from_slice(part);
        }
        assert!(
            matches!(first_flight(&split), FirstFlight::Hello(ClientHello { server_name: Some(name), .. }) if name == "a.example")
        );
    }

    #[test]
    fn other_bytes_are_not_tls_and_bad_lengths_are_malformed() {
        assert_eq!(first_flight(b"GET / HTTP/1.1\r\n"), FirstFlight::NotTls);
        assert_eq!(first_flight(b"SSH-2.0-x\r\n"), FirstFlight::NotTls);
        let mut record = hello(Some("a.example"), &[]);
        // Extensions length one byte too long.
        let at = record.len() - (4 + 2 + 3 + "a.example".len()) - 2;
        record[at + 1] += 1;
        assert!(matches!(first_flight(&record), FirstFlight::Malformed(_)));
        let mut not_hello = hello(Some("a.example"), &[]);
        not_hello[5] = 2;
        assert!(matches!(
            first_flight(&not_hello),
            FirstFlight::Malformed(_)
        ));
        assert!(matches!(
            first_flight(&[HANDSHAKE, 3, 1, 0xff, 0xff]),
            FirstFlight::Malformed(_)
        ));
    }
}
