//! The shutdown signal both daemons stop on.

use std::future::Future;

/// Completes on SIGINT or SIGTERM. The handlers are installed when this is called (before
/// the daemon writes its readiness file), not when the future is first polled: a signal that
/// arrives right after readiness must stop the daemon cleanly, not kill it.
pub fn signal() -> impl Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let terminate = signal(SignalKind::terminate());
    let interrupt = signal(SignalKind::interrupt());
    async move {
        match (terminate, interrupt) {
            (Ok(mut terminate), Ok(mut interrupt)) => {
                tokio::select! {
                    _ = terminate.recv() => {}
                    _ = interrupt.recv() => {}
                }
            }
            (Ok(mut only), Err(_)) | (Err(_), Ok(mut only)) => {
                only.recv().await;
            }
            // No handler could be installed: the signals keep their default action.
            (Err(_), Err(_)) => std::future::pending().await,
        }
    }
}
