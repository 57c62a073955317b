//! What the supervisor and its spawner (`tollgate-shim spawner`) say to each other: one
//! request per start, one reply, each a single `SOCK_SEQPACKET` message.
//!
//! The spawner is a small process the supervisor starts once, before its descriptor table
//! grows with live runs, to start every shim and `exec` helper: a child started from it
//! inherits its few descriptors, not the supervisor's thousands (each copied at the clone and
//! closed again at the `execve`, a cost that grew with every live run).
//!
//! A request carries the program, its arguments and, as `SCM_RIGHTS`, the child's descriptors
//! in the order of [`SpawnRequest::fd_targets`]; the environment is always empty. The reply
//! carries the child's pid and an errno.

/// The spawner's end of its socket: fd 3, as the shim's control socket is.
pub const SPAWNER_FD: i32 = 3;

/// The largest request the spawner reads (program and arguments are short paths and words).
pub const MAX_REQUEST: usize = 16 * 1024;

/// The most descriptors a request carries (stdout, stderr, control, stdin, pid 1's pidfd).
pub const MAX_FDS: usize = 5;

/// The size of an encoded [`SpawnReply`].
pub const REPLY_LEN: usize = 8;

/// The first byte of a request: which optional descriptors follow the three always sent.
const HAS_STDIN: u8 = 1;
const HAS_PID_ONE: u8 = 2;

/// A request that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The message was empty or its flags byte unknown.
    #[error("a spawn request without a valid flags byte")]
    Flags,
    /// The program or an argument was not NUL-terminated, or the program was empty.
    #[error("a spawn request whose program or arguments are not NUL-terminated strings")]
    Strings,
    /// A reply was not [`REPLY_LEN`] bytes long.
    #[error("a spawn reply of {0} bytes, not {REPLY_LEN}")]
    Reply(usize),
}

/// One child to start: `program` with `args` (after `argv[0]`, which is the program) and an
/// empty environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnRequest {
    /// The program's path; also its `argv[0]`.
    pub program: Vec<u8>,
    /// Its arguments after `argv[0]`.
    pub args: Vec<Vec<u8>>,
    /// Whether a stdin descriptor is attached (else the child's fd 0 is `/dev/null`).
    pub stdin: bool,
    /// Whether a pidfd of the sandbox's pid 1 is attached.
    pub pid_one: bool,
}

impl SpawnRequest {
    /// The descriptor numbers the attached descriptors are placed on in the child, in the
    /// order they are attached: stdout, stderr, the control socket, then stdin and pid 1's
    /// pidfd when present.
    pub fn fd_targets(&self) -> Vec<i32> {
        let mut targets = vec![1, 2, crate::protocol::CONTROL_FD];
        if self.stdin {
            targets.push(0);
        }
        if self.pid_one {
            targets.push(crate::protocol::PID_ONE_FD);
        }
        targets
    }

    /// The message: a flags byte, then the program and each argument NUL-terminated.
    pub fn encode(&self) -> Vec<u8> {
        let flags =
            if self.stdin { HAS_STDIN } else { 0 } | if self.pid_one { HAS_PID_ONE } else { 0 };
        let mut message = vec![flags];
        for part in std::iter::once(&self.program).chain(&self.args) {
            message.extend_from_slice(part);
            message.push(0);
        }
        message
    }

    /// Reads a message [`SpawnRequest::encode`] wrote.
    pub fn decode(message: &[u8]) -> Result<Self, WireError> {
        let (&flags, rest) = message.split_first().ok_or(WireError::Flags)?;
        if flags & !(HAS_STDIN | HAS_PID_ONE) != 0 {
            return Err(WireError::Flags);
        }
        // Every part ends in a NUL: the text after the last one must be empty.
        let Some(rest) = rest.strip_suffix(&[0]) else {
            return Err(WireError::Strings);
        };
        let mut parts = rest.split(|&b| b == 0).map(<[u8]>::to_vec);
        let program = parts
            .next()
            .filter(|p| !p.is_empty())
            .ok_or(WireError::Strings)?;
        Ok(Self {
            program,
            args: parts.collect(),
            stdin: flags & HAS_STDIN != 0,
            pid_one: flags & HAS_PID_ONE != 0,
        })
    }
}

/// The spawner's answer: the child's pid (0 when none was started) and an errno (0 when the
/// child has executed the program). A child whose `execve` failed has exited already, and
/// is the supervisor's to reap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpawnReply {
    /// The child's host pid, or 0.
    pub pid: i32,
    /// Why the start failed, or 0.
    pub errno: i32,
}

impl SpawnReply {
    /// The message: pid then errno, each 4 bytes little-endian.
    pub fn encode(&self) -> [u8; REPLY_LEN] {
        let mut message = [0; REPLY_LEN];
        message[..4].copy_from_slice(&self.pid.to_le_bytes());
        message[4..].copy_from_slice(&self.errno.to_le_bytes());
        message
    }

    /// Reads a message [`SpawnReply::encode`] wrote.
    pub fn decode(message: &[u8]) -> Result<Self, WireError> {
        let message: [u8; REPLY_LEN] = message
            .try_into()
            .map_err(|_| WireError::Reply(message.len()))?;
        let [a, b, c, d, e, f, g, h] = message;
        Ok(Self {
            pid: i32::from_le_bytes([a, b, c, d]),
            errno: i32::from_le_bytes([e, f, g, h]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_reads_back_as_written() {
        let request = SpawnRequest {
            program: b"/usr/bin/tollgate-shim".to_vec(),
            args: vec![b"enter".to_vec(), Vec::new()],
            stdin: true,
            pid_one: true,
        };
        assert_eq!(SpawnRequest::decode(&request.encode()), Ok(request.clone()));
        assert_eq!(request.fd_targets(), [1, 2, 3, 0, 4]);
        let bare = SpawnRequest {
            args: Vec::new(),
            stdin: false,
            pid_one: false,
            ..request
        };
        assert_eq!(SpawnRequest::decode(&bare.encode()), Ok(bare.clone()));
        assert_eq!(bare.fd_targets(), [1, 2, 3]);
    }

    #[test]
    fn a_malformed_request_is_refused() {
        assert_eq!(SpawnRequest::decode(b""), Err(WireError::Flags));
        assert_eq!(
            SpawnRequest::decode(b"\x08/bin/sh\0"),
            Err(WireError::Flags)
        );
        assert_eq!(SpawnRequest::decode(b"\0/bin/sh"), Err(WireError::Strings));
        assert_eq!(SpawnRequest::decode(b"\0\0"), Err(WireError::Strings));
    }

    #[test]
    fn a_reply_reads_back_as_written() {
        let reply = SpawnReply {
            pid: 4242,
            errno: 2,
        };
        assert_eq!(SpawnReply::decode(&reply.encode()), Ok(reply));
        assert_eq!(SpawnReply::decode(b"1234"), Err(WireError::Reply(4)));
    }
}
