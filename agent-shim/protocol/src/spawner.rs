//! What the supervisor and its spawner (`tollgate-shim spawner`) say to each other: one
//! request per start, one reply, each a single `SOCK_SEQPACKET` message.
//!
//! The spawner is a small process the supervisor starts once, before its descriptor table
//! grows with live runs, to start every shim and `exec` helper: a child started from it
//! inherits its few descriptors, not the supervisor's thousands (each copied at the clone and
//! closed again at the `execve`, a cost that grew with every live run).
//!
//! A request carries the program, its arguments and, as `SCM_RIGHTS`, the child's descriptors
//! in the order of [`SpawnRequest::fd_targets`], then the cgroup it joins: each cgroup v1
//! hierarchy's `tasks` file, opened for writing, and the cgroup v2 directory (see
//! [`SpawnRequest::join_tasks`]). The environment is always empty. The reply carries the
//! child's pid, an errno and the step that failed.
//!
//! Before any request, the supervisor sends the [`SandboxBase`](crate::plan::SandboxBase) of
//! its sandboxes (JSON, one message), and the spawner makes the sandboxes' base mount
//! namespace from it: every shim it starts starts there. It answers with one message: empty
//! once the base is made, or one line saying why it could not be (then it exits).

/// The spawner's end of its socket: fd 3, as the shim's control socket is.
pub const SPAWNER_FD: i32 = 3;

/// The largest request the spawner reads (program and arguments are short paths and words).
pub const MAX_REQUEST: usize = 16 * 1024;

/// The most cgroup v1 `tasks` files a request carries (one per mounted v1 hierarchy a run
/// uses: memory, pids, cpu, freezer, with room to spare).
pub const MAX_JOIN_TASKS: usize = 8;

/// The most descriptors a request carries: stdout, stderr, control, stdin, pid 1's pidfd,
/// the `tasks` files and the v2 cgroup directory.
pub const MAX_FDS: usize = 5 + MAX_JOIN_TASKS + 1;

/// The spawner's answer to the base once it has made the base mount namespace; any other
/// answer is why it could not.
pub const BASE_READY: &[u8] = b"ready";

/// The size of an encoded [`SpawnReply`].
pub const REPLY_LEN: usize = 12;

/// The first byte of a request: which optional descriptors follow the three always sent.
const HAS_STDIN: u8 = 1;
const HAS_PID_ONE: u8 = 2;
const HAS_CGROUP_DIR: u8 = 4;
const IN_PLACE: u8 = 8;

/// A request that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The message was empty or its flags byte unknown.
    #[error("a spawn request without a valid flags byte")]
    Flags,
    /// The program or an argument was not NUL-terminated, or the program was empty.
    #[error("a spawn request whose program or arguments are not NUL-terminated strings")]
    Strings,
    /// More `tasks` files than [`MAX_JOIN_TASKS`].
    #[error("a spawn request with more than {MAX_JOIN_TASKS} cgroup tasks files")]
    TooManyTasks,
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
    /// How many cgroup v1 `tasks` files are attached after the placed descriptors. The child
    /// writes `0` to each before it executes the program: a single-threaded task moving
    /// itself is the one move for which the kernel skips its threadgroup lock (moving a
    /// process by pid takes it for writing, which can wait a whole RCU grace period).
    pub join_tasks: u8,
    /// Whether a cgroup v2 directory is attached last: the child is created in it
    /// (`clone3` with `CLONE_INTO_CGROUP`), so it is never outside it.
    pub join_dir: bool,
    /// Whether `program` is the spawner's own binary (`tollgate-shim`), started in place:
    /// the child runs the entry point `args` name (none: the shim; `enter`) in its copy of
    /// the spawner, without executing the binary again. Loading and relocating it took
    /// about a millisecond of every start; the spawner did it once.
    pub in_place: bool,
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

    /// How many descriptors a request carries: the placed ones, then the cgroup's.
    pub fn attached(&self) -> usize {
        self.fd_targets().len() + usize::from(self.join_tasks) + usize::from(self.join_dir)
    }

    /// The message: a flags byte, the number of `tasks` files, then the program and each
    /// argument NUL-terminated.
    pub fn encode(&self) -> Vec<u8> {
        let flags = if self.stdin { HAS_STDIN } else { 0 }
            | if self.pid_one { HAS_PID_ONE } else { 0 }
            | if self.join_dir { HAS_CGROUP_DIR } else { 0 }
            | if self.in_place { IN_PLACE } else { 0 };
        let mut message = vec![flags, self.join_tasks];
        for part in std::iter::once(&self.program).chain(&self.args) {
            message.extend_from_slice(part);
            message.push(0);
        }
        message
    }

    /// Reads a message [`SpawnRequest::encode`] wrote.
    pub fn decode(message: &[u8]) -> Result<Self, WireError> {
        let [flags, join_tasks, rest @ ..] = message else {
            return Err(WireError::Flags);
        };
        let (flags, join_tasks) = (*flags, *join_tasks);
        if flags & !(HAS_STDIN | HAS_PID_ONE | HAS_CGROUP_DIR | IN_PLACE) != 0 {
            return Err(WireError::Flags);
        }
        if usize::from(join_tasks) > MAX_JOIN_TASKS {
            return Err(WireError::TooManyTasks);
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
            join_tasks,
            join_dir: flags & HAS_CGROUP_DIR != 0,
            in_place: flags & IN_PLACE != 0,
        })
    }
}

/// The spawner's answer: the child's pid (0 when none was started), an errno (0 when the
/// child has executed the program) and, for a failure, the step that failed. A child that
/// failed after it was started has exited already, and is the supervisor's to reap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpawnReply {
    /// The child's host pid, or 0.
    pub pid: i32,
    /// Why the start failed, or 0.
    pub errno: i32,
    /// The cgroup the child could not join: an index into the request's cgroup descriptors
    /// (the `tasks` files in order, then the v2 directory), [`NO_BASE`] when the shim could
    /// not enter the sandboxes' base mount namespace, or [`NO_JOIN`] when the failure was
    /// neither (or there was none).
    pub failed_join: i32,
}

/// [`SpawnReply::failed_join`] when no join failed.
pub const NO_JOIN: i32 = -1;

/// [`SpawnReply::failed_join`] when the shim could not enter the sandboxes' base mount
/// namespace (it never ran).
pub const NO_BASE: i32 = -2;

impl SpawnReply {
    /// The message: pid, errno and the failed join, each 4 bytes little-endian.
    pub fn encode(&self) -> [u8; REPLY_LEN] {
        let mut message = [0; REPLY_LEN];
        message[..4].copy_from_slice(&self.pid.to_le_bytes());
        message[4..8].copy_from_slice(&self.errno.to_le_bytes());
        message[8..].copy_from_slice(&self.failed_join.to_le_bytes());
        message
    }

    /// Reads a message [`SpawnReply::encode`] wrote.
    pub fn decode(message: &[u8]) -> Result<Self, WireError> {
        let message: [u8; REPLY_LEN] = message
            .try_into()
            .map_err(|_| WireError::Reply(message.len()))?;
        let [a, b, c, d, e, f, g, h, i, j, k, l] = message;
        Ok(Self {
            pid: i32::from_le_bytes([a, b, c, d]),
            errno: i32::from_le_bytes([e, f, g, h]),
            failed_join: i32::from_le_bytes([i, j, k, l]),
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
            join_tasks: 4,
            join_dir: true,
            in_place: true,
        };
        assert_eq!(SpawnRequest::decode(&request.encode()), Ok(request.clone()));
        assert_eq!(request.fd_targets(), [1, 2, 3, 0, 4]);
        assert_eq!(request.attached(), 10);
        let bare = SpawnRequest {
            args: Vec::new(),
            stdin: false,
            pid_one: false,
            join_tasks: 0,
            join_dir: false,
            in_place: false,
            ..request
        };
        assert_eq!(SpawnRequest::decode(&bare.encode()), Ok(bare.clone()));
        assert_eq!(bare.fd_targets(), [1, 2, 3]);
        assert_eq!(bare.attached(), 3);
    }

    #[test]
    fn a_malformed_request_is_refused() {
        assert_eq!(SpawnRequest::decode(b""), Err(WireError::Flags));
        assert_eq!(SpawnRequest::decode(b"\0"), Err(WireError::Flags));
        assert_eq!(
            SpawnRequest::decode(b"\x10\0/bin/sh\0"),
            Err(WireError::Flags)
        );
        assert_eq!(
            SpawnRequest::decode(b"\0\x09/bin/sh\0"),
            Err(WireError::TooManyTasks)
        );
        assert_eq!(
            SpawnRequest::decode(b"\0\0/bin/sh"),
            Err(WireError::Strings)
        );
        assert_eq!(SpawnRequest::decode(b"\0\0\0"), Err(WireError::Strings));
    }

    #[test]
    fn a_reply_reads_back_as_written() {
        let reply = SpawnReply {
            pid: 4242,
            errno: 2,
            failed_join: NO_JOIN,
        };
        assert_eq!(SpawnReply::decode(&reply.encode()), Ok(reply));
        let joined = SpawnReply {
            failed_join: 3,
            ..reply
        };
        assert_eq!(SpawnReply::decode(&joined.encode()), Ok(joined));
        assert_eq!(SpawnReply::decode(b"1234"), Err(WireError::Reply(4)));
    }
}
