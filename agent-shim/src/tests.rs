//! pid 1's side of the gateway hand-over ([`Attached`]): a connection is offered once it has
//! spoken; one handed over is kept until the supervisor says it holds it, sent again when
//! asked, and dropped when told.

use std::io::{Read as _, Write as _};
use std::os::linux::net::SocketAddrExt as _;

use super::*;

/// pid 1 attached to a supervisor (the returned end), with a gateway socket and a client
/// connected to it that has sent `x`.
fn attached(name: &str) -> (Attached, UnixStream, UnixListener, UnixStream) {
    let (pid_one, supervisor, gateway, mut client) = silent(name);
    client.write_all(b"x").unwrap();
    (pid_one, supervisor, gateway, client)
}

/// pid 1 attached to a supervisor (the returned end), with a gateway socket and a client
/// connected to it that has sent nothing yet.
fn silent(name: &str) -> (Attached, UnixStream, UnixListener, UnixStream) {
    let (supervisor, control) = UnixStream::pair().unwrap();
    let address = std::os::unix::net::SocketAddr::from_abstract_name(format!(
        "tollgate-shim-test-{name}-{}",
        std::process::id()
    ))
    .unwrap();
    let gateway = UnixListener::bind_addr(&address).unwrap();
    gateway.set_nonblocking(true).unwrap();
    let client = UnixStream::connect_addr(&address).unwrap();
    client.set_nonblocking(true).unwrap();
    (
        Attached::new(control, Inbox::default(), held::HeldConnections::default()),
        supervisor,
        gateway,
        client,
    )
}

/// The supervisor's side: one line, with the descriptor that came with it.
fn receive(supervisor: &UnixStream) -> (String, Option<OwnedFd>) {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut buffer = [0u8; 256];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 2]);
    let mut iov = [std::io::IoSliceMut::new(&mut buffer)];
    let received = recvmsg::<()>(
        supervisor.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::empty(),
    )
    .unwrap();
    let mut fd = None;
    for message in received.cmsgs().unwrap() {
        if let ControlMessageOwned::ScmRights(fds) = message {
            assert_eq!(fds.len(), 1);
            // SAFETY: the kernel installed it for this receive; nothing else owns it.
            #[allow(unsafe_code)]
            let owned = unsafe { OwnedFd::from_raw_fd(fds[0]) };
            fd = Some(owned);
        }
    }
    let bytes = received.bytes;
    (String::from_utf8(buffer[..bytes].to_vec()).unwrap(), fd)
}

/// The supervisor says `line`, and pid 1 reads it.
fn tell(attached: Attached, mut supervisor: &UnixStream, line: &str) -> Attached {
    supervisor.write_all(line.as_bytes()).unwrap();
    match attached.read() {
        Some(Link::Attached(attached)) => attached,
        _ => panic!("pid 1 let go of the supervisor"),
    }
}

/// Whether the client still sees its connection open (nothing to read, no end).
fn open(mut client: &UnixStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(client.read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// A connection whose descriptor the supervisor did not get is still open on its caller's
/// side and is sent again when asked; once the supervisor says it holds it, pid 1 closes its
/// copy, so the caller sees the end when the supervisor ends it.
#[test]
fn a_connection_is_kept_until_received_and_sent_again_when_asked() {
    let (pid_one, supervisor, gateway, mut client) = attached("kept");
    let mut pid_one = pid_one;
    pid_one.on_gateway(&gateway);
    assert_eq!(receive(&supervisor).0, "\"connection_waiting\"\n");
    let mut pid_one = tell(pid_one, &supervisor, "\"accept\"\n");
    pid_one.on_gateway(&gateway);
    let (line, first) = receive(&supervisor);
    assert_eq!(line, "\"connection\"\n");
    // Lost on the way (as the kernel closes one that finds no free number).
    drop(first.expect("the connection came attached"));
    assert!(open(&client), "pid 1 kept no copy");

    let pid_one = tell(pid_one, &supervisor, "\"resend\"\n");
    let (line, again) = receive(&supervisor);
    assert_eq!(line, "\"connection\"\n");
    let again = UnixStream::from(again.expect("sent again attached"));
    let mut byte = [0u8; 1];
    (&again).read_exact(&mut byte).unwrap();
    assert_eq!(&byte, b"x", "the same connection");

    let pid_one = tell(pid_one, &supervisor, "\"received\"\n");
    assert!(pid_one.handed.is_none());
    assert!(open(&client));
    drop(again);
    let mut rest = [0u8; 1];
    assert_eq!(
        client.read(&mut rest).unwrap(),
        0,
        "the caller sees the end"
    );

    // Nothing kept: asked to send it again, pid 1 says it has none.
    let _pid_one = tell(pid_one, &supervisor, "\"resend\"\n");
    assert_eq!(receive(&supervisor).0, "\"not_accepted\"\n");
}

/// pid 1 keeps one connection at most: the next `Accept` means the supervisor holds the
/// last one.
#[test]
fn the_next_accept_drops_the_kept_connection() {
    let (pid_one, supervisor, gateway, client) = attached("bounded");
    let mut pid_one = tell(pid_one, &supervisor, "\"accept\"\n");
    pid_one.on_gateway(&gateway);
    let (_, handed) = receive(&supervisor);
    drop(handed);
    assert!(open(&client));
    let pid_one = tell(pid_one, &supervisor, "\"accept\"\n");
    assert!(pid_one.handed.is_none());
    // Its first bytes unread, the caller sees a reset rather than a plain end.
    let mut rest = [0u8; 1];
    let ended = match (&client).read(&mut rest) {
        Ok(read) => read == 0,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    };
    assert!(ended, "the caller still sees its connection open");
}

/// A connection whose client has not written is held, not offered: the supervisor, which
/// closes connections silent past its deadline, never holds one. Once it speaks it is
/// offered; one that hangs up silent is dropped without a word to the supervisor.
#[test]
fn a_connection_is_offered_only_once_it_has_spoken() {
    let (mut pid_one, supervisor, gateway, mut client) = silent("spoken");
    supervisor.set_nonblocking(true).unwrap();
    pid_one.on_gateway(&gateway);
    let mut byte = [0u8; 1];
    assert!(
        matches!((&supervisor).read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "a silent connection was offered"
    );
    client.write_all(b"x").unwrap();
    pid_one.on_silent();
    supervisor.set_nonblocking(false).unwrap();
    assert_eq!(receive(&supervisor).0, "\"connection_waiting\"\n");
    let _pid_one = tell(pid_one, &supervisor, "\"accept\"\n");
    let (line, handed) = receive(&supervisor);
    assert_eq!(line, "\"connection\"\n");
    let handed = UnixStream::from(handed.expect("the connection came attached"));
    (&handed).read_exact(&mut byte).unwrap();
    assert_eq!(&byte, b"x", "the same connection, its first bytes unread");
}
