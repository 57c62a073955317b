//! SIGHUP: reload what can change without touching a run. The model routes file is read,
//! its keys loaded and its local routes probed again; only when all of that succeeds do runs
//! starting from then on get the new routes (live runs keep the ones they started with). A
//! file that does not load leaves the routes in use as they are. A SIGHUP never stops the
//! daemon or a run.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};
use tollgate_router_backends::ModelRoutes;

use crate::runs::RunManager;

/// Installs the SIGHUP handler now (from here on a SIGHUP never kills the daemon) and
/// reloads on each one.
pub(super) fn on_hangup(
    manager: Arc<RunManager>,
    routes: Option<PathBuf>,
    probe_timeout: Duration,
    config: Option<PathBuf>,
) -> std::io::Result<()> {
    let mut hangups = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            if let Some(config) = &config {
                reload_log_level(config);
            }
            reload(&manager, routes.as_ref(), probe_timeout).await;
        }
    });
    Ok(())
}

/// Applies the configuration file's `log_level` anew (a level set by RUST_LOG stays until it
/// is changed here).
fn reload_log_level(config: &std::path::Path) {
    let file = match super::SupervisorFile::load(config) {
        Ok(file) => file,
        Err(e) => {
            tracing::warn!(error = %e, "SIGHUP: config file not read again; nothing of it changed");
            return;
        }
    };
    if let Some(level) = file.log_level {
        match tollgate_daemon::logging::set_level(&level) {
            Ok(()) => tracing::info!(level = %level, "SIGHUP: log level set"),
            Err(e) => tracing::warn!(error = %e, "SIGHUP: log level not changed"),
        }
    }
}

async fn reload(manager: &RunManager, routes: Option<&PathBuf>, probe_timeout: Duration) {
    let Some(path) = routes else {
        tracing::info!("SIGHUP: nothing to reload (started without --routes)");
        return;
    };
    match ModelRoutes::load(path, probe_timeout).await {
        Ok(models) => {
            let count = models.routes.routes.len();
            manager.set_model_routes(Arc::new(models));
            tracing::info!(
                routes = count,
                file = %path.display(),
                "SIGHUP: model routes reloaded; runs starting from now use them"
            );
        }
        Err(e) => tracing::warn!(
            error = %e,
            file = %path.display(),
            "SIGHUP: model routes not reloaded; keeping the ones in use"
        ),
    }
}
