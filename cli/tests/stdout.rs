//! What the CLI does when its standard output cannot be written: a full device is an error
//! (one line on stderr, exit 74), a closed pipe ends it quietly.

use std::os::unix::process::ExitStatusExt as _;
use std::process::{Command, Stdio};

fn tollgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
}

fn dev_full() -> std::fs::File {
    std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full opens for writing")
}

/// Every kind of output (an escaped human view, raw JSON, a generated script) meets the
/// same end on a full device.
#[test]
fn a_failed_write_to_stdout_is_one_line_on_stderr_and_exit_74() {
    let commands: [&[&str]; 4] = [
        &["classify", "hello"],
        &["classify", "--json", "hello"],
        &["classify", "--explain-policy"],
        &["completions", "bash"],
    ];
    for args in commands {
        let output = tollgate()
            .args(args)
            .stdout(dev_full())
            .stderr(Stdio::piped())
            .output()
            .expect("tollgate runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(74),
            "tollgate {args:?}: {stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "tollgate {args:?}: {stderr}");
        assert!(
            stderr.starts_with("tollgate: error: cannot write to standard output: "),
            "tollgate {args:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn a_closed_pipe_ends_the_command_quietly() {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let output = tollgate()
        .args(["completions", "bash"])
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("tollgate runs");
    assert_eq!(
        output.status.signal(),
        Some(nix::sys::signal::Signal::SIGPIPE as i32),
        "{:?}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.stderr.is_empty());
}

/// An error report that cannot be written (stderr on a full device) still ends the command
/// with the error's own exit status, not a panic's 101.
#[test]
fn an_unwritable_stderr_keeps_the_errors_exit_status() {
    let args = ["profile", "show", "no-such-profile"];
    let reported = tollgate()
        .args(args)
        .env("TOLLGATE_PROFILES_DIR", "/nonexistent")
        .stderr(Stdio::piped())
        .output()
        .expect("tollgate runs");
    let code = reported.status.code();
    assert!(
        matches!(code, Some(c) if c != 0 && c != 101),
        "{:?}: {}",
        reported.status,
        String::from_utf8_lossy(&reported.stderr)
    );
    let unreported = tollgate()
        .args(args)
        .env("TOLLGATE_PROFILES_DIR", "/nonexistent")
        .stderr(dev_full())
        .status()
        .expect("tollgate runs");
    assert_eq!(unreported.code(), code);
}
