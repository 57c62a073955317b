//! systemd's readiness protocol (`Type=notify`): a daemon under systemd says it is ready once
//! it listens (the same moment it writes its readiness file) and that it is stopping when it
//! begins to. Without `NOTIFY_SOCKET` (not under systemd) nothing is sent.

use sd_notify::NotifyState;

/// Tells systemd the daemon is ready, with a one-line status (`listening on …`).
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Tells systemd the daemon is stopping.
pub fn stopping() {
    send(&[NotifyState::Stopping]);
}

fn send(states: &[NotifyState<'_>]) {
    // The variable stays set: removing it would race other threads reading the environment.
    if let Err(e) = sd_notify::notify(false, states) {
        tracing::warn!(error = %e, "could not notify systemd");
    }
}
